"""A bare nn.Parameter outside any module, handed to the optimizer beside a model's."""
import torch
import torch.nn.functional as F

from _common import batches, mlp, print_loss, print_tensors

torch.manual_seed(0)
model = mlp(256, 1024, 1024, depth=2)
readout = torch.nn.Parameter(torch.randn(1024, 16) * 0.02)  # no module owns it
optimizer = torch.optim.Adam(list(model.parameters()) + [readout], lr=1e-3)
for step, (x, y) in enumerate(batches(1, 6, (32, 256), (32, 16))):
    optimizer.zero_grad()
    loss = F.mse_loss(model(x) @ readout, y)
    loss.backward()
    optimizer.step()
    print_loss(step, loss)
print_tensors(model.named_parameters())
print_tensors([("readout", readout)])
