"""spillway.initialize as DeepSpeed's (issue 21, docs/deepspeed.md): DeepSpeed's
arguments and tuple, its configs as its documentation writes them, its numbers
(checked against DeepSpeed's own code, run by deepspeed_engine_reference.py in
the environment bench/optim/deepspeed_env.sh makes), checkpoints that resume
bit-identically, and refusals that name the key."""

import copy
import os
import pathlib
import subprocess
import tempfile

import pytest
import torch
import torch.nn.functional as F

import spillway
from spillway_testing import (SPILLING_CONF, make_mlp as make_mlp_on_device, mlp_batches,
                              parameters_copy, plain_torch)

REPO = pathlib.Path(__file__).resolve().parents[2]
VOCAB, CONTEXT, WIDTH = 512, 16, 256


# Room for the small GPT's activations and temporaries (about 5 MiB outside
# chunks) beside a few 2 MiB chunks; its model data (about 27 MiB with Adam's
# state) still spills.
BUDGET_BYTES = 14 << 20


@pytest.fixture(scope="module", autouse=True)
def spilling():
    spillway.enable(SPILLING_CONF)
    spillway._C._set_device_budget(BUDGET_BYTES)


@pytest.fixture(autouse=True)
def unmanaged_afterwards():
    """Each test's models leave the chunks, passed or failed (the next test's
    budget must not hold them)."""
    before = set(_MODELS)
    yield
    for model in [m for m in _MODELS if m not in before]:
        _MODELS.clear()


_MODELS = []


def built(factory, *args):
    """A model built in torch's own memory (the budget is smaller than some of
    them before they are chunked), handed to spillway by initialize()."""
    with plain_torch():
        model = factory(*args)
    _MODELS.append(model)
    return model


def make_mlp(seed):
    return built(make_mlp_on_device, seed)


@pytest.fixture(scope="module")
def deepspeed_python():
    """DeepSpeed's interpreter; a test that needs it fails (never skips) when
    the environment cannot be made."""
    made = subprocess.run(["bash", str(REPO / "bench/optim/deepspeed_env.sh")],
                          capture_output=True, text=True, check=False)
    assert made.returncode == 0, f"bench/optim/deepspeed_env.sh failed:\n{made.stderr}"
    return made.stdout.strip()


def deepspeed_reference(python, task, spec):
    with tempfile.TemporaryDirectory() as folder:
        source, target = os.path.join(folder, "in.pt"), os.path.join(folder, "out.pt")
        torch.save(spec, source)
        run = subprocess.run([python, str(REPO / "tests/python/deepspeed_engine_reference.py"),
                              task, source, target], capture_output=True, text=True,
                             env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), check=False)
        assert run.returncode == 0, run.stderr[-4000:]
        return torch.load(target, weights_only=False)


