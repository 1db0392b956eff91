// The DeepSpeed-style configuration of initialize(): accepted keys land in
// EngineConfig; unknown keys and bad values are rejected with their path.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "hooks/engine/engine_config.h"

namespace spillway::engine {
namespace {

// The message parse_engine_config throws, or "" when it accepts the text.
std::string rejection(const std::string& json) {
  try {
    parse_engine_config(json);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

TEST(EngineConfig, FullDeepSpeedStyleConfigIsRead) {
  const EngineConfig config = parse_engine_config(R"({
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6,
                                              "weight_decay": 0.1}},
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
             "loss_scale_window": 500, "hysteresis": 3, "min_loss_scale": 2,
             "consecutive_hysteresis": true},
    "zero_optimization": {"stage": 2},
    "steps_per_print": 10, "wall_clock_breakdown": true,
    "spillway": {"device_budget": "6MiB", "chunk_size": "2MiB", "strict_residency": true}
  })");
  EXPECT_EQ(config.optimizer.type, OptimizerType::adamw);
  EXPECT_DOUBLE_EQ(config.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(config.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(config.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(config.optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(config.optimizer.weight_decay, 0.1);
  EXPECT_EQ(config.precision, Precision::fp16);
  EXPECT_EQ(config.loss_scaler.static_scale, 0);
  EXPECT_EQ(config.loss_scaler.initial_scale_power, 12);
  EXPECT_EQ(config.loss_scaler.window, 500);
  EXPECT_EQ(config.loss_scaler.hysteresis, 3);
  EXPECT_EQ(config.loss_scaler.min_scale, 2);
  EXPECT_TRUE(config.loss_scaler.consecutive_hysteresis);
  EXPECT_EQ(config.loss_scaler.rule, LossScaleRule::zero_optimizer);
  EXPECT_EQ(config.zero.stage, 2);
  EXPECT_EQ(config.steps_per_print, 10);
  EXPECT_TRUE(config.wall_clock_breakdown);
  EXPECT_DOUBLE_EQ(config.gradient_clipping, 1.0);
  EXPECT_EQ(config.gradient_accumulation_steps, 4);
  EXPECT_EQ(config.train_batch_size, 32);
  ASSERT_TRUE(config.spillway_conf.has_value());
  EXPECT_EQ(*config.spillway_conf, "chunk_size:2MiB,device_budget:6MiB,strict_residency:true");
}

TEST(EngineConfig, DefaultsWhenBlocksAreAbsent) {
  const EngineConfig config = parse_engine_config(R"({"optimizer": {"type": "sgd"}})");
  EXPECT_EQ(config.optimizer.type, OptimizerType::sgd);
  EXPECT_DOUBLE_EQ(config.optimizer.lr, 1e-3);
  EXPECT_EQ(config.precision, Precision::f32);
  EXPECT_EQ(config.gradient_accumulation_steps, 1);
  EXPECT_EQ(config.gradient_clipping, 0);
  EXPECT_FALSE(config.spillway_conf.has_value());
  // DeepSpeed 0.18's defaults: no step line, no timers, stage 0.
  EXPECT_FALSE(config.steps_per_print.has_value());
  EXPECT_FALSE(config.wall_clock_breakdown);
  EXPECT_EQ(config.zero.stage, 0);
  EXPECT_EQ(config.loss_scaler.rule, LossScaleRule::fp16_optimizer);
  EXPECT_EQ(describe_deepspeed_mapping(config), "");
}

TEST(EngineConfig, AdamDecouplesWeightDecayUnlessAdamWModeIsOff) {
  // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false.
  EXPECT_EQ(parse_engine_config(R"({"optimizer": {"type": "Adam"}})").optimizer.type,
            OptimizerType::adamw);
  EXPECT_EQ(
      parse_engine_config(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})")
          .optimizer.type,
      OptimizerType::adam);
}

TEST(EngineConfig, SgdOptionsAreRead) {
  const EngineConfig config = parse_engine_config(
      R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true,
                                                   "weight_decay": 1e-4}}, "bf16": {"enabled": true}})");
  EXPECT_DOUBLE_EQ(config.optimizer.momentum, 0.9);
  EXPECT_TRUE(config.optimizer.nesterov);
  EXPECT_DOUBLE_EQ(config.optimizer.weight_decay, 1e-4);
  EXPECT_EQ(config.precision, Precision::bf16);
}

