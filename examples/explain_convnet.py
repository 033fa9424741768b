"""An example for ``python -m minicomp explain examples/explain_convnet.py``: the file defines ``model``
and ``example_inputs``; the command prints how minicomp compiles it and writes an HTML page.
(CUDA when there is a GPU, else the CPU: kernels in Triton's interpreter, times not measured.)"""
import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"
batch, size = (32, 64) if device == "cuda" else (2, 8)  # the interpreter is slow: a small CPU example


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.features(x)
        return self.head(x.mean((2, 3))).softmax(-1)


model = ConvNet().eval().to(device)
example_inputs = (torch.randn(batch, 3, size, size, device=device),)

if __name__ == "__main__":
    import minicomp
    print(minicomp.explain(model, *example_inputs))
