"""DeepSpeed's side of test_deepspeed.py, run by the interpreter of
bench/optim/deepspeed_env.sh (DeepSpeed 0.18 from PyPI, the project's torch),
on the CPU. It never imports spillway.

    deepspeed_engine_reference.py TASK IN.pt OUT.pt

TASK train: IN holds a plain model (pickled torch.nn modules), its batches,
  the torch optimizer's kind and options, a DeepSpeed scheduler block and a
  gradient_clipping value; trains the model with torch.optim driven by
  DeepSpeed's scheduler class and clipped by DeepSpeed's clip_grad_norm_, in
  DeepSpeed's engine order (clip, optimizer.step, then scheduler.step), and
  writes the final parameters, the lr before every step and the norms.
TASK lrs: IN holds scheduler blocks, an optimizer kind and lr, and a step
  count; writes the lr (and momentum) DeepSpeed's scheduler leaves in the
  param group before each optimizer step.
TASK scaler: IN holds DynamicLossScaler's arguments and an overflow pattern;
  writes the scale before each step and whether the step was skipped.
"""

import os
import socket
import sys

import torch
import torch.nn.functional as F
from deepspeed.runtime import lr_schedules
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler


def torch_optimizer(kind, params, options):
    return getattr(torch.optim, kind)(params, **options)


def scheduler_of(block, optimizer):
    # As DeepSpeed's engine builds it from the config (engine._scheduler_from_config).
    return getattr(lr_schedules, block["type"])(optimizer, **block["params"])


def momentum_of(group):
    return list(group["betas"]) if "betas" in group else [group.get("momentum", 0.0)]


def one_process_group():
    """deepspeed.comm as DeepSpeed's engine has it in a one-process run (its
    loss scaler logs by rank; its clip_grad_norm_ all-reduces the norm)."""
    import deepspeed
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")
    deepspeed.init_distributed(dist_backend="gloo")


def train(spec):
    """DeepSpeed's engine order without ZeRO in fp32: backward, clip with
    DeepSpeed's clip_grad_norm_ when gradient_clipping is set, step, then the
    scheduler."""
    from deepspeed.runtime.utils import clip_grad_norm_
    clipping = spec.get("gradient_clipping", 0.0)
    if clipping > 0:
        one_process_group()
    model = spec["model"]
    optimizer = torch_optimizer(spec["kind"], model.parameters(), spec["options"])
    scheduler = scheduler_of(spec["scheduler"], optimizer)
    lrs, norms = [], []
    for x, y in spec["batches"]:
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        if clipping > 0:
            norms.append(float(clip_grad_norm_(model.parameters(), clipping)))
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return {"params": [p.detach().clone() for p in model.parameters()], "lrs": lrs,
            "norms": norms}


def lrs(spec):
    out = []
    for block in spec["schedulers"]:
        param = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch_optimizer(spec["kind"], [param], spec["options"])
        scheduler = scheduler_of(block, optimizer)
        sequence = []
        for _ in range(spec["steps"]):
            group = optimizer.param_groups[0]
            sequence.append((group["lr"], momentum_of(group)))
            scheduler.step()
        out.append(sequence)
    return {"sequences": out}


def scaler(spec):
    one_process_group()
    scaler = DynamicLossScaler(init_scale=spec["init_scale"], scale_window=spec["scale_window"],
                               min_scale=spec["min_scale"], delayed_shift=spec["delayed_shift"],
                               consecutive_hysteresis=spec["consecutive_hysteresis"],
                               raise_error_at_min_scale=False)
    scales = []
    for overflow in spec["overflows"]:
        scales.append(scaler.cur_scale)
        scaler.update_scale(overflow)
    return {"scales": scales}


def main():
    task, source, target = sys.argv[1:]
    spec = torch.load(source, weights_only=False)  # written by the test itself
    result = {"train": train, "lrs": lrs, "scaler": scaler}[task](spec)
    torch.save(result, target)


if __name__ == "__main__":
    main()
