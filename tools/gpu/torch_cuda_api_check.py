#!/usr/bin/env python3
"""torch's CUDA memory functions with spillway as torch's CUDA allocator.

Installs spillway from the build folder's Python package
(spillway.use_as_torch_cuda_allocator: the bridge's TorchCudaAllocator, as the
SPILLWAY_CONF start-up hook does) and asserts that each function scripts call
answers from spillway instead of raising, as they do under a plain
torch.cuda.memory.CUDAPluggableAllocator:
  torch.cuda.memory_stats, memory_allocated, max_memory_allocated,
  memory_reserved, reset_peak_memory_stats, empty_cache, Tensor.record_stream,
plus a 0-byte tensor, and a tensor over the budget raising
torch.cuda.OutOfMemoryError with spillway's figures, after which allocation
goes on. Prints one `ok NAME` or `FAIL NAME: why` line each.

    python3 tools/gpu/torch_cuda_api_check.py --build build-gpu

Exits 0 when all pass, 1 when one fails, 2 (saying why) without torch >= 2.0
with CUDA and a GPU.
"""
import argparse
import os
import sys

from torch_gpu import missing_torch_gpu

MiB = 1 << 20


def cuda_bytes(torch, count):
    return torch.empty(count, dtype=torch.uint8, device="cuda")


def check_all(torch, spillway, budget):
    """Yields (name, None) for a pass, (name, why) for a failure."""

    def figure(key):
        return spillway.memory_stats()[key]

    empty = cuda_bytes(torch, 0)
    yield "empty tensor", None if empty.numel() == 0 else f"numel {empty.numel()}"

    held = cuda_bytes(torch, 4 * MiB)
    allocated = torch.cuda.memory_allocated()
    ours = figure("allocated_bytes.all.current")
    yield "memory_allocated", (None if allocated == ours and allocated >= 4 * MiB
                               else f"torch {allocated}, spillway {ours}")
    stats = torch.cuda.memory_stats()
    mismatched = [key for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                                  "reserved_bytes.all.current", "segment.all.current",
                                  "allocation.all.current", "num_ooms")
                  if stats.get(key) != figure(key)]
    yield "memory_stats", (None if not mismatched else
                           "differ from spillway's: " + ", ".join(
                               f"{key} {stats.get(key)} vs {figure(key)}" for key in mismatched))
    reserved = torch.cuda.memory_reserved()
    yield "memory_reserved", (None if reserved == figure("reserved_bytes.all.current")
                              and reserved >= allocated else f"{reserved}")

    big = cuda_bytes(torch, 64 * MiB).fill_(1)
    torch.cuda.synchronize()
    reserved_while_big = torch.cuda.memory_reserved()
    del big
    peak = torch.cuda.max_memory_allocated()
    yield "max_memory_allocated", (None if peak >= allocated + 64 * MiB
                                   and peak == figure("allocated_bytes.all.peak") else f"{peak}")
    torch.cuda.reset_peak_memory_stats()
    after_reset = torch.cuda.max_memory_allocated()
    yield "reset_peak_memory_stats", (None if after_reset == torch.cuda.memory_allocated()
                                      else f"peak {after_reset} after the reset")
    torch.cuda.empty_cache()
    released = reserved_while_big - torch.cuda.memory_reserved()
    yield "empty_cache", None if released >= 64 * MiB else f"released {released} bytes"

    side = torch.cuda.Stream()
    shared = cuda_bytes(torch, MiB)
    with torch.cuda.stream(side):
        shared.fill_(3)
    shared.record_stream(side)
    del shared
    side.synchronize()
    yield "record_stream", None

    ooms = torch.cuda.memory_stats()["num_ooms"]
    try:
        cuda_bytes(torch, 2 * budget)
        yield "out of memory", f"{2 * budget} bytes under a budget of {budget} were allocated"
    except torch.cuda.OutOfMemoryError as error:
        message = str(error)
        missing = [part for part in ("spillway: CUDA out of memory", "budget", "largest free block")
                   if part not in message]
        if not isinstance(error, torch.OutOfMemoryError):
            missing.append("is not a torch.OutOfMemoryError")
        if torch.cuda.memory_stats()["num_ooms"] != ooms + 1:
            missing.append("num_ooms did not count it")
        yield "out of memory", None if not missing else f"{missing}: {message}"
    after = cuda_bytes(torch, MiB).fill_(7)
    total = int(after.sum().item())
    yield "allocation after out of memory", None if total == 7 * MiB else f"sum {total}"
    del held


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True, help="the build folder (its python/ holds the package)")
    parser.add_argument("--budget-mib", type=int, default=512)
    args = parser.parse_args()

    missing = missing_torch_gpu()
    if missing:
        print(f"torch_cuda_api_check: skipped: {missing}")
        return 2
    package = os.path.join(os.path.abspath(args.build), "python")
    if not os.path.isdir(os.path.join(package, "spillway")):
        print(f"torch_cuda_api_check: no Python package in {package} (build spillway first)")
        return 1
    sys.path.insert(0, package)
    import torch
    import spillway

    budget = args.budget_mib * MiB
    spillway.enable(f"device:cuda,device_budget:{args.budget_mib}MiB,log:warn")
    spillway.use_as_torch_cuda_allocator()
    failures = 0
    last = "the start"
    try:
        for name, why in check_all(torch, spillway, budget):
            last = name
            if why is None:
                print(f"ok {name}")
            else:
                failures += 1
                print(f"FAIL {name}: {why}")
    except Exception as error:  # the rest cannot run; say where it stopped
        failures += 1
        print(f"FAIL after {last}: {type(error).__name__}: {error}")
    print(f"torch cuda api: {failures} of the checks failed" if failures else
          "torch cuda api: all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
