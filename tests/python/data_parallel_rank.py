"""One rank of test_data_parallel.py: an unchanged torch training loop,
with torch.distributed initialized (Gloo, a file store) and the model
managed, so that spillway trains it data parallel.

    python data_parallel_rank.py RANK WORLD FOLDER OPTIMIZER
"""

import sys

import torch
import torch.nn.functional as F

STEPS = 3
BATCH = 8
INPUTS = 256
WIDTH = 512
OUTPUTS = 16


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(INPUTS, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, OUTPUTS))


def make_optimizer(kind, params):
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def batch(step, rank):
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(BATCH, INPUTS, generator=generator),
            torch.randn(BATCH, OUTPUTS, generator=generator))


def state_of(optimizer, param):
    """The parameter's optimizer state as a list of tensors; [] when none."""
    state = optimizer.state.get(param, {})
    return [state[key].clone() for key in sorted(state) if torch.is_tensor(state[key])]


def main():
    rank, world, folder, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    import torch.distributed as dist
    import spillway

    spillway.enable("device:sim,strict_residency:true,chunk_size:2MiB,sim_capacity:256MiB")
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=world)
    model = make_model()
    spillway.manage(model)  # torch.distributed's default group
    optimizer = make_optimizer(kind, model.parameters())
    for step in range(STEPS):
        optimizer.zero_grad()
        x, y = batch(step, rank)
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    assert all(spillway._C._is_managed(p) for p in model.parameters())
    torch.save({"params": [p.detach().clone() for p in model.parameters()],
                "states": [state_of(optimizer, p) for p in model.parameters()]},
               f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
