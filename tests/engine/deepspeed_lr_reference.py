"""DeepSpeed's own learning-rate schedulers run on lr_schedule_cases.json.

Usage: python deepspeed_lr_reference.py CASES_JSON OUTPUT_JSON
with the python of bench/optim/deepspeed_env.sh (DeepSpeed from PyPI).

For each case it does what DeepSpeed's engine does, on the CPU: builds the
torch optimizer the case names with its lr and betas (or momentum), then the
scheduler as DeepSpeed's _scheduler_from_config does,
getattr(lr_schedules, type)(optimizer, **params). At every step it records
the param group's lr and betas (or momentum), which the optimizer step then
uses, steps the optimizer and calls scheduler.step(), as the engine does after
an applied step. lr_schedule_parity_test.cc compares spillway's LrSchedule
with what this writes.

DeepSpeed's scheduler only asks whether the optimizer has betas (OneCycle
cycles beta1 then); torch's Adam stands for DeepSpeed's Adam and AdamW alike.
"""

import json
import logging
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # no GPU needed, none looked for

import deepspeed  # noqa: E402
import torch  # noqa: E402
from deepspeed.runtime import lr_schedules  # noqa: E402
from deepspeed.utils import logger  # noqa: E402

# The schedulers warn when read "before [they have] started"; expected here.
logger.setLevel(logging.ERROR)


def build_optimizer(spec, parameter):
    kind = spec["type"].lower()
    params = spec.get("params", {})
    lr = params.get("lr", 1e-3)
    if kind == "sgd":
        return torch.optim.SGD([parameter], lr=lr, momentum=params.get("momentum", 0.0))
    if kind in ("adam", "adamw"):
        return torch.optim.Adam([parameter], lr=lr, betas=tuple(params.get("betas", (0.9, 0.999))))
    raise ValueError(f"unknown optimizer type {spec['type']!r}")


def run_case(case, steps):
    config = case["config"]
    parameter = torch.zeros(1, requires_grad=True)
    optimizer = build_optimizer(config["optimizer"], parameter)
    block = config["scheduler"]
    scheduler = getattr(lr_schedules, block["type"])(optimizer, **block["params"])
    group = optimizer.param_groups[0]
    record = {"lr": [], "beta1": [], "beta2": [], "momentum": []}
    for _ in range(steps):
        record["lr"].append(float(group["lr"]))
        if "betas" in group:
            record["beta1"].append(float(group["betas"][0]))
            record["beta2"].append(float(group["betas"][1]))
        else:
            record["momentum"].append(float(group["momentum"]))
        parameter.grad = torch.zeros_like(parameter)
        optimizer.step()
        scheduler.step()
    record["last_batch_iteration"] = scheduler.last_batch_iteration
    return record


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: deepspeed_lr_reference.py CASES_JSON OUTPUT_JSON")
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    steps = cases["steps"]
    results = {case["name"]: run_case(case, steps) for case in cases["cases"]}
    output = {"deepspeed_version": deepspeed.__version__, "steps": steps, "cases": results}
    with open(sys.argv[2], "w") as f:
        json.dump(output, f)  # floats as repr(): they parse back to the same doubles
    print(f"DeepSpeed {deepspeed.__version__}: {len(results)} cases x {steps} steps -> {sys.argv[2]}")


if __name__ == "__main__":
    main()
