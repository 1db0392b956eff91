"""Data parallel from Python (docs/data-parallel.md): an unchanged training
loop, torch.distributed initialized with Gloo, spillway.manage(model) using
its default group. Each rank runs data_parallel_rank.py in a process of its
own; backward reduces each chunk group as its gradients complete (Note
[Reducing while backward runs]); the test compares them with plain torch
computing the same mean gradient (each rank's micro-batch on its own, summed in rank order, divided
by the world size), bit for bit, parameters and optimizer state alike, and
checks that each parameter's state lives on one rank only.

Clipping and loss scaling (Note [Python clipping and loss scaling across
ranks]): torch.nn.utils.clip_grad_norm_ in the loop returns, on every rank,
the norm torch computes on the mean gradient, bit for bit; a GradScaler
whose step overflows on one rank skips that step on every rank. Gradient
accumulation: every micro-batch but the last inside spillway.no_sync().
Reentrant activation checkpointing: each segment's backward, nested in the
outer one, reduces the groups it writes whole and defers to the outermost
backward those it writes in part (Note [Deferred to the outermost
backward]); reducing a group twice is exact (Note [A reduction sends what
backward wrote since the last])."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import data_parallel_rank as ranked

HERE = os.path.dirname(os.path.abspath(__file__))


def run_ranks(world, folder, kind, checkpoint=None, conf=""):
    """`conf` is added to the ranks' configuration (",dist_params:sharded")."""
    folder.mkdir(parents=True, exist_ok=True)
    extra = [] if checkpoint is None else [str(checkpoint)]
    environment = dict(os.environ, SPILLWAY_TEST_CONF=conf)
    processes = [subprocess.Popen(
        [sys.executable, os.path.join(HERE, "data_parallel_rank.py"), str(rank), str(world),
         str(folder), kind] + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=environment)
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


def oracle(world, kind, steps=ranked.STEPS, resumed_world=None):
    """Plain torch on the mean gradient, over `world` micro-batches per step,
    then, with `resumed_world`, `steps` more over that many. Under "amp" the
    loss scale is a power of two, so scaled gradients unscale to the same
    bits, and the overflowing step is skipped."""
    torch.set_num_threads(1)
    model = ranked.make_model(kind)
    params = list(model.parameters())
    optimizer = ranked.make_optimizer(kind, params)
    norms = []
    worlds = [world] * steps + ([] if resumed_world is None else [resumed_world] * steps)
    for step, world in enumerate(worlds):
        sums = [None] * len(params)
        for rank in range(world):
            optimizer.zero_grad()
            for micro in range(ranked.micro_batches(kind)):
                x, y = ranked.batch(step, rank, micro)
                F.mse_loss(model(x), y).backward()
            for i, param in enumerate(params):
                sums[i] = param.grad.clone() if rank == 0 else sums[i].add_(param.grad)
        for param, total in zip(params, sums):
            param.grad = total.div_(world)
        if kind == "clip":
            norms.append(torch.nn.utils.clip_grad_norm_(params, ranked.CLIP_NORM))
        if ranked.scaled(kind) and step == ranked.OVERFLOW_STEP:
            continue
        optimizer.step()
    return ([p.detach().clone() for p in params], [ranked.state_of(optimizer, p) for p in params],
            norms)


@pytest.mark.parametrize("world,kind", [(2, "adam"), (3, "sgd"), (3, "clip"), (2, "amp"),
                                        (2, "accumulate"), (2, "checkpointed"),
                                        (3, "checkpointed"), (2, "unfrozen")])
def test_ranks_match_plain_torch_bit_for_bit(tmp_path, world, kind):
    results = run_ranks(world, tmp_path / "ranks", kind)
    expected_params, expected_states, expected_norms = oracle(world, kind)
    # What the ranks sent, they received; each step's reduction and
    # gathering move at least (N-1)/N of the gradients and of the parameters.
    traffic = [result["traffic"] for result in results]
    assert sum(t["bytes_sent"] for t in traffic) == sum(t["bytes_received"] for t in traffic)
    assert all(t["parameter_gathers"] == 0 and t["parameter_gathers_ahead"] == 0 for t in traffic), \
        "replicated: nothing to gather"
    if not ranked.scaled(kind):  # a skipped step gathers nothing
        model_bytes = sum(p.numel() * p.element_size()
                          for p in ranked.make_model(kind).parameters())
        least = ranked.STEPS * 2 * model_bytes * (world - 1) // world
        for rank, moved in enumerate(traffic):
            assert moved["bytes_sent"] >= least and moved["bytes_received"] >= least, (rank, moved)
    if kind == "clip":
        assert any(norm > ranked.CLIP_NORM for norm in expected_norms), "nothing was clipped"
        for rank, result in enumerate(results):
            assert [n.item() for n in result["norms"]] == [n.item() for n in expected_norms], \
                f"rank {rank} clipped by another norm"
    if ranked.scaled(kind):
        for rank, result in enumerate(results):
            expected_finite = [not ranked.overflows(kind, step, rank, world)
                               for step in range(ranked.STEPS)]
            assert result["finite"] == expected_finite, f"rank {rank}"
            assert result["scales"] == results[0]["scales"], f"rank {rank}'s loss scale"
        scales = results[0]["scales"]
        assert scales[ranked.OVERFLOW_STEP] < scales[0], "the overflow did not lower the scale"
    assert_matches(results, expected_params, expected_states)


@pytest.mark.parametrize("world,kind", [(2, "adam"), (3, "sgd"), (3, "clip"), (2, "amp"),
                                        (2, "amp_eval"), (2, "accumulate"),
                                        (2, "checkpointed")])
def test_sharded_parameters_match_plain_torch_bit_for_bit(tmp_path, world, kind):
    """dist_params:sharded (Note [Parameters gathered for their use]): each
    rank keeps its own parameter chunks and gathers the others' for each op
    that uses them, in the unchanged loop; a reentrant checkpoint's
    recomputation gathers again inside backward; a step the scaler skips
    ends the owners' uses, so an eval under no_grad after it gathers (Note
    [Uses only the owner makes]), its losses those of replicated
    parameters."""
    results = run_ranks(world, tmp_path / "ranks", kind, conf=",dist_params:sharded")
    expected_params, expected_states, expected_norms = oracle(world, kind)
    for rank, result in enumerate(results):  # at least one gather a step
        traffic = result["traffic"]
        assert traffic["parameter_gathers"] >= ranked.STEPS, rank
        # Steps after the first that gather more than one group follow the
        # first's plan, issuing gathers ahead of their use (Note [Gathers
        # issued ahead of their use]).
        if traffic["parameter_gathers"] >= 2 * ranked.STEPS:
            assert traffic["parameter_gathers_ahead"] > 0, (rank, traffic)
    if kind == "amp_eval":  # each rank's eval of its own batch, as replicated
        replicated = run_ranks(world, tmp_path / "replicated", kind)
        for rank, (mine, theirs) in enumerate(zip(results, replicated)):
            assert len(mine["evals"]) == ranked.STEPS, rank
            assert mine["evals"] == theirs["evals"], rank
    if kind == "clip":
        for rank, result in enumerate(results):
            assert [n.item() for n in result["norms"]] == [n.item() for n in expected_norms], \
                f"rank {rank} clipped by another norm"
    assert_matches(results, expected_params, expected_states)


def test_a_sharded_checkpoint_resumes_replicated_and_sharded(tmp_path):
    """Saved with sharded parameters at N = 2, each rank writing what it
    owns (Note [Uses only the owner makes]); resumed at N = 2 with
    replicated parameters and at N = 4 with sharded ones, as plain torch."""
    checkpoint = tmp_path / "checkpoint"
    saved = run_ranks(2, tmp_path / "save", "save", checkpoint, conf=",dist_params:sharded")
    expected_params, expected_states, _ = oracle(2, "adam")
    assert_matches(saved, expected_params, expected_states)
    for world, conf in ((2, ""), (4, ",dist_params:sharded")):
        results = run_ranks(world, tmp_path / f"resume{world}", "resume", checkpoint, conf=conf)
        expected_params, expected_states, _ = oracle(2, "adam", resumed_world=world)
        assert_matches(results, expected_params, expected_states)


def test_reentrant_checkpointing_sends_a_group_once_not_once_per_segment(tmp_path):
    """Note [Deferred to the outermost backward]: the chunk groups span the
    checkpointed segments, yet each step sends what the same steps without
    checkpointing send, plus per step two small all-gathers per segment's
    backward (the layouts compared, its order agreed) and at most one group
    sent twice: the last layer's, which the outer backward reduces as soon
    as that layer's gradients are written, before the segments write the
    rest of it."""
    world = 2
    plain = [r["traffic"] for r in run_ranks(world, tmp_path / "deep", "deep")]
    checkpointed = [r["traffic"] for r in run_ranks(world, tmp_path / "ckpt", "checkpointed")]
    segments = ranked.hidden_layers("checkpointed")
    model_bytes = sum(p.numel() * p.element_size()
                      for p in ranked.make_model("checkpointed").parameters())
    chunk_bytes = 2 << 20  # data_parallel_rank.py's chunk_size
    group_bytes = min(model_bytes, world * chunk_bytes)
    for rank, (mine, reference) in enumerate(zip(checkpointed, plain)):
        extra_collectives = mine["collectives"] - reference["collectives"]
        assert 0 <= extra_collectives <= ranked.STEPS * (2 * segments + 1), (rank, mine, reference)
        extra_bytes = mine["bytes_sent"] - reference["bytes_sent"]
        assert extra_bytes <= ranked.STEPS * group_bytes, (rank, mine, reference)


def assert_matches(results, expected_params, expected_states):
    """Every rank holds the expected parameters; each parameter's optimizer
    state is on one rank and equals the expected, bit for bit."""
    for i, (expected, state) in enumerate(zip(expected_params, expected_states)):
        for rank, result in enumerate(results):
            assert torch.equal(result["params"][i], expected), f"rank {rank}, parameter {i}"
        holders = [rank for rank, result in enumerate(results) if result["states"][i]]
        assert len(holders) == 1, f"parameter {i}: optimizer state on ranks {holders}"
        held = results[holders[0]]["states"][i]
        assert len(held) == len(state)
        for mine, theirs in zip(held, state):
            assert torch.equal(mine, theirs), f"parameter {i}, state on rank {holders[0]}"


def test_accumulating_without_no_sync_raises_naming_it(tmp_path):
    """The second micro-batch's backward outside spillway.no_sync() would add
    to gradients the first reduced (Note [A backward onto a reduced
    gradient]): backward raises, on the owners, naming no_sync()."""
    results = run_ranks(2, tmp_path / "ranks", "unsynced")
    for rank, result in enumerate(results):
        assert "after it was reduced across ranks" in result["error"], (rank, result["error"])
        assert "of model 'Sequential#0'" in result["error"], (rank, result["error"])
        assert "no_sync()" in result["error"], (rank, result["error"])


def test_a_rank_whose_backward_reaches_no_model_fails_every_rank_at_once(tmp_path):
    """Rank 1's loss does not depend on the model: its optimizer step's
    reduction meets rank 0's reduction during backward in their first
    all-gather, and both raise there, naming the ranks and the model (Note
    [What each rank is reducing for]), instead of waiting out the group's
    timeout (30 minutes; run_ranks gives up after 240 s)."""
    results = run_ranks(2, tmp_path / "ranks", "unreached")
    for rank, result in enumerate(results):
        message = result["error"]
        assert "the backward of rank(s) 0 reaches model(s) 'Sequential#0'" in message, (rank, message)
        assert "rank(s) 1 went on to reduce gradients for an optimizer step" in message, \
            (rank, message)


def test_a_gradient_written_while_its_reduction_is_in_flight_raises(tmp_path):
    """A parameter used both inside and outside a reentrant checkpoint gets
    two writes in one backward; the second comes while the group's
    reduction is in flight, and the mean would overwrite it (Note [No write
    to a gradient in flight]): backward raises on both owners, naming it."""
    results = run_ranks(2, tmp_path / "ranks", "shared")
    for rank, result in enumerate(results):
        assert "while its chunk group's reduction across ranks was in flight" in \
            result["error"], (rank, result["error"])
        assert f"gradient of '{'ab'[rank]}' of model 'UsedInsideAndOutside#0'" in \
            result["error"], (rank, result["error"])


def test_a_checkpoint_by_owner_resumes_at_any_world_size(tmp_path):
    """Saved at N = 2 (Note [Checkpoints by owner]): each rank's shard holds
    what it owns, once; resumed at N = 1 (no process group), N = 2 and
    N = 4, training goes on bit for bit as plain torch would; consolidated,
    it is a state_dict and an optimizer state_dict that plain torch loads."""
    import spillway
    from spillway import consolidate

    checkpoint = tmp_path / "checkpoint"
    saved = run_ranks(2, tmp_path / "save", "save", checkpoint)
    expected_params, expected_states, _ = oracle(2, "adam")
    assert_matches(saved, expected_params, expected_states)

    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    shards = [torch.load(checkpoint / name, weights_only=True) for name in manifest["shards"]]
    names = list(ranked.make_model().state_dict())
    for name in names:  # each entry and its state in exactly one shard, its owner's
        assert [name in shard["module"] for shard in shards].count(True) == 1, name
        assert [name in shard["optimizer_state"] for shard in shards].count(True) == 1, name
    assert all(shard["module"] for shard in shards), "a rank wrote nothing"
    assert sorted(manifest["optimizer"]["state"]) == sorted(names)

    for world in (1, 2, 4):
        results = run_ranks(world, tmp_path / f"resume{world}", "resume", checkpoint)
        expected_params, expected_states, _ = oracle(2, "adam", resumed_world=world)
        assert_matches(results, expected_params, expected_states)

    # Consolidated: plain torch loads it and holds the oracle's step STEPS.
    assert consolidate.main([str(checkpoint), str(tmp_path / "model.pt"), "--optimizer",
                             str(tmp_path / "optimizer.pt")]) == 0
    model = ranked.make_model()
    optimizer = ranked.make_optimizer("adam", model.parameters())
    model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    optimizer.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    expected_params, expected_states, _ = oracle(2, "adam")
    for param, expected, state in zip(model.parameters(), expected_params, expected_states):
        assert torch.equal(param, expected)
        assert len(ranked.state_of(optimizer, param)) == len(state)
        for mine, theirs in zip(ranked.state_of(optimizer, param), state):
            assert torch.equal(mine, theirs)

    # What does not fit is refused, naming it.
    (tmp_path / "incomplete").mkdir()
    with pytest.raises(spillway.CheckpointError, match="manifest.json does not exist"):
        spillway.load_checkpoint(tmp_path / "incomplete", ranked.make_model())
    wider = torch.nn.Sequential(torch.nn.Linear(ranked.INPUTS, ranked.WIDTH + 1))
    with pytest.raises(spillway.CheckpointError, match="missing|unexpected"):
        spillway.load_checkpoint(checkpoint, wider)
    model = ranked.make_model()
    model[0] = torch.nn.Linear(ranked.INPUTS, ranked.WIDTH, dtype=torch.float64)
    with pytest.raises(spillway.CheckpointError, match="'0.weight' is torch.float32"):
        spillway.load_checkpoint(checkpoint, model)
    assert consolidate.main([str(tmp_path / "incomplete"), str(tmp_path / "x.pt")]) == 2
    corrupt = tmp_path / "corrupt"
    shutil.copytree(checkpoint, corrupt)
    manifest["module"]["0.weight"]["shard"] = 7
    (corrupt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(spillway.CheckpointError, match="'0.weight' in shard 7, of 2"):
        spillway.load_checkpoint(corrupt, ranked.make_model())
