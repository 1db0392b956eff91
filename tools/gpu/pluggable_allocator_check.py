#!/usr/bin/env python3
"""spillway as torch's CUDA allocator, beside torch's own, on the same loop.

Runs a small training loop twice, each in a fresh process (an allocator can
only be swapped before CUDA's first allocation): once with torch's native
caching allocator, once with libspillway.so installed through
torch.cuda.memory.CUDAPluggableAllocator. Prints each run's step time and peak
reserved memory, spillway's stats (spillway_stats_json), and the losses of
both runs, which must be identical: the allocator moves no bytes.

    python3 tools/gpu/pluggable_allocator_check.py --lib build/allocator/libspillway.so [--rehearse]

Needs torch >= 2.0 with CUDA and a GPU; exits 2 (and says why) without them.
Prints `metric NAME VALUE UNIT` lines for tools/gpu_check.sh; exits 0 when
the losses are identical, 1 otherwise or when a run fails.

--rehearse runs without a GPU and never exits 2: both runs train on the CPU
(torch's own CPU allocator); the spillway run first loads libspillway.so with
ctypes under SPILLWAY_CONF=device:sim (read at its first use), takes a block
through spillway_malloc, writes and reads it, gives it back through
spillway_free and reads spillway_stats_json. It checks the C ABI and this
script's own logic; torch allocating through spillway needs a GPU. The native
CPU run has no peak reserved figure, so the peak ratio is not printed.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

from torch_gpu import missing_torch_gpu

MiB = 1 << 20


def synchronize(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def train(device, steps, batch, width, layers):
    """The loop both runs share; returns (losses, seconds per step)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                              torch.nn.Linear(4 * width, width)) for _ in range(layers)]
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs = torch.randn(batch, width, device=device)
    target = torch.randn(batch, width, device=device)
    losses = []
    synchronize(torch, device)
    start = None
    for step in range(steps):
        if step == 1:  # the first step pays for CUDA's lazy setup
            synchronize(torch, device)
            start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    synchronize(torch, device)
    return losses, (time.perf_counter() - start) / max(1, steps - 1)


def load_spillway(lib):
    """libspillway.so's C ABI through ctypes (allocator/spillway.h)."""
    spillway = ctypes.CDLL(lib)  # where torch loaded it too: the same handle, the same runtime
    spillway.spillway_malloc.restype = ctypes.c_void_p
    spillway.spillway_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    spillway.spillway_free.restype = None
    spillway.spillway_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    spillway.spillway_last_error.restype = ctypes.c_char_p
    spillway.spillway_stats_json.restype = ctypes.c_size_t
    spillway.spillway_stats_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return spillway


def stats_of(spillway):
    needed = spillway.spillway_stats_json(None, 0)
    if needed == 0:
        raise RuntimeError(f"spillway_stats_json failed: {spillway.spillway_last_error().decode()}")
    buffer = ctypes.create_string_buffer(needed + 1)
    spillway.spillway_stats_json(buffer, len(buffer))
    return json.loads(buffer.value.decode())


def round_trip(spillway, size):
    """spillway_malloc, a write and a read of every byte, spillway_free; a
    failure as an exception naming the call."""
    pointer = spillway.spillway_malloc(size, 0, None)
    if not pointer:
        raise RuntimeError(f"spillway_malloc({size}) returned NULL: "
                           f"{spillway.spillway_last_error().decode()}")
    ctypes.memset(pointer, 0x5A, size)
    if ctypes.string_at(pointer, size) != b"\x5a" * size:
        raise RuntimeError(f"spillway_malloc({size}): the bytes written do not read back")
    held = stats_of(spillway)
    spillway.spillway_free(pointer, size, 0, None)
    error = spillway.spillway_last_error().decode()
    after = stats_of(spillway)
    if error:
        raise RuntimeError(f"spillway_free failed: {error}")
    if after["allocated_bytes.all.current"] != held["allocated_bytes.all.current"] - size:
        raise RuntimeError(f"spillway_free did not give the block back: allocated "
                           f"{after['allocated_bytes.all.current']} bytes after it, "
                           f"{held['allocated_bytes.all.current']} while held")


