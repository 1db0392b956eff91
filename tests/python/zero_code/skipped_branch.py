"""A layer that some steps skip, under SGD with momentum and weight decay: torch
does not update a parameter whose gradient is undefined, so the skipped
layer's weights and momentum stay as they are in those steps."""
import torch
import torch.nn.functional as F
from torch import nn

from _common import batches, print_loss, print_tensors


class SometimesDeeper(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(256, 1024)
        self.middle = nn.Sequential(*(nn.Sequential(nn.Linear(1024, 1024), nn.ReLU())
                                      for _ in range(3)))
        self.extra = nn.Linear(1024, 1024)
        self.last = nn.Linear(1024, 16)

    def forward(self, x, deeper):
        h = self.middle(torch.relu(self.first(x)))
        if deeper:
            h = torch.relu(self.extra(h))
        return self.last(h)


torch.manual_seed(0)
model = SometimesDeeper()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, weight_decay=1e-2)
for step, (x, y) in enumerate(batches(1, 7, (32, 256), (32, 16))):
    optimizer.zero_grad()  # set_to_none=True, torch's default
    loss = F.mse_loss(model(x, deeper=step in (0, 3)), y)
    loss.backward()
    print("extra has a gradient", model.extra.weight.grad is not None)
    optimizer.step()
    print_loss(step, loss)
print_tensors(model.named_parameters())
print_tensors((f"momentum {index}", optimizer.state[p]["momentum_buffer"])
              for index, p in enumerate(model.parameters()))
