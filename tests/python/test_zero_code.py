"""manage:auto (Note [Adopting models without being told], spillway/_auto.py):
unchanged training scripts (zero_code/, none imports spillway) run plain and
with SPILLWAY_CONF, and print the same losses and final values, bit for bit,
while their model data spills.

The budget applies from the first forward on (Note [Adopting models without
being told]: a model is built in ordinary memory and adopted at its first
forward or optimizer, so building one larger than the budget is not possible
yet). Each script runs three times, each in a new interpreter:
1. plain torch;
2. under SPILLWAY_CONF with room for everything, which measures what the
   script's chunks hold (chunk_bytes.tensors: parameters, gradients,
   buffers) and the peak of everything else torch allocates on the device
   (activations, a torch optimizer's state: allocated_bytes.non_model.peak)
   from the first forward on;
3. under a device budget of that peak plus room for a third of the chunk
   bytes (or for the chunks one op needs at once, if more), with strict
   residency: evicted chunks point at inaccessible memory.
"""

import json
import os
import subprocess
import sys

import pytest

SCRIPTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zero_code")
CHUNK = 2 << 20
BASE_CONF = "device:sim,strict_residency:true,chunk_size:2MiB,sim_capacity:512MiB"
ROOMY_BUDGET = 400 << 20

# Runs a script as `python script.py` would, then writes spillway's figures
# (when it is active) to the file the environment names.
RUNNER = """
import json, os, runpy, sys
import torch
script = sys.argv[1]
sys.path.insert(0, os.path.dirname(script))
if os.environ.get("SPILLWAY_CONF") is not None:
    def at_first_forward(module, args):
        handle.remove()
        import spillway
        spillway._C._reset_peak_stats()
        if "ZERO_CODE_BUDGET" in os.environ:
            spillway._C._set_device_budget(int(os.environ["ZERO_CODE_BUDGET"]))
    handle = torch.nn.modules.module.register_module_forward_pre_hook(at_first_forward)
names = runpy.run_path(script, run_name="__main__")  # alive: the stats see its models
if os.environ.get("SPILLWAY_CONF") is not None:
    import spillway
    with open(os.environ["ZERO_CODE_STATS"], "w") as stats:
        json.dump(spillway.memory_stats(), stats)
"""

TRAINING_SCRIPTS = ["mlp_adam", "tied_gpt", "lora", "cnn_batchnorm", "actor_critic",
                    "grad_accumulation", "set_to_none", "double_after_construction",
                    "bare_parameter", "skipped_branch", "checkpoint_resume", "whole_module_save"]


def run_script(name, conf, tmp_path, budget=None):
    """(completed process, memory_stats() or None) of zero_code/<name>.py;
    `budget` is the device budget from the first forward on."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "SPILLWAY_CONF")}
    env["OMP_NUM_THREADS"] = "1"  # one thread count for both runs
    stats_path = tmp_path / f"{name}.{'plain' if conf is None else 'spillway'}.json"
    env["ZERO_CODE_STATS"] = str(stats_path)
    if conf is not None:
        env["SPILLWAY_CONF"] = conf
    if budget is not None:
        env["ZERO_CODE_BUDGET"] = str(budget)
    script = os.path.join(SCRIPTS_DIR, f"{name}.py")
    result = subprocess.run([sys.executable, "-c", RUNNER, script], env=env, capture_output=True,
                            text=True, timeout=600)
    stats = json.loads(stats_path.read_text()) if conf is not None and stats_path.exists() else None
    return result, stats


def budget_for(measured):
    """The non-model peak, in whole slabs, plus room for a third of the chunk
    bytes, in whole chunks, or for what one op needs at once and a chunk, if
    that is more (min_budget_bytes: a tensor larger than a chunk has a chunk
    of its own)."""
    model = measured["chunk_bytes.tensors"]
    # A chunk more than one op needs: a budget at the exact minimum fails on
    # the fragmentation of a few MiB.
    room = max(model // 3, measured["min_budget_bytes"] + CHUNK)
    room = -(-room // CHUNK) * CHUNK
    non_model = -(-measured["allocated_bytes.non_model.peak"] // CHUNK) * CHUNK
    return non_model + room, room


@pytest.mark.parametrize("name", TRAINING_SCRIPTS)
def test_an_unchanged_script_trains_bit_identically_while_spilled(name, tmp_path):
    plain, _ = run_script(name, None, tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert "step 0 loss" in plain.stdout

    roomy, measured = run_script(name, f"{BASE_CONF},device_budget:{ROOMY_BUDGET}B", tmp_path)
    assert roomy.returncode == 0, roomy.stderr
    assert roomy.stdout == plain.stdout
    # The script's model data went into chunks without being named.
    assert measured["chunk_bytes.tensors"] > 0, measured
    clients = measured["clients"]
    assert clients, measured

    budget, room = budget_for(measured)
    spilled, stats = run_script(name, f"{BASE_CONF},device_budget:{ROOMY_BUDGET}B", tmp_path,
                                budget)
    assert spilled.returncode == 0, spilled.stderr
    assert spilled.stdout == plain.stdout
    # A real spill: the chunks had room for at most about a third of themselves.
    assert stats["chunk_bytes.tensors"] == measured["chunk_bytes.tensors"]
    assert room <= stats["chunk_bytes.tensors"] / 2, (room, stats)
    assert stats["evictions"] > 0, stats
    assert stats["num_budget_overruns"] == 0, stats
    assert stats["policy"]["planned_steps"] > 0, stats["policy"]


def clients_of(name, tmp_path):
    roomy, stats = run_script(name, f"{BASE_CONF},device_budget:{ROOMY_BUDGET}B", tmp_path)
    assert roomy.returncode == 0, roomy.stderr
    return stats["clients"]


def test_each_root_module_is_one_client_named_after_its_class(tmp_path):
    assert sorted(clients_of("actor_critic", tmp_path)) == ["Sequential#0", "Sequential#1"]
    assert sorted(clients_of("tied_gpt", tmp_path)) == ["TinyGPT#0"]
    # A module loaded whole by torch.load registers nothing; it is still a root.
    assert sorted(clients_of("whole_module_save", tmp_path)) == ["Sequential#0", "Sequential#1"]


def test_a_parameter_no_module_owns_is_managed_in_a_client_of_the_optimizer(tmp_path):
    clients = clients_of("bare_parameter", tmp_path)
    assert sorted(clients) == ["Adam.params#0", "Sequential#0"]
    readout_bytes = 1024 * 16 * 4
    assert clients["Adam.params#0"]["chunk_bytes.tensors"] == 2 * readout_bytes  # and its grad


@pytest.mark.parametrize("name, kind, why", [
    ("compiled", "Sequential", "torch.compile"),
    ("ddp_bucket_view", "DistributedDataParallel", "gradient_as_bucket_view"),
])
def test_a_model_spillway_cannot_manage_is_refused_and_manage_explicit_leaves_it_to_torch(
        name, kind, why, tmp_path):
    plain, _ = run_script(name, None, tmp_path)
    assert plain.returncode == 0, plain.stderr

    refused, _ = run_script(name, BASE_CONF, tmp_path)
    assert refused.returncode != 0
    assert "step 0 loss" not in refused.stdout
    assert f"cannot manage {kind}" in refused.stderr, refused.stderr
    assert why in refused.stderr
    assert "manage:explicit" in refused.stderr

    explicit, stats = run_script(name, f"{BASE_CONF},manage:explicit", tmp_path)
    assert explicit.returncode == 0, explicit.stderr
    assert explicit.stdout == plain.stdout
    assert stats["chunk_bytes.tensors"] == 0, stats
