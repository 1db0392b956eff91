"""spillway.initialize: DeepSpeed's entry point, so that switching is a change
of import (docs/deepspeed.md):

    engine, optimizer, dataloader, lr_scheduler = spillway.initialize(
        model=model, model_parameters=model.parameters(), config="ds_config.json")
    for x, y in batches:
        loss = loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()       # steps the optimizer at each accumulation boundary

The configuration (DeepSpeed's keys, hooks/engine/engine_config.h) is checked
as a whole before the model is touched; errors (ValueError) name the key. The
optimizer is spillway.optim's (state and fp32 master copies in chunks), built
over model_parameters from the config's optimizer block, or from the client's
torch.optim optimizer. The C++ engine (hooks/torch/engine.h) does the work:
loss scaling, accumulation, DeepSpeed's clipping factor, the scheduler in
DeepSpeed's order.
"""

import json
import os
import time
import warnings

import torch

from . import _C
from . import optim as _optim

# What save_checkpoint writes into the model-states file itself; every other
# key there is the client's state.
_CHECKPOINT_KEYS = {"module", "buffer_names", "optimizer", "lr_scheduler", "global_steps",
                    "global_samples", "skipped_steps", "dp_world_size", "mp_world_size",
                    "ds_config", "ds_version", "spillway_engine"}
_TORCH_OPTIMIZERS = {torch.optim.Adam: "Adam", torch.optim.AdamW: "AdamW", torch.optim.SGD: "SGD"}


class LRScheduler:
    """The configuration's scheduler (DeepSpeed's WarmupLR, WarmupDecayLR,
    WarmupCosineLR, OneCycle or LRRangeTest), as DeepSpeed's object behaves:
    the engine steps it after every applied optimizer step."""

    def __init__(self, engine):
        self._engine = engine

    @property
    def last_batch_iteration(self):
        return self._engine._core.lr_schedule_iteration

    def get_lr(self):
        return self._engine._core.get_lr()

    def get_last_lr(self):
        return self.get_lr()

    def step(self, last_batch_iteration=None):
        core = self._engine._core
        if last_batch_iteration is None:
            core.step_lr_schedule()
        else:
            core.restore_lr_schedule(int(last_batch_iteration))
        self._engine._groups_from_core()

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state_dict):
        self.step(state_dict["last_batch_iteration"])


