#!/usr/bin/env python3
"""A Python training script on CUDA under SPILLWAY_CONF (a gpu_check.sh step).

Installs the package into this interpreter's environment the way users
install it (pip install . without build isolation, built in BUILD), then runs
tools/gpu/train_script.py
four times, each in a fresh interpreter:
  torch      plain torch, no SPILLWAY_CONF
  allocator  the script unchanged, SPILLWAY_CONF set: spillway is torch's CUDA
             allocator from interpreter start (CUDAPluggableAllocator)
  spilling   the same with spillway.manage(model) and a budget below the
             model's parameters and gradients, so chunks spill every step;
             its trace goes to spillway-report, and CUPTI's kernels are
             joined with the traced ops (memory_stats()["op_timing"])
  spilling_lru   as spilling, under policy:lru: its stall time and bytes beside
             the planned policy's
  spillway_adam  as spilling, with spillway.optim.Adam (state in chunks)
Losses and final parameters must be identical in all but the last, which
prints its losses beside them. CUPTI that cannot record here (another
profiler, no permission) is reported, not failed. Prints
`metric NAME VALUE UNIT` lines; exits 1 on a mismatch or failure, 2 without
torch >= 2.0 with CUDA and a GPU.

    python3 tools/gpu/python_train_check.py --build build-gpu --out OUT_DIR
"""
import argparse
import json
import os
import subprocess
import sys

from torch_gpu import missing_torch_gpu

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def run_script(env, extra_args):
    result = subprocess.run([sys.executable, os.path.join(HERE, "train_script.py"), *extra_args],
                            env=env, capture_output=True, text=True, timeout=240)
    sys.stderr.write(result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"python_train_check: train_script.py {' '.join(extra_args)} exited "
                         f"{result.returncode}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget", default="1GiB")
    parser.add_argument("--chunk-size", default="128MiB")
    args = parser.parse_args()

    missing = missing_torch_gpu()
    if missing:
        print(f"python_train_check: skipped: {missing}")
        return 2

    os.makedirs(args.out, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("SPILLWAY_CONF", "PYTHONPATH")}
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    build_type = ""
    with open(os.path.join(args.build, "CMakeCache.txt")) as cache:
        for line in cache:
            if line.startswith("CMAKE_BUILD_TYPE:"):
                build_type = line.split("=", 1)[1].strip()
    # In BUILD, with its build type: pip configures it again and compiles nothing new.
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                    "--disable-pip-version-check", f"--config-settings=build-dir={args.build}",
                    f"--config-settings=cmake.build-type={build_type}", REPO], env=env, check=True)

    trace = os.path.join(args.out, "python_train.trace")
    conf = f"device:cuda,chunk_size:{args.chunk_size}"
    runs = {"torch": run_script(env, []),
            "allocator": run_script({**env, "SPILLWAY_CONF": conf + ",device_budget:0.9"}, []),
            "spilling": run_script({**env, "SPILLWAY_CONF":
                                    f"{conf},device_budget:{args.budget},trace:{trace}"},
                                   ["--manage"]),
            "spilling_lru": run_script({**env, "SPILLWAY_CONF":
                                        f"{conf},device_budget:{args.budget},policy:lru"},
                                       ["--manage"]),
            "spillway_adam": run_script({**env, "SPILLWAY_CONF":
                                         f"{conf},device_budget:{args.budget}"},
                                        ["--manage", "--optimizer", "spillway"])}
    reference = runs["torch"]
    same = True
    for name, run in runs.items():
        identical = run["losses"] == reference["losses"] and run["checksum"] == reference["checksum"]
        if name != "spillway_adam":  # another optimizer: close, not identical
            same = same and identical
        print(f"{name}: losses {run['losses']}, checksum {run['checksum']!r}, "
              f"identical to torch: {identical}")
        print(f"metric python_{name}_tokens_per_s {run['tokens_per_s']:.0f} tokens/s")
        print(f"metric python_{name}_max_reserved {run['max_reserved'] / 2**20:.0f} MiB")
    for name in ("spilling", "spilling_lru"):
        figures = runs[name]["spillway"]
        print(f"{name}: {json.dumps(figures)}")
        print(f"metric python_{name}_stall {figures['stall_ns'] / 1e6:.1f} ms")
        print(f"metric python_{name}_h2d {figures['bytes_moved.h2d'] / 2**20:.0f} MiB")
        print(f"metric python_{name}_prefetches {figures['prefetches']} count")
    op_timing = runs["spilling"]["spillway"]["op_timing"]
    if op_timing["source"] == "cupti":
        print(f"metric python_cupti_ops {op_timing['ops']} ops")
        print(f"metric python_cupti_kernels {op_timing['kernels']} kernels")
        print(f"metric python_cupti_uncorrelated {op_timing['uncorrelated']} records")
        if op_timing["ops"] == 0 or op_timing["kernels"] == 0:
            print("python_train_check: CUPTI recorded, but no kernel was joined with an op")
            same = False
    else:
        print(f"python_train_check: CUPTI not used: {op_timing['reason']}")
    report = os.path.join(args.build, "bin", "spillway-report")
    html = os.path.join(args.out, "python_train_report.html")
    summary = subprocess.run([report, trace, "-o", html, "--summary"], capture_output=True,
                             text=True)
    print(summary.stdout)
    if summary.returncode != 0:
        print(f"python_train_check: spillway-report failed: {summary.stderr}")
        return 1
    os.remove(trace)  # the report keeps what matters; $OUT returns few files
    print(f"losses identical across runs: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
