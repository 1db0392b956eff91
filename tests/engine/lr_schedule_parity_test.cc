// LrSchedule against DeepSpeed's own schedulers: for each case of
// lr_schedule_cases.json, the lr and betas (or SGD momentum) the optimizer
// holds at every step, as deepspeed_lr_reference.py recorded them from
// DeepSpeed at test time (ctest fixture deepspeed_lr_reference), must be the
// same doubles. Bit-equal, measured: LrSchedule keeps DeepSpeed's order of
// operations, and Python's floats and math.log/math.cos are the C library's.
#include <gtest/gtest.h>

#include <fstream>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hooks/engine/engine_config.h"
#include "hooks/engine/lr_schedule.h"

namespace spillway::engine {
namespace {

using nlohmann::json;

json read_json(const char* path) {
  std::ifstream in(path);
  if (!in) return json();
  return json::parse(in, nullptr, /*allow_exceptions=*/false);
}

const json& cases() {
  static const json parsed = read_json(SPILLWAY_LR_SCHEDULE_CASES);
  return parsed;
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  if (cases().is_object())
    for (const json& entry : cases().at("cases")) names.push_back(entry.at("name"));
  return names;  // none: gtest reports the suite as never instantiated, a failure
}

const json& case_config(const std::string& name) {
  for (const json& entry : cases().at("cases"))
    if (entry.at("name") == name) return entry.at("config");
  throw std::out_of_range(name);
}

// Both values to the last bit, which gtest's own message rounds away.
std::string both(double spillway, double deepspeed) {
  std::ostringstream out;
  out << std::setprecision(17) << "spillway " << spillway << ", DeepSpeed " << deepspeed;
  return out.str();
}

class LrScheduleParity : public testing::TestWithParam<std::string> {};

TEST_P(LrScheduleParity, EveryStepEqualsDeepSpeed) {
  const json reference = read_json(SPILLWAY_DEEPSPEED_LR_REFERENCE);
  ASSERT_TRUE(reference.is_object())
      << "no readable " << SPILLWAY_DEEPSPEED_LR_REFERENCE
      << ": the ctest fixture engine_deepspeed_lr_reference writes it (ctest -R parity runs it)";
  const std::string name = GetParam();
  ASSERT_TRUE(reference.at("cases").contains(name)) << "DeepSpeed's reference lacks " << name;
  const json& expected = reference.at("cases").at(name);
  const long long steps = cases().at("steps");

  const EngineConfig config = parse_engine_config(case_config(name).dump());
  ASSERT_TRUE(config.scheduler.has_value());
  LrSchedule schedule(*config.scheduler, config.optimizer);
  const bool sgd = config.optimizer.type == OptimizerType::sgd;
  ASSERT_EQ(expected.at("lr").size(), static_cast<size_t>(steps));
  for (long long step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const double lr = expected.at("lr").at(step).get<double>();
    ASSERT_EQ(schedule.lr(), lr) << "lr: " << both(schedule.lr(), lr);
    if (sgd) {
      // Never scheduled: the configured momentum throughout.
      ASSERT_FALSE(schedule.betas().has_value());
      ASSERT_EQ(config.optimizer.momentum, expected.at("momentum").at(step).get<double>());
    } else {
      const AdamBetas betas =
          schedule.betas().value_or(AdamBetas{config.optimizer.beta1, config.optimizer.beta2});
      const double beta1 = expected.at("beta1").at(step).get<double>();
      const double beta2 = expected.at("beta2").at(step).get<double>();
      ASSERT_EQ(betas.beta1, beta1) << "beta1: " << both(betas.beta1, beta1);
      ASSERT_EQ(betas.beta2, beta2) << "beta2: " << both(betas.beta2, beta2);
    }
    schedule.step();
  }
  EXPECT_EQ(schedule.last_batch_iteration(), expected.at("last_batch_iteration").get<long long>());
}

INSTANTIATE_TEST_SUITE_P(DeepSpeed, LrScheduleParity, testing::ValuesIn(case_names()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace spillway::engine