using ::testing::HasSubstr;

// A config whose optimizer is `type` with `params` (a JSON object).
std::string fmt_config(const char* type, const std::string& params) {
  return std::string(R"({"optimizer": {"type": ")") + type + R"(", "params": )" + params + "}}";
}

TEST(EngineConfig, UnknownKeysAreNamedWithTheirPath) {
  EXPECT_THAT(rejection(R"({"optimizer": {"type": "sgd"}, "zero_optimisation": {}})"),
              HasSubstr("zero_optimisation: unknown key (accepted here: optimizer, scheduler"));
  EXPECT_THAT(rejection(R"({"optimizer": {"type": "sgd"}, "zero_optimization": {"stag": 1}})"),
              HasSubstr("zero_optimization.stag: unknown key (accepted here: stage,"));
  EXPECT_THAT(
      rejection(
          R"({"optimizer": {"type": "sgd"}, "fp16": {"enabled": true, "loss_scale_windw": 4}})"),
      HasSubstr("fp16.loss_scale_windw: unknown key (accepted here: enabled, auto_cast, "
                "loss_scale"));
  EXPECT_THAT(rejection(R"({"optimizer": {"type": "sgd", "params": {"betas": [0.9, 0.99]}}})"),
              HasSubstr("optimizer.params.betas: unknown key"));
  EXPECT_THAT(rejection(R"({"optimizer": {"type": "adam", "param": {}}})"),
              HasSubstr("optimizer.param: unknown key"));
}

TEST(EngineConfig, BadValuesAreNamedWithWhatIsAccepted) {
  const std::string sgd = R"("optimizer": {"type": "sgd"})";
  EXPECT_THAT(rejection("{" + sgd + R"(, "gradient_accumulation_steps": 2.5})"),
              HasSubstr("gradient_accumulation_steps: expected an integer >= 1, got 2.5"));
  EXPECT_THAT(rejection("{" + sgd + R"(, "gradient_accumulation_steps": 0})"),
              HasSubstr("gradient_accumulation_steps: expected an integer >= 1, got 0"));
  EXPECT_THAT(rejection("{" + sgd + R"(, "gradient_clipping": "1.0"})"),
              HasSubstr("gradient_clipping: expected a number"));
  EXPECT_THAT(rejection("{" + sgd + R"(, "bf16": {"enabled": "yes"}})"),
              HasSubstr("bf16.enabled: expected true or false"));
  EXPECT_THAT(rejection("{" + sgd + R"(, "fp16": {"enabled": true}, "bf16": {"enabled": true}})"),
              HasSubstr("fp16 and bf16 cannot both be enabled"));
  // An integer in DeepSpeed's config.
  EXPECT_THAT(rejection("{" + sgd + R"(, "fp16": {"min_loss_scale": 0.5}})"),
              HasSubstr("fp16.min_loss_scale: expected an integer >= 1, got 0.5"));
  EXPECT_THAT(rejection(R"({"optimizer": {"type": "Lamb"}})"),
              HasSubstr("optimizer.type: \"Lamb\" is not in spillway, which offers Adam, AdamW "
                        "and SGD"));
  EXPECT_THAT(rejection(R"({"optimizer": {"type": "Adamm"}})"),
              HasSubstr("optimizer.type: expected Adam, AdamW or SGD, got \"Adamm\""));
  EXPECT_THAT(rejection(R"({"optimizer": {"type": "adam", "params": {"betas": [0.9]}}})"),
              HasSubstr("optimizer.params.betas: expected [beta1, beta2] in [0, 1)"));
  EXPECT_THAT(rejection(R"({"optimizer": {"type": "adam", "params": {"lr": -1}}})"),
              HasSubstr("optimizer.params.lr: expected a number >= 0, got -1"));
  EXPECT_THAT(rejection(R"({"optimizer": {"type": "sgd", "params": {"nesterov": true}}})"),
              HasSubstr("optimizer.params.nesterov: needs momentum > 0"));
  EXPECT_THAT(
      rejection("{" + sgd + R"(, "train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                                        "gradient_accumulation_steps": 2})"),
      HasSubstr("train_batch_size: 16 is not train_micro_batch_size_per_gpu (4) x "
                "gradient_accumulation_steps (2)"));
  // Derived first, as DeepSpeed does, then checked: 10 // 4 = 2, 4 x 2 != 10.
  EXPECT_THAT(
      rejection("{" + sgd + R"(, "train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})"),
      HasSubstr("train_batch_size: 10 is not train_micro_batch_size_per_gpu (4) x "
                "gradient_accumulation_steps (2)"));
}