def run_one(mode, lib, conf, device, steps, batch, width, layers):
    """Child process: one run, its result as one JSON line on stdout."""
    import torch

    result = {"mode": mode}
    spillway = None
    if mode == "spillway":
        os.environ["SPILLWAY_CONF"] = conf
        if device == "cuda":
            allocator = torch.cuda.memory.CUDAPluggableAllocator(lib, "spillway_malloc", "spillway_free")
            torch.cuda.memory.change_current_allocator(allocator)
            spillway = load_spillway(lib)
        else:  # the rehearsal: the C ABI on the simulated device; torch keeps its CPU allocator
            spillway = load_spillway(lib)
            round_trip(spillway, MiB)
    losses, step_s = train(device, steps, batch, width, layers)
    result.update(losses=losses, step_s=step_s)
    if spillway is not None:
        stats = stats_of(spillway)
        if stats["allocation.all.allocated"] <= 0:
            raise RuntimeError("spillway's stats show no allocation: spillway was not the allocator")
        result.update(stats=stats, peak_reserved=stats["reserved_bytes.all.peak"])
    elif device == "cuda":
        result.update(peak_reserved=torch.cuda.max_memory_reserved())
    else:
        result.update(peak_reserved=None)  # torch keeps no such figure for the CPU
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True, help="path of libspillway.so")
    parser.add_argument("--conf", help="SPILLWAY_CONF for the spillway run (default "
                                       "device:cuda,log:warn; rehearsal device:sim,log:warn)")
    parser.add_argument("--rehearse", action="store_true",
                        help="no GPU: both runs on the CPU, the C ABI on the simulated device")
    parser.add_argument("--steps", type=int, help="default 30 (rehearsal 6)")
    parser.add_argument("--batch", type=int, help="default 256 (rehearsal 32)")
    parser.add_argument("--width", type=int, help="default 1024 (rehearsal 128)")
    parser.add_argument("--layers", type=int, help="default 8 (rehearsal 4)")
    parser.add_argument("--device", choices=["cuda", "cpu"], help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=["native", "spillway"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_one(args.child, os.path.abspath(args.lib), args.conf, args.device, args.steps,
                args.batch, args.width, args.layers)
        return 0

    if args.rehearse:  # a small model, so that it takes seconds
        device, conf, steps = "cpu", args.conf or "device:sim,log:warn", args.steps or 6
        shape = (args.batch or 32, args.width or 128, args.layers or 4)
    else:
        missing = missing_torch_gpu()
        if missing:
            print(f"pluggable_allocator_check: {missing}")
            return 2
        device, conf, steps = "cuda", args.conf or "device:cuda,log:warn", args.steps or 30
        shape = (args.batch or 256, args.width or 1024, args.layers or 8)
    batch, width, layers = shape
    if steps < 2:
        parser.error("--steps: at least 2 (the first step is not timed)")
    if not os.path.exists(args.lib):
        print(f"pluggable_allocator_check: {args.lib} does not exist (build spillway first)")
        return 1
    import torch  # for the summary line: importable, missing_torch_gpu() checked

    results = {}
    env = {key: value for key, value in os.environ.items() if key != "SPILLWAY_CONF"}
    for mode in ("native", "spillway"):
        child = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--lib", args.lib, "--conf", conf,
             "--device", device, "--steps", str(steps), "--batch", str(batch),
             "--width", str(width), "--layers", str(layers)],
            env=env, capture_output=True, text=True, timeout=300)
        sys.stderr.write(child.stderr)
        if child.returncode != 0:
            last = [line for line in child.stderr.splitlines() if line.strip()][-1:] or [""]
            print(f"pluggable_allocator_check: the {mode} run failed (exit {child.returncode}): "
                  f"{last[0][:600]}")
            return 1
        results[mode] = json.loads(child.stdout.strip().splitlines()[-1])

    native, spillway = results["native"], results["spillway"]
    where = (torch.cuda.get_device_name(0) if device == "cuda"
             else "no GPU: rehearsal on the CPU, spillway's C ABI on the simulated device")
    print(f"torch {torch.__version__}, {where}; "
          f"{layers} MLP blocks of width {width}, batch {batch}, {steps} steps")
    for result in (native, spillway):
        peak = result["peak_reserved"]
        print(f"{result['mode']:>9}: {result['step_s'] * 1e3:.3f} ms/step, peak reserved "
              f"{'none (torch keeps no figure on the CPU)' if peak is None else f'{peak / MiB:.1f} MiB'}")
    print("spillway stats:", json.dumps(spillway["stats"]))
    identical = native["losses"] == spillway["losses"]
    print("losses identical:", "yes" if identical else "NO")
    print(f"metric pluggable_step_time_vs_native {spillway['step_s'] / native['step_s']:.4f} ratio")
    if native["peak_reserved"] and spillway["peak_reserved"]:
        print(f"metric pluggable_peak_reserved_vs_native "
              f"{spillway['peak_reserved'] / native['peak_reserved']:.4f} ratio")
    else:
        print("pluggable_allocator_check: no peak reserved ratio: the native run has no figure")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
