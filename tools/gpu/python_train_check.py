#!/usr/bin/env python3
"""A Python training script under SPILLWAY_CONF, beside plain torch (a gpu_check.sh step).

Does not install the package: tools/gpu_check.sh has (tools/install-python.sh,
its step python_install). It first checks that this interpreter imports
spillway from its own environment (installed_spillway.py), then runs
tools/gpu/train_script.py six times, each in a fresh interpreter:
  torch      plain torch, no SPILLWAY_CONF
  allocator  the script unchanged, SPILLWAY_CONF set: spillway is torch's
             allocator from interpreter start (and, under manage:auto, the
             model goes into chunks at its optimizer)
  managed    with spillway.manage(model) under a roomy budget: nothing needs
             to spill; measures what the spilling budget is derived from
  spilling   the same under the derived budget, below what the model's
             chunks take, so chunks spill every step; its trace goes to
             spillway-report, and CUPTI's kernels are joined with the traced
             ops (memory_stats()["op_timing"])
  spilling_lru   as spilling, under policy:lru: its stall time and bytes beside
             the planned policy's
  spillway_adam  as spilling, with spillway.optim.Adam (state in chunks)

Note [The spilling budget]: a fixed budget cannot fit every model and
device (1 GiB could not even hold torch.optim.Adam's 1 GiB of state beside
the activations, so spillway_malloc returned NULL). The budget is derived:
3/4 of the plain run's peak reserved bytes (on the CPU, where torch keeps no
such figure, the allocator run's peak from spillway's stats), raised to a
floor that fits the largest op's working set: the managed run's non-model
peak (activations, temporaries, torch.optim.Adam's state), plus
min_budget_bytes (the chunks one op needs at once), plus what it reserved
beyond what it allocated (fragmentation), plus one chunk. The budget must be
below what the managed run reserved with all chunks resident, or nothing
would spill: where 3/4 of the peak is not, the floor is the budget, and where
the floor is not either, the check fails. The derivation is printed.

Asserts: spillway is not active in the torch run and active in every
SPILLWAY_CONF run (so a run where the package was not importable cannot pass
as plain torch); each spilling run evicted chunks; losses and final
parameters are identical to plain torch in all but spillway_adam, which
prints its losses beside them. CUPTI that cannot record here (another
profiler, no permission) is reported, not failed. Prints `metric NAME VALUE
UNIT` lines; exits 0 when all holds, 1 on a mismatch or failure, 2 without
torch >= 2.0 with CUDA and a GPU.

--rehearse runs the same logic without a GPU: host tensors on the simulated
device (device:sim), a small model (width 512, 4 layers, 2 MiB chunks), in
seconds; it never exits 2.

    python3 tools/gpu/python_train_check.py --build build-gpu --out OUT_DIR [--rehearse]
"""
import argparse
import json
import os
import re
import subprocess
import sys

from installed_spillway import installed_spillway
from torch_gpu import missing_torch_gpu

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20

# The model on a GPU (train_script.py's defaults) and in the rehearsal.
GPU_MODEL = []
REHEARSAL_MODEL = ["--width", "512", "--layers", "4", "--batch", "4", "--sequence", "32"]


class CheckFailed(Exception):
    """A check that did not hold; its message is printed as `python_train_check: ...`."""


def parse_size(text):
    """Bytes of "128MiB", "2MiB", "1GiB" or a plain number."""
    match = re.fullmatch(r"(\d+)\s*(B|KiB|MiB|GiB)?", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"expected a size such as 128MiB, got {text!r}")
    return int(match.group(1)) << {None: 0, "B": 0, "KiB": 10, "MiB": 20, "GiB": 30}[match.group(2)]


def mib(count):
    return f"{count / MiB:.1f} MiB"