TEST(EngineConfig, BatchSizesAreDerivedAsDeepSpeedDerivesThem) {
  const std::string sgd = R"("optimizer": {"type": "sgd"})";
  EngineConfig config = parse_engine_config(
      "{" + sgd + R"(, "train_batch_size": 32, "train_micro_batch_size_per_gpu": 8})");
  EXPECT_EQ(config.gradient_accumulation_steps, 4);
  config = parse_engine_config("{" + sgd +
                               R"(, "train_batch_size": 32, "gradient_accumulation_steps": 4})");
  EXPECT_EQ(config.train_micro_batch_size_per_gpu, 8);
  config = parse_engine_config(
      "{" + sgd + R"(, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4})");
  EXPECT_EQ(config.train_batch_size, 32);
  config = parse_engine_config("{" + sgd + R"(, "train_batch_size": 12})");
  EXPECT_EQ(config.train_micro_batch_size_per_gpu, 12);
  EXPECT_EQ(config.gradient_accumulation_steps, 1);
  config = parse_engine_config("{" + sgd + R"(, "train_micro_batch_size_per_gpu": 3})");
  EXPECT_EQ(config.train_batch_size, 3);
  // "auto" is the Hugging Face Trainer's placeholder; DeepSpeed rejects it.
  EXPECT_THAT(rejection("{" + sgd + R"(, "train_batch_size": "auto"})"),
              HasSubstr("train_batch_size: \"auto\" is filled in by the Hugging Face Trainer"));
  EXPECT_THAT(
      rejection("{" + sgd + R"(, "train_micro_batch_size_per_gpu": 8, "train_batch_size": 4})"),
      HasSubstr("train_batch_size: 4 is not"));
}

TEST(EngineConfig, DeepSpeedsAdamFlagsKeepTheirMeaning) {
  const auto type_of = [](const std::string& params, const char* type = "Adam") {
    return parse_engine_config(fmt_config(type, params)).optimizer;
  };
  // AdamW stays AdamW whatever adam_w_mode says (DeepSpeed ORs them).
  EXPECT_EQ(type_of(R"({"adam_w_mode": false})", "AdamW").type, OptimizerType::adamw);
  EXPECT_EQ(type_of(R"({"adam_w_mode": false})").type, OptimizerType::adam);
  EXPECT_EQ(type_of(R"({"torch_adam": true})").type, OptimizerType::adamw);
  EXPECT_TRUE(type_of(R"({"torch_adam": true})").torch_adam);
  // torch.optim.AdamW's default weight decay is 0.01; FusedAdam's is 0.
  EXPECT_DOUBLE_EQ(type_of(R"({"torch_adam": true})").weight_decay, 1e-2);
  EXPECT_DOUBLE_EQ(type_of(R"({"torch_adam": true, "adam_w_mode": false})").weight_decay, 0);
  EXPECT_DOUBLE_EQ(type_of(R"({})").weight_decay, 0);
  EXPECT_DOUBLE_EQ(type_of(R"({"torch_adam": true, "weight_decay": 0.2})").weight_decay, 0.2);
  EXPECT_EQ(type_of(R"({"bias_correction": true, "amsgrad": false})").type, OptimizerType::adamw);
  EXPECT_THAT(rejection(fmt_config("Adam", R"({"amsgrad": true})")),
              HasSubstr("optimizer.params.amsgrad: AMSGrad is not in spillway's Adam"));
  EXPECT_THAT(rejection(fmt_config("Adam", R"({"bias_correction": false})")),
              HasSubstr("optimizer.params.bias_correction: spillway's Adam always corrects"));
  EXPECT_THAT(rejection(fmt_config("Adam", R"({"max_grad_norm": 1.0})")),
              HasSubstr("optimizer.params.max_grad_norm: not an optimizer parameter"));
  EXPECT_THAT(rejection(fmt_config("Adam", R"({"lr": "auto"})")),
              HasSubstr("optimizer.params.lr: \"auto\""));
  for (const char* type : {"OneBitAdam", "OneBitLamb", "ZeroOneAdam", "Lion", "Adagrad", "MuAdam"})
    EXPECT_THAT(rejection(fmt_config(type, "{}")),
                HasSubstr(std::string("\"") + type + "\" is not in spillway"));
}

