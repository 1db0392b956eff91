"""Gradient clipping and loss scaling across data parallel ranks.

Note [Python clipping and loss scaling across ranks]: under data parallel training (Note [Data parallel over chunk groups] in
hooks/torch/data_parallel.cc) an unchanged loop clips and scales gradients
between backward and the optimizer's step, before the optimizer's pre-hook
would reduce them. Each rank would then look at its own micro-batch's
gradients: torch.nn.utils.clip_grad_norm_ would take a different norm on
each rank, and torch.amp.GradScaler would find an overflow on one rank only,
skip the step there and step on the others, after which the ranks no
longer run the same collectives. So while a process group is set:

- clip_grad_norm_ reduces the gradients first (the optimizer's pre-hook then
  reduces nothing more: Note [A reduction reduces what backward wrote since
  the last]), takes each held gradient's norm as torch does, makes the list
  of norms whole on every rank (Note [Per-parameter figures summed over
  owners]) and combines it as torch's _get_total_norm does, in torch's order.
  The norm is therefore bit for bit the one torch computes in one process
  holding the mean gradients, and every rank clips by it.
- GradScaler's _unscale_grads_ (behind unscale_, step, and the fused
  optimizers' check) reduces the gradients first, then asks every rank
  whether any found an inf or NaN, so that all skip the step or none does,
  and the loss scale stays the same everywhere.

The patches are installed when spillway is imported, and fall through to
torch's own functions without a process group. A loop that imported
clip_grad_norm_ by name before importing spillway keeps torch's.
"""

import torch
from torch.utils._foreach_utils import (_device_has_foreach_support,
                                        _group_tensors_by_device_and_dtype,
                                        _has_foreach_support)

from . import _C

_torch_clip_grad_norm_ = torch.nn.utils.clip_grad.clip_grad_norm_
_torch_unscale_grads_ = torch.amp.GradScaler._unscale_grads_


def _data_parallel():
    return _C.data_parallel_world_size() > 1


def reduce_optimizer_gradients(optimizer):
    """Reduces the gradients of the models that hold the optimizer's
    parameters (once per backward: Note [A reduction reduces what backward
    wrote since the last]); nothing without a group of two or more."""
    if _data_parallel():
        _C.reduce_gradients([p for group in optimizer.param_groups for p in group["params"]])


def _each_norm(grads, norm_type, foreach):
    """Each gradient's norm, computed as torch's _get_total_norm computes it."""
    norms = [None] * len(grads)
    if not grads:  # a rank that owns no gradient
        return norms
    grouped = _group_tensors_by_device_and_dtype([grads], with_indices=True)
    for (device, _), ([device_grads], indices) in grouped.items():
        if (foreach is None and _has_foreach_support(device_grads, device)) or (
                foreach and _device_has_foreach_support(device)):
            group_norms = torch._foreach_norm(device_grads, norm_type)
        elif foreach:
            raise RuntimeError(
                f"foreach=True was passed, but can't use the foreach API on {device.type} tensors")
        else:
            group_norms = [torch.linalg.vector_norm(g, norm_type) for g in device_grads]
        for index, norm in zip(indices, group_norms):
            norms[index] = norm
    return norms


def _total_norm(params, norms, norm_type):
    """torch's combination of per-gradient norms: grouped by device and dtype
    in torch's order, stacked on the first gradient's device."""
    present = [i for i, norm in enumerate(norms) if norm is not None]
    if not present:
        return torch.tensor(0.0)
    # Stand-ins with each gradient's device and dtype give torch's grouping order.
    stand_ins = [torch.empty(0, dtype=params[i].dtype, device=params[i].device) for i in present]
    grouped = _group_tensors_by_device_and_dtype([stand_ins], with_indices=True)
    first_device = params[present[0]].device
    ordered = []
    for (device, dtype), (_, indices) in grouped.items():
        ordered.extend(torch.tensor(norms[present[k]], dtype=dtype, device=device)
                       for k in indices)
    return torch.linalg.vector_norm(
        torch.stack([norm.to(first_device) for norm in ordered]), norm_type)


def _clip_by(params, max_norm, total_norm, foreach):
    clip_with_norm = getattr(torch.nn.utils, "clip_grads_with_norm_", None)
    if clip_with_norm is not None:
        clip_with_norm(params, max_norm, total_norm, foreach)
        return
    factor = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)  # torch before 2.6
    for param in params:
        if param.grad is not None:
            param.grad.mul_(factor.to(param.grad.device))


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """torch.nn.utils.clip_grad_norm_, by the norm of the mean gradient across
    data parallel ranks (Note [Python clipping and loss scaling across
    ranks]); torch's own without a process group."""
    if not _data_parallel():
        return _torch_clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite,
                                      foreach)
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    norm_type = float(norm_type)
    with torch.no_grad():
        _C.reduce_gradients(params)
        held = [i for i, p in enumerate(params) if p.grad is not None]
        mine = [None] * len(params)
        for i, norm in zip(held, _each_norm([params[i].grad for i in held], norm_type, foreach)):
            mine[i] = norm.item()
        norms = _C.owned_figures_everywhere(mine, "gradient norms")
        total_norm = _total_norm(params, norms, norm_type)
        if error_if_nonfinite and torch.logical_or(total_norm.isnan(), total_norm.isinf()):
            raise RuntimeError(
                f"The total norm of order {norm_type} for gradients from `parameters` is "
                "non-finite, so it cannot be clipped. To disable this error and scale the "
                "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
        _clip_by(params, max_norm, total_norm, foreach)
    return total_norm


def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
    """GradScaler's check and unscaling of the optimizer's gradients, on the
    reduced gradients, with every rank told whether any found an overflow
    (Note [Python clipping and loss scaling across ranks])."""
    if not _data_parallel():
        return _torch_unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16)
    reduce_optimizer_gradients(optimizer)
    per_device = _torch_unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16)
    here = any(flag.item() > 0 for flag in per_device.values())
    anywhere = 1.0 if _C.on_any_rank(here, "a gradient overflowed") else 0.0
    if anywhere:
        # Every rank skips the optimizer's step, so none reaches the step()
        # that ends the owners' uses the reduction began (Note [Uses only
        # the owner makes], hooks/torch/sharded_params.cc): end them here,
        # before an eval under no_grad would use a dropped parameter.
        _C._close_owner_step()
    for flag in per_device.values():
        flag.fill_(anywhere)
    if not per_device:  # this rank holds none of the optimizer's gradients
        per_device[found_inf.device] = torch.full((), anywhere, dtype=torch.float32,
                                                  device=found_inf.device)
    return per_device


def install():
    """Puts the data parallel versions in torch's place (idempotent)."""
    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
    torch.nn.utils.clip_grad.clip_grad_norm_ = clip_grad_norm_
    torch.amp.GradScaler._unscale_grads_ = _unscale_grads_
