#include "tools/chunksize/chunk_size_search.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "allocator/chunk/chunk_packer.h"
#include "tools/chunksize/chunk_packing.h"
#include "tools/chunksize/packed_step_trace.h"
#include "tracer/planner/cost_simulator.h"

namespace spillway::chunksize {
namespace {

std::uint64_t round_up(std::uint64_t value, std::uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Steps this close are a tie: the simulator's sums of doubles differ in
// the last bits between sizes that move nothing.
constexpr double kStepTie = 1e-6;

bool better(const CandidateResult& a, const CandidateResult& b) {
  if (std::abs(a.step_ns - b.step_ns) > kStepTie * std::max(a.step_ns, b.step_ns)) {
    return a.step_ns < b.step_ns;
  }
  return std::make_tuple(a.moved_bytes(), a.waste_bytes, a.chunk_size) <
         std::make_tuple(b.moved_bytes(), b.waste_bytes, b.chunk_size);
}

}  // namespace

std::vector<std::uint64_t> candidate_sizes(std::uint64_t min_size, std::uint64_t max_size) {
  if (min_size == 0) throw ChunkSizeError("the smallest chunk size must be positive");
  if (max_size < min_size) {
    throw ChunkSizeError("the largest chunk size (" + std::to_string(max_size) +
                         " bytes) is below the smallest (" + std::to_string(min_size) + " bytes)");
  }
  std::set<std::uint64_t> sizes{min_size};
  for (std::uint64_t power = 1; power <= max_size && power != 0; power <<= 1) {
    for (std::uint64_t size : {power, power + power / 2}) {
      if (size > min_size && size <= max_size) sizes.insert(size);
    }
  }
  return {sizes.begin(), sizes.end()};
}

CandidateResult evaluate_chunk_size(const sim::ModelSpec& model,
                                    const std::vector<ModelTensor>& tensors,
                                    std::uint64_t chunk_size, const SearchOptions& options) {
  CandidateResult result;
  result.chunk_size = chunk_size;
  const Packing packing = pack_tensors(tensors, chunk_size);
  result.chunks = packing.chunks.size();
  result.waste_bytes = packing.waste_bytes();
  result.capacity_bytes = packing.capacity_bytes();
  if (packing.own_chunks() > 0) {
    result.why_not = std::to_string(packing.own_chunks()) +
                     " tensors are larger than the chunk and would get chunks of their own";
    return result;
  }
  plan::CostModel device = options.device;
  device.chunk_size = ChunkPacker(chunk_size).chunk_capacity();
  const plan::StepTrace trace = packed_step_trace(model, tensors, packing);
  try {
    result.bound_ns = plan::step_bound(trace, device).bound_ns;
  } catch (const plan::PlanError& error) {
    result.why_not = error.what();
    return result;
  }
  const plan::SimResult sim =
      plan::simulate(trace, device, plan::SimPolicy::planned, options.steps, options.plan_options);
  if (!sim.ok()) {
    result.why_not = sim.error;
    return result;
  }
  result.fits = true;
  result.step_ns = sim.last().step_ns;
  result.stall_ns = sim.last().stall_ns;
  result.h2d_bytes = sim.last().h2d_bytes;
  result.d2h_bytes = sim.last().d2h_bytes;
  return result;
}

SearchResult search_chunk_size(const sim::ModelSpec& model, const SearchOptions& options) {
  if (options.device.device_budget == 0) throw ChunkSizeError("the device budget must be positive");
  if (options.steps == 0) throw ChunkSizeError("the number of steps must be positive");
  const std::vector<ModelTensor> tensors = model_tensors(model);
  if (tensors.empty()) throw ChunkSizeError("the model '" + model.name + "' has no model data");
  SearchResult search;
  for (const ModelTensor& tensor : tensors) {
    if (tensor.bytes > search.largest_tensor_bytes) {
      search.largest_tensor_bytes = tensor.bytes;
      search.largest_tensor = tensor.name;
    }
  }
  const std::uint64_t fits_largest =
      std::max(kMinChunkSize, round_up(search.largest_tensor_bytes, ChunkPacker::kChunkRoundBytes));
  if (options.min_chunk_size != 0 && options.min_chunk_size < fits_largest) {
    throw ChunkSizeError(
        "the smallest chunk size asked for (" + std::to_string(options.min_chunk_size) +
        " bytes) cannot hold the largest tensor, " + search.largest_tensor + " (" +
        std::to_string(search.largest_tensor_bytes) + " bytes); the smallest that can is " +
        std::to_string(fits_largest) + " bytes");
  }
  const std::uint64_t min_size =
      options.min_chunk_size != 0 ? options.min_chunk_size : fits_largest;
  const std::uint64_t max_size =
      options.max_chunk_size != 0 ? options.max_chunk_size : 16 * min_size;
  if (max_size < min_size) {
    throw ChunkSizeError("the largest chunk size asked for (" + std::to_string(max_size) +
                         " bytes) is below the smallest candidate, " + std::to_string(min_size) +
                         " bytes, which the largest tensor " + search.largest_tensor + " (" +
                         std::to_string(search.largest_tensor_bytes) + " bytes) needs");
  }
  for (std::uint64_t size : candidate_sizes(min_size, max_size)) {
    search.candidates.push_back(evaluate_chunk_size(model, tensors, size, options));
  }
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < search.candidates.size(); ++i) {
    if (!search.candidates[i].fits) continue;
    if (!best || better(search.candidates[i], search.candidates[*best])) best = i;
  }
  if (!best) {
    throw ChunkSizeError("no candidate chunk size fits the device budget of " +
                         std::to_string(options.device.device_budget) + " bytes; at " +
                         std::to_string(search.candidates.front().chunk_size) +
                         " bytes: " + search.candidates.front().why_not);
  }
  search.best = *best;
  search.default_size = evaluate_chunk_size(model, tensors, options.default_chunk_size, options);
  return search;
}

}  // namespace spillway::chunksize
