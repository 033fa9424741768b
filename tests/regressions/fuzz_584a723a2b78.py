# A minimal program on which minicomp differed from eager, found and shrunk by
# tests/test_fuzz.py; replayed by tests/test_regressions.py. When it is a known,
# unfixed bug, set XFAIL = "<reason>" to expect the failure (strictly).
#
# Failure when saved:
#   AssertionError: gradient of input 0: Tensor-likes are not close!
#   
#   Mismatched elements: 1 / 1 (100.0%)
#   Greatest absolute difference: 0.00390625 at index (0,) (up to 1e-05 allowed)
#   Greatest relative difference: 0.0031347961630672216 at index (0,) (up to 1e-05 allowed)
#   minicomp: [1.25]
#   eager:    [1.24609375]
#   (also further than twice eager's error from the float64 result)
GRADIENTS = True  # a failure of the backward: replayed with check_gradients_against_eager
import torch

# Known minicomp bug (passes/simplify.cse + codegen/wrapper): two equal outputs come back as one tensor.
# CSE merges the two casts and the wrapper returns the one buffer twice (`a is b`; Inductor returns two
# tensors, as eager does). Autograd then adds the two upstream gradients in the outputs' dtype, bf16
# (0.625 + 0.62109375 -> 1.25), where eager adds them after the casts back, in float32 (1.24609375);
# and an in-place update of one output changes the other, also without a backward. The fix: the
# wrapper copies an output whose buffer an earlier output already returns, unless the aten graph's
# outputs alias there too (their fake tensors share storage).
# Fixed: the wrapper returns a copy for the second of two results that cse merged.


def f(v0):
    v1 = v0.bfloat16()
    v2 = v0.bfloat16()
    return v1, v2


def make_inputs():
    torch.manual_seed(0)
    return [
        torch.randn(1),  # v0: float32 [1] contiguous
    ]


if __name__ == "__main__":
    from tests.test_fuzz import check_gradients_against_eager
    check_gradients_against_eager(f, make_inputs)
    print("minicomp's outputs and gradients match eager's")