def run_script(name, env, extra_args, timeout):
    """One run of train_script.py in a fresh interpreter; its JSON result."""
    command = [sys.executable, os.path.join(HERE, "train_script.py"), *extra_args]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    sys.stderr.write(result.stderr)
    if result.returncode != 0:
        last = [line for line in result.stderr.splitlines() if line.strip()][-1:] or [""]
        raise CheckFailed(f"the {name} run (train_script.py {' '.join(extra_args)}, SPILLWAY_CONF="
                          f"{env.get('SPILLWAY_CONF', '')!r}) exited {result.returncode}: "
                          f"{last[0][:600]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def check_run(name, run, under_spillway, device):
    """What every run must show: spillway active exactly under SPILLWAY_CONF,
    and a peak reserved figure that is a figure (never 0)."""
    if under_spillway and not run["spillway_active"]:
        raise CheckFailed(f"the {name} run has SPILLWAY_CONF set but spillway was not active in it "
                          "(not imported, or it allocated nothing): it ran as plain torch")
    if not under_spillway and run["spillway_active"]:
        raise CheckFailed(f"the {name} run has no SPILLWAY_CONF but spillway was active in it")
    peak = run["max_reserved"]
    if peak is not None and peak <= 0:
        raise CheckFailed(f"the {name} run reported {peak} bytes as its peak reserved memory: "
                          "a figure of 0 is no figure (torch keeps none here)")
    if peak is None and (under_spillway or device == "cuda"):
        raise CheckFailed(f"the {name} run reported no peak reserved memory, which "
                          f"{'spillway' if under_spillway else 'torch on a GPU'} keeps")


def spilling_budget(runs, chunk_bytes):
    """Note [The spilling budget]: the budget, after printing its derivation."""
    if runs["torch"]["max_reserved"] is not None:
        peak, peak_from = runs["torch"]["max_reserved"], "the torch run's (torch's figure)"
    else:
        peak = runs["allocator"]["max_reserved"]
        peak_from = "the allocator run's (spillway's figure: plain torch keeps none on the CPU)"
    managed = runs["managed"]["spillway"]
    non_model = managed["allocated_bytes.non_model.peak"]
    op_chunks = managed["min_budget_bytes"]
    unused = managed["reserved_bytes.all.peak"] - managed["allocated_bytes.all.peak"]
    floor = non_model + op_chunks + unused + chunk_bytes
    target = peak * 3 // 4
    needed = managed["reserved_bytes.all.peak"]  # all chunks resident: nothing spills at or above
    budget = -(-max(target, floor) // MiB) * MiB
    print(f"python_train_check: spilling budget {mib(budget)}: the larger of 3/4 of {peak_from} "
          f"peak reserved {mib(peak)} = {mib(target)} and the floor {mib(floor)} = the managed "
          f"run's non-model peak {mib(non_model)} + the largest op's chunks (min_budget_bytes) "
          f"{mib(op_chunks)} + reserved beyond allocated {mib(unused)} + one chunk "
          f"{mib(chunk_bytes)}; rounded up to a MiB")
    if budget >= needed and floor < needed:
        budget = -(-floor // MiB) * MiB
        print(f"python_train_check: spilling budget {mib(budget)}, the floor: 3/4 of the peak is "
              f"not below the {mib(needed)} the managed run reserved, so nothing would spill")
    if budget >= needed:
        raise CheckFailed(f"no spilling budget: the floor {mib(floor)} is not below the "
                          f"{mib(needed)} the managed run reserved with all chunks resident (a "
                          "model too small beside its activations and optimizer state?)")
    print(f"python_train_check: the managed run reserved {mib(needed)} with all "
          f"{mib(managed['allocated_bytes.model.peak'])} of its chunks resident; the budget leaves "
          f"the chunks about {mib(budget - non_model - unused)}")
    return budget


def run_all(args, env, device, model, timeout):
    """Runs the six runs, checking each as it ends; their results by name."""
    trace = os.path.join(args.out, "python_train.trace")
    base = f"device:{'sim' if device == 'cpu' else 'cuda'},chunk_size:{args.chunk_size // MiB}MiB"
    script_args = ["--device", device, *model]
    runs = {}

    def run(name, conf, extra):
        run_env = dict(env)
        if conf is not None:
            run_env["SPILLWAY_CONF"] = conf
        runs[name] = run_script(name, run_env, script_args + extra, timeout)
        check_run(name, runs[name], conf is not None, device)
        if conf is not None and extra and runs[name]["spillway"]["allocated_bytes.model.peak"] <= 0:
            raise CheckFailed(f"the {name} run called spillway.manage(model), but no chunk was allocated")

    run("torch", None, [])
    run("allocator", f"{base},device_budget:0.9", [])
    run("managed", f"{base},device_budget:0.9", ["--manage"])
    budget = args.budget or spilling_budget(runs, args.chunk_size)
    spilling = f"{base},device_budget:{budget}B"
    run("spilling", f"{spilling},trace:{trace}", ["--manage"])
    run("spilling_lru", f"{spilling},policy:lru", ["--manage"])
    run("spillway_adam", spilling, ["--manage", "--optimizer", "spillway"])
    for name in ("spilling", "spilling_lru", "spillway_adam"):
        if runs[name]["spillway"]["evictions"] <= 0:
            raise CheckFailed(f"the {name} run evicted no chunk under the budget of {mib(budget)}: "
                              "it did not spill")
    return runs, trace


def report(runs, trace, args):
    """Prints the comparison and the metrics; whether they all hold."""
    reference = runs["torch"]
    same = True
    for name, run in runs.items():
        identical = run["losses"] == reference["losses"] and run["checksum"] == reference["checksum"]
        if name != "spillway_adam":  # another optimizer: close, not identical
            same = same and identical
        print(f"{name}: losses {run['losses']}, checksum {run['checksum']!r}, "
              f"identical to torch: {identical}")
        print(f"metric python_{name}_tokens_per_s {run['tokens_per_s']:.0f} tokens/s")
        if run["max_reserved"] is None:
            print(f"python_train_check: {name}: no peak reserved figure (torch keeps none on the CPU)")
        else:
            print(f"metric python_{name}_max_reserved {run['max_reserved'] / MiB:.0f} MiB")
    for name in ("spilling", "spilling_lru", "spillway_adam"):
        figures = runs[name]["spillway"]
        print(f"{name}: {json.dumps(figures)}")
        print(f"metric python_{name}_stall {figures['stall_ns'] / 1e6:.1f} ms")
        print(f"metric python_{name}_h2d {figures['bytes_moved.h2d'] / MiB:.0f} MiB")
        print(f"metric python_{name}_evictions {figures['evictions']} count")
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
    spillway_report = os.path.join(args.build, "bin", "spillway-report")
    html = os.path.join(args.out, "python_train_report.html")
    summary = subprocess.run([spillway_report, trace, "-o", html, "--summary"],
                             capture_output=True, text=True)
    print(summary.stdout)
    if summary.returncode != 0:
        print(f"python_train_check: spillway-report failed: {summary.stderr}")
        return False
    os.remove(trace)  # the report keeps what matters; $OUT returns few files
    print(f"losses identical across runs: {same}")
    return same


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True, help="the build folder (bin/spillway-report)")
    parser.add_argument("--out", required=True, help="where the report goes")
    parser.add_argument("--rehearse", action="store_true",
                        help="no GPU: the simulated device, a small model (never exits 2)")
    parser.add_argument("--budget", type=parse_size,
                        help="the spilling runs' device budget (default: derived from the "
                             "runs before them, printed)")
    parser.add_argument("--chunk-size", type=parse_size,
                        help="chunk size (default 128MiB, rehearsal 2MiB)")
    args = parser.parse_args()

    if args.rehearse:
        device, model, timeout = "cpu", REHEARSAL_MODEL, 120
        args.chunk_size = args.chunk_size or 2 * MiB
    else:
        missing = missing_torch_gpu()
        if missing:
            print(f"python_train_check: skipped: {missing}")
            return 2
        device, model, timeout = "cuda", GPU_MODEL, 240
        args.chunk_size = args.chunk_size or 128 * MiB
    where, why = installed_spillway()
    if why:
        print(f"python_train_check: {why}")
        return 1
    print(f"python_train_check: spillway is installed in this interpreter's environment: {where}")
    spillway_report = os.path.join(args.build, "bin", "spillway-report")
    if not os.access(spillway_report, os.X_OK):
        print(f"python_train_check: {spillway_report} is missing (build spillway-report first)")
        return 1

    os.makedirs(args.out, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("SPILLWAY_CONF", "PYTHONPATH")}
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    try:
        runs, trace = run_all(args, env, device, model, timeout)
    except CheckFailed as failure:
        print(f"python_train_check: {failure}")
        return 1
    except subprocess.TimeoutExpired as expired:
        print(f"python_train_check: {' '.join(expired.cmd[1:])} ran past {expired.timeout} s")
        return 1
    return 0 if report(runs, trace, args) else 1


if __name__ == "__main__":
    sys.exit(main())
