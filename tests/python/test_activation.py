"""Activation at interpreter start: the package installed by `pip install .`
into the fresh virtual environment this interpreter belongs to
(install_into_fresh_venv.sh), and scripts run with SPILLWAY_CONF set."""

import os
import subprocess
import sys
import textwrap

import pytest

from spillway_testing import SPILLING_CONF, TRACE_KIND_STEP, trace_event_kinds

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A training script that knows nothing of spillway.
PLAIN_SCRIPT = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    adam = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(8, 32), torch.randn(8, 4)
    for _ in range(4):
        adam.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        adam.step()
    print(f"loss {loss.item()!r}")
""")


def run(code, conf=None, cwd=None):
    """code in a new interpreter of this environment, as a user's script runs."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "SPILLWAY_CONF")}
    if conf is not None:
        env["SPILLWAY_CONF"] = conf
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_the_package_comes_from_site_packages_not_the_source_tree():
    result = run("import sysconfig, spillway, spillway._C as c; "
                 "print(sysconfig.get_path('purelib')); print(spillway.__file__); print(c.__file__)")
    assert result.returncode == 0, result.stderr
    site_packages, package, extension = result.stdout.split()
    assert package.startswith(site_packages + os.sep)
    assert extension.startswith(site_packages + os.sep)
    assert not package.startswith(os.path.join(REPO, "python") + os.sep)


def test_without_spillway_conf_the_hook_imports_nothing():
    result = run("import sys; print('spillway' in sys.modules, 'torch' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_with_spillway_conf_spillway_is_active_before_user_code():
    result = run("import spillway; print(spillway.is_enabled())", conf="device:sim")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_a_bad_spillway_conf_stops_the_interpreter_at_start_naming_the_key():
    result = run("print('user code ran')", conf="device:sim,device_budgett:1GiB")
    assert result.returncode != 0
    assert "user code ran" not in result.stdout
    assert "device_budgett" in result.stderr, result.stderr
    assert "SPILLWAY_CONF" in result.stderr


def test_an_unchanged_script_runs_under_spillway(tmp_path):
    plain = run(PLAIN_SCRIPT)
    assert plain.returncode == 0, plain.stderr
    trace = tmp_path / "run.trace"
    spilled = run(PLAIN_SCRIPT, conf=f"device:sim,trace:{trace}")
    assert spilled.returncode == 0, spilled.stderr
    assert spilled.stdout == plain.stdout  # same training result
    # spillway was there: the trace it wrote at exit has the script's 4 steps.
    assert trace_event_kinds(trace).count(TRACE_KIND_STEP) == 4


def test_a_script_that_manages_its_model_spills_under_the_environments_budget():
    code = PLAIN_SCRIPT.replace(
        "adam = torch.optim.Adam",
        "import spillway\nspillway.manage(model)\nadam = torch.optim.Adam").replace(
        "torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)",
        "torch.nn.Linear(32, 512), *(torch.nn.Linear(512, 512) for _ in range(5)), "
        "torch.nn.Linear(512, 4)") + "\nprint('evictions', spillway.memory_stats()['evictions'])\n"
    # The budget holds torch Adam's state (2 x 5.3 MiB, outside chunks, as on
    # a GPU) and the activations beside 3 chunks' room: the 11 MiB of
    # parameters and gradients still spill.
    result = run(code, conf=SPILLING_CONF.replace("device_budget:6MiB", "device_budget:22MiB"))
    assert result.returncode == 0, result.stderr
    evictions = int(result.stdout.split("evictions")[1])
    assert evictions > 0, result.stdout
