// The Runtime wires one activation together: configuration -> device ->
// caching allocator -> chunk manager (the allocator's pressure handler). These
// tests drive it from a configuration string, as the C ABI and the hooks do,
// and check the wiring end to end: model data spills when activations need the
// budget, comes back bit-exact, and the stats show it under the contract keys.
#include "allocator/runtime.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace spillway {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

struct Param {
  TensorId id;
  std::vector<unsigned char> bytes;
};

// Writes `bytes` into the tensor through its device copy.
void write_tensor(Runtime& runtime, TensorId id, const std::vector<unsigned char>& bytes) {
  void* data = nullptr;
  ASSERT_EQ(
      runtime.chunk_manager().acquire(id, Stream{}, &data, AccessMode::read_write, WaitMode::host),
      Status::ok)
      << ChunkManager::last_error();
  ASSERT_EQ(runtime.device().copy_async(data, bytes.data(), bytes.size(), Stream{}), Status::ok);
  ASSERT_EQ(runtime.device().synchronize_stream(Stream{}), Status::ok);
  ASSERT_EQ(runtime.chunk_manager().release(id, Stream{}), Status::ok);
}

std::vector<unsigned char> read_tensor(Runtime& runtime, TensorId id, std::size_t bytes) {
  std::vector<unsigned char> out(bytes);
  void* data = nullptr;
  EXPECT_EQ(runtime.chunk_manager().acquire(id, Stream{}, &data, AccessMode::read, WaitMode::host),
            Status::ok)
      << ChunkManager::last_error();
  EXPECT_EQ(runtime.device().copy_async(out.data(), data, bytes, Stream{}), Status::ok);
  EXPECT_EQ(runtime.device().synchronize_stream(Stream{}), Status::ok);
  EXPECT_EQ(runtime.chunk_manager().release(id, Stream{}), Status::ok);
  return out;
}

TEST(Runtime, ActivationsSpillModelDataWhichComesBackExact) {
  Runtime runtime("device:sim,sim_capacity:512MB,device_budget:64MiB,chunk_size:4MiB,log:error");
  std::string error;
  CachingAllocator* allocator = runtime.allocator(&error);
  ASSERT_NE(allocator, nullptr) << error;

  // 12 chunks of model data (48 MiB) under a 64 MiB budget: all resident.
  const ClientId model = runtime.chunk_manager().add_client("model");
  std::mt19937 rng(7);
  std::vector<Param> params(12);
  for (auto& param : params) {
    param.bytes.resize(4 * MiB);
    for (auto& b : param.bytes) b = static_cast<unsigned char>(rng());
    ASSERT_EQ(runtime.chunk_manager().register_tensor(model, {TensorKind::param, 0, 4, MiB, "w"},
                                                      &param.id),
              Status::ok);
    write_tensor(runtime, param.id, param.bytes);
  }
  EXPECT_EQ(runtime.stats().evictions, 0);

  // Activations take 40 MiB: the allocator must ask the chunk manager to spill.
  std::vector<void*> activations;
  for (int i = 0; i < 10; ++i) {
    void* block = nullptr;
    ASSERT_EQ(allocator->allocate(&block, 4 * MiB, Stream{}), Status::ok)
        << CachingAllocator::last_error();
    activations.push_back(block);
  }
  const Stats spilled = runtime.stats();
  EXPECT_GT(spilled.evictions, 0);
  EXPECT_GT(spilled.bytes_moved_d2h, 0);
  EXPECT_LE(spilled.reserved_bytes.current, std::int64_t{64} * MiB);
  EXPECT_GT(spilled.chunk_bytes_host, 0);

  for (void* block : activations) ASSERT_EQ(allocator->deallocate(block), Status::ok);
  // Every parameter comes back bit-identical.
  for (const auto& param : params) {
    EXPECT_EQ(read_tensor(runtime, param.id, param.bytes.size()), param.bytes);
  }
  EXPECT_GT(runtime.stats().bytes_moved_h2d, 0);

  const std::string json = runtime.stats().to_json();
  for (const char* key : {"\"allocated_bytes.all.current\"", "\"reserved_bytes.all.peak\"",
                          "\"chunk_bytes.device\"", "\"bytes_moved.d2h\"", "\"evictions\"",
                          "\"stall_ns\"", "\"stall_ns.expected\"", "\"stall_ns.actual\"",
                          "\"stall_ns.expected.last_step\"", "\"stall_ns.actual.last_step\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " missing from " << json;
  }
}

TEST(Runtime, StaticPolicyNeverSpillsSoOverBudgetIsAnError) {
  Runtime runtime(
      "device:sim,sim_capacity:512MB,device_budget:16MiB,chunk_size:4MiB,policy:static,log:error");
  std::string error;
  CachingAllocator* allocator = runtime.allocator(&error);
  ASSERT_NE(allocator, nullptr) << error;
  const ClientId model = runtime.chunk_manager().add_client("model");
  std::vector<TensorId> ids(4);
  for (auto& id : ids) {
    ASSERT_EQ(
        runtime.chunk_manager().register_tensor(model, {TensorKind::param, 0, 4, MiB, "w"}, &id),
        Status::ok);
    write_tensor(runtime, id, std::vector<unsigned char>(4 * MiB, 1));
  }
  // The budget is full of model data that may not move.
  void* block = nullptr;
  EXPECT_EQ(allocator->allocate(&block, 4 * MiB, Stream{}), Status::out_of_memory);
  EXPECT_EQ(runtime.stats().evictions, 0);
  EXPECT_NE(CachingAllocator::last_error().find("chunk"), std::string::npos)
      << "the out-of-memory message should say the chunk manager holds the memory: "
      << CachingAllocator::last_error();
}

TEST(Runtime, BadConfigurationNamesTheKeyAndActivatesNothing) {
  Runtime runtime("device:sim,chunk_size:1MiB");
  std::string error;
  EXPECT_EQ(runtime.allocator(&error), nullptr);
  EXPECT_NE(error.find("chunk_size"), std::string::npos) << error;
  EXPECT_NE(error.find("1MiB"), std::string::npos) << error;
}

TEST(Runtime, ABandwidthThatCopiesAChunkInSecondsIsWarnedAtActivation) {
  const auto activation_log = [](const char* conf) {
    Runtime runtime(conf);
    ::testing::internal::CaptureStderr();
    std::string error;
    const bool active = runtime.allocator(&error) != nullptr;
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_TRUE(active) << error;
    return log;
  };
  // 1 B/s: a 4 MiB chunk takes 48 days.
  const std::string slow =
      activation_log("device:sim,sim_capacity:64MiB,chunk_size:4MiB,sim_bandwidth:1B/s");
  EXPECT_NE(slow.find("sim_bandwidth:1B/s copies one chunk (4194304 bytes) in 4.19e+06 s"),
            std::string::npos)
      << slow;
  EXPECT_EQ(activation_log("device:sim,sim_capacity:64MiB,chunk_size:4MiB,sim_bandwidth:8MB/s")
                .find("sim_bandwidth"),
            std::string::npos);
  EXPECT_EQ(activation_log("device:sim,sim_capacity:64MiB,chunk_size:4MiB").find("sim_bandwidth"),
            std::string::npos);
}

}  // namespace
}  // namespace spillway
