"""A model compiled with torch.compile, which spillway cannot manage yet: under
manage:auto it is refused, and manage:explicit leaves it to torch."""
import torch
import torch.nn.functional as F

from _common import batches, mlp, print_loss, print_tensors

torch.manual_seed(0)
model = torch.compile(mlp(64, 128, 8), backend="eager")
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step, (x, y) in enumerate(batches(1, 3, (16, 64), (16, 8))):
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    print_loss(step, loss)
print_tensors(model.named_parameters())
