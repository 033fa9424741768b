import os

import pytest
import torch

# Every buffer minicomp allocates starts as garbage, so an unwritten element cannot pass as correct.
os.environ.setdefault("MINICOMP_POISON", "1")
# CPU graphs run minicomp's kernels in Triton's interpreter (by default they run in PyTorch), so every
# CPU test exercises the real codegen.
os.environ.setdefault("MINICOMP_CPU", "interpret")
# Under pytest-xdist (the README's ``-n logical``) each worker gets its share of the cores: PyTorch's own
# threads, one per core in every worker, would oversubscribe them.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def pytest_collection_modifyitems(config, items):
    """A test marked ``gpu`` (``@pytest.mark.gpu``, or ``gpu(reason=...)``) skips without a CUDA device."""
    if torch.cuda.is_available():
        return
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is not None:
            item.add_marker(pytest.mark.skip(reason=marker.kwargs.get("reason", "needs a CUDA device")))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory, monkeypatch):
    """An empty minicomp cache for every test: tests that patch the compiler's thresholds must not
    reuse another test's graph-cache entry for the same function."""
    path = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(path))
    return path


@pytest.fixture
def tuning_in_the_interpreter(monkeypatch):
    """max-autotune times interpreted kernels too (it never does for a user: ``passes/tune.measures``), so
    tests exercise the tuning machinery on the CPU."""
    from minicomp.passes import tune as tuning
    monkeypatch.setattr(tuning, "measures", lambda target: True)
