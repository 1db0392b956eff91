"""The package's API: enable, memory_stats, dump_trace, manage's arguments, initialize."""

import gc
import json
import os
import tempfile

import pytest
import torch
import torch.nn.functional as F

import spillway
from spillway_testing import (SPILLING_CONF, TRACE_KIND_STEP, make_mlp, mlp_batches,
                              train_step, trace_event_kinds, use_budget_for)

# Design section 3: the contract keys of memory_stats().
CONTRACT_KEYS = [f"{figure}.all.{kind}"
                 for figure in ("allocated_bytes", "reserved_bytes", "active_bytes", "allocation",
                                "segment")
                 for kind in ("current", "peak", "allocated", "freed")] + [
    "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "chunk_bytes.device",
    "chunk_bytes.host", "bytes_moved.h2d", "bytes_moved.d2h", "evictions", "prefetches",
    "stall_ns", "num_spills_for_allocation", "num_budget_overruns", "min_budget_bytes",
    "stall_ns.expected", "stall_ns.actual", "stall_ns.expected.last_step",
    "stall_ns.actual.last_step", "chunk_bytes.capacity", "chunk_bytes.tensors"] + [
    f"allocated_bytes.{owner}.{kind}" for owner in ("model", "non_model")
    for kind in ("current", "peak", "allocated", "freed")]


def test_a_bad_configuration_is_rejected_naming_the_key_and_changes_nothing():
    with pytest.raises(ValueError, match="device_budgett"):
        spillway.enable("device:sim,device_budgett:6MiB")
    with pytest.raises(ValueError, match="chunk_size"):
        spillway.enable("device:sim,chunk_size:lots")
    assert not spillway.is_enabled()
    assert spillway.memory_stats() == {}


@pytest.fixture(scope="module")
def trace_dir():
    directory = tempfile.mkdtemp(prefix="spillway-pytest-")
    spillway.enable(SPILLING_CONF + f",trace:{os.path.join(directory, 'live.trace')}")
    return directory


def test_memory_stats_has_the_contract_keys(trace_dir):
    model = make_mlp(seed=1)
    use_budget_for((model, 2))  # unmanaged, parameters and gradients are ordinary tensors
    spillway.manage(model)
    stats = spillway.memory_stats()
    missing = [key for key in CONTRACT_KEYS if key not in stats]
    assert not missing, f"memory_stats() lacks {missing}"
    assert all(isinstance(stats[key], int) for key in CONTRACT_KEYS)
    assert stats["chunk_bytes.device"] + stats["chunk_bytes.host"] > 0
    # chunk_fill_ratio: the bytes of the managed tensors over their chunks'.
    assert isinstance(stats["chunk_fill_ratio"], float)
    assert stats["chunk_bytes.tensors"] >= sum(p.numel() * p.element_size()
                                               for p in model.parameters())
    assert stats["chunk_fill_ratio"] == stats["chunk_bytes.tensors"] / stats["chunk_bytes.capacity"]
    assert 0 < stats["chunk_fill_ratio"] <= 1
    # The client is named after the module's class.
    assert any(name.startswith("Sequential#") for name in stats["clients"]), stats["clients"]
    json.dumps(stats)  # plain data
    spillway.unmanage(model)


def test_a_dropped_module_gives_its_chunks_back_and_what_is_still_held_stays(trace_dir):
    # Note [A parameter only the bridge holds goes] (hooks/torch/dropped_params.cc).
    def chunk_figures():
        stats = spillway.memory_stats()  # sweeps first
        return stats["chunk_bytes.tensors"], stats["chunk_bytes.host"] + stats["chunk_bytes.device"]

    before_tensors, before_bytes = chunk_figures()
    model = make_mlp(seed=5)
    use_budget_for((model, 2))
    spillway.manage(model)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-2)
    for batch in mlp_batches(6, 2):
        train_step(model, sgd, batch)
    managed_tensors, managed_bytes = chunk_figures()
    assert managed_tensors - before_tensors >= 2 * sum(
        p.numel() * p.element_size() for p in model.parameters())
    kept = model[0].weight  # the parameter itself
    alias = model[2].weight.data  # a view of another parameter's data
    expected = [kept.detach().clone(), alias.clone()]
    x = mlp_batches(7, 1)[0][0]
    graph = model(x).sum()  # an autograd graph that saved every weight
    del model, sgd
    gc.collect()
    assert chunk_figures()[1] == managed_bytes, "a parameter something holds went"
    graph.backward()  # the saved weights are all there
    assert kept.grad is not None and spillway._C._is_managed(kept.grad)
    del graph
    gc.collect()
    # The weights only the graph held are gone; the two held ones stay, with their values.
    _, held_bytes = chunk_figures()
    assert before_bytes < held_bytes < managed_bytes
    assert spillway._C._is_managed(kept) and spillway._C._is_managed(alias)
    assert torch.equal(kept.detach().clone(), expected[0])
    assert torch.equal(alias.clone(), expected[1])
    del kept, alias
    gc.collect()
    assert chunk_figures() == (before_tensors, before_bytes)

    # unmanage first: nothing is left to go later.
    model = make_mlp(seed=6)
    spillway.manage(model)
    spillway.unmanage(model)
    del model
    gc.collect()
    assert chunk_figures() == (before_tensors, before_bytes)


def test_enabling_again_with_another_configuration_is_an_error(trace_dir):
    with pytest.raises(ValueError):
        spillway.enable("device:sim,chunk_size:4MiB")
    spillway.enable()  # the active configuration: nothing to do


