"""zero_grad(set_to_none=True): gradients are undefined between steps, as torch leaves them."""
import torch
import torch.nn.functional as F

from _common import batches, mlp, print_loss, print_tensors

torch.manual_seed(0)
model = mlp(256, 1024, 16)
print("before any backward", [p.grad is None for p in model.parameters()])
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
for step, (x, y) in enumerate(batches(1, 5, (32, 256), (32, 16))):
    optimizer.zero_grad(set_to_none=True)
    print("after zero_grad", all(p.grad is None for p in model.parameters()))
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    print_loss(step, loss)
print_tensors(model.named_parameters())
print_tensors((name, p.grad) for name, p in model.named_parameters())
