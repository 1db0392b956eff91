"""One training run under a given eviction policy, for test_planned.py.

    python3 policy_run.py POLICY MODEL STEPS

Enables spillway with SPILLING_CONF and policy:POLICY, trains MODEL ("mlp",
or "branchy": a layer used only on some steps, a data-dependent branch)
once as plain torch (nothing managed) and once managed, with torch.optim.Adam,
and prints one JSON line: whether losses and parameters were bit-identical,
the bytes moved by the managed run, and the policy's report.
"""

import copy
import json
import sys

import torch

import spillway
from spillway_testing import (SPILLING_CONF, WIDTH, make_mlp, mlp_batches, parameters_copy,
                              plain_torch, train_step, use_budget_for)


class Branchy(torch.nn.Module):
    """An MLP with a detour layer that only batches with a positive mean take."""

    def __init__(self, seed):
        super().__init__()
        self.trunk = make_mlp(seed)
        torch.manual_seed(seed + 1)
        self.detour = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        h = x
        for index, layer in enumerate(self.trunk):
            h = layer(h)
            if index == 1 and x.mean() > 0:
                h = torch.tanh(self.detour(h))
        return h


def train(model, batches):
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    return [train_step(model, adam, batch) for batch in batches]


def main():
    policy, kind, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    spillway.enable(SPILLING_CONF.replace("policy:lru", f"policy:{policy}"))
    model = make_mlp(seed=3) if kind == "mlp" else Branchy(seed=3)
    batches = mlp_batches(4, steps)
    if kind == "branchy":
        # The detour on steps 0, 4 and 7 only. Step 0 too: a managed
        # parameter's gradient exists from manage() on, so one that no step
        # has reached yet would count Adam steps that torch does not
        # (docs/torch-bridge.md, "Limits").
        for step, (x, _) in enumerate(batches):
            x.copy_(x.abs() if step in (0, 4, 7) else -x.abs())
    with plain_torch():
        plain = copy.deepcopy(model)
        plain_losses = train(plain, batches)
        plain_params = parameters_copy(plain)

    use_budget_for((model, 2))  # Adam's state
    spillway.manage(model)
    before = spillway.memory_stats()
    losses = train(model, batches)
    after = spillway.memory_stats()
    identical = (all(torch.equal(a, b) for a, b in zip(plain_losses, losses))
                 and all(torch.equal(a, b)
                         for a, b in zip(plain_params, parameters_copy(model))))
    print(json.dumps({
        "identical": identical,
        "h2d": after["bytes_moved.h2d"] - before["bytes_moved.h2d"],
        "d2h": after["bytes_moved.d2h"] - before["bytes_moved.d2h"],
        "evictions": after["evictions"] - before["evictions"],
        "policy": after["policy"],
    }))


if __name__ == "__main__":
    main()