def test_manage_accepts_modules_tensors_and_named_pairs_and_rejects_the_rest(trace_dir):
    first, second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    spillway.manage([first.weight, first.bias])
    spillway.manage([("second.weight", second.weight), ("second.bias", second.bias)])
    spillway.manage(first)  # already managed: skipped
    with pytest.raises(TypeError, match="position 0"):
        spillway.manage([3])
    out = F.linear(torch.ones(1, 4), first.weight, first.bias)  # computes on chunk memory
    assert torch.equal(out, F.linear(torch.ones(1, 4), first.weight.detach().clone(),
                                     first.bias.detach().clone()))
    spillway.unmanage(first)
    spillway.unmanage(second)


def test_dump_trace_writes_a_complete_trace(trace_dir):
    path = os.path.join(trace_dir, "dumped.trace")
    spillway.dump_trace(path)
    trace_event_kinds(path)  # reads: header, whole records, end record
    with pytest.raises(ValueError):
        spillway.dump_trace(os.path.join(trace_dir, "live.trace"))


def test_initialize_trains_with_a_deepspeed_style_config(trace_dir):
    model = make_mlp(seed=2)
    use_budget_for((model, 2))  # unmanaged, parameters and gradients are ordinary tensors
    engine, _, _, _ = spillway.initialize(model=model, config={
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
        "gradient_clipping": 1.0,
        "gradient_accumulation_steps": 2,
    })
    losses = []
    for x, y in mlp_batches(3, 8):
        loss = F.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    assert engine.micro_steps == 8 and engine.global_steps == 4
    assert engine.last_gradient_norm > 0
    assert losses[-1] < losses[0], losses
    spillway.unmanage(model)


def test_initialize_bf16_casts_the_model(trace_dir):
    model = make_mlp(seed=4)
    use_budget_for((model, 2))  # unmanaged, parameters and gradients are ordinary tensors
    engine, _, _, _ = spillway.initialize(
        model=model, config='{"optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, '
                            '"bf16": {"enabled": true}}')
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    x, y = mlp_batches(5, 1)[0]
    engine.backward(F.mse_loss(engine(x.bfloat16()).float(), y))
    assert engine.step()
    spillway.unmanage(model)


@pytest.mark.parametrize("config, named", [
    ({"optimizer": {"type": "Adam"}, "fp17": {"enabled": True}}, "fp17"),
    ({"optimizer": {"type": "Adamax"}}, "optimizer.type"),
    ({"optimizer": {"type": "Adam"}, "spillway": {"chunk_size": "lots"}}, "chunk_size"),
])
def test_initialize_rejects_bad_configs_by_name_before_touching_the_model(config, named):
    model = make_mlp(seed=6)
    with pytest.raises(ValueError, match=named):
        spillway.initialize(model=model, config=config)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_steps_of_the_engine_are_marked_in_the_trace(trace_dir):
    model = make_mlp(seed=7)
    use_budget_for((model, 2))  # unmanaged, parameters and gradients are ordinary tensors
    engine, _, _, _ = spillway.initialize(
        model=model, config={"optimizer": {"type": "SGD", "params": {"lr": 1e-2}}})
    before = os.path.join(trace_dir, "engine-before.trace")
    spillway.dump_trace(before)
    for x, y in mlp_batches(8, 3):
        engine.backward(F.mse_loss(engine(x), y))
        engine.step()
    after = os.path.join(trace_dir, "engine-after.trace")
    spillway.dump_trace(after)
    assert (trace_event_kinds(after).count(TRACE_KIND_STEP)
            - trace_event_kinds(before).count(TRACE_KIND_STEP)) == 3
    spillway.unmanage(model)


def test_use_as_torch_cuda_allocator_needs_a_gpu(trace_dir):
    # Installing spillway as torch's CUDA allocator needs device:cuda, so on the
    # simulated device it says why (a build without torch's CUDA side says so).
    if torch.version.cuda is None:
        assert not spillway._C.has_torch_cuda_allocator
    if torch.cuda.is_available():
        pytest.skip("a GPU is usable: tools/gpu/torch_cuda_api_check.py installs it there")
    expected = "needs device:cuda" if spillway._C.has_torch_cuda_allocator else "no torch CUDA"
    with pytest.raises(RuntimeError, match=expected):
        spillway.use_as_torch_cuda_allocator()


def test_the_adopters_forward_hook_is_there_only_while_a_root_waits():
    # Note [Adopting models without being told]: a global forward hook sends
    # every module call through torch's slow path, so it goes once every
    # recorded module's root is adopted, and comes back for a new module.
    from spillway import _auto
    from torch.nn.modules import module as torch_module

    adopted = []

    def hooks():
        return len(torch_module._global_forward_pre_hooks)

    before = hooks()
    _auto.install(lambda module_or_named, client: adopted.append(client))
    try:
        assert hooks() == before + 1
        first = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        first(torch.randn(2, 4))
        assert adopted == ["Sequential"]
        assert hooks() == before
        second = torch.nn.Linear(4, 2)
        assert hooks() == before + 1
        first(torch.randn(2, 4))  # the second still waits: the hook stays
        assert hooks() == before + 1
        second(torch.randn(2, 4))
        assert adopted == ["Sequential", "Linear"]
        assert hooks() == before
    finally:
        _auto.uninstall()
    assert hooks() == before
