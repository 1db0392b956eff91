#!/usr/bin/env python3
"""A plain PyTorch training script for tools/gpu/python_train_check.py.

It knows nothing of spillway unless --manage is given, which adds the one line
a script adds to put its parameters into chunks (spillway.manage(model)).
Under SPILLWAY_CONF the installed package's start-up hook has already made
spillway torch's allocator (CUDA on a GPU, the CPU allocator on device:sim)
before this script runs.

--device cpu runs the same loop on host tensors: the rehearsal of
gpu_check.sh (device:sim), where a SPILLWAY_CONF run's tensors are carved
from the simulated device.

Prints one JSON line: the losses, a checksum of the final parameters, tokens
per second over the steps after the first, and
  max_reserved         peak reserved bytes, from torch where torch answers
                       (torch.cuda.max_memory_reserved: torch's own allocator,
                       or spillway's TorchCudaAllocator), else from spillway's
                       memory_stats() when spillway is active, else null (a
                       plain CPU run: torch keeps no such figure, and 0 is
                       not one); max_reserved_from says which
  spillway_active      spillway was imported (by the start-up hook or
                       --manage) and its stats show allocations: a
                       SPILLWAY_CONF run where the package was not importable
                       ran as plain torch, and says so here
  spillway             when active, its figures: peaks of reserved, model and
                       non-model bytes, min_budget_bytes, bytes moved,
                       evictions, prefetches, stall time, OOMs, the policy and
                       where op timing came from
"""
import argparse
import json
import sys
import time

import torch

SPILLWAY_FIGURES = (
    "reserved_bytes.all.peak", "allocated_bytes.all.peak", "allocated_bytes.model.peak",
    "allocated_bytes.non_model.peak", "min_budget_bytes", "num_budget_overruns", "num_ooms",
    "num_spills_for_allocation", "bytes_moved.h2d", "bytes_moved.d2h", "prefetches", "evictions",
    "stall_ns", "policy", "op_timing")


def spillway_stats():
    """spillway's memory_stats() when the package was imported and is active, else None."""
    spillway = sys.modules.get("spillway")
    if spillway is None or not spillway.is_enabled():
        return None
    return spillway.memory_stats()


def torch_reserved_peak(device):
    """torch's peak reserved bytes, or None where torch has no figure: on the
    CPU, or under an allocator that does not answer (a bare
    CUDAPluggableAllocator raises)."""
    if device != "cuda":
        return None
    try:
        peak = torch.cuda.max_memory_reserved()
    except RuntimeError as error:
        print(f"train_script: torch.cuda.max_memory_reserved() raised: {error}", file=sys.stderr)
        return None
    return peak if peak > 0 else None


def reserved_peak(device, stats):
    """(bytes, where from): torch's figure, else spillway's, else (None, None)."""
    peak = torch_reserved_peak(device)
    if peak is not None:
        return peak, "torch"
    if stats is not None and stats["reserved_bytes.all.peak"] > 0:
        return stats["reserved_bytes.all.peak"], "spillway"
    return None, None


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--manage", action="store_true", help="spillway.manage(model)")
    parser.add_argument("--optimizer", choices=["torch", "spillway"], default="torch",
                        help="torch.optim.Adam or spillway.optim.Adam (state in chunks)")
    args = parser.parse_args()
    device = args.device

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = torch.nn.Sequential(*[
        torch.nn.Sequential(torch.nn.LayerNorm(args.width), torch.nn.Linear(args.width, args.width),
                            torch.nn.GELU()) for _ in range(args.layers)]).to(device)
    if args.manage:
        import spillway
        spillway.manage(model)
    if args.optimizer == "spillway":
        import spillway.optim
        optimizer = spillway.optim.Adam(model.parameters(), lr=1e-4)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    generator = torch.Generator(device=device).manual_seed(1)
    shape = (args.batch, args.sequence, args.width)
    inputs = torch.randn(shape, device=device, generator=generator)
    target = torch.randn(shape, device=device, generator=generator)
    losses = []
    start = None
    for step in range(args.steps):
        if step == 1:  # the first step pays for lazy setup
            synchronize(device)
            start = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    synchronize(device)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        checksum = sum(float(p.double().sum()) for p in model.parameters())
    stats = spillway_stats()
    active = stats is not None and stats["allocation.all.allocated"] > 0
    max_reserved, max_reserved_from = reserved_peak(device, stats)
    result = {
        "losses": losses,
        "checksum": checksum,
        "tokens_per_s": (args.steps - 1) * args.batch * args.sequence / seconds,
        "max_reserved": max_reserved,
        "max_reserved_from": max_reserved_from,
        "spillway_active": active,
    }
    if active:
        result["spillway"] = {key: stats.get(key) for key in SPILLWAY_FIGURES}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
