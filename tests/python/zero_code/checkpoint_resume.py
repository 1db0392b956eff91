"""A checkpoint saved mid-run with torch.save, loaded into a fresh model and
optimizer, which train on."""
import os
import tempfile

import torch

from _common import batches, mlp, print_tensors, train


data = batches(1, 8, (32, 256), (32, 16))
torch.manual_seed(0)
model = mlp(256, 1024, 16)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
train(model, optimizer, data[:4], 0)
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "checkpoint.pt")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    del model, optimizer
    # Memory-mapped: a large checkpoint need not be read into memory whole.
    checkpoint = torch.load(path, mmap=True)
    print_tensors(sorted(checkpoint["model"].items()))
    fresh = mlp(256, 1024, 16)
    fresh.load_state_dict(checkpoint["model"])
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=1e-3)
    fresh_optimizer.load_state_dict(checkpoint["optimizer"])
    del checkpoint
train(fresh, fresh_optimizer, data[4:], 4)
print_tensors(fresh.named_parameters())
