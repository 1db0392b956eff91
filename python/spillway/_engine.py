"""spillway.initialize: a DeepSpeed-style training engine for a torch.nn.Module.

    engine = spillway.initialize(model, {
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
        "bf16": {"enabled": True}, "gradient_clipping": 1.0,
        "gradient_accumulation_steps": 4,
        "spillway": {"device_budget": "6GiB"}})
    for x, y in batches:
        loss = loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()       # steps the optimizer on every 4th call

The configuration is checked as a whole before the model is touched; errors
(ValueError) name the key. The C++ engine (hooks/torch/engine.h) does the
work: loss scaling, gradient accumulation and clipping, spillway's optimizer
with its state and fp32 master copies in chunks.
"""

import json
import os

import torch

from . import _C


class Engine:
    """What initialize() returns: forward (or call), backward(loss), step()."""

    def __init__(self, module, core):
        self.module = module
        self._core = core

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    __call__ = forward

    def backward(self, loss):
        """Backward of the loss, scaled for fp16 and gradient accumulation."""
        self._core.backward(loss)

    def step(self):
        """Ends a micro-batch; at an accumulation boundary steps the optimizer
        (or skips the step on an fp16 overflow) and zeroes the gradients.
        Returns whether the optimizer stepped."""
        return self._core.step()

    def is_gradient_accumulation_boundary(self):
        return self._core.is_gradient_accumulation_boundary()

    @property
    def loss_scale(self):
        return self._core.loss_scale

    @property
    def global_steps(self):
        return self._core.global_steps

    @property
    def skipped_steps(self):
        return self._core.skipped_steps

    @property
    def micro_steps(self):
        return self._core.micro_steps

    @property
    def last_gradient_norm(self):
        """Global norm of the last boundary's gradients (unscaled, before clipping)."""
        return self._core.last_gradient_norm


def _config_text(config):
    if isinstance(config, dict):
        return json.dumps(config)
    if isinstance(config, (str, os.PathLike)):
        text = os.fspath(config)
        if text.lstrip().startswith("{"):
            return text
        with open(text, encoding="utf-8") as file:  # a path to a JSON file
            return file.read()
    raise TypeError("spillway.initialize: config must be a dict, JSON text or a path to a JSON "
                    f"file, not {type(config).__name__}")


def initialize(model, config):
    """Builds an Engine for `model` from a DeepSpeed-style configuration: a
    dict, JSON text, or a path to a JSON file. Keys: optimizer {type, params},
    fp16 {...}, bf16 {enabled}, gradient_clipping, gradient_accumulation_steps,
    and a spillway {...} block with SPILLWAY_CONF's keys. Unknown keys are
    errors that name them."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"spillway.initialize: model must be a torch.nn.Module, "
                        f"not {type(model).__name__}")
    text = _config_text(config)
    dtype = getattr(torch, _C.engine_compute_dtype(text))  # checks the whole configuration
    if dtype != torch.float32:
        model.to(dtype)
    return Engine(model, _C.EngineCore(list(model.named_parameters()), text))
