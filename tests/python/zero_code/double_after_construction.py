"""model.double() after construction: the parameters change dtype before training."""
import torch
import torch.nn.functional as F

from _common import batches, mlp, print_loss, print_tensors

torch.manual_seed(0)
model = mlp(256, 512, 16, depth=5).double()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step, (x, y) in enumerate(batches(1, 5, (32, 256), (32, 16))):
    optimizer.zero_grad()
    loss = F.mse_loss(model(x.double()), y.double())
    loss.backward()
    optimizer.step()
    print_loss(step, loss)
print("dtypes", sorted({str(p.dtype) for p in model.parameters()}))
print_tensors(model.named_parameters())
