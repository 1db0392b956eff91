// The chunk size search: the candidate set, agreement of the packed step
// with spillway-sim's where packing cannot differ, the choice minimising
// the simulated step, and the errors.
#include <gtest/gtest.h>

#include <algorithm>

#include <map>

#include "tools/chunksize/chunk_packing.h"
#include "tools/chunksize/chunk_size_search.h"
#include "tools/chunksize/packed_step_trace.h"
#include "tracer/planner/cost_simulator.h"

namespace spillway::chunksize {
namespace {

constexpr std::uint64_t MiB = 1 << 20;

TEST(CandidateSizes, PowersOfTwoAndHalfStepsFromTheMinimum) {
  EXPECT_EQ(candidate_sizes(3 * MiB, 16 * MiB),
            (std::vector<std::uint64_t>{3 * MiB, 4 * MiB, 6 * MiB, 8 * MiB, 12 * MiB, 16 * MiB}));
  EXPECT_EQ(candidate_sizes(5 * MiB, 13 * MiB),
            (std::vector<std::uint64_t>{5 * MiB, 6 * MiB, 8 * MiB, 12 * MiB}));
  EXPECT_EQ(candidate_sizes(7, 7), (std::vector<std::uint64_t>{7}));
  EXPECT_THROW(candidate_sizes(8 * MiB, 4 * MiB), ChunkSizeError);
  EXPECT_THROW(candidate_sizes(0, 4 * MiB), ChunkSizeError);
}

// Relabels chunks by first use, so traces with different chunk numbering compare.
plan::StepTrace canonical(plan::StepTrace trace) {
  std::map<plan::PlanChunk, plan::PlanChunk> label;
  for (plan::TracedOp& op : trace.ops) {
    for (plan::ChunkUse& use : op.chunks) {
      use.chunk =
          label.try_emplace(use.chunk, static_cast<plan::PlanChunk>(label.size())).first->second;
    }
    std::sort(op.chunks.begin(), op.chunks.end(),
              [](const plan::ChunkUse& a, const plan::ChunkUse& b) { return a.chunk < b.chunk; });
  }
  return trace;
}

TEST(PackedStepTrace, MatchesSpillwaySimWhenLayersFillWholeChunks) {
  // Every layer's data of each kind is exactly one chunk: the layer packing
  // of spillway-sim and the whole-tensor packing agree.
  const sim::ModelSpec model = sim::parse_model(R"({"repeat": 3, "layers": [
      {"name": "x", "param_bytes": 1024, "optimizer_bytes": 1024, "activation_bytes": 5,
       "forward_ns": 10, "optimizer_ns": 3}]})");
  const std::vector<ModelTensor> tensors = model_tensors(model);
  const plan::StepTrace packed =
      canonical(packed_step_trace(model, tensors, pack_tensors(tensors, 1024)));
  const plan::StepTrace reference = canonical(sim::step_trace(model, 1024));
  ASSERT_EQ(packed.ops.size(), reference.ops.size());
  for (std::size_t i = 0; i < packed.ops.size(); ++i) {
    EXPECT_EQ(packed.ops[i].name, reference.ops[i].name);
    EXPECT_EQ(packed.ops[i].duration_ns, reference.ops[i].duration_ns);
    EXPECT_EQ(packed.ops[i].non_model_bytes, reference.ops[i].non_model_bytes);
    ASSERT_EQ(packed.ops[i].chunks.size(), reference.ops[i].chunks.size()) << packed.ops[i].name;
    for (std::size_t c = 0; c < packed.ops[i].chunks.size(); ++c) {
      EXPECT_EQ(packed.ops[i].chunks[c].chunk, reference.ops[i].chunks[c].chunk);
      EXPECT_EQ(packed.ops[i].chunks[c].write, reference.ops[i].chunks[c].write);
    }
  }
}

SearchOptions copy_bound_device(std::uint64_t budget) {
  SearchOptions options;
  options.device.device_budget = budget;
  options.device.h2d_bytes_per_s = 55e9;
  options.device.d2h_bytes_per_s = 55e9;
  return options;
}

