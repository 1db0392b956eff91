"""Models trained with torch.optim under spillway, against plain torch.

One configuration for the whole process: a budget that forces chunks out and
back every step, with strict_residency (an evicted tensor's memory faults).
"""

import copy
import io
import os
import tempfile

import pytest
import torch

import spillway
from spillway_testing import (INPUTS, OUTPUTS, SPILLING_CONF, TRACE_KIND_STEP, WIDTH,
                              TinyTransformer, make_mlp,
                              mlp_batches, parameters_copy, plain_torch, trace_event_kinds,
                              train_step, transformer_batches, use_budget_for)

STEPS = 5


@pytest.fixture(scope="module", autouse=True)
def spilling_spillway():
    directory = tempfile.mkdtemp(prefix="spillway-pytest-")
    spillway.enable(SPILLING_CONF + f",trace:{os.path.join(directory, 'live.trace')}")
    yield directory


def assert_same(reference_losses, losses, reference_params, model):
    assert len(losses) == len(reference_losses)
    for step, (expected, got) in enumerate(zip(reference_losses, losses)):
        assert torch.equal(expected, got), f"loss of step {step}: {got} != {expected}"
    for index, (expected, got) in enumerate(zip(reference_params, parameters_copy(model))):
        assert torch.equal(expected, got), f"parameter {index} differs"


def train_interleaved(models, data):
    """Each model with an Adam of its own, a step of each in turn; the losses per model."""
    optimizers = [torch.optim.Adam(model.parameters(), lr=1e-3) for model in models]
    losses = tuple([] for _ in models)
    for step in range(STEPS):
        for model, optimizer, batches, model_losses in zip(models, optimizers, data, losses):
            model_losses.append(train_step(model, optimizer, batches[step]))
    return losses


def test_two_models_with_their_own_adam_interleaved_are_bit_identical():
    with plain_torch():  # built on the host, as before .cuda()
        actor, critic = make_mlp(seed=1), TinyTransformer(seed=2)
    actor_data, critic_data = mlp_batches(3, STEPS), transformer_batches(4, STEPS)
    with plain_torch():
        plain_actor, plain_critic = copy.deepcopy(actor), copy.deepcopy(critic)
        plain_losses = train_interleaved((plain_actor, plain_critic), (actor_data, critic_data))
        plain_params = parameters_copy(plain_actor), parameters_copy(plain_critic)
    # Both Adams' state, and the transformer's attention and the two Adams'
    # temporaries (measured: about 4 MiB beyond the state).
    use_budget_for((actor, 2), (critic, 2), activation_bytes=6 << 20)
    before = spillway.memory_stats()
    spillway.manage(actor)
    spillway.manage(critic)
    losses = train_interleaved((actor, critic), (actor_data, critic_data))

    assert_same(plain_losses[0], losses[0], plain_params[0], actor)
    assert_same(plain_losses[1], losses[1], plain_params[1], critic)
    after = spillway.memory_stats()
    assert after["evictions"] - before["evictions"] >= 2 * STEPS, "the budget did not force spills"
    assert after["bytes_moved.h2d"] > before["bytes_moved.h2d"]
    spillway.unmanage(actor)
    spillway.unmanage(critic)


def test_sgd_with_momentum_and_set_to_none_zero_grad_is_bit_identical():
    model = make_mlp(seed=5)
    data = mlp_batches(6, STEPS)
    with plain_torch():
        plain = copy.deepcopy(model)
        plain_sgd = torch.optim.SGD(plain.parameters(), lr=1e-2, momentum=0.9, nesterov=True)
        plain_losses = [train_step(plain, plain_sgd, batch, set_to_none=True) for batch in data]
        plain_params = parameters_copy(plain)

    use_budget_for((model, 1))  # the momentum
    spillway.manage(model)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, nesterov=True)
    losses = [train_step(model, sgd, batch, set_to_none=True) for batch in data]
    assert_same(plain_losses, losses, plain_params, model)
    spillway.unmanage(model)


def test_managed_parameters_read_back_after_unmanage():
    model = make_mlp(seed=7)
    expected = parameters_copy(model)
    # Unmanaged, parameters and gradients are ordinary tensors on the device.
    use_budget_for((model, 3))
    spillway.manage(model)
    spillway.unmanage(model)
    for index, (before, after) in enumerate(zip(expected, parameters_copy(model))):
        assert torch.equal(before, after), f"parameter {index} changed on its way through chunks"


