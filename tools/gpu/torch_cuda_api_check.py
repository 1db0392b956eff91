#!/usr/bin/env python3
"""torch's CUDA memory functions with spillway as torch's CUDA allocator.

Installs spillway as torch's CUDA allocator from the package installed in
this interpreter's environment (tools/gpu_check.sh installs it first, step
python_install; installed_spillway.py checks it is there):
spillway.use_as_torch_cuda_allocator, the bridge's TorchCudaAllocator, as the
SPILLWAY_CONF start-up hook does. Asserts that each function scripts call
answers from spillway instead of raising, as they do under a plain
torch.cuda.memory.CUDAPluggableAllocator:
  torch.cuda.memory_stats, memory_allocated, max_memory_allocated,
  memory_reserved, reset_peak_memory_stats, empty_cache, Tensor.record_stream,
plus a 0-byte tensor, and a tensor over the budget raising
torch.cuda.OutOfMemoryError with spillway's figures, after which allocation
goes on; last, data parallel over a 1-rank NCCL group (Note [The device
collectives take] in hooks/torch/collective_wait.cc): every collective of a
training step through NCCL on this GPU, the result bit-identical to the same
steps without the group. Prints one `ok NAME` or `FAIL NAME: why` line each.

    python3 tools/gpu/torch_cuda_api_check.py --build build-gpu [--rehearse]

Exits 0 when all pass, 1 when one fails, 2 (saying why) without torch >= 2.0
with CUDA and a GPU.

--rehearse (no GPU; exits 0 or 1, never 2) checks only what needs no CUDA:
the arguments, that spillway is installed here and exposes
use_as_torch_cuda_allocator and memory_stats, that the GPU run's
configuration parses, that memory_stats() has every key the checks compare
once spillway is active (on the simulated device), and that
use_as_torch_cuda_allocator refuses the simulated device with its error. It
prints `not checked (needs a GPU): NAME` for each check above: none of them
ran.
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile
import traceback

from installed_spillway import installed_spillway
from torch_gpu import missing_torch_gpu

MiB = 1 << 20

CHECK_NAMES = ("empty tensor", "memory_allocated", "memory_stats", "memory_reserved",
               "max_memory_allocated", "reset_peak_memory_stats", "empty_cache", "record_stream",
               "out of memory", "allocation after out of memory", "nccl data parallel, 1 rank",
               "dist:env makes an nccl group, 1 rank")
# spillway's figures that torch.cuda.memory_stats() must repeat.
COMPARED_KEYS = ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                 "reserved_bytes.all.current", "segment.all.current", "allocation.all.current",
                 "num_ooms")


def cuda_bytes(torch, count):
    return torch.empty(count, dtype=torch.uint8, device="cuda")


def check_all(torch, spillway, budget):
    """Yields (name, None) for a pass, (name, why) for a failure."""

    def figure(key):
        return spillway.memory_stats()[key]

    # CHECK_NAMES lists these names in this order.
    empty = cuda_bytes(torch, 0)
    yield "empty tensor", None if empty.numel() == 0 else f"numel {empty.numel()}"

    held = cuda_bytes(torch, 4 * MiB)
    allocated = torch.cuda.memory_allocated()
    ours = figure("allocated_bytes.all.current")
    yield "memory_allocated", (None if allocated == ours and allocated >= 4 * MiB
                               else f"torch {allocated}, spillway {ours}")
    stats = torch.cuda.memory_stats()
    mismatched = [key for key in COMPARED_KEYS if stats.get(key) != figure(key)]
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
    yield "nccl data parallel, 1 rank", nccl_one_rank(torch, spillway)
    yield "dist:env makes an nccl group, 1 rank", dist_env_one_rank(torch, budget)


def nccl_one_rank(torch, spillway):
    """None when three SGD steps of a managed model with every data parallel
    collective on a 1-rank NCCL group (gathers, the reduce-scatter reduction,
    the flags' all-reduce) equal bit for bit the same steps without the
    group, plain and with the last layer under a reentrant activation
    checkpoint (a backward nested in backward, reducing on the device
    thread); else why not."""
    import torch.distributed as dist
    if not dist.is_nccl_available():
        return "this torch has no NCCL"
    device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=device)
    group = dist.distributed_c10d._get_default_group()
    try:
        def train(with_group, checkpointed):
            model = small_model(torch, device)
            spillway.manage(model)  # a 1-rank group is one manage() skips: set it directly
            if with_group:
                spillway._C.set_process_group(group)
            values = train_three_sgd_steps(torch, spillway, model, reduce=with_group,
                                           checkpointed=checkpointed)
            spillway._C.set_process_group(None)
            spillway.unmanage(model)
            return values

        for checkpointed in (False, True):
            expected = train(False, checkpointed)
            before = spillway.data_parallel_traffic()["collectives"]
            got = train(True, checkpointed)
            ran = spillway.data_parallel_traffic()["collectives"] - before
            how = "under a reentrant checkpoint" if checkpointed else "plain"
            if ran < 4:
                return f"{how}: {ran} collectives ran; a join, a reduction and a gathering take more"
            differing = [i for i, (a, b) in enumerate(zip(expected, got)) if not torch.equal(a, b)]
            if differing:
                return f"{how}: parameters {differing} differ from the run without the group"
        return None
    finally:
        dist.destroy_process_group()


def small_model(torch, device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 16)).to(device)


def train_three_sgd_steps(torch, spillway, model, reduce, checkpointed=False):
    """With `checkpointed`, the ReLU and the last Linear recompute in a
    backward of their own (use_reentrant=True), nested in the outer one."""
    from torch.utils.checkpoint import checkpoint
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(32, 256, device=next(model.parameters()).device)
    for _ in range(3):
        optimizer.zero_grad()
        hidden = model[0](x)
        out = checkpoint(model[1:], hidden, use_reentrant=True) if checkpointed else \
            model[1:](hidden)
        out.square().mean().backward()
        if reduce:  # the optimizer's hook reduces only for 2 ranks or more
            spillway._C.reduce_gradients(list(model.parameters()))
        optimizer.step()
    return [p.detach().cpu().clone() for p in model.parameters()]


# A process of its own: dist:env is read when the runtime is configured.
DIST_ENV_RANK = """
import sys
import torch
import spillway
sys.path.insert(0, sys.argv[3])
from torch_cuda_api_check import small_model, train_three_sgd_steps
spillway.enable(sys.argv[1])
torch.set_num_threads(1)  # on the CPU (the rehearsal), bit for bit with the parent's run
device = torch.device("cuda", torch.cuda.current_device()) if "device:cuda" in sys.argv[1] else \
    torch.device("cpu")
model = small_model(torch, device)
spillway.manage(model)  # joins the group RANK, WORLD_SIZE and MASTER_* describe
values = train_three_sgd_steps(torch, spillway, model, reduce=True)
torch.save({"values": values, "backend": spillway._C._data_parallel_backend(),
            "collectives": spillway.data_parallel_traffic()["collectives"]}, sys.argv[2])
"""


def dist_env_one_rank(torch, budget, device_kind="cuda"):
    """None when a process configured with dist:env on the GPU joins an NCCL
    group from torchrun's variables (one rank) and its three SGD steps equal
    bit for bit the same steps here without a group; else why not. With
    device_kind "sim" (the rehearsal): a Gloo group on the simulated device."""
    import spillway
    on_gpu = device_kind == "cuda"
    torch.set_num_threads(1)
    model = small_model(torch, torch.device("cuda", torch.cuda.current_device()) if on_gpu else
                        torch.device("cpu"))
    spillway.manage(model)
    expected = train_three_sgd_steps(torch, spillway, model, reduce=False)
    spillway.unmanage(model)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    with tempfile.TemporaryDirectory() as folder:
        result = os.path.join(folder, "rank0.pt")
        conf = f"device:{device_kind},device_budget:{budget // MiB}MiB,dist:env,log:warn"
        run = subprocess.run([sys.executable, "-c", DIST_ENV_RANK, conf, result,
                              os.path.dirname(os.path.abspath(__file__))],
                             env=env, capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            return f"the rank exited with {run.returncode}: {(run.stdout + run.stderr)[-2000:]}"
        got = torch.load(result)
    backend = "nccl" if on_gpu else "gloo"
    if got["backend"] != backend:
        return f"dist:env made a {got['backend']!r} group, not a {backend} one"
    if got["collectives"] < 4:
        return f"{got['collectives']} collectives ran; a join, a reduction and a gathering take more"
    differing = [i for i, (a, b) in enumerate(zip(expected, got["values"])) if not torch.equal(a, b)]
    return None if not differing else f"parameters {differing} differ from the run without it"


def gpu_conf(budget_mib):
    return f"device:cuda,device_budget:{budget_mib}MiB,log:warn"


def names_checked_on_a_gpu():
    """The names check_all yields, read from its source: what the rehearsal
    says it did not check must be all of them."""
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(check_all))
    yields = sorted((node.lineno, node.value.elts[0].value) for node in ast.walk(tree)
                    if isinstance(node, ast.Yield) and isinstance(node.value, ast.Tuple)
                    and isinstance(node.value.elts[0], ast.Constant))
    return tuple(dict.fromkeys(name for _, name in yields))


def rehearse(spillway, budget_mib):
    """What needs no CUDA, as (name, None) for a pass, (name, why) for a failure."""
    names = names_checked_on_a_gpu()
    yield "CHECK_NAMES lists every GPU check", (
        None if names == CHECK_NAMES else f"check_all yields {names}")
    missing = [name for name in ("use_as_torch_cuda_allocator", "memory_stats", "enable",
                                 "manage", "unmanage", "data_parallel_traffic")
               if not callable(getattr(spillway, name, None))]
    missing += [f"_C.{name}" for name in ("set_process_group", "reduce_gradients")
                if not callable(getattr(spillway._C, name, None))]
    yield "package exposes the entry points", (None if not missing else f"missing {missing}")
    try:
        device = spillway._C.checked_device(gpu_conf(budget_mib))
        yield "the GPU run's configuration parses", None if device == "cuda" else f"device {device}"
    except ValueError as error:
        yield "the GPU run's configuration parses", str(error)
    spillway.enable(f"device:sim,device_budget:{budget_mib}MiB,log:warn")
    import torch
    held = torch.empty(MiB, dtype=torch.uint8)  # carved from the simulated device
    stats = spillway.memory_stats()
    absent = [key for key in COMPARED_KEYS if key not in stats]
    yield "memory_stats has the compared keys", (None if not absent else f"missing {absent}")
    yield "memory_stats counts an allocation", (
        None if stats.get("allocated_bytes.all.current", 0) >= MiB else
        f"allocated_bytes.all.current {stats.get('allocated_bytes.all.current')} with 1 MiB held")
    del held
    yield "dist:env's rank script joins a gloo group on the simulated device", dist_env_one_rank(
        torch, budget_mib * MiB, device_kind="sim")
    try:
        spillway.use_as_torch_cuda_allocator()
        yield "use_as_torch_cuda_allocator refuses the simulated device", "it did not raise"
    except RuntimeError as error:
        expected = "needs device:cuda" if spillway._C.has_torch_cuda_allocator else "no torch CUDA"
        yield "use_as_torch_cuda_allocator refuses the simulated device", (
            None if expected in str(error) else f"unexpected error: {error}")


def report(checks, prefix=""):
    """Prints a line per check; the number that failed."""
    failures = 0
    last = "the start"
    try:
        for name, why in checks:
            last = name
            if why is None:
                print(f"ok {prefix}{name}")
            else:
                failures += 1
                print(f"FAIL {prefix}{name}: {why}")
    except Exception as error:  # the rest cannot run; say where it stopped, and from where
        failures += 1
        print(f"FAIL after {last}: {type(error).__name__}: {error}")
        print("".join("  | " + line for line in traceback.format_exc().splitlines(True)), end="")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", help="the build folder (unused: the package checked is the "
                                        "one installed in this interpreter's environment)")
    parser.add_argument("--budget-mib", type=int, default=512)
    parser.add_argument("--nccl-only", action="store_true",
                        help="run only the 1-rank NCCL check (to debug it under a debugger)")
    parser.add_argument("--rehearse", action="store_true",
                        help="no GPU: check only what needs no CUDA, say what was not checked")
    args = parser.parse_args()

    if not args.rehearse:
        missing = missing_torch_gpu()
        if missing:
            print(f"torch_cuda_api_check: skipped: {missing}")
            return 2
    where, why = installed_spillway()
    if why:
        print(f"torch_cuda_api_check: {why}")
        return 1
    print(f"torch_cuda_api_check: spillway is installed in this interpreter's environment: {where}")
    import torch
    import spillway

    imported = os.path.dirname(os.path.realpath(spillway.__file__))
    if imported != where:
        print(f"torch_cuda_api_check: this process imports spillway from {imported}, not the one "
              f"installed in its environment ({where}): unset PYTHONPATH")
        return 1
    if args.rehearse:
        failures = report(rehearse(spillway, args.budget_mib), "rehearsal: ")
        for name in CHECK_NAMES:
            print(f"not checked (needs a GPU): {name}")
        print(f"torch_cuda_api_check: rehearsal: {failures} of the checks that need no GPU failed; "
              f"the {len(CHECK_NAMES)} checks of torch's CUDA functions did not run" if failures else
              f"torch_cuda_api_check: rehearsal: the checks that need no GPU passed; the "
              f"{len(CHECK_NAMES)} checks of torch's CUDA functions did not run (no GPU)")
        return 1 if failures else 0

    budget = args.budget_mib * MiB
    spillway.enable(gpu_conf(args.budget_mib))
    spillway.use_as_torch_cuda_allocator()
    failures = report(check_all(torch, spillway, budget) if not args.nccl_only else
                      ((name, nccl_one_rank(torch, spillway)) for name in CHECK_NAMES[-1:]))
    print(f"torch_cuda_api_check: {failures} of the checks failed" if failures else
          "torch_cuda_api_check: all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
