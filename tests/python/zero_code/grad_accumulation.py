"""Gradient accumulation: one optimizer step per 4 micro-batches."""
import torch
import torch.nn.functional as F

from _common import batches, mlp, print_loss, print_tensors

MICRO_BATCHES = 4
torch.manual_seed(0)
model = mlp(256, 1024, 16)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = batches(1, 4 * MICRO_BATCHES, (8, 256), (8, 16))
for step in range(4):
    optimizer.zero_grad()
    for x, y in data[step * MICRO_BATCHES:(step + 1) * MICRO_BATCHES]:
        loss = F.mse_loss(model(x), y) / MICRO_BATCHES
        loss.backward()
        print_loss(step, loss)
    optimizer.step()
print_tensors(model.named_parameters())
