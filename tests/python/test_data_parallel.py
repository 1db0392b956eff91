"""Data parallel from Python (docs/data-parallel.md): an unchanged training
loop, torch.distributed initialized with Gloo, spillway.manage(model) using
its default group. Each rank runs data_parallel_rank.py in a process of its
own; the test compares them with plain torch computing the same mean
gradient (each rank's micro-batch on its own, summed in rank order, divided
by the world size), bit for bit, parameters and optimizer state alike, and
checks that each parameter's state lives on one rank only.

Clipping and loss scaling (Note [Python clipping and loss scaling across
ranks]): torch.nn.utils.clip_grad_norm_ in the loop returns, on every rank,
the norm torch computes on the mean gradient, bit for bit; a GradScaler
whose step overflows on one rank skips that step on every rank."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import data_parallel_rank as ranked

HERE = os.path.dirname(os.path.abspath(__file__))


def run_ranks(world, folder, kind):
    processes = [subprocess.Popen(
        [sys.executable, os.path.join(HERE, "data_parallel_rank.py"), str(rank), str(world),
         str(folder), kind], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(world)]
    try:
        outputs = [process.communicate(timeout=240)[0] for process in processes]
    finally:  # a rank that hangs (a timeout) must not outlive the test
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for rank, (process, output) in enumerate(zip(processes, outputs)):
        assert process.returncode == 0, f"rank {rank} failed:\n{output}"
    return [torch.load(folder / f"rank{rank}.pt") for rank in range(world)]


def oracle(world, kind):
    """Plain torch on the mean gradient. Under "amp" the loss scale is a
    power of two, so scaled gradients unscale to the same bits, and the
    overflowing step is skipped."""
    torch.set_num_threads(1)
    model = ranked.make_model()
    params = list(model.parameters())
    optimizer = ranked.make_optimizer(kind, params)
    norms = []
    for step in range(ranked.STEPS):
        sums = [None] * len(params)
        for rank in range(world):
            optimizer.zero_grad()
            x, y = ranked.batch(step, rank)
            F.mse_loss(model(x), y).backward()
            for i, param in enumerate(params):
                sums[i] = param.grad.clone() if rank == 0 else sums[i].add_(param.grad)
        for param, total in zip(params, sums):
            param.grad = total.div_(world)
        if kind == "clip":
            norms.append(torch.nn.utils.clip_grad_norm_(params, ranked.CLIP_NORM))
        if kind == "amp" and step == ranked.OVERFLOW_STEP:
            continue
        optimizer.step()
    return ([p.detach().clone() for p in params], [ranked.state_of(optimizer, p) for p in params],
            norms)


@pytest.mark.parametrize("world,kind", [(2, "adam"), (3, "sgd"), (3, "clip"), (2, "amp")])
def test_ranks_match_plain_torch_bit_for_bit(tmp_path, world, kind):
    results = run_ranks(world, tmp_path, kind)
    expected_params, expected_states, expected_norms = oracle(world, kind)
    # What the ranks sent, they received; each step's reduction and
    # gathering move at least (N-1)/N of the gradients and of the parameters.
    traffic = [result["traffic"] for result in results]
    assert sum(t["bytes_sent"] for t in traffic) == sum(t["bytes_received"] for t in traffic)
    if kind != "amp":  # a skipped step gathers nothing
        model_bytes = sum(p.numel() * p.element_size() for p in ranked.make_model().parameters())
        least = ranked.STEPS * 2 * model_bytes * (world - 1) // world
        for rank, moved in enumerate(traffic):
            assert moved["bytes_sent"] >= least and moved["bytes_received"] >= least, (rank, moved)
    if kind == "clip":
        assert any(norm > ranked.CLIP_NORM for norm in expected_norms), "nothing was clipped"
        for rank, result in enumerate(results):
            assert [n.item() for n in result["norms"]] == [n.item() for n in expected_norms], \
                f"rank {rank} clipped by another norm"
    if kind == "amp":
        for rank, result in enumerate(results):
            expected_finite = [not ranked.overflows(kind, step, rank, world)
                               for step in range(ranked.STEPS)]
            assert result["finite"] == expected_finite, f"rank {rank}"
            assert result["scales"] == results[0]["scales"], f"rank {rank}'s loss scale"
        scales = results[0]["scales"]
        assert scales[ranked.OVERFLOW_STEP] < scales[0], "the overflow did not lower the scale"
    for i, (expected, state) in enumerate(zip(expected_params, expected_states)):
        for rank, result in enumerate(results):
            assert torch.equal(result["params"][i], expected), f"rank {rank}, parameter {i}"
        holders = [rank for rank, result in enumerate(results) if result["states"][i]]
        assert len(holders) == 1, f"parameter {i}: optimizer state on ranks {holders}"
        held = results[holders[0]]["states"][i]
        assert len(held) == len(state)
        for mine, theirs in zip(held, state):
            assert torch.equal(mine, theirs), f"parameter {i}, state on rank {holders[0]}"
