#!/usr/bin/env python3
"""spillway as torch's CUDA allocator, beside torch's own, on the same loop.

Runs a small training loop twice, each in a fresh process (an allocator can
only be swapped before CUDA's first allocation): once with torch's native
caching allocator, once with libspillway.so installed through
torch.cuda.memory.CUDAPluggableAllocator. Prints each run's step time and peak
reserved memory, spillway's stats (spillway_stats_json), and the losses of
both runs, which must be identical: the allocator moves no bytes.

    python3 tools/gpu/pluggable_allocator_check.py --lib build/allocator/libspillway.so

Needs torch >= 2.0 with CUDA and a GPU; exits 2 (and says why) without them.
Prints `metric NAME VALUE UNIT` lines for tools/gpu_check.sh.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

from torch_gpu import missing_torch_gpu


def train(steps, batch, width, layers):
    """The loop both runs share; returns (losses, seconds per step)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                              torch.nn.Linear(4 * width, width)) for _ in range(layers)]
    ).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs = torch.randn(batch, width, device="cuda")
    target = torch.randn(batch, width, device="cuda")
    losses = []
    torch.cuda.synchronize()
    start = None
    for step in range(steps):
        if step == 1:  # the first step pays for CUDA's lazy setup
            torch.cuda.synchronize()
            start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    return losses, (time.perf_counter() - start) / max(1, steps - 1)


def run_one(mode, lib, conf, steps, batch, width, layers):
    """Child process: one run, its result as one JSON line on stdout."""
    import torch

    result = {"mode": mode}
    if mode == "spillway":
        os.environ["SPILLWAY_CONF"] = conf
        allocator = torch.cuda.memory.CUDAPluggableAllocator(lib, "spillway_malloc", "spillway_free")
        torch.cuda.memory.change_current_allocator(allocator)
    losses, step_s = train(steps, batch, width, layers)
    result.update(losses=losses, step_s=step_s)
    if mode == "spillway":
        spillway = ctypes.CDLL(lib)  # the same handle torch loaded: the same runtime
        spillway.spillway_stats_json.restype = ctypes.c_size_t
        spillway.spillway_stats_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        needed = spillway.spillway_stats_json(None, 0)
        buffer = ctypes.create_string_buffer(needed + 1)
        spillway.spillway_stats_json(buffer, len(buffer))
        stats = json.loads(buffer.value.decode())
        result.update(stats=stats, peak_reserved=stats["reserved_bytes.all.peak"])
    else:
        result.update(peak_reserved=torch.cuda.max_memory_reserved())
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True, help="path of libspillway.so")
    parser.add_argument("--conf", default="device:cuda,log:warn", help="SPILLWAY_CONF for the spillway run")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--child", choices=["native", "spillway"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = (args.steps, args.batch, args.width, args.layers)
    if args.child:
        run_one(args.child, os.path.abspath(args.lib), args.conf, *shape)
        return 0

    missing = missing_torch_gpu()
    if missing:
        print(f"pluggable_allocator_check: {missing}")
        return 2
    if not os.path.exists(args.lib):
        print(f"pluggable_allocator_check: {args.lib} does not exist (build spillway first)")
        return 1
    import torch  # for the summary line: importable, missing_torch_gpu() checked

    results = {}
    for mode in ("native", "spillway"):
        child = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--lib", args.lib, "--conf", args.conf,
             "--steps", str(args.steps), "--batch", str(args.batch), "--width", str(args.width),
             "--layers", str(args.layers)],
            capture_output=True, text=True, timeout=300)
        sys.stderr.write(child.stderr)
        if child.returncode != 0:
            print(f"pluggable_allocator_check: the {mode} run failed (exit {child.returncode})")
            return 1
        results[mode] = json.loads(child.stdout.strip().splitlines()[-1])

    native, spillway = results["native"], results["spillway"]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}; "
          f"{args.layers} MLP blocks of width {args.width}, batch {args.batch}, {args.steps} steps")
    for result in (native, spillway):
        print(f"{result['mode']:>9}: {result['step_s'] * 1e3:.3f} ms/step, "
              f"peak reserved {result['peak_reserved'] / 2**20:.1f} MiB")
    print("spillway stats:", json.dumps(spillway["stats"]))
    identical = native["losses"] == spillway["losses"]
    print("losses identical:", "yes" if identical else "NO")
    print(f"metric pluggable_step_time_vs_native {spillway['step_s'] / native['step_s']:.4f} ratio")
    print(f"metric pluggable_peak_reserved_vs_native "
          f"{spillway['peak_reserved'] / native['peak_reserved']:.4f} ratio")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
