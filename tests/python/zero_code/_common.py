"""What the unchanged scripts of this folder share. None of them imports
spillway: test_zero_code.py runs each one plain and under SPILLWAY_CONF and
compares what they print."""

import hashlib

import torch
import torch.nn.functional as F


def print_tensors(named):
    """A digest of each tensor's bytes: equal digests are bit-identical values."""
    for name, tensor in named:
        data = tensor.detach().clone()  # an op reads it, wherever it lives
        print(name, hashlib.sha256(data.numpy().tobytes()).hexdigest())


def print_loss(step, loss):
    print(f"step {step} loss {loss.item()!r}")


def mlp(inputs, width, outputs, depth=3):
    layers = [torch.nn.Linear(inputs, width), torch.nn.ReLU()]
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, outputs))


def batches(seed, count, *shapes):
    generator = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(shape, generator=generator) for shape in shapes)
            for _ in range(count)]


def train(model, optimizer, data, first_step=0):
    """The usual loop: one optimizer step per (input, target) batch, MSE loss."""
    for step, (x, y) in enumerate(data, start=first_step):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        print_loss(step, loss)
