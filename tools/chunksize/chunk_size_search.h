// Chunk size search: simulates the step of a model description under the
// planned policy at each candidate chunk size (tensors packed by the chunk
// manager's rule) and picks the size with the shortest step.
//
// Candidates: the smallest chunk that holds the largest tensor (rounded up
// to 512 bytes, at least 2 MiB, the configuration's lower limit), then every
// 2^k and 3 * 2^(k-1) bytes (powers of two and the 1.5x steps between them)
// above it up to the maximum, which is 16x the smallest unless given.
// A smaller chunk would give the largest tensor a chunk of its own, which
// the simulator's one-size chunks cannot model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/chunksize/model_tensors.h"
#include "tools/sim/model_description.h"
#include "tracer/planner/planner.h"
#include "tracer/planner/step_trace.h"

namespace spillway::chunksize {

// The configuration's chunk_size limits (docs/configuration.md).
inline constexpr std::uint64_t kMinChunkSize = 2ull << 20;
inline constexpr std::uint64_t kDefaultChunkSize = 64'000'000;  // allocator/config/config.h

// Bad arguments, or no candidate fits the budget: the message says which.
class ChunkSizeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SearchOptions {
  plan::CostModel device;            // budget, margin, bandwidths; chunk_size unused
  std::uint64_t min_chunk_size = 0;  // 0: the smallest that holds the largest tensor
  std::uint64_t max_chunk_size = 0;  // 0: 16x the minimum
  std::uint64_t default_chunk_size = kDefaultChunkSize;
  std::size_t steps = 4;  // simulated; the last one is reported
  plan::PlanOptions plan_options;
};

struct CandidateResult {
  std::uint64_t chunk_size = 0;
  bool fits = false;
  std::string why_not;  // when !fits: the op that does not fit, or the tensor
  std::size_t chunks = 0;
  std::uint64_t waste_bytes = 0;
  std::uint64_t capacity_bytes = 0;
  double step_ns = 0;  // the last simulated step, planned policy
  double stall_ns = 0;
  double bound_ns = 0;          // step_bound: compute, link and room (cost_simulator.h)
  std::uint64_t h2d_bytes = 0;  // in the last step
  std::uint64_t d2h_bytes = 0;

  std::uint64_t moved_bytes() const { return h2d_bytes + d2h_bytes; }
};

struct SearchResult {
  std::uint64_t largest_tensor_bytes = 0;
  std::string largest_tensor;
  std::vector<CandidateResult> candidates;  // ascending chunk size
  std::size_t best = 0;                     // index of the fastest that fits
  CandidateResult default_size;             // fits == false with why_not when it cannot run

  const CandidateResult& best_result() const { return candidates[best]; }
};

// Sorted, distinct; throws ChunkSizeError when max < min or min is 0.
std::vector<std::uint64_t> candidate_sizes(std::uint64_t min_size, std::uint64_t max_size);

// One chunk size: packs, simulates, bounds. A size that does not fit (an op
// over the budget, a tensor over the chunk) comes back with fits == false.
CandidateResult evaluate_chunk_size(const sim::ModelSpec& model,
                                    const std::vector<ModelTensor>& tensors,
                                    std::uint64_t chunk_size, const SearchOptions& options);

// Best: shortest step (within one part in a million); ties go to fewer
// bytes moved, then less waste, then the smaller chunk. Throws ChunkSizeError when no candidate
// fits.
SearchResult search_chunk_size(const sim::ModelSpec& model, const SearchOptions& options);

}  // namespace spillway::chunksize
