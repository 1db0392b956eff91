"""spillway.optim: Adam, AdamW and SGD with their state in spillway's chunks.

Built like torch.optim's, from parameters or parameter groups (never from a
model), with torch's signatures. Each optimizer is a chunk-manager client of
its own: its state (exp_avg, exp_avg_sq, momentum_buffer) and, for bf16/fp16
parameters, an fp32 master copy live in chunks and move and spill like the
parameters. step() updates each parameter where its chunk is: the SIMD CPU
kernel for host-resident chunks, the device for resident ones. Parameters not
yet managed are managed when the optimizer is built.

Changes to a group's options (a learning-rate scheduler's, say) apply at the
next step. state_dict() has torch's layout ({"state": {index: {"step",
"exp_avg", "exp_avg_sq"} or {"momentum_buffer"}}, "param_groups": [...]}, plus
"master" for low-precision parameters), so it loads into torch.optim's
optimizers and theirs into these. `self.state` stays empty: the state is in
chunks, not in Python tensors.
"""

import torch

from . import _C

__all__ = ["Adam", "AdamW", "SGD"]


class _ChunkedOptimizer(torch.optim.Optimizer):
    """What Adam, AdamW and SGD share: the C++ optimizer and torch's protocol."""

    _kind = ""
    _unsupported = {}  # option -> the value spillway supports

    def __init__(self, params, defaults):
        self._impl = None
        super().__init__(params, defaults)
        self._impl = _C.make_optimizer(
            self._kind, [(group["params"], self._options(group)) for group in self.param_groups])

    # The options the C++ optimizer reads, checked.
    def _options(self, group):
        for option, supported in self._unsupported.items():
            if group.get(option, supported) not in (supported, None):
                raise ValueError(f"spillway.optim.{self._kind}: {option}={group[option]!r} "
                                 f"is not supported (only {supported!r})")
        return {key: group[key] for key in self._option_keys}

    def _slot_names(self, group):
        raise NotImplementedError

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if self._impl is not None:
            group = self.param_groups[-1]
            self._impl.add_param_group(self._kind, group["params"], self._options(group))

    def _push_group_options(self):
        """param_groups' options (changed by a scheduler, say) reach the C++ optimizer."""
        for index, group in enumerate(self.param_groups):
            self._impl.set_group_options(index, self._options(group))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._push_group_options()
        self._impl.step()
        return loss

    @property
    def client_name(self):
        """The chunk-manager client holding the state, e.g. "adam#0"."""
        return self._impl.client_name

    def state_dict(self):
        indices = {}
        packed_groups = []
        for group in self.param_groups:
            packed = {key: value for key, value in group.items() if key != "params"}
            packed["params"] = [indices.setdefault(id(p), len(indices)) for p in group["params"]]
            packed_groups.append(packed)
        state = {}
        for group in self.param_groups:
            names = self._slot_names(group)
            for param in group["params"]:
                held = self._impl.param_state(param)
                if held is None or not held[1]:
                    continue  # torch keeps no state before a parameter's first step
                step, _, slots, master = held
                entry = self._entry(step, dict(zip(names, (_shaped(v, param) for v in slots))))
                if master is not None:
                    entry["master"] = _shaped(master, param)
                state[indices[id(param)]] = entry
        return {"state": state, "param_groups": packed_groups}

    def _entry(self, step, slots):
        return {"step": torch.tensor(float(step)), **slots}

    def load_state_dict(self, state_dict):
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"spillway.optim.{self._kind}: the state dict has "
                             f"{len(saved_groups)} parameter groups, the optimizer "
                             f"{len(self.param_groups)}")
        by_index = {}
        for number, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"spillway.optim.{self._kind}: parameter group {number} has "
                                 f"{len(saved['params'])} parameters in the state dict, "
                                 f"{len(group['params'])} in the optimizer")
            by_index.update(zip(saved["params"], ((p, group) for p in group["params"])))
        for saved, group in zip(saved_groups, self.param_groups):
            group.update({key: value for key, value in saved.items() if key != "params"})
        self._push_group_options()
        for index, entry in state_dict["state"].items():
            if index not in by_index:
                raise ValueError(f"spillway.optim.{self._kind}: the state dict has state for "
                                 f"parameter {index}, which no group holds")
            param, group = by_index[index]
            names = self._slot_names(group)
            slots = [entry[name] for name in names if entry.get(name) is not None]
            # SGD's momentum_buffer None: the next step starts the buffer afresh.
            started = len(slots) == len(names)
            step = entry.get("step", 0)
            master = entry.get("master")
            self._impl.set_param_state(
                param, int(step.item() if torch.is_tensor(step) else step), started,
                [_flat(values, param) for values in slots],
                None if master is None else _flat(master, param))


def _dense(param):
    """Whether the parameter's elements fill its memory without gaps or
    overlaps in some order of its dimensions (contiguous, channels_last, a
    transpose): then its state lies in chunks in that same memory order, and
    its strides map the flat state to its shape (for a contiguous one, as a
    view would)."""
    expected = 1
    for size, stride in sorted(zip(param.shape, param.stride()), key=lambda d: d[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _shaped(values, param):
    """A state slot (flat, in the parameter's memory order) with the
    parameter's shape and strides, as torch's optimizers keep it."""
    if values.numel() != param.numel():
        return values
    if _dense(param):
        return values.as_strided(param.shape, param.stride())
    return values.view(param.shape)


def _flat(values, param):
    """A state slot from a state dict, flat in the parameter's memory order."""
    values = values.detach().to("cpu", torch.float32)
    if values.shape != param.shape or not _dense(param):
        return values.reshape(-1).contiguous()
    flat = torch.empty(values.numel(), dtype=torch.float32)
    flat.as_strided(param.shape, param.stride()).copy_(values)
    return flat


def _check_common(lr, eps=0.0, weight_decay=0.0):
    if lr < 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if eps < 0.0:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if weight_decay < 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


class Adam(_ChunkedOptimizer):
    """torch.optim.Adam's signature; amsgrad, maximize, capturable,
    differentiable and fused are not supported (ValueError)."""

    _kind = "Adam"
    _option_keys = ("lr", "betas", "eps", "weight_decay")
    _unsupported = {"amsgrad": False, "maximize": False, "capturable": False,
                    "differentiable": False, "fused": False}

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None):
        _check_common(lr, eps, weight_decay)
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Invalid beta parameters: {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      foreach=foreach, maximize=maximize, capturable=capturable,
                                      differentiable=differentiable, fused=fused))

    def _slot_names(self, group):
        return ("exp_avg", "exp_avg_sq")


class AdamW(Adam):
    """torch.optim.AdamW's signature (decoupled weight decay, default 1e-2)."""

    _kind = "AdamW"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, **kwargs):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, **kwargs)


class SGD(_ChunkedOptimizer):
    """torch.optim.SGD's signature: momentum, dampening, nesterov, weight decay;
    maximize and differentiable are not supported (ValueError)."""

    _kind = "SGD"
    _option_keys = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
    _unsupported = {"maximize": False, "differentiable": False}

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 *, maximize=False, foreach=None, differentiable=False):
        _check_common(lr, 0.0, weight_decay)
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize, foreach=foreach,
                                      differentiable=differentiable))

    def _slot_names(self, group):
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _entry(self, step, slots):
        return {"momentum_buffer": slots.get("momentum_buffer"), "step": step}
