# A minimal program on which minicomp differed from eager, found and shrunk by
# tests/test_fuzz.py; replayed by tests/test_regressions.py.
#
# Failure when saved:
#   GeneratedCodeError: NameError in generated code: name 'buf15' is not defined
#     wrappers/...: kernels['k3_mm_f32_1x1'][(1,)](buf15, buf12, buf13, BLOCK_M=16, ...)
#   (at commit 4030fcc, in fusion's store-narrow: the f32 cast of the bf16 round trip is recomputed
#   once per matmul (%15 for the first, %16 for the second), but both matmuls read the one CSE'd view
#   %6 = reshape(%15); %15 lives only inside the first matmul's group, so the second kernel is
#   passed buf15, which the wrapper never allocates. Passes with the uncommitted change to
#   minicomp/passes/fusion.py in the working tree at 02:38 UTC.)
import torch


def f(v0):
    v1 = (v0).to(torch.bfloat16).float()
    v2 = torch.abs(v1)
    v3 = v1.reshape(-1, 1) @ torch.ones(1, 1).cumsum(0).to(v1.dtype)
    v4 = v1.reshape(-1, 1) @ torch.ones(1, 1).cumsum(0).to(v1.dtype)
    return v2, v3, v4


def make_inputs():
    torch.manual_seed(0)
    return [
        torch.randn(1),  # v0: float32 [1] contiguous
    ]


if __name__ == "__main__":
    import minicomp
    args = make_inputs()
    torch.testing.assert_close(minicomp.compile(f)(*args), f(*args), equal_nan=True)
    print("minicomp matches eager")
