// The C ABI as CUDAPluggableAllocator uses it: libspillway.so opened with
// dlopen, every function found with dlsym, on the simulated device.
//
// In-process tests share one activation (configured by the environment below
// before any test runs). What needs a fresh process (activation from
// SPILLWAY_CONF, the trace completed at exit) runs abi_probe.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "allocator/spillway.h"
#include "tracer/trace_file.h"

namespace {

// The function types torch's CUDAPluggableAllocator casts the symbols to, with
// cudaStream_t as void*.
using MallocFn = void*(std::size_t, int, void*);
using FreeFn = void(void*, std::size_t, int, void*);
using RecordStreamFn = void(void*, void*);
using EmptyCacheFn = void();
using ConfigureFn = int(const char*);
using StatsJsonFn = std::size_t(char*, std::size_t);
using LastErrorFn = const char*();

static_assert(std::is_same_v<decltype(spillway_malloc), MallocFn>);
static_assert(std::is_same_v<decltype(spillway_free), FreeFn>);
static_assert(std::is_same_v<decltype(spillway_record_stream), RecordStreamFn>);
static_assert(std::is_same_v<decltype(spillway_empty_cache), EmptyCacheFn>);
static_assert(std::is_same_v<decltype(spillway_configure), ConfigureFn>);
static_assert(std::is_same_v<decltype(spillway_stats_json), StatsJsonFn>);
static_assert(std::is_same_v<decltype(spillway_last_error), LastErrorFn>);

constexpr const char* kConf =
    "device:sim,sim_capacity:512MB,device_budget:64MiB,chunk_size:8MiB,log:error";

struct Abi {
  void* library = nullptr;
  MallocFn* malloc = nullptr;
  FreeFn* free = nullptr;
  RecordStreamFn* record_stream = nullptr;
  EmptyCacheFn* empty_cache = nullptr;
  ConfigureFn* configure = nullptr;
  StatsJsonFn* stats_json = nullptr;
  LastErrorFn* last_error = nullptr;
};

Abi abi;

template <typename Function>
Function* find(const char* name) {
  void* symbol = dlsym(abi.library, name);
  EXPECT_NE(symbol, nullptr) << name << ": " << dlerror();
  return reinterpret_cast<Function*>(symbol);
}

class LoadSpillway : public ::testing::Environment {
 public:
  void SetUp() override {
    abi.library = dlopen(SPILLWAY_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(abi.library, nullptr) << dlerror();
    abi.malloc = find<MallocFn>("spillway_malloc");
    abi.free = find<FreeFn>("spillway_free");
    abi.record_stream = find<RecordStreamFn>("spillway_record_stream");
    abi.empty_cache = find<EmptyCacheFn>("spillway_empty_cache");
    abi.configure = find<ConfigureFn>("spillway_configure");
    abi.stats_json = find<StatsJsonFn>("spillway_stats_json");
    abi.last_error = find<LastErrorFn>("spillway_last_error");
    // Before anything activates: takes the place of SPILLWAY_CONF.
    ASSERT_EQ(abi.configure(kConf), 0) << abi.last_error();
  }
};

const auto* const load_spillway = ::testing::AddGlobalTestEnvironment(new LoadSpillway);

nlohmann::json stats() {
  const std::size_t length = abi.stats_json(nullptr, 0);
  EXPECT_GT(length, 0u) << abi.last_error();
  std::string buffer(length + 1, '\0');
  EXPECT_EQ(abi.stats_json(buffer.data(), buffer.size()), length);
  buffer.resize(length);
  return nlohmann::json::parse(buffer);
}

std::int64_t stat(const nlohmann::json& json, const char* key) {
  EXPECT_TRUE(json.contains(key)) << key;
  return json.value(key, std::int64_t{-1});
}

TEST(abi_Dlopen, MallocGivesWritableMemoryAndStatsFollow) {
  const nlohmann::json before = stats();
  for (const char* key :
       {"allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated",
        "allocated_bytes.all.freed", "reserved_bytes.all.current", "active_bytes.all.current",
        "num_alloc_retries", "num_ooms"}) {
    EXPECT_TRUE(before.contains(key)) << key;
  }
  // chunk_fill_ratio, a number: tensor bytes over chunk bytes (0 without chunks).
  ASSERT_TRUE(before.contains("chunk_fill_ratio"));
  ASSERT_TRUE(before["chunk_fill_ratio"].is_number());
  const std::int64_t capacity = stat(before, "chunk_bytes.capacity");
  const std::int64_t tensors = stat(before, "chunk_bytes.tensors");
  EXPECT_DOUBLE_EQ(before["chunk_fill_ratio"].get<double>(),
                   capacity == 0 ? 0.0 : static_cast<double>(tensors) / capacity);
  // Small pool, large pool (a 8 MiB chunk slab) and an oversize segment.
  const std::array<std::size_t, 3> sizes = {1000, 3 << 20, 20 << 20};
  std::vector<void*> blocks;
  std::size_t total = 0;
  for (std::size_t size : sizes) {
    void* ptr = abi.malloc(size, 0, nullptr);
    ASSERT_NE(ptr, nullptr) << abi.last_error();
    std::memset(ptr, 0xAB, size);  // writable, every byte
    EXPECT_EQ(static_cast<unsigned char*>(ptr)[size - 1], 0xAB);
    blocks.push_back(ptr);
    total += size;
  }
  const nlohmann::json during = stats();
  const std::int64_t allocated =
      stat(during, "allocated_bytes.all.current") - stat(before, "allocated_bytes.all.current");
  EXPECT_GE(allocated, static_cast<std::int64_t>(total));
  EXPECT_LE(allocated, static_cast<std::int64_t>(total + 3 * 512));
  EXPECT_GE(stat(during, "reserved_bytes.all.current"),
            stat(during, "allocated_bytes.all.current"));
  EXPECT_GE(stat(during, "allocated_bytes.all.peak"), stat(during, "allocated_bytes.all.current"));
  EXPECT_EQ(stat(during, "allocation.all.current") - stat(before, "allocation.all.current"), 3);

  for (std::size_t i = 0; i < blocks.size(); ++i) abi.free(blocks[i], sizes[i], 0, nullptr);
  const nlohmann::json after = stats();
  EXPECT_EQ(stat(after, "allocated_bytes.all.current"),
            stat(before, "allocated_bytes.all.current"));
  EXPECT_EQ(stat(after, "allocated_bytes.all.freed") - stat(before, "allocated_bytes.all.freed"),
            allocated);
  // Freed blocks stay cached until empty_cache.
  EXPECT_GT(stat(after, "reserved_bytes.all.current"), 0);
}

TEST(abi_Dlopen, EmptyCacheReturnsFreeSlabs) {
  void* ptr = abi.malloc(5 << 20, 0, nullptr);
  ASSERT_NE(ptr, nullptr) << abi.last_error();
  abi.free(ptr, 5 << 20, 0, nullptr);
  EXPECT_GT(stat(stats(), "reserved_bytes.all.current"), 0);
  abi.empty_cache();
  const nlohmann::json after = stats();
  EXPECT_EQ(stat(after, "reserved_bytes.all.current"), stat(after, "allocated_bytes.all.current"));
}

TEST(abi_Dlopen, StatsJsonReportsTheLengthAndTruncates) {
  const std::size_t length = abi.stats_json(nullptr, 0);
  ASSERT_GT(length, 10u);
  std::string exact(length + 1, 'x');
  EXPECT_EQ(abi.stats_json(exact.data(), exact.size()), length);
  EXPECT_EQ(std::strlen(exact.c_str()), length);
  char small[10];
  std::memset(small, 'x', sizeof small);
  EXPECT_EQ(abi.stats_json(small, sizeof small), length);
  EXPECT_EQ(std::strlen(small), sizeof small - 1);
  EXPECT_EQ(small[0], '{');
}

TEST(abi_Dlopen, OverBudgetGivesNullWithAMessageAndTheAllocatorKeepsServing) {
  const std::int64_t ooms_before = stat(stats(), "num_ooms");
  void* ptr = abi.malloc(std::size_t{256} << 20, 0, nullptr);  // budget is 64 MiB
  EXPECT_EQ(ptr, nullptr);
  const std::string error = abi.last_error();
  EXPECT_NE(error.find("spillway_malloc(268435456 bytes)"), std::string::npos) << error;
  EXPECT_NE(error.find("out of memory"), std::string::npos) << error;
  EXPECT_EQ(stat(stats(), "num_ooms"), ooms_before + 1);
  void* small = abi.malloc(4096, 0, nullptr);
  ASSERT_NE(small, nullptr) << abi.last_error();
  abi.free(small, 4096, 0, nullptr);
}

TEST(abi_Dlopen, ZeroBytesGivesNull) { EXPECT_EQ(abi.malloc(0, 0, nullptr), nullptr); }

TEST(abi_Dlopen, AnotherDeviceOrdinalIsRefused) {
  EXPECT_EQ(abi.malloc(1000, 1, nullptr), nullptr);
  EXPECT_NE(std::string(abi.last_error()).find("device 1 is not managed"), std::string::npos)
      << abi.last_error();
}

TEST(abi_Dlopen, BadPointersAreReportedNotFatal) {
  int not_ours = 0;
  abi.free(&not_ours, sizeof not_ours, 0, nullptr);
  EXPECT_NE(std::string(abi.last_error()).find("spillway_free("), std::string::npos);
  abi.free(nullptr, 0, 0, nullptr);  // ignored
  abi.record_stream(&not_ours, nullptr);
  EXPECT_NE(std::string(abi.last_error()).find("spillway_record_stream("), std::string::npos);
}

TEST(abi_Dlopen, RecordStreamThenFree) {
  void* ptr = abi.malloc(1 << 20, 0, nullptr);
  ASSERT_NE(ptr, nullptr) << abi.last_error();
  abi.record_stream(ptr, nullptr);
  abi.free(ptr, 1 << 20, 0, nullptr);
  EXPECT_EQ(stat(stats(), "allocated_bytes.all.current"), 0);
}

TEST(abi_Dlopen, ConfigureAfterActivation) {
  stats();                                                 // active
  EXPECT_EQ(abi.configure(kConf), 0) << abi.last_error();  // the same configuration
  EXPECT_NE(abi.configure("device:sim,chunk_size:16MiB"), 0);
  EXPECT_NE(std::string(abi.last_error()).find("already active"), std::string::npos)
      << abi.last_error();
  EXPECT_NE(abi.configure("no_such_key:1"), 0);
  EXPECT_NE(std::string(abi.last_error()).find("no_such_key"), std::string::npos)
      << abi.last_error();
  EXPECT_NE(abi.configure(nullptr), 0);
}

TEST(abi_Dlopen, LastErrorIsPerThread) {
  EXPECT_EQ(abi.malloc(1000, 7, nullptr), nullptr);
  EXPECT_STRNE(abi.last_error(), "");
  std::string other;
  std::thread([&] { other = abi.last_error(); }).join();
  EXPECT_EQ(other, "");
}

TEST(abi_Dlopen, ThreadsAllocateConcurrently) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      std::vector<void*> live;
      for (int i = 0; i < 2000; ++i) {
        const std::size_t size = 256 + static_cast<std::size_t>((i * 7919 + t) % 300'000);
        void* ptr = abi.malloc(size, 0, nullptr);
        ASSERT_NE(ptr, nullptr) << abi.last_error();
        std::memset(ptr, t, size);
        live.push_back(ptr);
        if (live.size() > 8) {
          abi.free(live.front(), 0, 0, nullptr);
          live.erase(live.begin());
        }
      }
      for (void* ptr : live) abi.free(ptr, 0, 0, nullptr);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(stat(stats(), "allocated_bytes.all.current"), 0);
}

// ---- Fresh processes ----

struct ProbeResult {
  int exit_code = -1;
  std::string output;
};

ProbeResult run_probe(const std::string& conf, const std::string& arguments) {
  const std::string command =
      "SPILLWAY_CONF='" + conf + "' '" + SPILLWAY_ABI_PROBE_PATH + "' " + arguments + " 2>&1";
  ProbeResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe))
    result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

TEST(abi_Process, UnknownKeyInSpillwayConfGivesNullNamingTheKey) {
  const ProbeResult result = run_probe("device:sim,bogus_key:1", "malloc");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("ptr=null"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("error=spillway_malloc: spillway is not active: invalid "
                               "configuration from SPILLWAY_CONF"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("bogus_key"), std::string::npos) << result.output;
}

TEST(abi_Process, BadValueInSpillwayConfNamesTheKeyAndValue) {
  const ProbeResult result = run_probe("device:sim,chunk_size:lots", "malloc");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("ptr=null"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("chunk_size"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("lots"), std::string::npos) << result.output;
}

TEST(abi_Process, GoodSpillwayConfActivates) {
  const ProbeResult result = run_probe("device:sim,sim_capacity:64MB", "malloc");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("ptr=ok error=\n"), std::string::npos) << result.output;
}

TEST(abi_Process, UnwritableTraceFailsActivationNamingTheKey) {
  const ProbeResult result = run_probe("device:sim,trace:/nonexistent/dir/x.trace", "malloc");
  EXPECT_NE(result.output.find("ptr=null"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("trace:/nonexistent/dir/x.trace"), std::string::npos)
      << result.output;
}

TEST(abi_Process, TraceFileIsCompletedAtExit) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("spillway_abi_trace_" + std::to_string(::getpid()) + ".trace"))
                               .string();
  const ProbeResult result =
      run_probe("device:sim,sim_capacity:256MB,chunk_size:4MiB,trace:" + path, "churn 100");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // Note [Pinning the library] in spillway.cc.
  EXPECT_NE(result.output.find("still loaded after dlclose: yes"), std::string::npos)
      << result.output;
  const spillway::TraceReadResult trace = spillway::read_trace_file(path);
  ASSERT_TRUE(trace.ok()) << trace.error;
  EXPECT_TRUE(trace.trace->finished);
  EXPECT_NE(spillway::find_metadata(trace.trace->metadata, "device").value_or("").find("sim"),
            std::string::npos);
  EXPECT_EQ(spillway::find_metadata(trace.trace->metadata, "chunk_size_bytes"), "4194304");
  int allocs = 0, frees = 0, segments = 0;
  std::uint64_t live_address = 0;
  for (const spillway::TraceEvent& event : trace.trace->events) {
    switch (event.kind) {
      case spillway::TraceEventKind::alloc:
        ++allocs;
        EXPECT_EQ(live_address, 0u);
        live_address = event.address;
        EXPECT_EQ(event.size, 512 + static_cast<std::uint64_t>((allocs - 1) % 7) * 100'000);
        break;
      case spillway::TraceEventKind::free:
        ++frees;
        EXPECT_EQ(event.address, live_address);
        live_address = 0;
        break;
      case spillway::TraceEventKind::segment_alloc:
        ++segments;
        break;
      default:
        break;
    }
  }
  EXPECT_EQ(allocs, 100);
  EXPECT_EQ(frees, 100);
  EXPECT_GT(segments, 0);
  std::filesystem::remove(path);
}

// ---- The library's exported symbols ----
//
// The C ABI is exported; so is spillway's own C++ namespace, for C++ users
// (the hooks) that must share the library's single process runtime. Nothing
// else: a fmt, std or nlohmann instantiation exported from here would bind a
// user's own copy of those libraries to ours.

// Demangled dynamic symbols libspillway.so defines, or empty when nm is
// missing.
std::vector<std::string> exported_symbols() {
  const std::string command = std::string("nm -D -C --defined-only --extern-only '") +
                              SPILLWAY_LIBRARY_PATH + "' 2>/dev/null";
  std::vector<std::string> names;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return names;
  char line[8192];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    // "<address> <type> <demangled name, which may hold spaces>"
    std::string text(line);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    const std::size_t type_at = text.find(' ');
    if (type_at == std::string::npos || type_at + 3 > text.size()) continue;
    names.push_back(text.substr(type_at + 3));
  }
  const int status = pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) names.clear();
  return names;
}

