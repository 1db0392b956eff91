"""spillway.optim against torch.optim, and its torch-style state dicts."""

import copy

import pytest
import torch

import spillway
import spillway.optim
from spillway_testing import (SPILLING_CONF, make_mlp, mlp_batches, parameters_copy, plain_torch,
                              train_step, use_budget_for)

STEPS = 50
TOLERANCE = 1e-6


@pytest.fixture(scope="module", autouse=True)
def spilling_spillway():
    spillway.enable(SPILLING_CONF)
    # spillway.optim keeps its state in chunks; beside the activations, the
    # budget holds one MLP's parameters and gradients as ordinary tensors,
    # which is what unmanage makes of them at the end of each test.
    use_budget_for((make_mlp(seed=0), 2))


def max_relative_difference(reference, model):
    worst = 0.0
    for expected, got in zip(reference, parameters_copy(model)):
        scale = expected.abs().clamp_min(1e-6)
        worst = max(worst, ((got - expected).abs() / scale).max().item())
    return worst


@pytest.mark.parametrize("name, options", [
    ("Adam", dict(lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)),
    ("AdamW", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)),
    ("SGD", dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-4)),
])
def test_matches_torch_optim_within_tolerance_every_step(name, options):
    model = make_mlp(seed=11)
    with plain_torch():
        reference = copy.deepcopy(model)
        torch_optimizer = getattr(torch.optim, name)(reference.parameters(), **options)
    optimizer = getattr(spillway.optim, name)(model.parameters(), **options)
    worst = 0.0
    for step, batch in enumerate(mlp_batches(12, STEPS)):
        with plain_torch():
            train_step(reference, torch_optimizer, batch)
            expected = parameters_copy(reference)
        train_step(model, optimizer, batch)
        difference = max_relative_difference(expected, model)
        assert difference <= TOLERANCE, f"step {step}: relative difference {difference:.3g}"
        worst = max(worst, difference)
    print(f"\nspillway.optim.{name} vs torch.optim.{name}: max relative parameter difference "
          f"{worst:.3g} over {STEPS} steps")
    spillway.unmanage(model)


def test_parameter_groups_and_changed_learning_rate_follow_torch():
    model = make_mlp(seed=13)
    with plain_torch():
        reference = copy.deepcopy(model)

    def groups(m):
        layers = list(m.children())
        return [{"params": layers[0].parameters(), "lr": 1e-2},
                {"params": [p for layer in layers[1:] for p in layer.parameters()]}]

    torch_adam = torch.optim.Adam(groups(reference), lr=1e-3)
    adam = spillway.optim.Adam(groups(model), lr=1e-3)
    for step, batch in enumerate(mlp_batches(14, 6)):
        if step == 3:  # what a learning-rate scheduler does
            for optimizer in (torch_adam, adam):
                optimizer.param_groups[1]["lr"] = 5e-4
        with plain_torch():
            train_step(reference, torch_adam, batch)
        train_step(model, adam, batch)
    with plain_torch():
        expected = parameters_copy(reference)
    assert max_relative_difference(expected, model) <= TOLERANCE
    spillway.unmanage(model)


def test_state_dict_round_trip_continues_bit_identically():
    model = make_mlp(seed=15)
    data = mlp_batches(16, 6)
    adam = spillway.optim.Adam(model.parameters(), lr=1e-3)
    for batch in data[:3]:
        train_step(model, adam, batch)
    saved_state = copy.deepcopy(adam.state_dict())
    saved_params = parameters_copy(model)
    continued = [train_step(model, adam, batch) for batch in data[3:]]
    continued_params = parameters_copy(model)

    clone = make_mlp(seed=99)
    with torch.no_grad():
        for target, source in zip(clone.parameters(), saved_params):
            target.copy_(source)
    clone_adam = spillway.optim.Adam(clone.parameters(), lr=123.0)  # the state dict sets lr
    clone_adam.load_state_dict(saved_state)
    assert clone_adam.param_groups[0]["lr"] == 1e-3
    resumed = [train_step(clone, clone_adam, batch) for batch in data[3:]]
    for expected, got in zip(continued, resumed):
        assert torch.equal(expected, got)
    for expected, got in zip(continued_params, parameters_copy(clone)):
        assert torch.equal(expected, got)
    use_budget_for((model, 2), (clone, 2))  # unmanaged, parameters and gradients are ordinary
    spillway.unmanage(model)
    spillway.unmanage(clone)


