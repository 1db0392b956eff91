"""One rank of test_data_parallel.py: an unchanged torch training loop,
with torch.distributed initialized (Gloo, a file store) and the model
managed, so that spillway trains it data parallel.

    python data_parallel_rank.py RANK WORLD FOLDER KIND [CHECKPOINT]

KIND: "adam" or "sgd"; "clip" (Adam, gradients clipped to CLIP_NORM by
torch.nn.utils.clip_grad_norm_); "amp" (SGD under torch.amp.GradScaler,
whose step OVERFLOW_STEP overflows on the last rank only); "amp_eval" (the
same on a model of 20 hidden layers, more chunk groups than sharded
parameters keep gathered, with an eval under no_grad after every step,
the skipped one included); "save" (Adam,
then spillway.save_checkpoint to CHECKPOINT); "resume" (Adam from
spillway.load_checkpoint of CHECKPOINT, steps STEPS to 2 STEPS - 1; a world
of 1 runs without torch.distributed); "accumulate" (SGD, MICRO_BATCHES
micro-batches per step, all but the last inside spillway.no_sync());
"unsynced" (two micro-batches' backwards without it, saving the error);
"checkpointed" (Adam, a deeper model whose hidden layers each recompute
under reentrant activation checkpointing; its chunk groups span them);
"deep" (the same model and steps without checkpointing);
"unreached" (the last rank's loss does not depend on the model, so its
backward reaches no managed model; saves what the optimizer step raised);
"shared" (each rank owns a parameter used both inside and outside a
reentrant checkpoint, so one backward writes its gradient twice; saves the
error);
"unfrozen" (the first layer frozen when manage() takes the model and
unfrozen after it, then trained as "adam").
"""

import os
import sys

import torch
import torch.nn.functional as F

STEPS = 3
BATCH = 8
INPUTS = 256
WIDTH = 512
OUTPUTS = 16
CLIP_NORM = 0.05
OVERFLOW_STEP = 1
MICRO_BATCHES = 2


def hidden_layers(kind):
    if kind == "amp_eval":
        return 20
    return 5 if kind in ("checkpointed", "deep") else 2


def scaled(kind):
    """Whether the kind trains under a GradScaler."""
    return kind in ("amp", "amp_eval")


def make_model(kind="adam"):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(INPUTS, WIDTH), torch.nn.ReLU()]
    for _ in range(hidden_layers(kind)):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, OUTPUTS))


def make_optimizer(kind, params):
    if kind in ("adam", "clip", "save", "resume", "checkpointed", "deep", "unfrozen"):
        return torch.optim.Adam(params, lr=1e-3)
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def forward(kind, model, x):
    """The model's output; under "checkpointed" each hidden Linear+ReLU pair
    recomputes in a backward of its own (use_reentrant=True), nested in the
    outer one, which reaches the first and the last layer."""
    if kind != "checkpointed":
        return model(x)
    from torch.utils.checkpoint import checkpoint
    x = model[1](model[0](x))
    for first in range(2, 2 + 2 * hidden_layers(kind), 2):
        x = checkpoint(model[first:first + 2], x, use_reentrant=True)
    return model[-1](x)


def micro_batches(kind):
    return MICRO_BATCHES if kind == "accumulate" else 1


def batch(step, rank, micro=0):
    generator = torch.Generator().manual_seed(1000 * step + 100 * micro + rank)
    return (torch.randn(BATCH, INPUTS, generator=generator),
            torch.randn(BATCH, OUTPUTS, generator=generator))


def overflows(kind, step, rank, world):
    return scaled(kind) and step == OVERFLOW_STEP and rank == world - 1


def state_of(optimizer, param):
    """The parameter's optimizer state as a list of tensors; [] when none."""
    state = optimizer.state.get(param, {})
    return [state[key].clone() for key in sorted(state) if torch.is_tensor(state[key])]


def accumulate_without_no_sync(model, rank, folder):
    """Two micro-batches' backwards, neither inside spillway.no_sync(): the
    second adds to gradients the first reduced. Saves what it raised."""
    message = "did not raise"
    try:
        for micro in range(MICRO_BATCHES):
            x, y = batch(0, rank, micro)
            F.mse_loss(model(x), y).backward()
    except RuntimeError as error:
        message = str(error)
    torch.save({"error": message}, f"{folder}/rank{rank}.pt")


