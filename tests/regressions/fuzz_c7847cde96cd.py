# A minimal program on which minicomp differed from eager, found and shrunk by
# tests/test_fuzz.py; replayed by tests/test_regressions.py. When it is a known,
# unfixed bug, set XFAIL = "<reason>" to expect the failure (strictly).
#
# Failure when saved:
#   RuntimeError: Segmentation fault (the process died) in the kernel of gather, mean
import torch

# Fixed minicomp bug (templates/emitter.py: a buffer without elements is never read). Fused into a
# mean over the empty dim, the gather ran in lanes with rmask off, where its index is 0, and read
# element 0 of v0, which has none: a segfault in the interpreter (an illegal address on a GPU). Found
# by the fuzzer's zero-size dims and random indices (shrunk by hand: a crash cannot be shrunk by
# Hypothesis).


def f(v0, i0):
    v1 = torch.gather(v0, 1, i0)
    v2 = v1.mean(1, keepdim=False)
    return v2


def make_inputs():
    torch.manual_seed(0)
    return [
        torch.randn(3, 0),  # v0: float32 [3, 0] contiguous
        torch.randint(0, 1, (3, 0)),  # i0: int64 [3, 0] contiguous in [0, 1)
    ]


if __name__ == "__main__":
    import minicomp
    args = make_inputs()
    torch.testing.assert_close(minicomp.compile(f)(*args), f(*args), equal_nan=True)
    print("minicomp matches eager")
