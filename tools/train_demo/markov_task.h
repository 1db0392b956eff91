// The demo's synthetic next-token task: sequences drawn from a fixed random
// bigram (first-order Markov) table in which each token has a few likely
// successors. A model that learns the table reaches the table's entropy, far
// below the uniform guess, so the loss falls visibly within a few steps.
// Everything comes from one seed through std::mt19937_64 (whose output the
// standard fixes) and integer arithmetic, so batches are the same on every
// machine and in every run with that seed.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include <torch/torch.h>

namespace spillway::train_demo {

struct Batch {
  torch::Tensor tokens;   // [batch, time] int64
  torch::Tensor targets;  // [batch, time] int64: the token after each one
};

class MarkovTask {
 public:
  static constexpr int kSuccessors = 4;  // hence a loss floor near ln 4

  MarkovTask(std::int64_t vocab, std::uint64_t seed);

  // The next batch of the stream; the n-th call returns the same batch in
  // every task built with the same seed.
  Batch next_batch(std::int64_t batch, std::int64_t time);

 private:
  std::int64_t vocab_;
  std::vector<std::int64_t> successors_;  // vocab x kSuccessors
  std::mt19937_64 rng_;
};

}  // namespace spillway::train_demo
