# A minimal program on which minicomp differed from eager, found and shrunk by
# tests/test_fuzz.py; replayed by tests/test_regressions.py. When it is a known,
# unfixed bug, set XFAIL = "<reason>" to expect the failure (strictly).
#
# Failure when saved:
#   AssertionError: Tensor-likes are not close!
#   
#   Mismatched elements: 1 / 1 (100.0%)
#   Greatest absolute difference: 4.0 at index (0,) (up to 0.02 allowed)
#   Greatest relative difference: 1.0 at index (0,) (up to 0.02 allowed)
#   (also further than twice eager's error from the float64 result)
import torch

# Fixed minicomp bug (codegen for CPU tensors / Triton interpreter): an int32 or bool -> bfloat16 cast gives
# garbage (4 -> 3.67e-40, -3 -> nan, True -> 9.2e-41): Triton's interpreter implements int -> bf16 as
# numpy astype(uint16), so the integer lands in the bfloat16 bit pattern. Casting through float32
# (x.to(tl.float32).to(tl.bfloat16)) in the generated kernel would avoid it. Same for type promotion
# (int32 + bfloat16) and comparisons of int with bfloat16.


def f(v0):
    v1 = v0.bfloat16()
    return v1


def make_inputs():
    torch.manual_seed(0)
    return [
        torch.randint(-4, 5, (1,), dtype=torch.int32),  # v0: int32 [1] contiguous
    ]


if __name__ == "__main__":
    import minicomp
    args = make_inputs()
    torch.testing.assert_close(minicomp.compile(f)(*args), f(*args), equal_nan=True)
    print("minicomp matches eager")
