"""Views and data movement (view, reshape, permute, expand, slices, select, cat, split, flip, pad, views
returned directly), each compared with eager.

Every compiled function runs on fresh random inputs; ``compile_and_compare`` checks dtype, shape
and values and that nothing fell back to PyTorch.
"""

import torch
import torch.nn.functional as F

from tests.test_reductions import randint
from tests.utils import compile_and_compare


# =============================================================================================
# 2. Views and data movement
# =============================================================================================

def test_view_and_reshape():
    def fn(x):
        return (x.view(24, 8) + 1, x.reshape(-1) * 2, x.reshape(4, -1, 2) - 1, x.view(2, 2, 6, 8).exp(),
                x.reshape(4, 48).neg(), x.view(4, 6, 2, 4).sum(-1), x.reshape(-1, 8)[5] * 3)
    compile_and_compare(fn, torch.randn(4, 6, 8))


def test_reshape_of_transposed_and_permuted():
    def fn(x):
        return (x.transpose(0, 1).reshape(6, -1) + 1, x.permute(2, 0, 1).reshape(8, 24) * 2,
                x.transpose(1, 2).reshape(4, 48).sin(), x.permute(1, 2, 0).reshape(-1) - 1,
                x.transpose(0, 2).reshape(2, 4, 6, 4).abs())
    compile_and_compare(fn, torch.randn(4, 6, 8))


def test_permute_transpose_t():
    def fn(x, m):
        return (x.permute(2, 0, 1) + 1, x.transpose(-1, 0) * 2, x.permute(1, 2, 0).exp(), m.t() - 1,
                x.transpose(1, 2) + x.permute(0, 2, 1), m.t().t() * 3, m.T + 1)
    compile_and_compare(fn, torch.randn(3, 5, 7), torch.randn(4, 9))


def test_expand_and_broadcasting():
    def fn(a, b, c):
        return (a + b, a * c, (b + c).exp(), a.expand(4, 5, 6) + 1, c.expand(3, -1, -1) * 2,
                c.unsqueeze(0).expand(2, 3, 5, 6).sum(1), b.expand(5, 6) - c)
    compile_and_compare(fn, torch.randn(4, 1, 6), torch.randn(5, 1), torch.randn(5, 6))


def test_broadcasting_with_zero_dim_and_mixed_dtypes():
    def fn(x, s, i):
        return x * s, x + i, i * s, (i + 1).sum(0), s.expand(2, 3) + 1, s.unsqueeze(0).expand(4) * x[:, 0]
    compile_and_compare(fn, torch.randn(4, 6), torch.randn(()), randint(1, 6, dtype=torch.int32))


def test_squeeze_unsqueeze():
    def fn(x):
        return (x.squeeze() * 2, x.squeeze(1) + 1, x.squeeze(-1) - 1, x.squeeze((1, 3)).exp(),
                x.unsqueeze(0) * 2, x.unsqueeze(-1) + 1, x.unsqueeze(2).neg(), x.squeeze(0) * 3,
                x.squeeze().unsqueeze(1) + 1)
    compile_and_compare(fn, torch.randn(3, 1, 5, 1))


def test_slices_with_steps_and_negative_starts():
    def fn(x):
        return (x[::2] + 1, x[1::3] * 2, x[-4:] - 1, x[:, -5:-1].exp(), x[2:9:3, 1::4] * 3,
                x[..., -1:] + 1, x[-3:, ::5].neg(), x[1:-1, 2:-2] * 2, x[:, 5:5] + 1, x[:, 20:] * 2,
                x.narrow(1, 3, 4) + 1)
    compile_and_compare(fn, torch.randn(10, 12))


def test_select_including_negative_index():
    def fn(x):
        return (x[1] + 1, x[-1] * 2, x[:, -2] - 1, x[..., 3].exp(), x.select(1, -3) * 3, x[0, -1] + 2,
                x[-2, 1, -4] * 2)
    compile_and_compare(fn, torch.randn(4, 5, 6))


def test_cat_two_and_three_inputs():
    def fn(a, b, c):
        return (torch.cat([a, b], 0) + 1, torch.cat([a, b, c], 0) * 2, torch.cat([a.t(), b.t()], 1).exp(),
                torch.cat([a, c, b], dim=-1) - 1, torch.cat([a, b * 2], 1))
    compile_and_compare(fn, torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4))
    compile_and_compare(lambda a, b, c: (torch.cat([a, b, c], 1), torch.cat([c, c * 2, c], -1)),
                        torch.randn(2, 3, 4), torch.randn(2, 1, 4), torch.randn(2, 5, 4))


def test_cat_uneven_sizes_along_dims():
    def fn(a, b, c):
        return torch.cat([a, b], 0), torch.cat([a.t(), c], 0), torch.cat([a, b, a], 0) * 2
    compile_and_compare(fn, torch.randn(2, 5), torch.randn(7, 5), torch.randn(3, 2))


