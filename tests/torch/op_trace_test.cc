// The op hooks' trace events (format version 3) for a managed LibTorch model:
// every op that touches managed tensors is an op_begin/op_end pair with its
// aten name, nested ops name their parent, and chunk uses fall inside ops;
// and memory_stats_json() says where op timing comes from.
// Its own program: the process runtime is configured once, here with a trace.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "allocator/runtime.h"
#include "hooks/torch/op_gpu_timing.h"
#include "hooks/torch/spillway_torch.h"
#include "tracer/trace_file.h"

namespace {

namespace fs = std::filesystem;
using spillway::TraceEvent;
using spillway::TraceEventKind;

constexpr int kSteps = 3;

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() /
         ("spillway_op_trace_" + name + "_" + std::to_string(::getpid()) + ".trace");
}

TEST(TorchOpTrace, ManagedModelOpsArePairedAndNamed) {
  const fs::path live = temp_file("live");
  const fs::path snapshot = temp_file("snapshot");
  spillway::configure("device:sim,chunk_size:2MiB,device_budget:6MiB,sim_capacity:256MiB,trace:" +
                      live.string());
  torch::set_num_threads(1);
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(128, 512), torch::nn::ReLU(),
                              torch::nn::Linear(512, 16));
  spillway::manage(*model);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    const torch::Tensor loss =
        torch::mse_loss(model->forward(torch::randn({16, 128})), torch::randn({16, 16}));
    loss.backward();
    optimizer.step();
    spillway::step();
  }
  spillway::dump_trace(snapshot.string());
  const spillway::TraceReadResult read = spillway::read_trace_file(snapshot.string());
  fs::remove(snapshot);
  ASSERT_TRUE(read.ok()) << read.error;  // names defined before use, ops coherent
  const spillway::TraceFileContents& trace = *read.trace;
  EXPECT_EQ(trace.format_version, spillway::kTraceFormatVersion);

  struct Open {
    std::uint32_t name;
    std::uint64_t thread;
  };
  std::map<std::uint64_t, Open> open;               // by sequence number
  std::map<std::uint64_t, std::uint64_t> last_seq;  // per thread
  std::set<std::string> names;
  std::vector<int> ops_per_step(1, 0);
  int pairs = 0, nested = 0, accesses_inside_ops = 0, steps = 0;
  for (const TraceEvent& e : trace.events) {
    switch (e.kind) {
      case TraceEventKind::op_begin:
        open[e.address] = {e.client, e.stream};
        names.insert(trace.op_names.at(e.client));
        EXPECT_GT(e.address, last_seq[e.stream]) << "a thread's ops are numbered as they start";
        last_seq[e.stream] = e.address;
        if (e.size != 0) {
          ++nested;
          EXPECT_TRUE(open.contains(e.size)) << "the enclosing op is open";
        }
        ++ops_per_step.back();
        break;
      case TraceEventKind::op_end: {
        const auto begun = open.find(e.address);
        ASSERT_NE(begun, open.end());
        EXPECT_EQ(begun->second.name, e.client);
        EXPECT_EQ(begun->second.thread, e.stream);
        open.erase(begun);
        ++pairs;
        break;
      }
      case TraceEventKind::chunk_access:
        if (!open.empty()) ++accesses_inside_ops;
        break;
      case TraceEventKind::step:
        ++steps;
        ops_per_step.push_back(0);
        break;
      default:
        break;
    }
  }
  EXPECT_TRUE(open.empty()) << open.size() << " ops without op_end";
  EXPECT_EQ(steps, kSteps);
  EXPECT_GT(pairs, 0);
  for (int step = 0; step < kSteps; ++step) EXPECT_GT(ops_per_step[step], 0) << step;
  // Linear's forward: addmm with the managed weight and bias, inside the
  // aten::linear record.
  EXPECT_TRUE(names.contains("aten::addmm")) << ::testing::PrintToString(names);
  EXPECT_GT(nested, 0) << "aten::t runs aten::transpose on the managed weight";
  EXPECT_GT(accesses_inside_ops, 0);

  // Op timing (hooks/torch/op_gpu_timing.h): on the sim device the op_end
  // durations above are the timing, and the stats say why CUPTI is not used.
  const nlohmann::json stats = nlohmann::json::parse(spillway::memory_stats_json());
  ASSERT_TRUE(stats.contains("op_timing")) << stats.dump();
  EXPECT_EQ(stats["op_timing"]["source"], "wall_clock");
  EXPECT_NE(stats["op_timing"]["reason"].get<std::string>().find("sim device"), std::string::npos)
      << stats["op_timing"].dump();
  EXPECT_EQ(stats["op_timing"]["kernels"], 0);

  // Note [A gradient set to none is not fetched]: the loop's zero_grad sets
  // the gradients to none, so in every step each grad chunk written comes
  // back for the backward zeroed on the device (a chunk_fetch of 0 bytes),
  // not with the last step's gradients. (Its writes include zero_grad's
  // detach_, before the backward.)
  spillway::ChunkManager& chunks = spillway::Runtime::process().chunk_manager();
  const auto is_grad_chunk = [&](std::uint64_t id) {
    const auto info = chunks.chunk_info(spillway::ChunkId{static_cast<std::uint32_t>(id)});
    return info && info->kind == spillway::TensorKind::grad;
  };
  std::set<std::uint64_t> zeroed, written;  // grad chunks, this step
  int grad_chunk_steps = 0;
  int step_number = 0;
  const auto check_step = [&] {
    ++step_number;
    for (const std::uint64_t chunk : written) {
      ++grad_chunk_steps;
      EXPECT_TRUE(zeroed.contains(chunk)) << "grad chunk " << chunk << " was written in step "
                                          << step_number << " and never zeroed on the device in it";
    }
    zeroed.clear();
    written.clear();
  };
  for (const TraceEvent& e : trace.events) {
    if (e.kind == TraceEventKind::step) {
      check_step();
    } else if (e.kind == TraceEventKind::chunk_fetch && e.size == 0 && is_grad_chunk(e.address)) {
      zeroed.insert(e.address);
    } else if (e.kind == TraceEventKind::chunk_access &&
               e.detail == spillway::kTraceDetailReadWrite && is_grad_chunk(e.address)) {
      written.insert(e.address);
    }
  }
  check_step();
  EXPECT_GE(grad_chunk_steps, kSteps);
}

// Note [One warning]: the hooks log CUPTI's fallback once per process,
// however often op timing starts and falls back.
TEST(TorchOpTiming, CuptiFallbackIsWarnedOncePerProcess) {
  spillway::torch_bridge::detail::forget_cupti_fallback_warning();
  ::testing::internal::CaptureStderr();
  spillway::torch_bridge::detail::warn_cupti_fallback_once("CUPTI cannot be used (first)");
  spillway::torch_bridge::detail::warn_cupti_fallback_once("CUPTI cannot be used (second)");
  const std::string log = ::testing::internal::GetCapturedStderr();
  std::size_t warnings = 0;
  for (std::size_t at = log.find("spillway[warn]"); at != std::string::npos;
       at = log.find("spillway[warn]", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << log;
  EXPECT_NE(log.find("CUPTI cannot be used (first)"), std::string::npos) << log;
  EXPECT_EQ(log.find("(second)"), std::string::npos) << log;
  spillway::torch_bridge::detail::forget_cupti_fallback_warning();
}

}  // namespace
