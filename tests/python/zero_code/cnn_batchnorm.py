"""A CNN with batch norm, whose running statistics (buffers) change every step."""
import torch
from torch import nn

from _common import batches, print_tensors, train


def block(inputs, outputs):
    return nn.Sequential(nn.Conv2d(inputs, outputs, 3, padding=1, bias=False),
                         nn.BatchNorm2d(outputs), nn.ReLU())


torch.manual_seed(0)
model = nn.Sequential(block(3, 64), block(64, 192), nn.MaxPool2d(2), block(192, 192),
                      block(192, 192), nn.MaxPool2d(2), block(192, 192), block(192, 192), block(192, 192),
                      block(192, 192), block(192, 192),
                      nn.Flatten(), nn.Linear(192 * 4 * 4, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
train(model, optimizer, batches(1, 5, (8, 3, 16, 16), (8, 10)))
print_tensors(model.named_parameters())
print_tensors(model.named_buffers())
