"""DeepSpeed's loss scales, skipped steps and clipping factors for the cases of
deepspeed_scaler_cases.json, computed by DeepSpeed's own code (0.18, CPU only),
and what DeepSpeedConfig reads from its configuration files.

Usage: python deepspeed_scaler_reference.py CASES.json OUT.json, with the
python of bench/optim/deepspeed_env.sh. deepspeed_parity_test.cc compares
spillway's LossScaler and deepspeed_gradient_factor with OUT.json.

The optimizer objects are made without their constructors (which need an
accelerator and a model); the methods called are DeepSpeed's unchanged.
"""

import json
import os
import socket
import sys

import torch


def free_port():
    """A port nothing listens on, so parallel ctest fixtures do not collide."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def init_single_process():
    import deepspeed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", free_port())
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    deepspeed.init_distributed(dist_backend="gloo")


def fp16_optimizer(fp16_block, clip_grad=0.0, scale=None):
    """An FP16_Optimizer holding the loss-scale state DeepSpeed's engine gives it."""
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.loss_scaler import LossScaleConfig, LossScaleProfile
    from deepspeed.runtime.precision_config import DeepSpeedFP16Config

    config = DeepSpeedFP16Config(**fp16_block)
    optimizer = FP16_Optimizer.__new__(FP16_Optimizer)
    optimizer.loss_scale_config = LossScaleConfig(
        low_precision_dtype=torch.float16,
        dynamic_loss_scale=config.loss_scale == 0,
        static_loss_scale=config.loss_scale,
        dynamic_loss_args=config.dynamic_loss_scale_args(),
        profile=LossScaleProfile.FUSED,
        initial_dynamic_scale=config.initial_dynamic_scale(),
    )
    if scale is not None:
        optimizer.loss_scale_config.cur_scale = scale
    optimizer.verbose = False
    optimizer.clip_grad = clip_grad
    return optimizer


def run_scaler(case):
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
    from deepspeed.runtime.precision_config import DeepSpeedFP16Config

    scales, skipped, error_at = [], [], None
    if case["rule"] == "fp16_optimizer":
        optimizer = fp16_optimizer(case["fp16"])
        state = optimizer.loss_scale_config
        for step, mark in enumerate(case["overflows"]):
            scales.append(state.cur_scale)
            overflow = mark == "x"
            optimizer._update_scale(overflow)
            skipped.append(overflow)
    else:
        config = DeepSpeedFP16Config(**case["fp16"])
        scaler = CreateLossScaler(dtype=torch.float16, static_loss_scale=config.loss_scale,
                                  dynamic_scaling=config.loss_scale == 0,
                                  dynamic_loss_args=config.dynamic_loss_scale_args())
        for step, mark in enumerate(case["overflows"]):
            scales.append(scaler.cur_scale)
            overflow = mark == "x"
            try:
                scaler.update_scale(overflow)
            except Exception as error:  # DeepSpeed raises a bare Exception
                if "minimum" not in str(error):
                    raise
                error_at = step
                break
            skipped.append(overflow)
    return {"name": case["name"], "scales": [float(s) for s in scales], "skipped": skipped,
            "error_at": error_at}


def clip_factor(path, norm, max_norm, loss_scale):
    """(the norm DeepSpeed used, the factor the gradients were multiplied by)."""
    from deepspeed.runtime import utils

    if path == "fp32":
        # The norm of two gradients, one holding it, one so small that it does
        # not change it and scales exactly (a power of two): its value after
        # clipping, over its value before, is the factor applied.
        tiny = 2.0**-60
        holder = torch.nn.Parameter(torch.zeros(1))
        holder.grad = torch.tensor([norm], dtype=torch.float32)
        probe = torch.nn.Parameter(torch.zeros(1))
        probe.grad = torch.tensor([tiny], dtype=torch.float32)
        used = utils.clip_grad_norm_([holder, probe], max_norm)
        return float(used), float(probe.grad[0]) / tiny
    if path == "bf16":
        global_norm = torch.tensor(norm, dtype=torch.float32)
        probe = torch.ones(1, dtype=torch.float32)
        utils.clip_tensors_by_global_norm([probe], max_norm=max_norm, global_norm=global_norm)
        return float(global_norm), float(probe[0])
    if path == "zero":
        # DeepSpeedZeroOptimizer's own method, on an object holding only what
        # it reads; the norm is a float32 tensor as scaled_global_norm makes it.
        from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
        from deepspeed.runtime.fp16.loss_scaler import LossScaler

        optimizer = DeepSpeedZeroOptimizer.__new__(DeepSpeedZeroOptimizer)
        optimizer.custom_loss_scaler = False
        optimizer.loss_scaler = LossScaler(scale=loss_scale)
        optimizer.clip_grad = max_norm
        total_norm = torch.tensor(norm, dtype=torch.float32)
        probe = torch.ones(1, dtype=torch.float32)
        optimizer.unscale_and_clip_grads([probe], total_norm)
        return float(total_norm), float(probe[0])
    optimizer = fp16_optimizer({}, clip_grad=max_norm, scale=loss_scale)
    probe = torch.ones(1, dtype=torch.float32)
    optimizer.unscale_and_clip_grads([probe], norm)
    return norm, float(probe[0])


def read_config(config):
    """What DeepSpeedConfig makes of a configuration, or {"error": ...}."""
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        ds = DeepSpeedConfig(config)
    except Exception as error:  # DeepSpeed's rejections are of several types
        return {"error": f"{type(error).__name__}: {error}"}
    fp16 = ds.float16_config
    zero = ds.zero_config

    def device(offload):
        return "none" if offload is None else str(getattr(offload.device, "value", offload.device))

    return {
        "train_batch_size": ds.train_batch_size,
        "train_micro_batch_size_per_gpu": ds.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": ds.gradient_accumulation_steps,
        "steps_per_print": ds.steps_per_print,
        "wall_clock_breakdown": ds.wall_clock_breakdown,
        "gradient_clipping": ds.gradient_clipping,
        "zero_stage": int(ds.zero_optimization_stage),
        "offload_optimizer": device(zero.offload_optimizer),
        "offload_param": device(zero.offload_param),
        "fp16_enabled": fp16.enabled,
        "bf16_enabled": ds.bfloat16_config.enabled,
        "loss_scale": float(fp16.loss_scale),
        "fp16_dynamic_args": {key: float(value) for key, value in fp16.dynamic_loss_scale_args().items()},
    }


def main():
    cases_path, out_path = sys.argv[1], sys.argv[2]
    with open(cases_path) as f:
        cases = json.load(f)
    init_single_process()
    import deepspeed

    result = {"deepspeed_version": deepspeed.__version__,
              "scaler": [run_scaler(case) for case in cases["scaler"]], "clip": []}
    for case in cases["clip"]:
        used, factors = [], []
        for norm in case["norms"]:
            norm_used, factor = clip_factor(case["path"], norm, case["max_norm"], case["loss_scale"])
            used.append(norm_used)
            factors.append(factor)
        result["clip"].append({"path": case["path"], "norms": used, "factors": factors})
    result["configs"] = [dict(read_config(case["config"]), name=case["name"]) for case in cases["configs"]]
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
