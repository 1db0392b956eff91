"""A model compiled with torch.compile, which spillway cannot manage yet: under
manage:auto it is refused, and manage:explicit leaves it to torch."""
import torch

from _common import batches, mlp, print_tensors, train

torch.manual_seed(0)
model = torch.compile(mlp(64, 128, 8), backend="eager")
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
train(model, optimizer, batches(1, 3, (16, 64), (16, 8)))
print_tensors(model.named_parameters())