const std::set<std::string> kCAbi = {
    "spillway_malloc",    "spillway_free",       "spillway_empty_cache", "spillway_record_stream",
    "spillway_configure", "spillway_stats_json", "spillway_last_error"};

TEST(abi_Library, ExportsTheCAbiAndNoOtherCSymbol) {
  const std::vector<std::string> names = exported_symbols();
  if (names.empty()) GTEST_SKIP() << "nm is not available to list the exported symbols";
  std::set<std::string> c_symbols;
  for (const std::string& name : names)
    if (name.rfind("spillway_", 0) == 0) c_symbols.insert(name);
  EXPECT_EQ(c_symbols, kCAbi);
}

TEST(abi_Library, ExportsNothingButSpillwaysOwn) {
  const std::vector<std::string> names = exported_symbols();
  if (names.empty()) GTEST_SKIP() << "nm is not available to list the exported symbols";
  const std::array<std::string, 5> own_prefixes = {
      "spillway::", "typeinfo for spillway::", "typeinfo name for spillway::",
      "vtable for spillway::", "spillway_"};
  std::vector<std::string> foreign;
  for (const std::string& name : names) {
    bool own = false;
    for (const std::string& prefix : own_prefixes) own = own || name.rfind(prefix, 0) == 0;
    if (!own) foreign.push_back(name);
  }
  std::string listed;
  for (std::size_t i = 0; i < foreign.size() && i < 10; ++i) listed += "\n  " + foreign[i];
  EXPECT_TRUE(foreign.empty()) << foreign.size() << " foreign symbols exported, e.g.:" << listed;
}

}  // namespace