TEST(EngineConfig, PrecisionBlocksTakeEveryDeepSpeedKey) {
  const std::string sgd = R"("optimizer": {"type": "sgd"})";
  const EngineConfig fp16 = parse_engine_config("{" + sgd + R"(, "fp16": {"enabled": true,
      "auto_cast": false, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
      "hysteresis": 2, "consecutive_hysteresis": false, "min_loss_scale": 1,
      "fp16_master_weights_and_grads": false}})");
  EXPECT_EQ(fp16.precision, Precision::fp16);
  EXPECT_EQ(fp16.loss_scaler.min_scale, 1);
  EXPECT_EQ(parse_engine_config("{" + sgd + R"(, "bfloat16": {"enabled": true}})").precision,
            Precision::bf16);
  EXPECT_EQ(parse_engine_config("{" + sgd + R"(, "bf16": {"enabled": true,
      "immediate_grad_update": true, "check_grad_overflow": false}})")
                .precision,
            Precision::bf16);
  EXPECT_THAT(rejection("{" + sgd + R"(, "fp16": {"enabled": true, "auto_cast": true}})"),
              HasSubstr("fp16.auto_cast: spillway does not cast"));
  EXPECT_THAT(rejection("{" + sgd + R"(, "bf16": {"enabled": true, "check_grad_overflow": true}})"),
              HasSubstr("bf16.check_grad_overflow: spillway's bf16 training does not check"));
  EXPECT_THAT(rejection("{" + sgd + R"(, "bf16": {"bf16_master_weights_and_grads": true}})"),
              HasSubstr("bf16.bf16_master_weights_and_grads: spillway keeps fp32 master"));
}

TEST(EngineConfig, ZeroBlockIsReadAndReported) {
  const EngineConfig config = parse_engine_config(R"({"optimizer": {"type": "AdamW"},
    "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true,
      "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
      "stage3_gather_16bit_weights_on_model_save": true, "sub_group_size": 1e9,
      "offload_optimizer": {"device": "cpu", "pin_memory": true},
      "offload_param": {"device": "cpu", "pin_memory": true, "buffer_count": 5}},
    "prescale_gradients": false, "communication_data_type": "fp32"})");
  EXPECT_EQ(config.zero.stage, 3);
  EXPECT_EQ(config.zero.offload_optimizer, OffloadDevice::cpu);
  EXPECT_EQ(config.zero.offload_param, OffloadDevice::cpu);
  const std::string report = describe_deepspeed_mapping(config);
  EXPECT_THAT(report, HasSubstr("zero_optimization.stage 3: DeepSpeed would shard the optimizer "
                                "states, gradients and parameters"));
  EXPECT_THAT(report, HasSubstr("offload_optimizer.device cpu: DeepSpeed would keep every "
                                "optimizer state in CPU memory"));
  EXPECT_THAT(report, HasSubstr("steps the chunks that are in CPU memory with its CPU Adam"));
  EXPECT_THAT(report, HasSubstr("offload_param.device cpu"));
  EXPECT_THAT(report, HasSubstr("no effect under spillway (multi-rank communication, bucket and "
                                "DeepSpeed-internal tuning): communication_data_type, "
                                "prescale_gradients, zero_optimization.contiguous_gradients"));
  EXPECT_THAT(report, HasSubstr("zero_optimization.reduce_bucket_size"));
  EXPECT_THAT(report, HasSubstr("zero_optimization.offload_param.buffer_count"));
  // The deprecated spelling of the optimizer offload.
  EXPECT_EQ(parse_engine_config(
                R"({"optimizer": {"type": "sgd"}, "zero_optimization": {"cpu_offload": true}})")
                .zero.offload_optimizer,
            OffloadDevice::cpu);
}