class Engine:
    """What initialize() returns first: DeepSpeed's engine methods over a
    module whose parameters live in spillway's chunks."""

    def __init__(self, module, optimizer, core, config, summary, client_lr_scheduler):
        self.module = module
        self.optimizer = optimizer
        self._core = core
        self._config = config
        self._summary = summary
        self.lr_scheduler = LRScheduler(self) if core.has_lr_schedule else client_lr_scheduler
        self._client_lr_scheduler = None if core.has_lr_schedule else client_lr_scheduler
        self._groups_from_core()

    # --- training -----------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        start = time.perf_counter()
        out = self.module(*args, **kwargs)
        self._core.add_forward_time((time.perf_counter() - start) * 1e3)
        return out

    __call__ = forward

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True):
        """Backward of the loss, scaled for fp16 and gradient accumulation."""
        if retain_graph or not scale_wrt_gas:
            raise ValueError("spillway.Engine.backward: retain_graph=True and "
                             "scale_wrt_gas=False are not supported")
        self._core.backward(loss)
        return loss

    def step(self, lr_kwargs=None):
        """Ends a micro-batch; at an accumulation boundary steps the optimizer
        (or skips the step on an fp16 overflow) and zeroes the gradients, then
        steps the learning-rate scheduler if the step was applied. Returns
        whether the optimizer stepped."""
        self.optimizer._push_group_options()  # a client scheduler's changes
        applied = self._core.step()
        if applied and self._client_lr_scheduler is not None:
            with warnings.catch_warnings():
                # torch's schedulers look for their optimizer's step() having run; the
                # engine steps it in C++ (it did: the step was applied).
                warnings.filterwarnings("ignore", message=r"Seems like `optimizer.step\(\)`")
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler")
                self._client_lr_scheduler.step(**(lr_kwargs or {}))
        self._groups_from_core()
        return applied

    def train(self, mode=True):
        self.module.train(mode)

    def eval(self):
        self.module.train(False)

    def zero_grad(self):
        self._core.zero_grad()

    # --- what DeepSpeed scripts read ----------------------------------------------------------

    def was_step_applied(self):
        return self._core.was_step_applied()

    def is_gradient_accumulation_boundary(self):
        return self._core.is_gradient_accumulation_boundary()

    def gradient_accumulation_steps(self):
        return self._summary["gradient_accumulation_steps"]

    def train_batch_size(self):
        return self._summary["train_batch_size"]

    def train_micro_batch_size_per_gpu(self):
        return self._summary["train_micro_batch_size_per_gpu"]

    def zero_optimization_stage(self):
        return self._summary["zero_stage"]

    def get_lr(self):
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_mom(self):
        if isinstance(self.optimizer, _optim.SGD):
            return [group["momentum"] for group in self.optimizer.param_groups]
        return [group["betas"] for group in self.optimizer.param_groups]

    def get_global_grad_norm(self):
        return self._core.last_gradient_norm

    @property
    def loss_scale(self):
        return self._core.loss_scale

    @property
    def global_steps(self):
        return self._core.global_steps

    @property
    def global_samples(self):
        return self._core.global_samples

    @property
    def skipped_steps(self):
        return self._core.skipped_steps

    @property
    def micro_steps(self):
        return self._core.micro_steps

    @property
    def last_gradient_norm(self):
        """Global norm of the last boundary's gradients (unscaled, before clipping)."""
        return self._core.last_gradient_norm

    # --- checkpoints (DeepSpeed's layout, docs/deepspeed.md) ----------------------------------

    def _paths(self, directory, tag):
        folder = os.path.join(directory, str(tag))
        model = os.path.join(folder, "mp_rank_00_model_states.pt")
        prefix = "bf16_" if self._summary["compute_dtype"] == "bfloat16" else ""
        optim = os.path.join(folder, f"{prefix}zero_pp_rank_0_mp_rank_00_optim_states.pt")
        return folder, model, optim

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True,
                        exclude_frozen_parameters=False):
        """Writes save_dir/tag/ as DeepSpeed does (tag: global_step<N> by
        default) and, with save_latest, save_dir/latest naming the tag. Values
        are read through ops, so they are true even where chunks are spilled."""
        tag = f"global_step{self.global_steps}" if tag is None else str(tag)
        folder, model_path, optim_path = self._paths(save_dir, tag)
        os.makedirs(folder, exist_ok=True)
        frozen = {name for name, param in self.module.named_parameters()
                  if not param.requires_grad} if exclude_frozen_parameters else set()
        # A copy is an op: it fetches a spilled chunk (torch.save alone would read the
        # storage's bytes directly). The copies are host data, off the device budget.
        with _C._HostWork():
            module_state = {name: value.detach().to("cpu", copy=True)
                            for name, value in self.module.state_dict().items()
                            if name not in frozen}
        sharded = self._summary["zero_stage"] > 0
        state = {
            "module": module_state,
            "buffer_names": [name for name, _ in self.module.named_buffers()],
            "optimizer": None if sharded else self.optimizer.state_dict(),
            "lr_scheduler": (self.lr_scheduler.state_dict()
                             if self.lr_scheduler is not None else None),
            "global_steps": self.global_steps,
            "global_samples": self.global_samples,
            "skipped_steps": self.skipped_steps,
            "dp_world_size": 1,
            "mp_world_size": 1,
            "ds_config": self._config,
            "ds_version": _version(),
            "spillway_engine": self._core.state_dict(),
        }
        assert state.keys() == _CHECKPOINT_KEYS
        for key, value in (client_state or {}).items():
            if key in state:
                raise ValueError(f"spillway.Engine.save_checkpoint: client_state key {key!r} "
                                 "is one the checkpoint itself uses")
            state[key] = value
        _save_atomically(state, model_path)
        if sharded:
            _save_atomically({"optimizer_state_dict": self.optimizer.state_dict(),
                              "ds_config": self._config, "ds_version": _version()}, optim_path)
        if save_latest:
            with open(os.path.join(save_dir, "latest.tmp"), "w", encoding="utf-8") as latest:
                latest.write(tag)
            os.replace(os.path.join(save_dir, "latest.tmp"), os.path.join(save_dir, "latest"))
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False):
        """Loads what save_checkpoint wrote (tag: the one `latest` names).
        Returns (path, client_state), or (None, None) with a warning when
        there is no `latest` to follow, as DeepSpeed does."""
        if tag is None:
            latest = os.path.join(load_dir, "latest")
            if not os.path.isfile(latest):
                warnings.warn(f"spillway.Engine.load_checkpoint: no tag given and no {latest}; "
                              "nothing loaded")
                return None, None
            with open(latest, encoding="utf-8") as file:
                tag = file.read().strip()
        _, model_path, optim_path = self._paths(load_dir, tag)
        if not os.path.isfile(model_path):
            raise FileNotFoundError(f"spillway.Engine.load_checkpoint: {model_path} does not "
                                    "exist")
        with _C._HostWork():  # what is read is host data, off the device budget
            checkpoint = torch.load(model_path, map_location="cpu", weights_only=True)
            self.module.load_state_dict(checkpoint["module"], strict=load_module_strict)
            saved_optimizer = checkpoint["optimizer"]
            if not load_module_only and load_optimizer_states and saved_optimizer is None:
                saved_optimizer = torch.load(optim_path, map_location="cpu",
                                             weights_only=True)["optimizer_state_dict"]
        if not load_module_only:
            if load_optimizer_states:
                self.optimizer.load_state_dict(saved_optimizer)
            self._core.load_state_dict(checkpoint["spillway_engine"])
            if load_lr_scheduler_states and checkpoint["lr_scheduler"] is not None:
                if self.lr_scheduler is None:
                    raise ValueError("spillway.Engine.load_checkpoint: the checkpoint has a "
                                     "learning-rate scheduler's state and this engine has none")
                self.lr_scheduler.load_state_dict(checkpoint["lr_scheduler"])
            self._groups_from_core()
        return model_path, {key: value for key, value in checkpoint.items()
                            if key not in _CHECKPOINT_KEYS}

    # --- the optimizer's groups, kept equal on both sides ---------------------------------------

    def _groups_from_core(self):
        """What the C++ engine set (the configured scheduler's lr and betas)
        shows in param_groups, as DeepSpeed's scheduler writes it there."""
        if not self._core.has_lr_schedule:
            return  # param_groups lead: a client scheduler's changes reach C++ at the next step
        for group, lr, momentum in zip(self.optimizer.param_groups, self._core.get_lr(),
                                       self._core.group_momentum()):
            group["lr"] = lr
            if "betas" in group and len(momentum) == 2:
                group["betas"] = tuple(momentum)


