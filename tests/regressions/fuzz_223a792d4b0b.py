# A minimal program on which minicomp differed from eager, found and shrunk by
# tests/test_fuzz.py; replayed by tests/test_regressions.py. When it is a known,
# unfixed bug, set XFAIL = "<reason>" to expect the failure (strictly).
#
# Failure when saved:
#   RuntimeError: Segmentation fault (the process died) in the kernel of mean: it read the input, which has no elements (data_ptr 0)
import torch

# Fixed minicomp bug (templates/emitter.py: a buffer without elements is never read, now a constant).
# The reduced dim of v0 has stride 0, so the kernel's load of v0 had no reduction variable and so no
# rmask: it read v0 (data_ptr 0) in every row of the mean over no elements, a segfault. Found by the
# fuzzer (seed 8; shrunk by hand).

def f(v0):
    v1 = v0.mean(0, keepdim=False)
    return v1


def make_inputs():
    torch.manual_seed(0)
    return [
        torch.randn(1, 2, dtype=torch.bfloat16).expand(0, 2),  # v0: bfloat16 [0, 2] expanded
    ]


if __name__ == "__main__":
    import minicomp
    args = make_inputs()
    torch.testing.assert_close(minicomp.compile(f)(*args), f(*args), equal_nan=True)
    print("minicomp matches eager")
