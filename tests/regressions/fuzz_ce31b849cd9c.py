# A minimal program on which minicomp differed from eager, found and shrunk by
# tests/test_fuzz.py; replayed by tests/test_regressions.py. When it is a known,
# unfixed bug, set XFAIL = "<reason>" to expect the failure (strictly).
#
# Failure when saved:
#   AssertionError: whole graph fell back: compile: TypeError: cannot unpack non-iterable NoneType object
import torch

# Fixed minicomp bug (passes/fusion._copy_unstrided_views): cse makes v1 and v3 one node, a graph
# result, which is stored with eager's strides for v3 (transposed, as v0); v2 flattens it, which no
# strides of that buffer express, and building the Program failed (view_as_strided gave None): the
# whole graph ran in PyTorch. Such a view is copied now, as eager copies it. Found by the fuzzer (seed
# 12), present before this branch.


def f(v0):
    v1 = torch.abs(v0)
    v2 = v1.reshape(-1)
    v3 = torch.abs(v0)
    return v2, v3


def make_inputs():
    torch.manual_seed(0)
    return [
        torch.randn(2, 2).transpose(0, -1),  # v0: float32 [2, 2] transposed
    ]


if __name__ == "__main__":
    import minicomp
    args = make_inputs()
    torch.testing.assert_close(minicomp.compile(f)(*args), f(*args), equal_nan=True)
    print("minicomp matches eager")
