"""policy:planned end to end: the plan from a traced step, against LRU, and
a data-dependent branch that makes it diverge, fall back and retrace."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 10


def run(policy, kind):
    result = subprocess.run([sys.executable, os.path.join(HERE, "policy_run.py"), policy, kind,
                             str(STEPS)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def lru_and_planned():
    return run("lru", "mlp"), run("planned", "mlp")


def test_planned_training_is_bit_identical_and_follows_its_plan(lru_and_planned):
    _, planned = lru_and_planned
    assert planned["identical"]
    assert planned["policy"]["name"] == "planned"
    assert planned["policy"]["plans_built"] >= 1
    # The first traced step includes manage()'s own accesses, so the next one
    # departs and is traced again; the rest follow the plan.
    assert planned["policy"]["planned_steps"] >= STEPS - 4, planned["policy"]
    assert planned["policy"]["phase"] == "following"


def test_planned_moves_no_more_bytes_than_lru(lru_and_planned):
    lru, planned = lru_and_planned
    assert lru["identical"]
    assert lru["evictions"] > 0, "the budget must force spills"
    print(f"\n{STEPS} steps: planned moved {planned['h2d']} bytes h2d, {planned['d2h']} d2h; "
          f"LRU {lru['h2d']} h2d, {lru['d2h']} d2h")
    assert planned["h2d"] <= lru["h2d"]
    assert planned["h2d"] + planned["d2h"] <= lru["h2d"] + lru["d2h"]


def test_a_data_dependent_branch_is_planned_by_kind_and_stays_bit_identical():
    branchy = run("planned", "branchy")
    assert branchy["identical"]
    policy = branchy["policy"]
    # Steps 0, 4 and 7 take the detour. A step that departs from the plan is
    # traced from its start and planned from, and the plan it left is kept
    # (Note [Steps of several kinds]): from the first step of each kind on,
    # every step follows the plan of its kind, the detours included.
    assert policy["divergences"] >= 1, policy
    assert policy["plans_built"] >= 2, policy
    assert policy["planned_steps"] >= STEPS - 3, str(policy)  # 7 of 10 measured; the rest traced
    print(f"\nbranchy: {policy}")
