import torch

import minicomp
from tests.utils import compile_and_compare


def test_relu_mul_add_one_kernel():
    compile_and_compare(lambda x: torch.relu(x) * 0.5 + 1, torch.randn(4, 5), kernels=1)


def test_report_names_the_kernel_and_its_ops():
    compile_and_compare(lambda x: torch.relu(x) * 0.5 + 1, torch.randn(3, 3), kernels=1)
    k = minicomp.report().kernels[0]
    assert k.name.startswith("k0_relu_mul_add_f32")
    assert k.ops == ("relu.default", "mul.Tensor", "add.Tensor")
