"""An MLP trained with Adam."""
import torch

from _common import batches, mlp, print_tensors, train

torch.manual_seed(0)
model = mlp(256, 1024, 16)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
train(model, optimizer, batches(1, 6, (32, 256), (32, 16)))
print_tensors(model.named_parameters())
