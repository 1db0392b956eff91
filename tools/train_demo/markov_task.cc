#include "tools/train_demo/markov_task.h"

namespace spillway::train_demo {

MarkovTask::MarkovTask(std::int64_t vocab, std::uint64_t seed)
    : vocab_(vocab), successors_(vocab * kSuccessors), rng_(seed) {
  // Raw engine output modulo the vocabulary, not std::uniform_int_distribution,
  // whose algorithm the standard leaves to the library.
  for (std::int64_t& successor : successors_) successor = std::int64_t(rng_() % vocab_);
}

Batch MarkovTask::next_batch(std::int64_t batch, std::int64_t time) {
  torch::Tensor sequences = torch::empty({batch, time + 1}, torch::kLong);
  auto rows = sequences.accessor<std::int64_t, 2>();
  for (std::int64_t b = 0; b < batch; ++b) {
    std::int64_t token = std::int64_t(rng_() % vocab_);
    for (std::int64_t t = 0; t <= time; ++t) {
      rows[b][t] = token;
      token = successors_[token * kSuccessors + std::int64_t(rng_() % kSuccessors)];
    }
  }
  return {sequences.narrow(1, 0, time).contiguous(), sequences.narrow(1, 1, time).contiguous()};
}

}  // namespace spillway::train_demo