TEST(ChunkSizeSearch, ChoosesTheFastestCandidate) {
  const sim::ModelSpec model = sim::gpt_model({8, 1024, 512, 1});
  // 60% of the model on the device: data moves, and the default's 64 MB
  // chunks fit too (a block's optimizer step touches up to 13 of them, each
  // simulated at the full chunk size).
  const SearchResult search =
      search_chunk_size(model, copy_bound_device(model.model_bytes() * 6 / 10));
  // Largest tensor: the MLP's 4 d^2 fp32 master, 16 MiB; candidates up to 16x.
  EXPECT_EQ(search.largest_tensor_bytes, 16 * MiB);
  ASSERT_EQ(search.candidates.front().chunk_size, 16 * MiB);
  ASSERT_EQ(search.candidates.back().chunk_size, 256 * MiB);
  ASSERT_EQ(search.candidates.size(), 9u);
  std::size_t fitting = 0;
  double slowest = 0;
  for (const CandidateResult& row : search.candidates) {
    if (!row.fits) continue;
    ++fitting;
    slowest = std::max(slowest, row.step_ns);
    EXPECT_LE(search.best_result().step_ns, row.step_ns) << row.chunk_size;
    EXPECT_GE(row.step_ns, row.bound_ns) << row.chunk_size;
    EXPECT_GT(row.moved_bytes(), 0u);  // half of the model fits: data moves
  }
  EXPECT_GE(fitting, 3u);
  EXPECT_GT(slowest, search.best_result().step_ns);  // the choice matters
  // The best candidate is what evaluate_chunk_size says of its size.
  const CandidateResult again =
      evaluate_chunk_size(model, model_tensors(model), search.best_result().chunk_size,
                          copy_bound_device(model.model_bytes() * 6 / 10));
  EXPECT_EQ(again.step_ns, search.best_result().step_ns);
  // 64 MB holds every tensor, so the default runs and is compared.
  EXPECT_TRUE(search.default_size.fits);
  EXPECT_EQ(search.default_size.chunk_size, kDefaultChunkSize);
}

TEST(ChunkSizeSearch, WholeModelOnTheDeviceMovesNothing) {
  const sim::ModelSpec model = sim::gpt_model({4, 512, 256, 1});
  const SearchResult search = search_chunk_size(model, copy_bound_device(4 * model.model_bytes()));
  for (const CandidateResult& row : search.candidates) {
    ASSERT_TRUE(row.fits);
    EXPECT_EQ(row.moved_bytes(), 0u);
  }
  // Every size runs at compute speed; the smallest wastes nothing (4 MiB:
  // qkv and attention out fill one chunk, each MLP matrix one), so it wins.
  EXPECT_EQ(search.candidates.front().waste_bytes, 0u);
  EXPECT_EQ(search.best, 0u);
}

TEST(ChunkSizeSearch, RejectsABudgetNoCandidateFits) {
  const sim::ModelSpec model = sim::gpt_model({8, 1024, 512, 1});
  try {
    search_chunk_size(model, copy_bound_device(40 * MiB));
    FAIL() << "expected ChunkSizeError";
  } catch (const ChunkSizeError& error) {
    EXPECT_NE(std::string(error.what()).find("no candidate chunk size fits"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("needs"), std::string::npos) << error.what();
  }
}

TEST(ChunkSizeSearch, RejectsAMinimumBelowTheLargestTensor) {
  const sim::ModelSpec model = sim::gpt_model({2, 1024, 512, 1});
  SearchOptions options = copy_bound_device(model.model_bytes());
  options.min_chunk_size = 4 * MiB;
  try {
    search_chunk_size(model, options);
    FAIL() << "expected ChunkSizeError";
  } catch (const ChunkSizeError& error) {
    EXPECT_NE(std::string(error.what()).find("block0.mlp_in.master"), std::string::npos)
        << error.what();
  }
  options.min_chunk_size = 0;
  options.max_chunk_size = 8 * MiB;
  EXPECT_THROW(search_chunk_size(model, options), ChunkSizeError);
}

TEST(ChunkSizeSearch, DefaultBelowTheLargestTensorIsReportedNotRun) {
  const sim::ModelSpec model = sim::gpt_model({2, 2048, 256, 1});  // 64 MiB fp32 matrices
  const SearchResult search = search_chunk_size(model, copy_bound_device(model.model_bytes()));
  EXPECT_FALSE(search.default_size.fits);
  EXPECT_NE(search.default_size.why_not.find("larger than the chunk"), std::string::npos);
}

}  // namespace
}  // namespace spillway::chunksize