def test_cat_mixed_dtypes_promote():
    def fn(f, i, h, l, b):
        return (torch.cat([i, f], 1), torch.cat([h, f]), torch.cat([i, l], 0), torch.cat([b, i], 1),
                torch.cat([h, i], 0), torch.cat([f, b]))
    compile_and_compare(fn, torch.randn(3, 4), randint(3, 4, dtype=torch.int32), torch.randn(3, 4, dtype=torch.float16),
                        randint(3, 4), torch.rand(3, 4) > 0.5)


def test_cat_with_empty_input():
    def fn(a, e, e2, b):
        return torch.cat([a, e]) * 2, torch.cat([e2, a, e2], 0) + 1, torch.cat([a, b[:, :0], b], 1)
    compile_and_compare(fn, torch.randn(3, 4), torch.randn(0), torch.randn(0, 4), torch.randn(3, 2))


def test_split_and_chunk_uneven():
    def fn(x):
        a, b, c = x.split(3, dim=1)
        d, e, f = x.chunk(3, 0)
        g, h, k = torch.split(x, [1, 5, 2], dim=1)
        return a + 1, b * 2, c - 1, d.exp(), e + 1, f * 2, g + h[:, :1], k.neg(), *x.chunk(4, -1)
    compile_and_compare(fn, torch.randn(7, 8))


def test_split_and_narrow_along_negative_dims():
    def fn(x):
        a, b, c = x.split([2, 3, 1], -1)
        d, e = x.chunk(2, -2)
        return a + 1, b * 2, c - 1, d.exp(), e.neg(), x.narrow(-1, 2, 3) + 1, x.narrow(-2, 1, 2) * 2
    compile_and_compare(fn, torch.randn(3, 4, 6))


def test_split_pieces_as_outputs():
    compile_and_compare(lambda x: x.split(4, 1), torch.randn(3, 10))
    compile_and_compare(lambda x: x.chunk(3, 0), torch.randn(8, 3))


def test_gated_chunk():
    def fn(x):
        a, b = x.chunk(2, -1)
        return a * torch.sigmoid(b)
    compile_and_compare(fn, torch.randn(4, 5, 12))


def test_flip():
    def fn(x):
        return (x.flip(0) + 1, x.flip(-1) * 2, x.flip(0, 2).exp(), x.flip((0, 1, 2)) - 1, x.flip(1).sum(1),
                torch.flip(x, [1, -1]) * 3, x.flip(0).flip(0) + 1)
    compile_and_compare(fn, torch.randn(3, 4, 5))


def test_constant_pad():
    def fn(x):
        return (F.pad(x, (1, 2)), F.pad(x, (1, 1, 2, 0), value=1.5), F.pad(x, (-1, -2)),
                F.pad(x, (2, -1, -1, 3)), F.pad(x, (0, 0, 0, 0, 1, 1), value=-2.0) * 2,
                F.pad(x, (3, 0), mode="constant", value=0.25).exp())
    compile_and_compare(fn, torch.randn(3, 4, 5))


def test_constant_pad_int_and_low_precision():
    compile_and_compare(lambda x: (F.pad(x, (1, 2), value=7), F.pad(x, (-1, 1, 2, -2)) + 1),
                        randint(4, 5, dtype=torch.int32))
    compile_and_compare(lambda x: F.pad(x, (2, 1, 1, 0), value=-0.5) * 2, torch.randn(4, 5, dtype=torch.bfloat16))


def test_view_chains_with_pointwise():
    def fn(x, y, z):
        return (x.t().reshape(-1) * 2,
                torch.cat([x, y * 2], 1).flip(0),
                x[::2].t().contiguous() + 1,
                F.pad(x.flip(1), (1, 1)).sum(0),
                x.t().unsqueeze(0).expand(2, -1, -1).reshape(2, -1) + z,
                x.transpose(0, 1)[1:, ::2].reshape(-1).exp(),
                torch.cat([x, y], 1).sum(1) / torch.cat([x, y], 1).amax(1),
                x.view(3, 2, 6).permute(2, 0, 1).flip(1).reshape(6, 6)[1::2] * y.sum(),
                F.pad(x, (-1, 2))[:, ::3].t() + y.t()[:3, :1])
    compile_and_compare(fn, torch.randn(6, 6), torch.randn(6, 3), torch.randn(2, 36))


def test_views_returned_directly():
    def fn(x):
        return x.t(), x[1], x.unsqueeze(0).expand(3, -1, -1), x.flip(0), x[:, 1::2], x.view(-1), x.permute(1, 0), x
    compile_and_compare(fn, torch.randn(4, 6))


def test_views_of_intermediates_returned_directly():
    def fn(x):
        y = x * 2 + 1
        return (y.t(), y[1], y.unsqueeze(0).expand(3, -1, -1), y.flip(0), y[:, 1::2], y.view(-1), y[-1, 2:],
                F.pad(y, (1, 1)), y)
    compile_and_compare(fn, torch.randn(4, 6))


def test_views_of_non_contiguous_input_returned_directly():
    compile_and_compare(lambda x: (x.t(), x[1], x.flip(1), x.reshape(-1)), torch.randn(5, 4).t())
