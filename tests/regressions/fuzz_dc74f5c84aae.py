# A minimal program on which minicomp differed from eager, found and shrunk by
# tests/test_fuzz.py; replayed by tests/test_regressions.py. When it is a known,
# unfixed bug, set XFAIL = "<reason>" to expect the failure (strictly).
#
# Failure when saved:
#   RuntimeError: IndexOutOfRange: index out of range in self: index -1: gather.default: dim 1 of size 0 takes indices in [0, 0)
import torch

# Fixed minicomp bug (templates/emitter.py, Emitter._check): the index check ran where the index has
# no element. i0 is read outside the reduction loop (stride 0 along the empty reduced dim), at reduced
# coordinate 0, which dim 1 (size 0) does not hold, and its lanes were masked only by xmask: a false
# IndexOutOfRange (eager: three NaNs). The check now also needs the coordinates inside the index.

def f(v0, i0):
    v1 = torch.gather(v0, 1, i0)
    v2 = v1.mean(1, keepdim=False)
    return v2


def make_inputs():
    torch.manual_seed(0)
    return [
        torch.randn(3, 0),  # v0: float32 [3, 0] contiguous
        torch.randint(0, 1, (3, 1)).expand(3, 0),  # i0: int64 [3, 0] expanded in [0, 1)
    ]


if __name__ == "__main__":
    import minicomp
    args = make_inputs()
    torch.testing.assert_close(minicomp.compile(f)(*args), f(*args), equal_nan=True)
    print("minicomp matches eager")
