"""Checkpoints of managed modules: state_dict() hands out true values.

Note [Checkpoints of managed modules]: torch.save writes a CPU tensor's bytes straight from its storage, with no op
for the hooks to acquire the chunk in. On the simulated device a managed
parameter is a CPU tensor, and one whose chunk is evicted points, under
strict_residency, at inaccessible memory (elsewhere at bytes that may be
stale): torch.save(model.state_dict()) would fault or save the wrong values.
So manage(module) puts a state-dict post hook on the module and each of its
submodules, which replaces the module's own managed CPU parameters and
buffers in the state dict with copies made through an op (clone acquires the
chunk, wherever it is), in torch's own host memory, off the device budget.
A state_dict(keep_vars=True) entry is the Parameter itself and stays so.
CUDA tensors need no copy: torch.save copies a CUDA storage to the host with
an op first. load_state_dict writes through copy_, an op, as it is.
"""

import torch

from . import _C

_HANDLES = {}  # id(module) -> the hook handles of it and its submodules


def _copy_own_managed_values(module, state_dict, prefix, local_metadata):
    del local_metadata
    names = [name for name, value in module._parameters.items() if value is not None]
    names += [name for name, value in module._buffers.items()
              if value is not None and name not in module._non_persistent_buffers_set]
    with _C._HostWork():  # torch's own memory, off the device budget
        for name in names:
            value = state_dict.get(prefix + name)
            if (isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter)
                    and value.device.type == "cpu" and _C._is_managed(value)):
                state_dict[prefix + name] = value.clone()


def hook(module):
    """Note [Checkpoints of managed modules]: installs the hooks once per module."""
    if id(module) in _HANDLES:
        return
    _HANDLES[id(module)] = [sub.register_state_dict_post_hook(_copy_own_managed_values)
                            for sub in module.modules()]


def unhook(module):
    for handle in _HANDLES.pop(id(module), []):
        handle.remove()
