"""The Python checks of tools/gpu_check.sh (tools/gpu/), rehearsed without a GPU.

test_rehearsal_*: each check passes with --rehearse (the simulated device, a
small model), run by this virtual environment's interpreter: the package is
pip-installed in it (the ctest fixture python_install) and its user site is
disabled, as on the GPU image.

test_put_back_*: each bug that issue 19 found in the Python checks, put back
into a copy of tools/gpu/ (or run as gpu_check.sh would have run it), makes
the rehearsal fail, for the reason named in its output, not another one:
  - pluggable_allocator_check.py using torch in main() without importing it
  - train_script.py reading torch.cuda.max_memory_reserved() unconditionally
  - a fixed spilling budget too small for torch.optim.Adam's state and the
    activations (1 GiB on the GPU model; scaled here to the rehearsal's model)
  - install-python.sh --user into a virtual environment without a user site,
    an install that the interpreter does not see, and what followed from it:
    checks run where spillway is not importable
"""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS_GPU = os.path.join(REPO, "tools", "gpu")
BUILD = os.environ.get("SPILLWAY_BUILD_DIR", "")


def build_path(*parts):
    path = os.path.join(BUILD, *parts)
    assert os.path.exists(path), f"{path} is missing: build it first (SPILLWAY_BUILD_DIR={BUILD!r})"
    return path