def _version():
    try:
        from importlib.metadata import version
        return "spillway " + version("spillway")
    except Exception:  # a build tree, not an installed package
        return "spillway (build tree)"


def _save_atomically(obj, path):
    """No half-written checkpoint file: written beside, then renamed."""
    partial = path + ".partial"
    torch.save(obj, partial)
    os.replace(partial, path)


def _config_dict(config):
    if isinstance(config, dict):
        return config
    if isinstance(config, (str, os.PathLike)):
        text = os.fspath(config)
        if text.lstrip().startswith("{"):
            return json.loads(text)
        with open(text, encoding="utf-8") as file:  # a path to a JSON file
            return json.load(file)
    raise TypeError("spillway.initialize: config must be a dict, JSON text or a path to a JSON "
                    f"file, not {type(config).__name__}")


def _trainable_groups(model_parameters, model):
    """model_parameters as parameter groups, frozen parameters left out (a
    spillway gradient is never undefined, so an optimizer holding a frozen
    parameter would decay it)."""
    items = list(model.parameters() if model_parameters is None else model_parameters)
    if items and isinstance(items[0], dict):
        groups = [dict(group, params=[p for p in group["params"] if p.requires_grad])
                  for group in items]
        return [group for group in groups if group["params"]]
    return [{"params": [p for p in items if p.requires_grad]}]


