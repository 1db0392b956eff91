"""spillway: chunk-based heterogeneous memory for PyTorch.

Parameters, gradients and optimizer state live in fixed-size chunks that move
between the device and pinned host memory under one device budget, so a model
larger than the device trains with PyTorch's results, bit for bit.

    import spillway
    spillway.enable("device_budget:6GiB")   # or set SPILLWAY_CONF
    spillway.manage(model)                   # parameters and gradients into chunks
    optimizer = torch.optim.Adam(model.parameters())   # or spillway.optim.Adam
    ... train as usual ...
    print(spillway.memory_stats()["evictions"])

With SPILLWAY_CONF set and the package installed (tools/install-python.sh),
spillway activates when the interpreter starts (spillway-activate.pth); a bad
SPILLWAY_CONF stops the interpreter there, naming the key. The configuration
syntax and keys: docs/configuration.md. The Python API: docs/python.md.
"""

import json
import os
import warnings

import torch  # first: the extension links against torch's libraries
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)

from . import _C
from . import _auto
from . import _checkpoint
from . import _data_parallel
from . import optim
from ._engine import Engine, initialize
from ._owner_checkpoint import CheckpointError, load_checkpoint, save_checkpoint

__all__ = [
    "enable",
    "is_enabled",
    "use_as_torch_cuda_allocator",
    "manage",
    "unmanage",
    "memory_stats",
    "data_parallel_traffic",
    "no_sync",
    "save_checkpoint",
    "load_checkpoint",
    "CheckpointError",
    "dump_trace",
    "step",
    "optim",
    "initialize",
    "Engine",
]


# Note [Python optimizers mark the step]
# The end of an optimizer's step() is the iteration boundary, so a global
# post-hook of torch.optim marks it (spillway.step(): counts the step,
# re-binds fresh gradients, Note [A budget below the smallest] in
# hooks/torch/manage.cc) and a Python training loop needs no call of its
# own. A hook, not a record-function callback, so that what step() raises
# reaches the script. It does nothing while spillway is not active.
def _mark_step_after_optimizer(optimizer, args, kwargs):
    _C.step()


register_optimizer_step_post_hook(_mark_step_after_optimizer)


# Note [Python optimizers reduce their gradients]
# Data parallel (Note [Data parallel over chunk groups] in
# hooks/torch/data_parallel.cc): before an optimizer's step, a global
# pre-hook reduces the gradients of the models that hold its parameters to
# their owners, so that the step updates what this rank owns and the
# post-hook's spillway.step() spreads the new values. Per optimizer, so two
# models with two optimizers (actor and critic) are each reduced once, after
# their own backward; with gradient accumulation, after the last one. Nothing
# happens without a process group.
def _reduce_before_optimizer(optimizer, args, kwargs):
    _data_parallel.reduce_optimizer_gradients(optimizer)


register_optimizer_step_pre_hook(_reduce_before_optimizer)

# Clipping and GradScaler across ranks (Note [Python clipping and loss
# scaling across ranks] in _data_parallel.py); torch's own without a group.
_data_parallel.install()


def enable(conf=None):
    """Activates spillway in this process.

    ``conf`` is a configuration in SPILLWAY_CONF syntax ("key:value,..."); when
    None, SPILLWAY_CONF (or the defaults) apply. Raises ValueError naming the
    key of a bad configuration, or when spillway is already active with
    another one; RuntimeError when activation fails (no device, say).
    """
    if conf is not None:
        _C.configure(conf)
    _C.activate()


def is_enabled():
    """Whether spillway is active in this process."""
    return _C.is_active()


def use_as_torch_cuda_allocator():
    """Makes spillway torch's CUDA allocator, so that everything torch
    allocates on the GPU shares spillway's device budget with the chunks.

    Activates spillway; needs device:cuda (or device:auto with a usable GPU)
    and must run before torch's first CUDA allocation. Afterwards an
    allocation that does not fit even after spilling chunks raises
    torch.OutOfMemoryError (torch.cuda.OutOfMemoryError) with spillway's
    figures, and torch.cuda.memory_stats(), memory_allocated(),
    max_memory_allocated(), memory_reserved(), reset_peak_memory_stats(),
    empty_cache() and Tensor.record_stream() answer from spillway. With
    SPILLWAY_CONF set this already happened at interpreter start. Raises
    RuntimeError naming the cause otherwise (no GPU, torch already allocated
    CUDA memory, a build without torch's CUDA side).
    """
    _C.use_as_torch_cuda_allocator()


def _named_parameters(module_or_params):
    # A module's buffers (batch norm's running statistics) are managed too.
    if isinstance(module_or_params, torch.nn.Module):
        return list(module_or_params.named_parameters()) + list(module_or_params.named_buffers())
    if isinstance(module_or_params, torch.Tensor):
        module_or_params = [module_or_params]
    named = []
    for index, item in enumerate(module_or_params):
        if isinstance(item, torch.Tensor):
            named.append((f"param{index}", item))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor):
            named.append((str(item[0]), item[1]))
        else:
            raise TypeError(
                "spillway.manage: expected a torch.nn.Module, tensors or (name, tensor) pairs, "
                f"got {type(item).__name__} at position {index}")
    return named