def run(command, timeout=600, **kwargs):
    """Runs a check as gpu_check.sh does; (exit status, stdout and stderr)."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("SPILLWAY_CONF", "PYTHONPATH")}
    env["PYTHONUNBUFFERED"] = "1"
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL, **kwargs)
    output = result.stdout + result.stderr
    print(f"$ {' '.join(command)}\nexit {result.returncode}\n{output[-4000:]}")
    return result.returncode, output


def copy_of_tools_gpu(tmp_path):
    target = tmp_path / "gpu"
    shutil.copytree(TOOLS_GPU, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def put_back(path, old, new):
    """Replaces `old` (which must occur exactly once) with `new` in a copied script."""
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} no longer holds {old!r}: update this test"
    path.write_text(text.replace(old, new))


def pluggable(directory, *extra):
    return run([sys.executable, str(directory / "pluggable_allocator_check.py"),
                "--lib", build_path("allocator", "libspillway.so"), "--rehearse", *extra])


def python_train(directory, out, python=sys.executable):
    return run([python, str(directory / "python_train_check.py"), "--build", BUILD,
                "--out", str(out), "--rehearse"])


@pytest.fixture(scope="module")
def venv_without_spillway(tmp_path_factory):
    """A virtual environment without system site packages (so without a user
    site) that sees torch through a .pth line but has no spillway: where
    `install-python.sh --user` would have left the GPU image's."""
    import torch
    venv = tmp_path_factory.mktemp("venv") / "no-spillway"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv",
                    "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    torch_site = os.path.dirname(os.path.dirname(torch.__file__))
    with open(os.path.join(site, "00-torch.pth"), "w") as pth:
        pth.write(torch_site + "\n")
    probe = subprocess.run([python, "-c", "import site, torch; print(site.ENABLE_USER_SITE)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "False"
    return python


def test_rehearsal_pluggable_allocator_check_passes():
    status, output = pluggable(pathlib.Path(TOOLS_GPU))
    assert status == 0
    assert "losses identical: yes" in output
    assert "metric pluggable_step_time_vs_native" in output
    assert '"allocation.all.allocated": 1' in output  # the round trip through the C ABI


def test_rehearsal_torch_cuda_api_check_passes():
    status, output = run([sys.executable, os.path.join(TOOLS_GPU, "torch_cuda_api_check.py"),
                          "--build", BUILD, "--rehearse"])
    assert status == 0
    assert "FAIL" not in output
    assert "ok rehearsal: use_as_torch_cuda_allocator refuses the simulated device" in output
    assert "not checked (needs a GPU): out of memory" in output


def test_record_snapshots_dry_run_trains_every_workload(tmp_path):
    """tools/gpu/record_snapshots.py's workloads run (on the CPU, tiny); without
    a GPU a real recording says so and exits 2, writing nothing."""
    script = os.path.join(TOOLS_GPU, "record_snapshots.py")
    status, output = run([sys.executable, script, "--dry-run"])
    assert status == 0
    for name in ("gpt2_small_sdpa", "long_context_eager"):
        assert f"record_snapshots: dry run: {name} trained on the CPU" in output
    status, output = run([sys.executable, script, "--out", str(tmp_path / "out")])
    assert status == 2, output
    assert "no usable CUDA device" in output
    assert not (tmp_path / "out").exists()


def test_rehearsal_python_train_check_passes(tmp_path):
    status, output = python_train(pathlib.Path(TOOLS_GPU), tmp_path)
    assert status == 0
    assert "python_train_check: spilling budget" in output
    lines = output.splitlines()
    for name in ("torch", "allocator", "managed", "spilling", "spilling_lru"):
        assert any(line.startswith(f"{name}: losses") and line.endswith("identical to torch: True")
                   for line in lines), f"no identical losses for the {name} run"
    assert "metric python_spilling_evictions" in output
    assert "losses identical across runs: True" in output
    assert os.path.exists(tmp_path / "python_train_report.html")


def test_put_back_pluggable_allocator_check_without_the_torch_import(tmp_path):
    directory = copy_of_tools_gpu(tmp_path)
    put_back(directory / "pluggable_allocator_check.py",
             "    import torch  # for the summary line: importable, missing_torch_gpu() checked\n", "")
    status, output = pluggable(directory, "--steps", "2")
    assert status != 0
    assert "NameError: name 'torch' is not defined" in output


def test_put_back_train_script_reading_torch_peak_unconditionally(tmp_path):
    directory = copy_of_tools_gpu(tmp_path)
    put_back(directory / "train_script.py",
             "max_reserved, max_reserved_from = reserved_peak(device, stats)",
             'max_reserved, max_reserved_from = torch.cuda.max_memory_reserved(), "torch"')
    status, output = python_train(directory, tmp_path / "out")
    assert status == 1
    # On a GPU under a bare CUDAPluggableAllocator this raises; here it is a 0.
    assert "the torch run reported 0 bytes as its peak reserved memory" in output


def test_put_back_fixed_budget_too_small(tmp_path):
    directory = copy_of_tools_gpu(tmp_path)
    # The old 1 GiB held no more than torch.optim.Adam's state of the GPU model;
    # the rehearsal model's Adam state is 8 MiB.
    put_back(directory / "python_train_check.py",
             "budget = args.budget or spilling_budget(runs, args.chunk_size)",
             "budget = 8 << 20")
    status, output = python_train(directory, tmp_path / "out")
    assert status == 1
    assert "the spilling run" in output
    assert "OutOfMemoryError: spillway: out of memory" in output


def install_python(python, *pip_args):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHON"] = python
    result = subprocess.run(["bash", os.path.join(REPO, "tools", "install-python.sh"), *pip_args],
                            env=env, capture_output=True, text=True, timeout=300)
    print(f"install-python.sh {' '.join(pip_args)}: exit {result.returncode}\n"
          f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return result


def test_put_back_install_python_user_into_a_venv_without_user_site(venv_without_spillway):
    result = install_python(venv_without_spillway, "--user", f"--config-settings=build-dir={BUILD}")
    assert result.returncode != 0
    assert "install-python.sh: refusing --user" in result.stderr
    assert "Can not perform a '--user' install" not in result.stderr  # pip's own refusal: not reached


def test_put_back_install_python_verifies_the_install(venv_without_spillway):
    # A pip that installs nothing (--dry-run) stands for one that installs
    # where the interpreter does not read: the check after pip catches it.
    result = install_python(venv_without_spillway, "--dry-run")
    assert result.returncode != 0
    assert "Would install spillway" in result.stdout  # pip ran, and succeeded
    assert "cannot import spillway" in result.stdout


def test_put_back_checks_where_spillway_is_not_importable(tmp_path, venv_without_spillway):
    # Each check says so at its start ...
    for script, args in (("python_train_check.py", ["--build", BUILD, "--out", str(tmp_path)]),
                         ("torch_cuda_api_check.py", ["--build", BUILD]),):
        status, output = run([venv_without_spillway, os.path.join(TOOLS_GPU, script), "--rehearse",
                              *args])
        assert status == 1
        assert "cannot import spillway" in output
    # ... and without that check, the SPILLWAY_CONF run cannot pass as plain torch.
    directory = copy_of_tools_gpu(tmp_path)
    put_back(directory / "python_train_check.py", "where, why = installed_spillway()",
             'where, why = "(not checked)", None')
    status, output = python_train(directory, tmp_path / "out", python=venv_without_spillway)
    assert status == 1
    assert ("the allocator run has SPILLWAY_CONF set but spillway was not active in it" in output)
