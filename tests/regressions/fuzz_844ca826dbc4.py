# A minimal program on which minicomp differed from eager, found and shrunk by
# tests/test_fuzz.py; replayed by tests/test_regressions.py. When it is a known,
# unfixed bug, set XFAIL = "<reason>" to expect the failure (strictly).
#
# Failure when saved:
#   AssertionError: output 0: Tensor-likes are not close!
#   
#   Mismatched elements: 1 / 4 (25.0%)
#   Greatest absolute difference: 2.1787893772125244 at index (2,) (up to 1e-05 allowed)
#   Greatest relative difference: 1.0 at index (2,) (up to 1e-05 allowed)
#   minicomp: [0.5684312582015991, -0.293428897857666, 0.0, 1.5409960746765137]
#   eager:    [0.5684312582015991, -0.293428897857666, -2.1787893772125244, 1.5409960746765137]
#   (also further than twice eager's error from the float64 result)
import torch

# Fixed minicomp bug (ir/expr.py + codegen): flip of a reshaped non-contiguous tensor reads out of bounds.
# The load index is 2*((-xindex + 1) % 2) + ((-xindex + 1) // 2) + 1: Affine.__floordiv__/__mod__
# split the constant 3 out of (3 - xindex) // 2, leaving the argument -xindex + 1, negative for
# xindex >= 2, and Triton's // and % truncate toward zero (C semantics) where the IR means floor:
# for xindex = 2 the kernel loads in_ptr0[-1] instead of in_ptr0[2]. Same in compiled (GPU) Triton.


def f(v0):
    v1 = v0.reshape(-1)
    v2 = v1.flip(0)
    return v2


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