class UsedInsideAndOutside(torch.nn.Module):
    """Two parameters of 1.5 MiB, so one chunk each: rank r owns the r-th."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(384, 1024))
        self.b = torch.nn.Parameter(torch.randn(384, 1024))

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        inside = checkpoint(lambda t: t * self.a + self.b, x, use_reentrant=True)
        return inside * self.a + self.b


def written_twice(rank, folder):
    """One backward that writes each gradient outside the checkpoint, then,
    while the group's reduction is in flight, inside it. Saves what it
    raised."""
    import spillway
    model = UsedInsideAndOutside()
    spillway.manage(model)
    message = "did not raise"
    try:
        model(torch.ones(384, 1024, requires_grad=True)).sum().backward()
    except RuntimeError as error:
        message = str(error)
    torch.save({"error": message}, f"{folder}/rank{rank}.pt")


def step_without_reaching(model, rank, world, folder):
    """One step in which the last rank's backward reaches no managed model
    (Note [What each rank is reducing for]). Saves what was raised."""
    optimizer = make_optimizer("adam", model.parameters())
    x, y = batch(0, rank)
    message = "did not raise"
    try:
        if rank == world - 1:
            x.requires_grad_(True)
            (x * 2).sum().backward()
        else:
            F.mse_loss(model(x), y).backward()
        optimizer.step()
    except RuntimeError as error:
        message = str(error)
    torch.save({"error": message}, f"{folder}/rank{rank}.pt")


def main():
    rank, world, folder, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    checkpoint = sys.argv[5] if len(sys.argv) > 5 else None
    torch.set_num_threads(1)
    import torch.distributed as dist
    import spillway

    # SPILLWAY_TEST_CONF adds to it: dist_params:sharded, say.
    spillway.enable("device:sim,strict_residency:true,chunk_size:2MiB,sim_capacity:256MiB"
                    + os.environ.get("SPILLWAY_TEST_CONF", ""))
    distributed = not (kind == "resume" and world == 1)
    if distributed:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                                world_size=world)
    if kind == "shared":
        written_twice(rank, folder)
        dist.destroy_process_group()
        return
    model = make_model(kind)
    if kind == "unfrozen":
        model[0].requires_grad_(False)
    spillway.manage(model)  # torch.distributed's default group
    if kind == "unfrozen":
        model[0].requires_grad_(True)  # Note [A parameter unfrozen after manage()]
    if kind == "unreached":
        step_without_reaching(model, rank, world, folder)
        dist.destroy_process_group()
        return
    if kind == "unsynced":
        accumulate_without_no_sync(model, rank, folder)
        dist.destroy_process_group()
        return
    optimizer = make_optimizer(kind, model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8) if scaled(kind) else None
    norms, scales, finite, evals = [], [], [], []
    first = 0
    if kind == "resume":
        spillway.load_checkpoint(checkpoint, model, optimizer)
        first = STEPS
    for step in range(first, first + STEPS):
        optimizer.zero_grad()
        for micro in range(micro_batches(kind) - 1):
            with spillway.no_sync():  # only the last backward reduces
                x, y = batch(step, rank, micro)
                F.mse_loss(model(x), y).backward()
        x, y = batch(step, rank, micro_batches(kind) - 1)
        loss = F.mse_loss(forward(kind, model, x), y)
        if scaler is None:
            loss.backward()
        else:
            # The rank's own gradients stay for the overflow below; the
            # scaler's unscale_ reduces them (Note [Python clipping and loss
            # scaling across ranks]).
            with spillway.no_sync():
                scaler.scale(loss).backward()
            if overflows(kind, step, rank, world):
                # One element of the first weight's gradient overflows, on
                # this rank only. Rank 0 owns that weight (the first chunk),
                # so after the reduction the other ranks hold finite
                # gradients alone and must learn of it from rank 0.
                with torch.no_grad():
                    model[0].weight.grad[0, 0] = float("inf")
            finite.append(all(bool(p.grad.isfinite().all()) for p in model.parameters()))
        if kind == "clip":
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM))
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
            scales.append(scaler.get_scale())
        if kind == "amp_eval":
            with torch.no_grad():
                evals.append(F.mse_loss(model(x), y).item())
    if kind == "save":
        spillway.save_checkpoint(checkpoint, model, optimizer)
    assert all(spillway._C._is_managed(p) for p in model.parameters())
    torch.save({"params": [p.detach().clone() for p in model.parameters()],
                "states": [state_of(optimizer, p) for p in model.parameters()],
                "norms": norms, "scales": scales, "finite": finite, "evals": evals,
                "traffic": spillway.data_parallel_traffic()},
               f"{folder}/rank{rank}.pt")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
