"""On the simulated device spillway is torch's CPU allocator: a batch whose
activations do not fit even with every chunk spilled raises torch's
out-of-memory error, and the same process trains on at a smaller batch with
the results of a run that never tried the large one.

One configuration for the whole process: a 16 MiB budget, strict residency.
"""

import copy

import pytest
import torch

import spillway
from spillway_testing import INPUTS, OUTPUTS, batches, make_mlp, parameters_copy, train_step

CONF = ("device:sim,strict_residency:true,chunk_size:2MiB,device_budget:16MiB,"
        "sim_capacity:256MiB,policy:lru")
STEPS = 4
HUGE_BATCH = 16384  # one 512-wide activation alone is 32 MiB


@pytest.fixture(scope="module", autouse=True)
def sim_spillway():
    spillway.enable(CONF)


def non_model_bytes(stats):
    """Allocated bytes outside chunks: what a tensor of the script takes."""
    return stats["allocated_bytes.non_model.current"]


def test_too_large_a_batch_raises_torchs_out_of_memory_error_and_training_goes_on():
    model = make_mlp(seed=21)
    plain = copy.deepcopy(model)
    data = batches(22, STEPS, (16, INPUTS), (16, OUTPUTS))
    plain_sgd = torch.optim.SGD(plain.parameters(), lr=1e-2)
    plain_losses = [train_step(plain, plain_sgd, batch) for batch in data]
    plain_params = parameters_copy(plain)
    del plain, plain_sgd

    spillway.manage(model)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-2)
    losses = [train_step(model, sgd, data[0])]
    before = spillway.memory_stats()
    huge = batches(23, 1, (HUGE_BATCH, INPUTS), (HUGE_BATCH, OUTPUTS))[0]

    with pytest.raises(torch.OutOfMemoryError) as raised:
        train_step(model, sgd, huge)
    message = str(raised.value)
    print(f"\nthe error: {message}")
    for figure in ("torch asked for", "Budget 16.00 MiB", "in model chunks", "in other tensors",
                   "reserved", "largest free block", "in compute", "smaller batch",
                   "raise device_budget"):
        assert figure in message, f"no {figure!r} in: {message}"
    # What a script written for a GPU catches.
    with pytest.raises(torch.cuda.OutOfMemoryError):
        train_step(model, sgd, huge)

    del raised, huge  # as a script that goes on with smaller batches lets them go
    after = spillway.memory_stats()
    assert after["num_ooms"] > before["num_ooms"]
    assert non_model_bytes(after) == non_model_bytes(before), "the failed steps left tensors"
    # No chunk stayed pinned or lost its bytes: training goes on, bit-identical.

    losses += [train_step(model, sgd, batch) for batch in data[1:]]
    for step, (expected, got) in enumerate(zip(plain_losses, losses)):
        assert torch.equal(expected, got), f"loss of step {step}: {got} != {expected}"
    for index, (expected, got) in enumerate(zip(plain_params, parameters_copy(model))):
        assert torch.equal(expected, got), f"parameter {index} differs"
    spillway.unmanage(model)


def test_activations_count_against_the_budget():
    # Outside chunks: with a model still managed, its chunks would make room
    # (and allocated_bytes.all stay put).
    before = non_model_bytes(spillway.memory_stats())
    activation = torch.ones(1 << 20)  # 4 MiB
    assert non_model_bytes(spillway.memory_stats()) >= before + (4 << 20)
    del activation
    assert non_model_bytes(spillway.memory_stats()) == before


GRADIENT_CHUNK_OUT_OF_MEMORY = """
import torch, spillway
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512),
                            torch.nn.Tanh(), torch.nn.Linear(512, 16))
spillway.enable("device:sim,strict_residency:true,chunk_size:2MiB,sim_capacity:256MiB,"
                "policy:lru,device_budget:3MiB")
spillway.manage(model)
x, y = torch.randn(16, 128), torch.randn(16, 16)
try:
    torch.nn.functional.mse_loss(model(x), y).backward()
    print("fits")
except torch.OutOfMemoryError as error:
    print("OutOfMemoryError:", error)
except RuntimeError as error:
    print("RuntimeError:", error)
"""


def test_a_gradient_chunk_that_does_not_fit_is_torchs_out_of_memory_error():
    """Backward's gradient chunks take room in the budget too: where one
    cannot be placed, the error is torch.OutOfMemoryError, as for any
    allocation, so `except torch.OutOfMemoryError` catches it (it was a
    plain RuntimeError). Its own process: a 3 MiB budget."""
    import subprocess
    import sys
    output = subprocess.run([sys.executable, "-c", GRADIENT_CHUNK_OUT_OF_MEMORY],
                            capture_output=True, text=True, timeout=120).stdout
    assert output.startswith("OutOfMemoryError: spillway: out of memory on sim"), output
    assert "acquiring a gradient's chunk failed" in output, output
    assert "raise device_budget (now 3.00 MiB)" in output, output