def manage(module_or_params, process_group=None):
    """Moves parameters into spillway's chunks and binds their gradients there.

    Takes a torch.nn.Module (its parameters and buffers), or an iterable of
    tensors or (name, tensor) pairs.
    Each call makes one chunk-manager client (a model), named after the
    module's class ("GPT#0"; "torch#0" for tensors); parameters already
    managed are skipped. Activates spillway if needed. state_dict() and
    torch.save then hold true values whatever is evicted (Note [Checkpoints
    of managed modules] in _checkpoint.py).

    Data parallel (docs/data-parallel.md): with ``process_group``, or else
    with torch.distributed initialized (its default group), the models train
    data parallel across the group's ranks: each rank owns whole chunks,
    backward reduces gradients to their owners as they complete (wrap the
    micro-batches of an accumulation window but the last in
    ``spillway.no_sync()``), and every optimizer step gives every rank the
    owners' new values after. Every rank must then manage the
    same models in the same order; a rank whose layout differs raises
    RuntimeError naming the first parameter that differs.
    """
    client = (type(module_or_params).__name__
              if isinstance(module_or_params, torch.nn.Module) else "torch")
    _manage_as(module_or_params, client, process_group)


def _join_process_group(process_group):
    if process_group is None:
        if _C.data_parallel_world_size() > 1:
            return  # already set
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return
        process_group = dist.distributed_c10d._get_default_group()
    if process_group.size() > 1:
        _C.set_process_group(process_group)


def _manage_as(module_or_params, client, process_group=None):
    named = _named_parameters(module_or_params)
    _checkpoint.install()
    _join_process_group(process_group)  # manage:auto's adoptions too
    _C.manage(named, client)


def unmanage(module_or_params):
    """Moves parameters (and their gradients) and a module's buffers back into
    ordinary storage."""
    _C.unmanage([param for _, param in _named_parameters(module_or_params)])


def memory_stats():
    """Allocator and chunk figures under the contract keys (design section 3),
    plus "clients": each model's and optimizer's chunk figures by name.
    An empty dict while spillway is not active."""
    return json.loads(_C.memory_stats_json())


def data_parallel_traffic():
    """What this process's data parallel collectives moved since it started:
    {"bytes_sent", "bytes_received", "collectives", "parameter_gathers",
    "parameter_gathers_ahead"}, payload bytes by each collective's meaning,
    the chunk groups gathered for the ops that use them under
    dist_params:sharded, and of those the ones issued ahead of their use
    (docs/data-parallel.md); zeros without a group."""
    return _C.data_parallel_traffic()


def no_sync():
    """A context in which backward does not reduce gradients across ranks,
    as torch DDP's no_sync: wrap every micro-batch of an accumulation window
    but the last, whose backward then reduces what they all accumulated
    (Note [Reducing while backward runs] in
    hooks/torch/backward_reduction.cc). Without it, the second micro-batch's
    backward would add to gradients already reduced, and raises. Nothing
    without a process group."""
    return _C._NoSync()


def dump_trace(path):
    """Writes a complete trace file (docs/trace-format.md) of what the `trace`
    option recorded so far; the live trace goes on."""
    _C.dump_trace(os.fspath(path))


def step():
    """The iteration boundary. Python optimizers (torch.optim's and
    spillway.optim's) mark it themselves at the end of each step(); call this
    only in a loop without an optimizer step."""
    _C.step()


def _activate_at_start(conf):
    """What spillway-activate.pth runs (through _spillway_activate) when SPILLWAY_CONF is set."""
    device = _C.checked_device(conf)  # ValueError naming the key
    cuda = (device != "sim" and torch.version.cuda is not None
            and hasattr(torch.cuda.memory, "CUDAPluggableAllocator")
            and torch.cuda.is_available())
    if cuda and _C.has_torch_cuda_allocator:
        use_as_torch_cuda_allocator()
    elif cuda:
        # Note [One runtime per process] (python/bindings/module.cc): torch
        # allocates through this module's C ABI from its first CUDA allocation.
        warnings.warn("spillway: this build has no torch CUDA allocator (see the configure "
                      "output's 'spillway:' lines), so its C ABI serves torch: an allocation "
                      "that does not fit gives torch a null pointer, and torch.cuda.memory_stats "
                      "raises")
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            _C.__file__, "spillway_malloc", "spillway_free")
        torch.cuda.memory.change_current_allocator(allocator)
    elif device == "cuda":
        raise ValueError("device:cuda asks for a GPU, but this torch has no usable CUDA "
                         f"(torch {torch.__version__}); use device:sim or device:auto")
    # Now, not at the first allocation: errors surface at start, and the op
    # hooks mark an unchanged script's optimizer steps.
    _C.activate()
    if _C.checked_option(conf, "manage") == "auto":
        _auto.install(_manage_as)  # Note [Adopting models without being told]
