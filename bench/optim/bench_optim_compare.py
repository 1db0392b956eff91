#!/usr/bin/env python3
"""bench_optim_compare.py: spillway's CPU AdamW side by side with DeepSpeed's
CPUAdam and torch's fused and foreach AdamW, in one process per thread count.

bench/run.sh optim runs it after bench_optim. Each thread count (1 and 2 by
default) gets a child process with OMP_NUM_THREADS and torch.set_num_threads
set to it, in which every optimizer steps the same fp32 tensors in turns:
spillway's kernel through libspillway_bench_adam.so (ctypes, one call per
tensor, on the kernels' default OpenMP pool), DeepSpeed's CPUAdam as built by
its own op builder (OpenMP), torch.optim.AdamW(fused=True) and (foreach=True)
(torch's intra-op pool). The tensors are GPT-2 medium's 292 parameter tensors
(dimensions divided by --scale, default 2, about 89M parameters; --scale 1 is
the real 355M), and spillway also steps one 64M-parameter array in one call.
Every timed step follows a 50 ms idle gap, as the optimizer step follows
forward and backward in training; the figures are medians over the rounds.

  metric cpu_adam_vs_deepspeed[_Nt]       DeepSpeed's step time over spillway's
                                          (layer list, idle gap); goal >= 1.0
  metric cpu_adam_layerwise_vs_single_call[_Nt]  params/s of the layer list
                                          (one call per tensor) over one 64M
                                          call, both after the gap; goal >= 0.9
  metric cpu_adam_chunk_runs_vs_deepspeed[_Nt]  the same with spillway's step as
                                          the chunked optimizers take it: one call
                                          per run of tensors filling a 64 MiB chunk
  metric cpu_adam_vs_torch_fused[_Nt]     torch fused AdamW's time over spillway's
  metric cpu_adam_vs_torch_foreach[_Nt]   torch foreach AdamW's time over spillway's
                                          (both per tensor, layer list)
  metric cpu_adam_vs_torch_best[_Nt]      the faster of the two over spillway's;
                                          goal >= 1.3 at the same thread count
  metric cpu_adam_{layerwise,chunk_runs,single_call,deepspeed,torch_fused,
                   torch_foreach}_ms[_Nt] the medians themselves

_Nt is absent for 1 thread (_2t for 2). DeepSpeed lives in a benchmark-only
virtual environment (deepspeed_env.sh); when it cannot be installed or built,
the run says why and reports the rest.

  bench_optim_compare.py --build BUILD_DIR [--threads 1,2] [--scale 2] [--rounds 11]
"""
import argparse
import ctypes
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01
SINGLE_CALL_PARAMS = 64 << 20
CHUNK_PARAMS = 16 << 20  # fp32 elements of a 64 MiB chunk
IDLE_GAP_S = 0.05


def gpt2_medium_shapes(scale):
    """GPT-2 medium's 292 parameter tensors, each dimension divided by scale."""
    d, vocab, positions, layers = 1024 // scale, -(-50257 // scale), 1024 // scale, 24
    shapes = [(vocab, d), (positions, d)]  # wte, wpe
    for _ in range(layers):
        shapes += [(d,), (d,)]  # ln_1
        shapes += [(d, 3 * d), (3 * d,)]  # attn.c_attn
        shapes += [(d, d), (d,)]  # attn.c_proj
        shapes += [(d,), (d,)]  # ln_2
        shapes += [(d, 4 * d), (4 * d,)]  # mlp.c_fc
        shapes += [(4 * d, d), (d,)]  # mlp.c_proj
    shapes += [(d,), (d,)]  # ln_f
    return shapes


def metric(name, value, unit):
    print(f"metric {name} {value:.6g} {unit}", flush=True)


def note(text):
    print(f"# {text}", flush=True)


def find_library(build):
    found = sorted(pathlib.Path(build).rglob("libspillway_bench_adam.so"))
    if not found:
        sys.exit(f"bench_optim_compare.py: no libspillway_bench_adam.so under {build} "
                 "(build bench_optim first)")
    return found[0]


