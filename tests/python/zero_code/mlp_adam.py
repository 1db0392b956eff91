"""An MLP trained with Adam."""
import torch
import torch.nn.functional as F

from _common import batches, mlp, print_loss, print_tensors

torch.manual_seed(0)
model = mlp(256, 1024, 16)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step, (x, y) in enumerate(batches(1, 6, (32, 256), (32, 16))):
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    print_loss(step, loss)
print_tensors(model.named_parameters())
