"""Checkpoints of managed tensors: state_dict() and pickling hand out true values.

Note [Checkpoints of managed modules]: torch.save writes a CPU tensor's bytes
straight from its storage, with no op for the hooks to acquire the chunk in.
On the simulated device a managed parameter is a CPU tensor, and one whose
chunk is evicted points, under strict_residency, at inaccessible memory
(elsewhere at bytes that may be stale): torch.save would fault or save the
wrong values. So the first manage() patches two of torch's functions, once
for the process:
- Module.state_dict: the outermost call replaces the managed CPU parameters
  and buffers in the state dict with copies made through an op (clone
  acquires the chunk, wherever it is), in torch's own host memory, off the
  device budget. A state dict then holds values that anything may read raw
  (numpy, safetensors). keep_vars=True hands out the tensors themselves, as
  torch does.
- Tensor._reduce_ex_internal, which pickles a tensor: a managed CPU tensor is
  pickled as such a copy. That covers torch.save(model), of the whole module,
  and torch.save of a parameter. Two tensors that share one managed storage
  pickle as two copies: loaded, they no longer share it.
Nothing is added to the modules themselves, so a pickled module carries no
reference to spillway and loads where spillway is not installed. CUDA tensors
need none of this: torch.save copies a CUDA storage to the host with an op
first. load_state_dict writes through copy_, an op, as it is.
"""

import functools
import threading

import torch

from . import _C

_installed = False
_install_lock = threading.Lock()
_calls = threading.local()  # depth: state_dict calls under way on this thread


def _is_managed_on_host(value):
    return (isinstance(value, torch.Tensor) and value.device.type == "cpu"
            and _C._is_managed(value))


def _copy_of(tensor):
    with _C._HostWork():  # torch's own memory, off the device budget
        return tensor.detach().clone(memory_format=torch.preserve_format)


def _keeps_vars(args, kwargs):
    # state_dict(destination, prefix, keep_vars): torch still takes them positionally.
    return bool(kwargs.get("keep_vars", args[2] if len(args) > 2 else False))


def install():
    """Note [Checkpoints of managed modules]: patches torch once per process."""
    global _installed
    with _install_lock:  # no caller goes on before the patches are in
        if not _installed:
            _patch_torch()
            _installed = True


def _patch_torch():
    state_dict = torch.nn.Module.state_dict
    reduce_ex_internal = torch.Tensor._reduce_ex_internal

    @functools.wraps(state_dict)
    def state_dict_of_true_values(self, *args, **kwargs):
        depth = getattr(_calls, "depth", 0)
        _calls.depth = depth + 1
        try:
            result = state_dict(self, *args, **kwargs)
        finally:
            _calls.depth = depth
        if depth == 0 and not _keeps_vars(args, kwargs):
            for key, value in result.items():
                if _is_managed_on_host(value):
                    result[key] = _copy_of(value)
        return result

    @functools.wraps(reduce_ex_internal)
    def reduce_a_copy(self, proto):
        if not _is_managed_on_host(self):
            return reduce_ex_internal(self, proto)
        copy = _copy_of(self)
        if self.requires_grad and self.is_leaf:
            copy.requires_grad_(True)
        return reduce_ex_internal(copy, proto)

    torch.nn.Module.state_dict = state_dict_of_true_values
    torch.Tensor._reduce_ex_internal = reduce_a_copy