def child(args):
    import torch

    threads = args.threads_one
    torch.set_num_threads(threads)
    suffix = "" if threads == 1 else f"_{threads}t"
    lib = ctypes.CDLL(str(find_library(args.build)))
    step_fn = lib.spillway_bench_adamw_step
    step_fn.restype = None
    step_fn.argtypes = [ctypes.c_size_t] + [ctypes.c_void_p] * 4 + [ctypes.c_int64] + \
        [ctypes.c_double] * 5 + [ctypes.c_int]

    shapes = gpt2_medium_shapes(args.scale)
    generator = torch.Generator().manual_seed(0)
    # The tensors lie back to back in flat arrays, as in spillway's chunks.
    total = sum(math.prod(shape) for shape in shapes)
    flat_p = torch.rand(total, generator=generator).sub_(0.5)
    flat_g = torch.randn(total, generator=generator).mul_(1e-3)
    params, offset = [], 0
    for shape in shapes:
        count = math.prod(shape)
        p = torch.nn.Parameter(flat_p[offset:offset + count].view(shape))
        p.grad = flat_g[offset:offset + count].view(shape)
        params.append(p)
        offset += count

    # spillway's state, flat too; its two ways of stepping share it (only
    # the time matters here).
    flat_m, flat_v = torch.zeros(total), torch.zeros(total)
    sw_step = [0]

    def spillway_layerwise():  # one kernel call per tensor, as one optimizer step
        sw_step[0] += 1
        offset = 0
        for p in params:
            step_fn(p.numel(), p.data_ptr(), p.grad.data_ptr(), flat_m[offset:].data_ptr(),
                    flat_v[offset:].data_ptr(), sw_step[0], LR, BETAS[0], BETAS[1], EPS,
                    WEIGHT_DECAY, threads)
            offset += p.numel()

    # The step as the chunked optimizers take it (Note [One kernel call per
    # run]): one call per run of tensors filling a chunk of CHUNK_PARAMS.
    runs, begin, end = [], 0, 0
    for p in params:
        if end > begin and end + p.numel() - begin > CHUNK_PARAMS:
            runs.append((begin, end))
            begin = end
        end += p.numel()
    runs.append((begin, end))
    run_step = [0]
    note(f"{threads} thread(s); GPT-2 medium's {len(shapes)} tensors with dimensions divided by "
         f"{args.scale}{' (full size)' if args.scale == 1 else ''}: {total / 1e6:.1f}M params, "
         f"{len(runs)} chunk runs; single call {SINGLE_CALL_PARAMS >> 20}M params")

    def spillway_chunk_runs():
        run_step[0] += 1
        for first, last in runs:
            step_fn(last - first, flat_p[first:].data_ptr(), flat_g[first:].data_ptr(),
                    flat_m[first:].data_ptr(), flat_v[first:].data_ptr(), run_step[0], LR,
                    BETAS[0], BETAS[1], EPS, WEIGHT_DECAY, threads)

    single = [torch.rand(SINGLE_CALL_PARAMS, generator=generator) for _ in range(2)] + \
        [torch.zeros(SINGLE_CALL_PARAMS) for _ in range(2)]
    single[1].sub_(0.5).mul_(1e-3)
    single_step = [0]

    def spillway_single_call():
        single_step[0] += 1
        p, g, m, v = single
        step_fn(SINGLE_CALL_PARAMS, p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(),
                single_step[0], LR, BETAS[0], BETAS[1], EPS, WEIGHT_DECAY, threads)

    contenders = {"layerwise": spillway_layerwise, "chunk_runs": spillway_chunk_runs,
                  "single_call": spillway_single_call}
    for kind in ("fused", "foreach"):
        optimizer = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS,
                                      weight_decay=WEIGHT_DECAY, **{kind: True})
        contenders[f"torch_{kind}"] = optimizer.step
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        ds = DeepSpeedCPUAdam(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                              adamw_mode=True)
        contenders["deepspeed"] = ds.step
        import deepspeed

        note(f"deepspeed {deepspeed.__version__}, CPUAdam built by its op builder")
    except Exception as error:  # no DeepSpeed here, or its op did not build
        note(f"deepspeed: not compared ({type(error).__name__}: {str(error).splitlines()[0]})")

    with torch.no_grad():
        for run in contenders.values():  # warm: state allocated, ops loaded
            run()
            run()
        times = {name: [] for name in contenders}
        for _ in range(args.rounds):  # in turns, so load changes hit all alike
            for name, run in contenders.items():
                time.sleep(IDLE_GAP_S)
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)

    ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    for name, value in ms.items():
        metric(f"cpu_adam_{name}_ms{suffix}", value, "ms")
    layer_rate = total / ms["layerwise"]
    single_rate = SINGLE_CALL_PARAMS / ms["single_call"]
    metric(f"cpu_adam_layerwise_vs_single_call{suffix}", layer_rate / single_rate, "ratio")
    if "deepspeed" in ms:
        metric(f"cpu_adam_vs_deepspeed{suffix}", ms["deepspeed"] / ms["layerwise"], "ratio")
        metric(f"cpu_adam_chunk_runs_vs_deepspeed{suffix}", ms["deepspeed"] / ms["chunk_runs"],
               "ratio")
    for kind in ("fused", "foreach"):
        metric(f"cpu_adam_vs_torch_{kind}{suffix}", ms[f"torch_{kind}"] / ms["layerwise"],
               "ratio")
    torch_best = min(ms["torch_fused"], ms["torch_foreach"])
    metric(f"cpu_adam_vs_torch_best{suffix}", torch_best / ms["layerwise"], "ratio")


def deepspeed_python():
    """The benchmark venv's python, or None with the reason printed."""
    try:
        env = dict(os.environ, SPILLWAY_PYTHON=sys.executable)  # over this interpreter
        made = subprocess.run([str(HERE / "deepspeed_env.sh")], capture_output=True, text=True,
                              timeout=1800, env=env)
    except (OSError, subprocess.TimeoutExpired) as error:
        note(f"deepspeed: no benchmark environment ({error})")
        return None
    if made.returncode != 0:
        reason = (made.stderr.strip().splitlines() or ["unknown error"])[-1]
        note(f"deepspeed: could not be installed, so it is not compared ({reason})")
        return None
    return made.stdout.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.environ.get("SPILLWAY_BENCH_BUILD_DIR",
                                                          str(HERE.parent.parent / "build-release")))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--scale", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--threads-one", type=int, help=argparse.SUPPRESS)  # a child's
    args = parser.parse_args()
    if args.threads_one is not None:
        child(args)
        return
    python = deepspeed_python() or sys.executable
    failed = False
    for threads in (int(t) for t in args.threads.split(",")):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        command = [python, __file__, "--build", args.build, "--scale", str(args.scale),
                   "--rounds", str(args.rounds), "--threads-one", str(threads)]
        failed |= subprocess.run(command, env=env).returncode != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
