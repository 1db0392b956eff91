"""What the Python tests share: small models, a training loop, a trace reader."""

import contextlib
import struct

import torch
import torch.nn.functional as F

import spillway

# The tests compare training under spillway with plain torch bit for bit. With
# two intra-op threads torch's own CPU matmuls (MKL) differed between two
# identical runs in a few processes of a hundred here (docs/train-demo.md), so
# every process that imports this runs torch on one.
torch.set_num_threads(1)

INPUTS = 128
WIDTH = 512
OUTPUTS = 16
BATCH = 16
SEQUENCE = 8

# 2 MiB chunks under a 6 MiB budget (3 chunks): each model's parameters and
# gradients fill several chunks, so every step moves most of them. On the sim
# device the budget also holds everything else torch allocates (activations,
# a torch optimizer's state): a test whose model keeps state outside chunks
# widens the budget by that much (use_budget_for), so chunks keep about 3
# chunks' room and still spill.
SPILLING_CONF = ("device:sim,strict_residency:true,chunk_size:2MiB,device_budget:6MiB,"
                 "sim_capacity:256MiB,policy:lru")
CHUNK_ROOM_BYTES = 4 << 20  # 2 chunks: what one op or update pins
ACTIVATION_ROOM_BYTES = 2 << 20  # activations and temporaries: one small-pool slab
SLAB_BYTES = 2 << 20


def slab_bytes_of(tensor):
    """What a tensor of this size takes of the allocator's slabs: requests up to
    1 MiB share 2 MiB small-pool slabs (so a 768 KiB one takes half a slab),
    larger ones whole 2 MiB multiples."""
    size = -(-tensor.numel() * tensor.element_size() // 512) * 512
    if size > SLAB_BYTES // 2:
        return -(-size // SLAB_BYTES) * SLAB_BYTES
    return SLAB_BYTES // (SLAB_BYTES // size)


def use_budget_for(*models_and_state_slots, activation_bytes=ACTIVATION_ROOM_BYTES):
    """Sets the device budget to 2 chunks' room plus, for each (model, slots),
    `slots` tensors of each parameter's size kept outside chunks (a torch
    Adam's exp_avg and exp_avg_sq: 2; SGD's momentum: 1), in the slabs they
    take, plus `activation_bytes` for activations and temporaries."""
    outside = sum(slots * slab_bytes_of(param)
                  for model, slots in models_and_state_slots for param in model.parameters())
    outside = -(-outside // SLAB_BYTES) * SLAB_BYTES
    spillway._C._set_device_budget(CHUNK_ROOM_BYTES + activation_bytes + outside)


@contextlib.contextmanager
def plain_torch():
    """Plain torch on torch's own memory, off the simulated device: the
    reference runs, which would otherwise share the budget with the model
    under test (docs/torch-bridge.md, "Sim mode is a faithful GPU")."""
    with spillway._C._HostWork():
        yield


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