class TinyGPT(torch.nn.Module):
    """Token and position embeddings, two causal pre-norm blocks, an LM head
    tied to the token embedding."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.tokens = torch.nn.Embedding(VOCAB, WIDTH)
        self.positions = torch.nn.Embedding(CONTEXT, WIDTH)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(WIDTH, 4, 4 * WIDTH, dropout=0.0, norm_first=True,
                                             batch_first=True) for _ in range(2))
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, tokens):
        length = tokens.shape[1]
        x = self.tokens(tokens) + self.positions(torch.arange(length))
        mask = torch.nn.Transformer.generate_square_subsequent_mask(length)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


def gpt_batches(seed, steps, batch=4):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (batch, CONTEXT + 1), generator=generator)
            for _ in range(steps)]


def gpt_loss(logits, tokens):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


# As DeepSpeed's documentation writes them (docs/deepspeed.md), with spillway's
# budget left to SPILLWAY_CONF (here: the spilling test configuration).
DOCUMENTED_CONFIGS = {
    "bf16_warmup_zero3_offload": {
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95],
                                                  "eps": 1e-8, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4,
                                                     "warmup_num_steps": 4}},
        "bf16": {"enabled": True},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu",
                                                                "pin_memory": True},
                              "offload_param": {"device": "cpu", "pin_memory": True},
                              "overlap_comm": True, "contiguous_gradients": True,
                              "stage3_prefetch_bucket_size": "auto"},
        "steps_per_print": 2, "wall_clock_breakdown": False,
    },
    "fp16_dynamic_warmup_decay": {
        "train_batch_size": 4,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0,
                                                          "warmup_max_lr": 1e-3,
                                                          "warmup_num_steps": 2,
                                                          "total_num_steps": 10}},
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                 "loss_scale_window": 1000, "hysteresis": 2, "consecutive_hysteresis": False,
                 "min_loss_scale": 1},
    },
    "adamw_clipping_accumulation": {
        "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
        "gradient_clipping": 0.5,
    },
    "sgd_one_cycle": {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9}},
        "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2,
                                                     "cycle_first_step_size": 3,
                                                     "cycle_momentum": False}},
    },
    "minimal": {"train_batch_size": 4, "optimizer": {"type": "Adam"}},
}


@pytest.mark.parametrize("name", sorted(DOCUMENTED_CONFIGS))
def test_documented_configs_train_a_small_gpt_while_spilling(name):
    config = copy.deepcopy(DOCUMENTED_CONFIGS[name])
    model = built(TinyGPT, 1)
    before = spillway.memory_stats()["evictions"]
    engine, optimizer, loader, scheduler = spillway.initialize(
        model=model, model_parameters=model.parameters(), config=config)
    assert engine.module is model and engine.optimizer is optimizer and loader is None
    assert (scheduler is not None) == ("scheduler" in config)
    fp16 = config.get("fp16", {}).get("enabled", False)
    losses = []
    for tokens in gpt_batches(2, 12 * engine.gradient_accumulation_steps()):
        loss = gpt_loss(engine(tokens[:, :-1]), tokens)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    assert engine.global_steps == 12
    assert spillway.memory_stats()["evictions"] > before, "the budget did not spill"
    if not fp16:  # fp16 spends its first steps finding a scale
        assert min(losses[-4:]) < losses[0], losses
    assert engine.skipped_steps < engine.global_steps


def _train_tiny(engine, batches):
    for x, y in batches:
        engine.backward(F.mse_loss(engine(x), y))
        engine.step()


@pytest.mark.parametrize("block", [
    {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3,
                                    "warmup_num_steps": 5, "warmup_type": "linear"}},
    {"type": "WarmupCosineLR", "params": {"total_num_steps": 8, "warmup_num_steps": 3}},
], ids=["WarmupLR", "WarmupCosineLR"])
def test_a_scheduled_clipped_run_is_bit_identical_to_deepspeeds_scheduler_driving_torch(
        deepspeed_python, block):
    model = make_mlp(seed=7)
    plain = copy.deepcopy(model)
    batches = mlp_batches(3, 8)
    options = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    clipping = 0.05  # below the MLP's gradient norms: every step is clipped
    reference = deepspeed_reference(deepspeed_python, "train", {
        "model": plain, "batches": batches, "kind": "AdamW", "options": options,
        "scheduler": block, "gradient_clipping": clipping})
    engine, _, _, scheduler = spillway.initialize(model=model, config={
        "optimizer": {"type": "AdamW", "params": {**options, "betas": list(options["betas"])}},
        "scheduler": block, "gradient_clipping": clipping})
    lrs, norms = [], []
    for x, y in batches:
        engine.backward(F.mse_loss(engine(x), y))
        lrs.append(engine.get_lr()[0])
        engine.step()
        norms.append(engine.get_global_grad_norm())
    assert lrs == reference["lrs"]
    assert norms == reference["norms"] and min(norms) > clipping
    for mine, theirs in zip(parameters_copy(model), reference["params"]):
        assert torch.equal(mine, theirs)
    assert scheduler.state_dict() == {"last_batch_iteration": len(batches) - 1}


def test_the_lr_at_every_step_equals_deepspeeds_for_each_scheduler_type(deepspeed_python):
    blocks = [
        {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 50}},
        {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 30,
                                             "total_num_steps": 150}},
        {"type": "WarmupCosineLR", "params": {"total_num_steps": 180, "warmup_num_steps": 20,
                                              "warmup_min_ratio": 0.1}},
        {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-2,
                                        "cycle_first_step_size": 40, "decay_step_size": 10,
                                        "decay_lr_rate": 0.1, "cycle_min_mom": 0.85,
                                        "cycle_max_mom": 0.95}},
        {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-4,
                                           "lr_range_test_step_size": 16,
                                           "lr_range_test_staircase": True}},
    ]
    steps = 200
    options = {"lr": 0.02, "betas": (0.9, 0.999)}
    reference = deepspeed_reference(deepspeed_python, "lrs", {
        "schedulers": blocks, "kind": "Adam", "options": options, "steps": steps})
    for block, expected in zip(blocks, reference["sequences"]):
        model = built(torch.nn.Linear, 4, 1)
        engine, optimizer, _, _ = spillway.initialize(model=model, config={
            "optimizer": {"type": "Adam", "params": {"lr": 0.02, "adam_w_mode": False}},
            "scheduler": block})
        got = []
        batch = (torch.ones(2, 4), torch.zeros(2, 1))
        for _ in range(steps):
            group = optimizer.param_groups[0]
            got.append((engine.get_lr()[0], list(group["betas"])))
            _train_tiny(engine, [batch])
        assert got == expected, block["type"]
    

class Elementwise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1024))

    def forward(self, x):
        return self.weight * x


def test_the_loss_scale_and_skipped_steps_follow_deepspeeds_dynamic_loss_scaler(
        deepspeed_python):
    overflows = [False, True, False, True, True, True, False, False, False, True] + [False] * 10
    fp16 = {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 3, "hysteresis": 2,
            "consecutive_hysteresis": False, "min_loss_scale": 1}
    reference = deepspeed_reference(deepspeed_python, "scaler", {
        "init_scale": 2.0 ** 12, "scale_window": 3, "min_scale": 1, "delayed_shift": 2,
        "consecutive_hysteresis": False, "overflows": overflows})
    model = built(Elementwise)
    engine, _, _, _ = spillway.initialize(model=model, config={
        "optimizer": {"type": "SGD", "params": {"lr": 1e-3}}, "fp16": fp16,
        "zero_optimization": {"stage": 2}})  # ZeRO: DynamicLossScaler's rule
    x = torch.full((1024,), 0.5, dtype=torch.half)
    scales, applied = [], []
    for overflow in overflows:
        loss = engine(x).float().sum() * (float("inf") if overflow else 1.0)
        scales.append(engine.loss_scale)
        engine.backward(loss)
        engine.step()
        applied.append(engine.was_step_applied())
    assert scales == reference["scales"]
    assert applied == [not o for o in overflows]
    assert engine.skipped_steps == sum(overflows)
    assert engine.global_steps == len(overflows)  # DeepSpeed counts skipped steps too


def test_save_then_load_checkpoint_resumes_bit_identically(tmp_path):
    config = {"train_micro_batch_size_per_gpu": 16,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3,
                                                           "warmup_num_steps": 6}},
              "gradient_accumulation_steps": 2}
    batches = mlp_batches(5, 16)
    model = make_mlp(seed=3)
    engine, _, _, _ = spillway.initialize(model=model, config=config)
    _train_tiny(engine, batches[:6])
    assert engine.save_checkpoint(str(tmp_path), client_state={"epoch": 3})
    assert (tmp_path / "latest").read_text() == "global_step3"
    assert (tmp_path / "global_step3" / "mp_rank_00_model_states.pt").is_file()
    _train_tiny(engine, batches[6:])
    expected = parameters_copy(model)
    expected_lr, expected_steps = engine.get_lr(), engine.global_steps

    resumed = make_mlp(seed=99)  # other values: everything must come from the checkpoint
    engine, optimizer, _, scheduler = spillway.initialize(model=resumed, config=config)
    path, client_state = engine.load_checkpoint(str(tmp_path))
    assert path.endswith("mp_rank_00_model_states.pt") and client_state == {"epoch": 3}
    assert engine.global_steps == 3 and scheduler.last_batch_iteration == 2
    _train_tiny(engine, batches[6:])
    assert engine.get_lr() == expected_lr and engine.global_steps == expected_steps
    for mine, theirs in zip(parameters_copy(resumed), expected):
        assert torch.equal(mine, theirs)


def test_a_zero_stage_writes_the_optimizer_apart_and_loads_it_back(tmp_path):
    config = {"optimizer": {"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9}},
              "zero_optimization": {"stage": 1}}
    model = make_mlp(seed=4)
    engine, _, _, _ = spillway.initialize(model=model, config=config)
    _train_tiny(engine, mlp_batches(1, 2))
    engine.save_checkpoint(str(tmp_path), tag="t")
    assert (tmp_path / "t" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").is_file()
    state = engine.optimizer.state_dict()
    other = make_mlp(seed=4)
    engine, _, _, _ = spillway.initialize(model=other, config=config)
    engine.load_checkpoint(str(tmp_path), tag="t")
    loaded = engine.optimizer.state_dict()
    for index, entry in state["state"].items():
        assert torch.equal(entry["momentum_buffer"], loaded["state"][index]["momentum_buffer"])


def test_a_torch_optimizer_and_scheduler_from_the_script_are_used_as_deepspeed_uses_them():
    model = make_mlp(seed=5)
    plain = copy.deepcopy(model)
    batches = mlp_batches(6, 5)
    groups = lambda m: [{"params": [p for n, p in m.named_parameters() if n.endswith("weight")]},
                        {"params": [p for n, p in m.named_parameters() if n.endswith("bias")],
                         "weight_decay": 0.0}]
    client = torch.optim.AdamW(groups(model), lr=2e-3, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.StepLR(client, step_size=2, gamma=0.5)
    engine, optimizer, _, scheduler = spillway.initialize(
        model=model, optimizer=client, lr_scheduler=schedule, config={"train_batch_size": 16})
    assert isinstance(optimizer, spillway.optim.AdamW) and scheduler is schedule
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.05, 0.0]
    _train_tiny(engine, batches)

    reference = torch.optim.AdamW(groups(plain), lr=2e-3, weight_decay=0.05)
    reference_schedule = torch.optim.lr_scheduler.StepLR(reference, step_size=2, gamma=0.5)
    for x, y in batches:
        reference.zero_grad()
        F.mse_loss(plain(x), y).backward()
        reference.step()
        reference_schedule.step()
    for mine, theirs in zip(parameters_copy(model), parameters_copy(plain)):
        assert torch.equal(mine, theirs)


def test_training_data_becomes_a_loader_of_micro_batches():
    data = torch.utils.data.TensorDataset(torch.randn(20, 128), torch.randn(20, 16))
    model = make_mlp(seed=6)
    engine, _, loader, _ = spillway.initialize(
        model=model, training_data=data, config={"train_micro_batch_size_per_gpu": 4,
                                                 "optimizer": {"type": "SGD"}})
    assert [len(x) for x, _ in loader] == [4] * 5


@pytest.mark.parametrize("config, named", [
    ({"optimizer": {"type": "OneBitAdam"}}, "OneBitAdam"),
    ({"optimizer": {"type": "Adam"}, "zero_optimization": {
        "stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}},
     "offload_param.device.*NVMe"),
    ({"optimizer": {"type": "Adam"}, "pipeline": {"stages": 2}}, "pipeline"),
    ({"optimizer": {"type": "Adam"}, "train_batch_size": "auto"}, "train_batch_size"),
    ({"optimizer": {"type": "Adam"}, "steps_per_prnt": 10}, "steps_per_prnt"),
    ({"optimizer": {"type": "Adam"}, "scheduler": {"type": "StepLR", "params": {}}},
     "scheduler.type"),
])
def test_refused_keys_name_themselves_and_leave_the_model_alone(config, named):
    model = make_mlp(seed=8)
    before = parameters_copy(model)
    with pytest.raises(ValueError, match=named):
        spillway.initialize(model=model, config=config)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    for mine, theirs in zip(parameters_copy(model), before):
        assert torch.equal(mine, theirs)


def test_deepspeed_style_arguments_are_checked():
    model = make_mlp(seed=9)
    with pytest.raises(TypeError, match="model="):
        spillway.initialize(model, {"optimizer": {"type": "Adam"}})
    with pytest.raises(ValueError, match="mpu"):
        spillway.initialize(model=model, mpu=object(), config={"optimizer": {"type": "Adam"}})

    class Args:
        deepspeed_config = {"optimizer": {"type": "Adam"}}

    engine, _, _, _ = spillway.initialize(args=Args(), model=model)
    assert engine.get_lr() == [1e-3]
