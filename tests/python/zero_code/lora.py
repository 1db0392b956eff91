"""LoRA-style fine-tuning: a frozen base, trainable low-rank adapters."""
import torch
from torch import nn

from _common import batches, print_tensors, train


class LoRALinear(nn.Module):
    def __init__(self, inputs, outputs, rank=8):
        super().__init__()
        self.base = nn.Linear(inputs, outputs)
        self.base.requires_grad_(False)
        self.down = nn.Parameter(torch.randn(rank, inputs) * 0.01)
        self.up = nn.Parameter(torch.zeros(outputs, rank))

    def forward(self, x):
        return self.base(x) + (x @ self.down.t()) @ self.up.t()


torch.manual_seed(0)
layers = [LoRALinear(256, 1024), nn.ReLU()]
for _ in range(5):
    layers += [LoRALinear(1024, 1024), nn.ReLU()]
model = nn.Sequential(*layers, LoRALinear(1024, 16))
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
train(model, optimizer, batches(1, 6, (32, 256), (32, 16)))
print_tensors(model.named_parameters())
