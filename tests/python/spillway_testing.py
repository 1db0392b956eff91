"""What the Python tests share: small models, a training loop, a trace reader."""

import struct

import torch
import torch.nn.functional as F

INPUTS = 128
WIDTH = 512
OUTPUTS = 16
BATCH = 16
SEQUENCE = 8

# 2 MiB chunks under a 6 MiB budget (3 chunks): each model's parameters and
# gradients fill several chunks, so every step moves most of them.
SPILLING_CONF = ("device:sim,strict_residency:true,chunk_size:2MiB,device_budget:6MiB,"
                 "sim_capacity:256MiB,policy:lru")


def make_mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(INPUTS, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(),
        torch.nn.Linear(WIDTH, OUTPUTS))


class TinyTransformer(torch.nn.Module):
    """Two encoder layers between an input and an output projection; no dropout."""

    def __init__(self, seed, model=256):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Linear(INPUTS, model)
        self.blocks = torch.nn.Sequential(*(
            torch.nn.TransformerEncoderLayer(model, 4, dim_feedforward=4 * model, dropout=0.0)
            for _ in range(2)))
        self.head = torch.nn.Linear(model, OUTPUTS)

    def forward(self, x):  # x: [sequence, batch, inputs]
        return self.head(self.blocks(self.embed(x)))


def batches(seed, steps, shape, target_shape):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=generator), torch.randn(target_shape, generator=generator))
            for _ in range(steps)]


def mlp_batches(seed, steps):
    return batches(seed, steps, (BATCH, INPUTS), (BATCH, OUTPUTS))


def transformer_batches(seed, steps):
    return batches(seed, steps, (SEQUENCE, BATCH, INPUTS), (SEQUENCE, BATCH, OUTPUTS))


def train_step(model, optimizer, batch, set_to_none=False):
    optimizer.zero_grad(set_to_none=set_to_none)
    x, y = batch
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach().clone()


def parameters_copy(model):
    with torch.no_grad():
        return [p.detach().clone() for p in model.parameters()]


TRACE_HEADER_BYTES = 40
TRACE_RECORD_BYTES = 40
TRACE_KIND_STEP = 10


def trace_event_kinds(path):
    """The kind of every event record in a trace file (docs/trace-format.md),
    the end record excluded."""
    with open(path, "rb") as file:
        data = file.read()
    assert data[:8] == b"SPWTRACE", "not a spillway trace"
    (header_size,) = struct.unpack_from("<I", data, 12)
    records = data[header_size:]
    assert len(records) % TRACE_RECORD_BYTES == 0, "trace records are not whole"
    kinds = [struct.unpack_from("<H", records, offset + 8)[0]
             for offset in range(0, len(records), TRACE_RECORD_BYTES)]
    return kinds[:-1]  # the last record is the end record