def test_each_python_optimizer_step_marks_a_step_in_the_trace(spilling_spillway):
    model = make_mlp(seed=8)
    use_budget_for((model, 2))  # Adam's state
    spillway.manage(model)
    adam = torch.optim.Adam(model.parameters())
    path = os.path.join(spilling_spillway, "before.trace")
    spillway.dump_trace(path)
    steps_before = trace_event_kinds(path).count(TRACE_KIND_STEP)
    for batch in mlp_batches(9, 3):
        train_step(model, adam, batch)
    path = os.path.join(spilling_spillway, "after.trace")
    spillway.dump_trace(path)
    assert trace_event_kinds(path).count(TRACE_KIND_STEP) == steps_before + 3
    spillway.unmanage(model)


def test_batch_norm_running_statistics_are_managed_and_bit_identical():
    """Buffers that change every step (issue 16): managed with the module."""
    with plain_torch():
        torch.manual_seed(10)
        model = torch.nn.Sequential(
            torch.nn.Linear(INPUTS, WIDTH), torch.nn.BatchNorm1d(WIDTH), torch.nn.ReLU(),
            torch.nn.Linear(WIDTH, WIDTH), torch.nn.BatchNorm1d(WIDTH), torch.nn.ReLU(),
            torch.nn.Linear(WIDTH, WIDTH), torch.nn.BatchNorm1d(WIDTH), torch.nn.Tanh(),
            torch.nn.Linear(WIDTH, OUTPUTS))
    data = mlp_batches(11, STEPS)
    with plain_torch():
        plain = copy.deepcopy(model)
        plain_sgd = torch.optim.SGD(plain.parameters(), lr=1e-2, momentum=0.9, weight_decay=1e-4)
        plain_losses = [train_step(plain, plain_sgd, batch) for batch in data]
        plain_params = parameters_copy(plain)
        plain_buffers = [b.clone() for b in plain.buffers()]
    use_budget_for((model, 1))  # the momentum
    before = spillway.memory_stats()
    spillway.manage(model)
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    tensors = spillway.memory_stats()["chunk_bytes.tensors"] - before.get("chunk_bytes.tensors", 0)
    assert tensors == 2 * sum(p.numel() * p.element_size() for p in model.parameters()) + buffer_bytes
    sgd = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, weight_decay=1e-4)
    losses = [train_step(model, sgd, batch) for batch in data]
    assert_same(plain_losses, losses, plain_params, model)
    for index, (expected, buffer) in enumerate(zip(plain_buffers, model.buffers())):
        assert torch.equal(expected, buffer.clone()), f"buffer {index} differs"
    assert spillway.memory_stats()["evictions"] - before["evictions"] >= STEPS
    spillway.unmanage(model)
    for index, (expected, buffer) in enumerate(zip(plain_buffers, model.buffers())):
        assert torch.equal(expected, buffer), f"buffer {index} differs after unmanage"


def test_param_data_assigned_mid_run_goes_into_the_chunk_at_once():
    """`param.data = t` on a managed parameter (Note [set_data on a managed
    parameter, at the call]): data of its layout is in the chunk as soon as
    the assignment returns, and training stays bit-identical; data of another
    shape is refused, leaving the parameter as it was."""
    model = make_mlp(seed=14)
    data = mlp_batches(15, STEPS)

    def halve_first(first):
        with torch.no_grad():
            first.data = first.detach() * 0.5

    with plain_torch():
        plain = copy.deepcopy(model)
        plain_adam = torch.optim.Adam(plain.parameters(), lr=1e-3)
        plain_losses = []
        for step, batch in enumerate(data):
            plain_losses.append(train_step(plain, plain_adam, batch))
            if step == 1:
                halve_first(next(plain.parameters()))
        plain_params = parameters_copy(plain)
    use_budget_for((model, 2))
    spillway.manage(model)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    first = next(model.parameters())
    losses = []
    for step, batch in enumerate(data):
        losses.append(train_step(model, adam, batch))
        if step == 1:
            halve_first(first)
            assert spillway._C._is_managed(first), "the new data stayed outside the chunk"
            before = first.detach().clone()
            with pytest.raises(RuntimeError, match="nothing was changed"):
                first.data = torch.zeros(3, 3)
            assert spillway._C._is_managed(first) and torch.equal(first, before)
    with plain_torch():
        assert_same(plain_losses, losses, plain_params, model)
    use_budget_for((model, 4))
    spillway.unmanage(model)


