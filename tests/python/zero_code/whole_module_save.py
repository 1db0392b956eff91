"""Training that saves the whole module with torch.save(model) mid-run and
trains on; at the end the checkpoint is loaded and fine-tuned for a step."""
import os
import tempfile

import torch

from _common import batches, mlp, print_tensors, train


def sgd(params):
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=1e-4)


data = batches(2, 8, (32, 256), (32, 16))
torch.manual_seed(1)
model = mlp(256, 1024, 16, depth=6)
optimizer = sgd(model.parameters())
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "model.pt")
    train(model, optimizer, data[:4], 0)
    torch.save(model, path)
    train(model, optimizer, data[4:], 4)
    print_tensors(model.named_parameters())
    # Memory-mapped: a large checkpoint need not be read into memory whole.
    saved = torch.load(path, weights_only=False, mmap=True)
    print_tensors(saved.named_parameters())
    train(saved, sgd(saved.parameters()), data[4:5], 4)
    print_tensors(saved.named_parameters())
