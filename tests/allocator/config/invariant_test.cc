// SPILLWAY_INVARIANT (allocator/config/invariant.h): where invariants are checked
// (sanitizer and Debug builds) a broken one aborts naming the condition, the
// message and the place; elsewhere its condition is not even evaluated.
#include <gtest/gtest.h>

#include "allocator/config/invariant.h"

namespace spillway {
namespace {

#if SPILLWAY_CHECK_INVARIANTS
TEST(InvariantDeathTest, ABrokenInvariantAbortsNamingConditionMessageAndPlace) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int chunks_in_use = 1;
  EXPECT_DEATH(SPILLWAY_INVARIANT(chunks_in_use == 0, "a chunk in compute is never evicted"),
               "invariant broken at .*invariant_test.cc:[0-9]+: chunks_in_use == 0 \\(a chunk "
               "in compute is never evicted\\)");
}

TEST(Invariant, AKeptInvariantIsEvaluatedOnceAndPasses) {
  int evaluations = 0;
  SPILLWAY_INVARIANT(++evaluations == 1, "evaluated once");
  EXPECT_EQ(evaluations, 1);
}
#else
TEST(Invariant, WithoutCheckingTheConditionIsNotEvaluated) {
  int evaluations = 0;
  SPILLWAY_INVARIANT(++evaluations == 1, "not evaluated");
  SPILLWAY_INVARIANT(false, "not checked in this build");
  EXPECT_EQ(evaluations, 0);
}
#endif

}  // namespace
}  // namespace spillway