def deep_mlp(seed):
    """Eight linear layers: most of its chunks stay evicted under use_budget_for((model, 1))."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(INPUTS, WIDTH),
        *[torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH)) for _ in range(6)],
        torch.nn.Tanh(), torch.nn.Linear(WIDTH, OUTPUTS))


def test_a_checkpoint_saved_mid_run_while_spilled_resumes_as_plain_torch():
    """torch.save(model.state_dict()) under strict_residency with most chunks
    evicted (issue 16): a fresh plain model loaded from it trains on exactly
    as the plain run, and so does the managed one."""
    with plain_torch():
        model = deep_mlp(seed=12)
        fresh = copy.deepcopy(model)
    data = mlp_batches(13, 4)

    def sgd(params):
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9)

    with plain_torch():
        plain = copy.deepcopy(model)
        plain_sgd = sgd(plain.parameters())
        plain_losses = [train_step(plain, plain_sgd, batch) for batch in data]
        plain_params = parameters_copy(plain)
    use_budget_for((model, 1))
    spillway.manage(model)
    managed_sgd = sgd(model.parameters())
    losses = [train_step(model, managed_sgd, batch) for batch in data[:2]]
    stats = spillway.memory_stats()
    assert stats["chunk_bytes.device"] < stats["chunk_bytes.capacity"] // 2, "most chunks evicted"
    checkpoint = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": managed_sgd.state_dict()}, checkpoint)
    losses += [train_step(model, managed_sgd, batch) for batch in data[2:]]
    with plain_torch():  # the copies compared, off the device budget
        assert_same(plain_losses, losses, plain_params, model)
        checkpoint.seek(0)
        saved = torch.load(checkpoint)
        fresh.load_state_dict(saved["model"])
        fresh_sgd = sgd(fresh.parameters())
        fresh_sgd.load_state_dict(saved["optimizer"])
        resumed = [train_step(fresh, fresh_sgd, batch) for batch in data[2:]]
        assert_same(plain_losses[2:], resumed, plain_params, fresh)
    # Unmanaged, the model is ordinary tensors on the device: room for it.
    use_budget_for((model, 4))
    spillway.unmanage(model)


def test_a_whole_module_pickled_while_spilled_holds_true_values_and_no_spillway():
    """torch.save(model), of the module itself, and torch.save of one
    parameter, under strict_residency with chunks evicted (Note [Checkpoints
    of managed modules]): the true values, and nothing in the file that
    needs spillway to load it."""
    with plain_torch():
        model = deep_mlp(seed=14)
    use_budget_for((model, 1))
    spillway.manage(model)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    for batch in mlp_batches(15, 2):
        train_step(model, sgd, batch)
    stats = spillway.memory_stats()
    assert stats["chunk_bytes.device"] < stats["chunk_bytes.capacity"] // 2, "most chunks evicted"
    with plain_torch():  # the copies compared, off the device budget
        expected = parameters_copy(model)
    first = next(model.parameters())
    whole, one = io.BytesIO(), io.BytesIO()
    torch.save(model, whole)
    torch.save(first, one)
    assert b"spillway" not in whole.getvalue()
    with plain_torch():
        whole.seek(0)
        loaded = torch.load(whole, weights_only=False)
        one.seek(0)
        loaded_first = torch.load(one)
        for index, (value, got) in enumerate(zip(expected, loaded.parameters())):
            assert torch.equal(value, got), f"parameter {index} differs"
            assert got.requires_grad
        assert not any(spillway._C._is_managed(p) for p in loaded.parameters())
        assert isinstance(loaded_first, torch.nn.Parameter)
        assert torch.equal(expected[0], loaded_first)
    # A state dict holds copies that anything may read; keep_vars, the tensors themselves.
    assert not any(spillway._C._is_managed(v) for v in model.state_dict().values())
    assert model.state_dict(keep_vars=True)["0.weight"] is first
    use_budget_for((model, 4))
    spillway.unmanage(model)
