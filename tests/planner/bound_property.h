// The bound's property tests: random repeating steps and cost models (3 to
// 12 chunks, room for 2 to 6, 1 to 40 ops of one or two chunks, some
// written, some fresh, with random durations and non-model bytes that leave
// the op's chunks room, and random copy bandwidths each way), and the check
// that no simulated step is shorter than the bound.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>

#include "tracer/planner/cost_simulator.h"
#include "tracer/planner/planner.h"
#include "tracer/planner/step_trace.h"

namespace spillway::plan {

struct RandomStep {
  StepTrace trace;
  CostModel model;
};

inline RandomStep random_step(std::mt19937& rng, std::uint64_t chunk_bytes) {
  const int chunks = std::uniform_int_distribution<int>(3, 12)(rng);
  const int capacity = std::uniform_int_distribution<int>(2, 6)(rng);
  const int length = std::uniform_int_distribution<int>(1, 40)(rng);
  RandomStep step;
  for (int i = 0; i < length; ++i) {
    TracedOp op{"op" + std::to_string(i),
                std::uniform_int_distribution<std::uint64_t>(1, 5000)(rng),
                0,
                {}};
    const int width = std::uniform_int_distribution<int>(1, 2)(rng);
    const int squeeze = std::uniform_int_distribution<int>(0, capacity - width)(rng);
    op.non_model_bytes = static_cast<std::uint64_t>(squeeze) * chunk_bytes + rng() % chunk_bytes;
    if (op.non_model_bytes + width * chunk_bytes > capacity * chunk_bytes) op.non_model_bytes = 0;
    for (int w = 0; w < width; ++w) {
      const auto chunk =
          static_cast<PlanChunk>(std::uniform_int_distribution<int>(0, chunks - 1)(rng));
      op.chunks.push_back({chunk, rng() % 2 == 0, rng() % 5 == 0});
    }
    step.trace.ops.push_back(op);
  }
  const double h2d = static_cast<double>(chunk_bytes) * 1e6 / (1 + rng() % 4000);
  const double d2h = static_cast<double>(chunk_bytes) * 1e6 / (1 + rng() % 4000);
  step.model =
      CostModel{static_cast<std::uint64_t>(capacity) * chunk_bytes, chunk_bytes, 0, h2d, d2h};
  return step;
}

// Calls check(trace, model, bound, round) on `rounds` random steps drawn
// from `seed`.
template <typename Check>
void for_random_steps(std::uint32_t seed, int rounds, Check check) {
  std::mt19937 rng(seed);
  for (int round = 0; round < rounds; ++round) {
    const RandomStep step = random_step(rng, std::uint64_t{1} << 20);
    check(step.trace, step.model, step_bound(step.trace, step.model), round);
  }
}

// Every step of `result` lasts at least `bound_ns` (up to rounding).
inline ::testing::AssertionResult no_step_below(const SimResult& result, double bound_ns) {
  for (std::size_t s = 0; s < result.steps.size(); ++s) {
    if (result.steps[s].step_ns < bound_ns * (1 - 1e-12)) {
      return ::testing::AssertionFailure() << "step " << s << " takes " << result.steps[s].step_ns
                                           << " ns, below the bound's " << bound_ns;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace spillway::plan