def _rebuilt_client_optimizer(client):
    """A torch.optim Adam/AdamW/SGD as spillway.optim's equivalent, same
    groups and options; its state would be lost, so it must have none."""
    kind = _TORCH_OPTIMIZERS.get(type(client))
    if kind is None:
        raise TypeError(f"spillway.initialize: optimizer {type(client).__name__} is not "
                        "supported; pass a torch.optim.Adam, AdamW or SGD (rebuilt as "
                        "spillway.optim's, with its state in chunks), a spillway.optim "
                        "optimizer, or none and an optimizer block in the config")
    if any(client.state.values()):
        raise ValueError("spillway.initialize: the optimizer has already stepped; pass it "
                         "before its first step (its state would be lost)")
    decoupled = {bool(group.get("decoupled_weight_decay", False))
                 for group in client.param_groups}
    if kind == "Adam" and decoupled == {True}:
        kind = "AdamW"  # torch 2.x's Adam(decoupled_weight_decay=True) is AdamW
    elif len(decoupled) > 1:
        raise ValueError("spillway.initialize: the optimizer mixes groups with and without "
                         "decoupled_weight_decay; spillway's optimizers take one kind")
    groups = [{key: value for key, value in group.items() if key != "decoupled_weight_decay"}
              for group in client.param_groups]
    return getattr(_optim, kind)(groups)


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, distributed_port=None, mpu=None, dist_init_required=None,
               collate_fn=None, config=None, mesh_param=None, config_params=None):
    """DeepSpeed's initialize(): returns (engine, optimizer, dataloader,
    lr_scheduler). See docs/deepspeed.md for what each argument becomes."""
    del distributed_port, dist_init_required  # one process: no rendezvous to make
    if isinstance(args, torch.nn.Module):
        raise TypeError("spillway.initialize: the first argument is DeepSpeed's `args`; pass "
                        "the model as model=... and the configuration as config=...")
    if model is None or not isinstance(model, torch.nn.Module):
        raise TypeError("spillway.initialize: model= must be a torch.nn.Module, "
                        f"not {type(model).__name__}")
    if mpu is not None or mesh_param is not None:
        raise ValueError("spillway.initialize: mpu / mesh_param (model or sequence parallel) "
                         "are not supported; spillway trains in one process (data parallel: "
                         "issue 17)")
    if config is None:
        config = config_params
    if getattr(args, "deepspeed_config", None) is not None:
        if config is not None:
            raise ValueError("spillway.initialize: a config both in args.deepspeed_config and "
                             "in config=; give one")
        config = args.deepspeed_config
    if config is None:
        raise ValueError("spillway.initialize: no configuration (config=, or "
                         "args.deepspeed_config)")
    config = _config_dict(config)

    client = optimizer
    if client is not None and not isinstance(client, torch.optim.Optimizer) and callable(client):
        client = client(_trainable_groups(model_parameters, model))
    # The engine's own parse needs an optimizer block; a client's replaces the config's, as
    # in DeepSpeed.
    parsed = dict(config)
    if client is not None and "optimizer" not in parsed:
        parsed["optimizer"] = {"type": "SGD", "params": {}}
    summary = _C.engine_config_summary(json.dumps(parsed))  # checks the whole configuration
    if lr_scheduler is not None:
        parsed.pop("scheduler", None)  # the script's scheduler wins, as in DeepSpeed
    text = json.dumps(parsed)
    if summary["spillway_conf"] is not None:
        _C.configure(summary["spillway_conf"])  # before manage() activates spillway
    dtype = getattr(torch, summary["compute_dtype"])
    if dtype != torch.float32:
        model.to(dtype)

    from . import manage  # the package's, which names the parameters from the model
    manage(model)
    if client is None:
        kind, options = summary["optimizer"]
        chunked = getattr(_optim, kind)(_trainable_groups(model_parameters, model), **options)
    elif isinstance(client, _optim._ChunkedOptimizer):
        chunked = client
    else:
        chunked = _rebuilt_client_optimizer(client)

    client_scheduler = None
    if lr_scheduler is not None:
        if callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
            client_scheduler = lr_scheduler(chunked)
        else:
            client_scheduler = lr_scheduler
            if client is not None and getattr(client_scheduler, "optimizer", None) is client:
                client_scheduler.optimizer = chunked  # it drives the rebuilt optimizer's groups
    core = _C.EngineCore(list(model.named_parameters()), text, chunked._impl)
    engine = Engine(model, chunked, core, config, summary, client_scheduler)

    dataloader = None
    if training_data is not None:
        micro = summary["train_micro_batch_size_per_gpu"]
        if micro is None:
            raise ValueError("spillway.initialize: training_data needs train_batch_size or "
                             "train_micro_batch_size_per_gpu in the config")
        sampler = (torch.utils.data.RandomSampler(training_data)
                   if not isinstance(training_data, torch.utils.data.IterableDataset) else None)
        dataloader = torch.utils.data.DataLoader(
            training_data, batch_size=micro, sampler=sampler, collate_fn=collate_fn,
            drop_last=bool(config.get("dataloader_drop_last", False)))
    return engine, chunked, dataloader, engine.lr_scheduler
