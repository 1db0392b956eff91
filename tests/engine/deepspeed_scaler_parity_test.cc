// Parity with DeepSpeed 0.18's own code: deepspeed_scaler_reference.py ran
// DeepSpeed's loss scalers and clipping over deepspeed_scaler_cases.json (the
// ctest fixture deepspeed_scaler_reference); here spillway runs the same
// cases, its options read by parse_engine_config from the same fp16 block,
// and every scale, skipped step and factor must be bit-equal.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace spillway::engine
