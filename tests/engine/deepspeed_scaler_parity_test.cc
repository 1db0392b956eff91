// Parity with DeepSpeed 0.18's own code: deepspeed_scaler_reference.py ran
// DeepSpeed's loss scalers and clipping over deepspeed_scaler_cases.json (the
// ctest fixture deepspeed_scaler_reference); here spillway runs the same
// cases, its options read by parse_engine_config from the same fp16 block,
// and every scale, skipped step and factor must be bit-equal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "hooks/engine/engine_config.h"
#include "hooks/engine/gradient_clipping.h"
#include "hooks/engine/loss_scaler.h"

namespace spillway::engine {
namespace {

using nlohmann::json;

json read_json(const char* path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(std::string("cannot read ") + path);
  return json::parse(in);
}

class DeepSpeedParity : public ::testing::Test {
 protected:
  void SetUp() override {
    cases_ = read_json(SPILLWAY_DS_SCALER_CASES);
    reference_ = read_json(SPILLWAY_DS_SCALER_REFERENCE);
    ASSERT_EQ(reference_.at("scaler").size(), cases_.at("scaler").size())
        << "the reference is older than the cases; rerun the fixture";
    ASSERT_EQ(reference_.at("clip").size(), cases_.at("clip").size());
    ASSERT_EQ(reference_.at("configs").size(), cases_.at("configs").size());
  }
  json cases_;
  json reference_;
};

// The scaler options as the engine gets them: the case's fp16 block read by
// parse_engine_config, under ZeRO stage 1 for DeepSpeed's DynamicLossScaler.
LossScalerOptions options_for(const json& scaler_case) {
  json config = {
      {"optimizer", {{"type", "Adam"}}},
      {"fp16", scaler_case.at("fp16")},
      {"zero_optimization", {{"stage", scaler_case.at("rule") == "zero_optimizer" ? 1 : 0}}}};
  config["fp16"]["enabled"] = true;
  return parse_engine_config(config.dump()).loss_scaler;
}

TEST_F(DeepSpeedParity, LossScaleBeforeEachStepAndSkippedStepsAreDeepSpeeds) {
  for (std::size_t i = 0; i < cases_.at("scaler").size(); ++i) {
    const json& scaler_case = cases_["scaler"][i];
    const json& expected = reference_["scaler"][i];
    SCOPED_TRACE(scaler_case.at("name").get<std::string>());
    ASSERT_EQ(expected.at("name"), scaler_case.at("name"));
    const LossScalerOptions options = options_for(scaler_case);
    EXPECT_EQ(options.rule, scaler_case.at("rule") == "zero_optimizer"
                                ? LossScaleRule::zero_optimizer
                                : LossScaleRule::fp16_optimizer);
    LossScaler scaler(options);
    const std::string overflows = scaler_case.at("overflows");
    std::uint64_t skipped = 0;
    bool stopped = false;
    for (std::size_t step = 0; step < overflows.size(); ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      ASSERT_LT(step, expected.at("scales").size());
      EXPECT_EQ(scaler.scale(), expected["scales"][step].get<double>());
      const bool overflow = overflows[step] == 'x';
      try {
        scaler.update(overflow);
      } catch (const std::runtime_error&) {
        EXPECT_EQ(expected.at("error_at"), json(step)) << "spillway stopped, DeepSpeed did not";
        stopped = true;
        break;
      }
      EXPECT_EQ(overflow, expected.at("skipped")[step].get<bool>());
      skipped += overflow ? 1 : 0;
    }
    if (!stopped) EXPECT_TRUE(expected.at("error_at").is_null()) << "DeepSpeed stopped the run";
    if (!stopped) EXPECT_EQ(scaler.overflows(), skipped);
  }
}

std::string fmt_case(const std::string& path, double max_norm, double loss_scale, double norm) {
  char text[160];
  std::snprintf(text, sizeof text, "%s max_norm %.17g loss_scale %.17g norm %.17g", path.c_str(),
                max_norm, loss_scale, norm);
  return text;
}

ClipPath path_named(const std::string& name) {
  if (name == "fp16") return ClipPath::fp16;
  if (name == "bf16") return ClipPath::bf16;
  if (name == "zero") return ClipPath::zero;
  return ClipPath::fp32;
}

TEST_F(DeepSpeedParity, ClippingFactorIsDeepSpeeds) {
  for (std::size_t i = 0; i < cases_.at("clip").size(); ++i) {
    const json& clip_case = cases_["clip"][i];
    const json& expected = reference_["clip"][i];
    const double max_norm = clip_case.at("max_norm");
    const double loss_scale = clip_case.at("loss_scale");
    const ClipPath path = path_named(clip_case.at("path"));
    ASSERT_EQ(expected.at("factors").size(), clip_case.at("norms").size());
    for (std::size_t k = 0; k < expected["factors"].size(); ++k) {
      // The norm DeepSpeed computed from the case's (float32 where its path
      // holds the norm in a tensor).
      const double norm = expected["norms"][k];
      SCOPED_TRACE(fmt_case(clip_case.at("path"), max_norm, loss_scale, norm));
      EXPECT_EQ(deepspeed_gradient_factor(path, norm, max_norm, loss_scale),
                expected["factors"][k].get<double>());
    }
  }
}

// The same configuration file read by DeepSpeedConfig and by
// parse_engine_config: what DeepSpeed rejects spillway rejects, and what it
// accepts reads the same.
TEST_F(DeepSpeedParity, ConfigurationsReadAsDeepSpeedReadsThem) {
  for (std::size_t i = 0; i < cases_.at("configs").size(); ++i) {
    const json& config_case = cases_["configs"][i];
    const json& expected = reference_["configs"][i];
    SCOPED_TRACE(config_case.at("name").get<std::string>());
    ASSERT_EQ(expected.at("name"), config_case.at("name"));
    EngineConfig config;
    try {
      config = parse_engine_config(config_case.at("config").dump());
    } catch (const std::invalid_argument& error) {
      EXPECT_TRUE(expected.contains("error"))
          << "spillway rejects what DeepSpeed accepts: " << error.what();
      continue;
    }
    ASSERT_FALSE(expected.contains("error"))
        << "spillway accepts what DeepSpeed rejects: " << expected.at("error");
    EXPECT_EQ(config.train_batch_size, expected.at("train_batch_size").get<long long>());
    EXPECT_EQ(config.train_micro_batch_size_per_gpu,
              expected.at("train_micro_batch_size_per_gpu").get<long long>());
    EXPECT_EQ(config.gradient_accumulation_steps,
              expected.at("gradient_accumulation_steps").get<int>());
    if (expected.at("steps_per_print").is_null()) {
      EXPECT_FALSE(config.steps_per_print.has_value());
    } else {
      EXPECT_EQ(config.steps_per_print, expected.at("steps_per_print").get<long long>());
    }
    EXPECT_EQ(config.wall_clock_breakdown, expected.at("wall_clock_breakdown").get<bool>());
    EXPECT_EQ(config.gradient_clipping, expected.at("gradient_clipping").get<double>());
    EXPECT_EQ(config.zero.stage, expected.at("zero_stage").get<int>());
    EXPECT_EQ(to_string(config.zero.offload_optimizer), expected.at("offload_optimizer"));
    EXPECT_EQ(to_string(config.zero.offload_param), expected.at("offload_param"));
    EXPECT_EQ(config.precision == Precision::fp16, expected.at("fp16_enabled").get<bool>());
    EXPECT_EQ(config.precision == Precision::bf16, expected.at("bf16_enabled").get<bool>());
    const LossScalerOptions& scaler = config.loss_scaler;
    const json& args = expected.at("fp16_dynamic_args");
    EXPECT_EQ(scaler.static_scale, expected.at("loss_scale").get<double>());
    EXPECT_EQ(std::ldexp(1.0, scaler.initial_scale_power), args.at("init_scale").get<double>());
    EXPECT_EQ(scaler.window, args.at("scale_window").get<double>());
    EXPECT_EQ(scaler.hysteresis, args.at("delayed_shift").get<double>());
    EXPECT_EQ(scaler.consecutive_hysteresis, args.at("consecutive_hysteresis").get<double>() != 0);
    EXPECT_EQ(scaler.min_scale, args.at("min_scale").get<double>());
  }
}

}  // namespace
}  // namespace spillway::engine
