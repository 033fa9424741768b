"""ResNet-50 (torchvision's layout: bottleneck blocks of 3, 4, 6 and 3, stride on the 3x3 convolution) in
plain PyTorch, for ``python -m minicomp explain examples/explain_resnet50.py``: inference, bf16,
32 images of 224x224 channels-last on a GPU; one 32x32 fp32 image on the CPU (Triton's interpreter is slow)."""
import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"
batch, size, dtype = (32, 224, torch.bfloat16) if device == "cuda" else (1, 32, torch.float32)


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(*conv_bn(cin, width, 1), nn.ReLU(), *conv_bn(width, width, 3, stride), nn.ReLU(),
                                  *conv_bn(width, cout, 1))
        self.shortcut = nn.Sequential(*conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = 4 * width
        self.stem = nn.Sequential(*conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(self.layers(self.stem(x)).mean((2, 3)))


model = ResNet50().eval().to(device, dtype, memory_format=torch.channels_last)
example_inputs = (torch.randn(batch, 3, size, size, device=device, dtype=dtype).to(memory_format=torch.channels_last),)
