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
             "loss_scale_window": 500, "hysteresis": 3, "min_loss_scale": 0.5},
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
  EXPECT_DOUBLE_EQ(config.loss_scaler.min_scale, 0.5);
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

TEST(EngineConfig, UnknownKeysAreNamedWithTheirPath) {
  EXPECT_THAT(rejection(R"({"optimizer": {"type": "sgd"}, "zero_optimization": {}})"),
              HasSubstr("zero_optimization: unknown key"));
  EXPECT_THAT(
      rejection(
          R"({"optimizer": {"type": "sgd"}, "fp16": {"enabled": true, "loss_scale_windw": 4}})"),
      HasSubstr("fp16.loss_scale_windw: unknown key (accepted here: enabled, loss_scale"));
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
  EXPECT_THAT(rejection("{" + sgd + R"(, "fp16": {"min_loss_scale": 0}})"),
              HasSubstr("fp16.min_loss_scale: expected a number > 0"));
  EXPECT_THAT(rejection(R"({"optimizer": {"type": "Lamb"}})"),
              HasSubstr("optimizer.type: expected Adam, AdamW or SGD, got \"Lamb\""));
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