def test_state_dict_has_torch_layout_and_loads_into_torch_adam():
    model = make_mlp(seed=17)
    with plain_torch():
        reference = copy.deepcopy(model)
    data = mlp_batches(18, 4)
    adam = spillway.optim.Adam(model.parameters(), lr=1e-3)
    torch_adam = torch.optim.Adam(reference.parameters(), lr=1e-3)
    for batch in data[:2]:
        train_step(model, adam, batch)
        with plain_torch():
            train_step(reference, torch_adam, batch)
    state = adam.state_dict()
    theirs = torch_adam.state_dict()
    assert state["state"].keys() == theirs["state"].keys()
    for index, entry in theirs["state"].items():
        assert set(state["state"][index]) == set(entry)
        assert float(state["state"][index]["step"]) == float(entry["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            assert state["state"][index][key].shape == entry[key].shape
            assert torch.allclose(state["state"][index][key], entry[key], rtol=1e-5, atol=1e-8)
    # torch's optimizer takes spillway's state and goes on as spillway's would.
    with plain_torch():
        other = copy.deepcopy(reference)
        with torch.no_grad():
            for target, source in zip(other.parameters(), parameters_copy(model)):
                target.copy_(source)
        other_adam = torch.optim.Adam(other.parameters(), lr=1e-3)
        other_adam.load_state_dict(state)
    for batch in data[2:]:
        train_step(model, adam, batch)
        with plain_torch():
            train_step(other, other_adam, batch)
    with plain_torch():
        expected = parameters_copy(other)
    assert max_relative_difference(expected, model) <= TOLERANCE
    spillway.unmanage(model)


def test_state_dict_of_a_channels_last_parameter_is_torchs():
    """The state of a channels_last weight lies in chunks in its memory
    order: the state dict gives it torch's shape and strides, so it equals
    torch's element for element, and torch's loads back in that order."""
    torch.manual_seed(21)
    conv = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    with plain_torch():
        reference = copy.deepcopy(conv)
    x = torch.randn(2, 3, 8, 8)
    adam = spillway.optim.Adam(conv.parameters(), lr=1e-2)
    with plain_torch():
        torch_adam = torch.optim.Adam(reference.parameters(), lr=1e-2)

    def step(model, optimizer):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    step(conv, adam)
    with plain_torch():
        step(reference, torch_adam)
    ours, theirs = adam.state_dict()["state"][0], torch_adam.state_dict()["state"][0]
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.allclose(ours[key], theirs[key], rtol=1e-5, atol=1e-8), key
    # torch's state in, one more step each: the same weights.
    adam.load_state_dict(torch_adam.state_dict())
    step(conv, adam)
    with plain_torch():
        step(reference, torch_adam)
        expected = parameters_copy(reference)
    assert max_relative_difference(expected, conv) <= TOLERANCE
    spillway.unmanage(conv)


def test_a_parameter_unfrozen_after_manage_is_stepped():
    """A weight frozen when manage() took the model and unfrozen after gets
    its gradient chunk at the first op that uses it (Note [A parameter
    unfrozen after manage()]), so spillway's optimizer steps it as torch's
    does."""
    model = make_mlp(seed=22)
    first = next(model.parameters())
    first.requires_grad_(False)
    with plain_torch():
        reference = copy.deepcopy(model)
    spillway.manage(model)
    first.requires_grad_(True)
    with plain_torch():
        next(reference.parameters()).requires_grad_(True)
    adam = spillway.optim.Adam(model.parameters(), lr=1e-3)
    torch_adam = torch.optim.Adam(reference.parameters(), lr=1e-3)
    for batch in mlp_batches(23, 3):
        train_step(model, adam, batch)
        with plain_torch():
            train_step(reference, torch_adam, batch)
    with plain_torch():
        expected = parameters_copy(reference)
    assert not torch.equal(expected[0], parameters_copy(make_mlp(seed=22))[0]), "not trained"
    assert max_relative_difference(expected, model) <= TOLERANCE
    spillway.unmanage(model)


@pytest.mark.parametrize("options, named", [
    (dict(amsgrad=True), "amsgrad"),
    (dict(maximize=True), "maximize"),
])
def test_unsupported_options_are_rejected_by_name(options, named):
    with pytest.raises(ValueError, match=named):
        spillway.optim.Adam(make_mlp(seed=19).parameters(), **options)


def test_optimizer_state_is_a_client_of_its_own():
    model = make_mlp(seed=20)
    adam = spillway.optim.Adam(model.parameters())
    train_step(model, adam, mlp_batches(21, 1)[0])
    clients = spillway.memory_stats()["clients"]
    assert adam.client_name in clients, clients.keys()
    spillway.unmanage(model)
