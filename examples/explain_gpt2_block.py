"""A GPT-2 block (pre-norm causal self-attention and a GELU MLP, as GPT-2 small's: d=768, 12 heads) for
``python -m minicomp explain examples/explain_gpt2_block.py``: bf16, batch 8 x 512 tokens on a GPU; a
tiny fp32 one on the CPU (Triton's interpreter is slow)."""
import torch
import torch.nn.functional as F
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"
d, heads, batch, tokens, dtype = (768, 12, 8, 512, torch.bfloat16) if device == "cuda" else (32, 2, 2, 8, torch.float32)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, heads, d // heads).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln_2(x))


model = Block().eval().to(device, dtype)
example_inputs = (torch.randn(batch, tokens, d, device=device, dtype=dtype),)