TEST(EngineConfig, NvmeAndZeroPlusPlusAreRefusedByName) {
  const std::string sgd = R"("optimizer": {"type": "sgd"})";
  EXPECT_THAT(
      rejection("{" + sgd + R"(, "zero_optimization": {"offload_optimizer": {"device": "nvme"}}})"),
      HasSubstr("zero_optimization.offload_optimizer.device: spillway does not offload to "
                "NVMe; it spills chunks to pinned CPU memory"));
  EXPECT_THAT(rejection("{" + sgd + R"(, "zero_optimization": {"offload_param": {"device": "cpu",
                  "nvme_path": "/local_nvme"}}})"),
              HasSubstr("zero_optimization.offload_param.nvme_path: spillway does not offload"));
  EXPECT_THAT(rejection("{" + sgd + R"(, "zero_optimization": {"stage": 4}})"),
              HasSubstr("zero_optimization.stage: expected 0, 1, 2 or 3, got 4"));
  EXPECT_THAT(rejection("{" + sgd + R"(, "zero_optimization": {"zero_quantized_weights": true}})"),
              HasSubstr("zero_optimization.zero_quantized_weights: ZeRO++"));
  EXPECT_EQ(rejection("{" + sgd + R"(, "zero_optimization": {"zero_quantized_weights": false}})"),
            "");
}

TEST(EngineConfig, FeaturesSpillwayLacksAreRefusedUnlessOff) {
  const std::string sgd = R"("optimizer": {"type": "sgd"})";
  EXPECT_THAT(rejection("{" + sgd + R"(, "pipeline": {"stages": 2}})"),
              HasSubstr("pipeline: pipeline parallelism is not in spillway"));
  EXPECT_THAT(rejection("{" + sgd + R"(, "tensorboard": {"enabled": true, "output_path": "x"}})"),
              HasSubstr("tensorboard: DeepSpeed's monitors are not in spillway"));
  EXPECT_EQ(rejection("{" + sgd + R"(, "tensorboard": {"enabled": false}})"), "");
  EXPECT_THAT(rejection("{" + sgd + R"(, "flops_profiler": {"enabled": true}})"),
              HasSubstr("flops_profiler: DeepSpeed's flops profiler is not in spillway"));
  EXPECT_THAT(
      rejection("{" + sgd + R"(, "activation_checkpointing": {"partition_activations": true}})"),
      HasSubstr("activation_checkpointing: DeepSpeed's activation checkpointing"));
  EXPECT_EQ(rejection("{" + sgd + R"(, "activation_checkpointing": {"partition_activations": false,
                  "cpu_checkpointing": false, "number_checkpoints": null}})"),
            "");
  EXPECT_THAT(rejection("{" + sgd + R"(, "sparse_attention": {"mode": "fixed"}})"),
              HasSubstr("sparse_attention: DeepSpeed's sparse attention kernels"));
  EXPECT_THAT(rejection("{" + sgd + R"(, "data_types": {"grad_accum_dtype": "bf16"}})"),
              HasSubstr("data_types.grad_accum_dtype: spillway accumulates gradients in fp32"));
  EXPECT_THAT(rejection("{" + sgd + R"(, "steps_per_print": 0})"),
              HasSubstr("steps_per_print: expected an integer >= 1, got 0"));
}

TEST(EngineConfig, MissingOptimizerIsAnError) {
  EXPECT_THAT(rejection("{}"), HasSubstr("optimizer: required"));
  EXPECT_THAT(rejection(R"({"optimizer": {}})"), HasSubstr("optimizer.type: required"));
}

TEST(EngineConfig, SpillwayBlockErrorsComeFromTheConfigurationParser) {
  const std::string message =
      rejection(R"({"optimizer": {"type": "sgd"}, "spillway": {"device_budget": "lots"}})");
  EXPECT_THAT(message, HasSubstr("spillway.device_budget"));
  EXPECT_THAT(message, HasSubstr("lots"));
  EXPECT_THAT(rejection(R"({"optimizer": {"type": "sgd"}, "spillway": {"chunk_sise": "2MiB"}})"),
              HasSubstr("spillway.chunk_sise"));
  EXPECT_THAT(rejection(R"({"optimizer": {"type": "sgd"}, "spillway": {"trace": ["a"]}})"),
              HasSubstr("spillway.trace: expected a string, number or boolean"));
}

TEST(EngineConfig, MalformedJsonIsRejectedWithItsPosition) {
  const std::string message = rejection(R"({"optimizer": {"type": "sgd"},})");
  EXPECT_THAT(message, HasSubstr("not valid JSON"));
  EXPECT_THAT(message, HasSubstr("column 31"));
  EXPECT_THAT(rejection("[1, 2]"), HasSubstr("expected a JSON object"));
}

}  // namespace
}  // namespace spillway::engine
