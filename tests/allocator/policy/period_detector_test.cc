// PeriodDetector (allocator/policy/period_detector.h): the step of an
// unmarked access stream is found once it has run twice, and neither the
// short repeats inside a step nor a stream without a period pass for one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "allocator/policy/period_detector.h"

namespace spillway::testing {
namespace {

ChunkId chunk(int id) { return static_cast<ChunkId>(id); }

// A training-shaped stream over `layers` layers, `per_chunk` to a parameter
// chunk (weight and bias read in turn, so a chunk is read several times in a
// row) and gradient chunks beside them: forward and backward once per
// micro-batch, then the optimizer over every chunk.
std::vector<int> forward_backward(int layers, int per_chunk = 2) {
  std::vector<int> accesses;
  for (int layer = 0; layer < layers; ++layer) {
    accesses.push_back(layer / per_chunk);  // weight
    accesses.push_back(layer / per_chunk);  // bias
  }
  for (int layer = layers - 1; layer >= 0; --layer) {
    accesses.push_back(layer / per_chunk);        // the weight, for the input's gradient
    accesses.push_back(100 + layer / per_chunk);  // its gradient, accumulated
  }
  return accesses;
}

std::vector<int> training_step(int layers, int micro_batches, int per_chunk = 2) {
  std::vector<int> step;
  for (int micro = 0; micro < micro_batches; ++micro) {
    const std::vector<int> part = forward_backward(layers, per_chunk);
    step.insert(step.end(), part.begin(), part.end());
  }
  for (int c = 0; c < (layers + per_chunk - 1) / per_chunk; ++c) {
    step.push_back(100 + c);  // read the gradient
    step.push_back(c);        // update the parameter
  }
  return step;
}

// Feeds `steps` copies of `step`; the accesses (from 0) at which a period
// was found, and the periods.
struct Found {
  std::vector<std::size_t> at;
  std::vector<std::size_t> periods;
};

Found feed(PeriodDetector& detector, const std::vector<int>& step, int steps) {
  Found found;
  std::size_t index = 0;
  for (int s = 0; s < steps; ++s) {
    for (int id : step) {
      detector.push(chunk(id));
      if (const std::optional<std::size_t> period = detector.find_period()) {
        found.at.push_back(index);
        found.periods.push_back(*period);
      }
      ++index;
    }
  }
  return found;
}

TEST(PeriodDetector, FindsTheStepAtTheLastAccessOfItsSecondRun) {
  for (int layers : {12, 40, 100}) {
    const std::vector<int> step = training_step(layers, 1);
    PeriodDetector detector;
    const Found found = feed(detector, step, 2);
    ASSERT_EQ(found.at.size(), 1u)
        << layers << " layers: found at " << found.at.size() << " points";
    EXPECT_EQ(found.at[0], 2 * step.size() - 1) << layers << " layers";
    EXPECT_EQ(found.periods[0], step.size()) << layers << " layers";
  }
}

TEST(PeriodDetector, TakesNoRepeatOfAFewChunksInsideAStep) {
  // A step with runs of one chunk and a stretch alternating two chunks, long
  // after the stream began: none of them is a period of the stream.
  std::vector<int> step = training_step(40, 1);
  const std::vector<int> repeats = {7, 7, 7, 7, 3, 5, 3, 5, 3, 5};
  step.insert(step.begin() + 50, repeats.begin(), repeats.end());
  PeriodDetector detector;
  const Found found = feed(detector, step, 1);
  EXPECT_TRUE(found.at.empty()) << "a repeat inside the step taken as the step, period "
                                << found.periods.front() << " at access " << found.at.front();
}

TEST(PeriodDetector, FindsNothingInAStreamWithoutAPeriod) {
  std::mt19937 random(3);
  PeriodDetector detector;
  for (int i = 0; i < 20000; ++i) {
    detector.push(chunk(static_cast<int>(random() % 40)));
    ASSERT_EQ(detector.find_period(), std::nullopt) << "at access " << i;
  }
}

TEST(PeriodDetector, WaitsForTheCoverageWindowBeforeTakingAShortStep) {
  // A 6-access step has run twice after 12 accesses; the period is taken
  // only once the history spans the coverage window.
  const std::vector<int> step = {0, 1, 2, 2, 1, 0};
  PeriodDetector detector;
  const Found found = feed(detector, step, 20);
  ASSERT_FALSE(found.at.empty());
  EXPECT_EQ(found.at.front(), PeriodDetector::kCoverageWindow - 1);
  EXPECT_EQ(found.periods.front(), step.size());
}

// Follows each period found, the way PlannedPolicy does, until the stream
// departs from it. The period followed at the end, the access it was found
// at, and the lengths of the periods departed from.
struct Followed {
  std::size_t period = 0;
  std::size_t found_at = 0;
  std::vector<std::size_t> departed;
};

Followed follow(const std::vector<int>& stream) {
  PeriodDetector detector;
  Followed followed;
  std::vector<int> plan;
  std::size_t position = 0;
  for (std::size_t i = 0; i < stream.size(); ++i) {
    detector.push(chunk(stream[i]));
    if (!plan.empty()) {
      if (position == plan.size()) position = 0;
      if (plan[position] == stream[i]) {
        ++position;
        continue;
      }
      followed.departed.push_back(plan.size());
      plan.clear();
    }
    if (const std::optional<std::size_t> period = detector.find_period()) {
      plan.assign(stream.begin() + static_cast<std::ptrdiff_t>(i + 1 - *period),
                  stream.begin() + static_cast<std::ptrdiff_t>(i + 1));
      position = plan.size();
      followed.found_at = i;
    }
  }
  followed.period = plan.size();
  return followed;
}

std::vector<int> repeated(const std::vector<int>& loop, int times) {
  std::vector<int> stream;
  for (int s = 0; s < times; ++s) stream.insert(stream.end(), loop.begin(), loop.end());
  return stream;
}

TEST(PeriodDetector, GradientAccumulationIsFoundAsTheWholeStepWhenItHasRunTwice) {
  for (int micro_batches : {2, 4, 15}) {
    // 24 layers to a chunk: each chunk recurs about a hundred times a micro-batch.
    for (int per_chunk : {2, 24}) {
      const std::vector<int> step = training_step(48, micro_batches, per_chunk);
      const Followed followed = follow(repeated(step, 5));
      const std::string where = std::to_string(micro_batches) + " micro-batches, " +
                                std::to_string(per_chunk) + " layers a chunk";
      EXPECT_EQ(followed.period, step.size()) << where;
      EXPECT_EQ(followed.found_at, 2 * step.size() - 1) << where;
      // The micro-batch is followed while it lasts, in each of the first two
      // steps. With 24 layers to a chunk the backward pass alternates two
      // chunks 48 times, a period of the stream while it lasts, also followed.
      const std::size_t micro_batch = forward_backward(48, per_chunk).size();
      EXPECT_EQ(std::count(followed.departed.begin(), followed.departed.end(), micro_batch), 2)
          << where;
      for (std::size_t period : followed.departed) EXPECT_LE(period, micro_batch) << where;
    }
  }
}

// Training, then evaluation (a shorter loop over some of the chunks), then
// training again: each loop is followed once it has run twice.
TEST(PeriodDetector, ALoopThatChangesIsFoundAgainEachTime) {
  const std::vector<int> train = training_step(40, 1);
  std::vector<int> evaluate;
  for (int c = 0; c < 20; ++c) evaluate.insert(evaluate.end(), {c, c, c, c});
  std::vector<int> stream = repeated(train, 3);
  const std::vector<int> evaluation = repeated(evaluate, 4);
  stream.insert(stream.end(), evaluation.begin(), evaluation.end());
  Followed followed = follow(stream);
  EXPECT_EQ(followed.period, evaluate.size());
  EXPECT_EQ(followed.departed, std::vector<std::size_t>{train.size()});
  const std::vector<int> training_again = repeated(train, 3);
  stream.insert(stream.end(), training_again.begin(), training_again.end());
  followed = follow(stream);
  EXPECT_EQ(followed.period, train.size());
  // By the end of its second run (an access sooner here: evaluation's last
  // access is training's last too).
  EXPECT_LE(followed.found_at, stream.size() - train.size() - 1);
  EXPECT_EQ(followed.departed, (std::vector<std::size_t>{train.size(), evaluate.size()}));
}

TEST(PeriodDetector, KeepsFindingAfterItsHistoryIsCut) {
  const std::vector<int> step = training_step(12, 1);
  PeriodDetector detector;
  feed(detector, step, 3);
  detector.keep_latest(step.size() / 2);
  EXPECT_EQ(detector.size(), step.size() / 2);
  const Found found = feed(detector, step, 2);
  ASSERT_FALSE(found.periods.empty());
  EXPECT_EQ(found.periods.front(), step.size());
}

}  // namespace
}  // namespace spillway::testing
