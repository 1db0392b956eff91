// spillway-replay: replays an allocation trace (binary trace file, PyTorch
// memory snapshot or CSV) on the simulated device through spillway's caching
// allocator, and prints peak allocated, peak reserved, their ratio
// (fragmentation), device mallocs and out-of-memories, as text and as
// `metric NAME VALUE UNIT` lines; for a snapshot, beside the recording
// allocator's own figure (Note [The native figure from a snapshot]).
//
//   spillway-replay tests/data/gpt2_small_amp.csv --chunk-size 64MB
//   spillway-replay run.pickle --device 1
//
// Exit status: 0 replayed; 1 the trace could not be read or is inconsistent
// (the message names the line, byte offset or snapshot entry); CLI11's codes for bad
// flags.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <functional>
#include <string>

#include "allocator/config/config.h"
#include "allocator/config/format_bytes.h"
#include "allocator/config/options.h"
#include "tools/common/tool_main.h"
#include "tools/replay/allocation_replay.h"
#include "tools/replay/allocation_trace.h"

namespace {

// A size flag's value, in SPILLWAY_CONF's size syntax ("64MB", "1.5GiB", "0").
std::function<std::string(std::string&)> size_validator(std::size_t* out) {
  return [out](std::string& text) -> std::string {
    const auto bytes = spillway::detail::parse_size(text);
    if (!bytes) return "'" + text + "' is not a size such as 64MB (B, KB, MB, GB, KiB, MiB, GiB)";
    *out = static_cast<std::size_t>(*bytes);
    return "";
  };
}

}  // namespace

namespace {

int tool_main(int argc, char** argv) {
  CLI::App app{
      "Replays an allocation trace on the simulated device through spillway's caching "
      "allocator and reports fragmentation (peak reserved / peak allocated)."};
  std::string trace_path;
  std::string budget_text = "0";
  std::string chunk_text = "64MB";  // shown as the default: Config{}.chunk_size
  spillway::TraceLoadOptions load_options;
  spillway::ReplayOptions options;
  options.chunk_size = spillway::Config{}.chunk_size;
  app.add_option("TRACE", trace_path,
                 "trace to replay: a spillway trace file, a PyTorch memory snapshot "
                 "(torch.cuda.memory._dump_snapshot) or a CSV (action,ptr,size,stream,time_ns)")
      ->required();
  app.add_option("--device", load_options.snapshot_device, "which device of a snapshot to replay")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--budget", budget_text, "device budget; 0 = unlimited")
      ->check(CLI::Validator(size_validator(&options.budget_bytes), "SIZE"))
      ->capture_default_str();
  app.add_option("--chunk-size", chunk_text, "large-pool slab size (the chunk_size option)")
      ->check(CLI::Validator(size_validator(&options.chunk_size), "SIZE"))
      ->capture_default_str();
  app.add_option("--expandable-segments", options.expandable_segments,
                 "the expandable_segments option: true or false")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (options.chunk_size == 0) {
    std::fprintf(stderr, "spillway-replay: --chunk-size must be positive\n");
    return 2;
  }

  const spillway::AllocationTraceResult loaded =
      spillway::load_allocation_trace(trace_path, load_options);
  if (!loaded.ok()) {
    std::fprintf(stderr, "spillway-replay: %s\n", loaded.error.c_str());
    return 1;
  }
  spillway::ReplayResult result;
  std::string error;
  if (!spillway::replay_allocations(loaded.trace, options, &result, &error)) {
    std::fprintf(stderr, "spillway-replay: %s: %s\n", trace_path.c_str(), error.c_str());
    return 1;
  }

  using spillway::format_bytes;
  using Format = spillway::AllocationTrace::Format;
  const spillway::AllocationTrace& trace = loaded.trace;
  const bool binary = trace.format == Format::binary;
  const bool snapshot = trace.format == Format::snapshot;
  fmt::print("trace: {} ({}, {} allocs, {} frees, {} cache releases)\n", trace_path,
             binary     ? "spillway trace file"
             : snapshot ? fmt::format("PyTorch memory snapshot, device {}", trace.snapshot_device)
                        : "csv",
             result.allocs, result.frees, result.cache_releases);
  if (snapshot)
    fmt::print("snapshot: {} trace entries, {} blocks live before the trace began\n",
               trace.snapshot_entries, trace.blocks_live_before_trace);
  fmt::print(
      "budget: {}, chunk size: {}\n",
      options.budget_bytes == 0 ? std::string("unlimited") : format_bytes(options.budget_bytes),
      format_bytes(options.chunk_size));
  fmt::print("peak requested: {} ({} bytes)\n", format_bytes(result.peak_requested_bytes),
             result.peak_requested_bytes);
  fmt::print("peak allocated: {} ({} bytes)\n", format_bytes(result.peak_allocated_bytes()),
             result.peak_allocated_bytes());
  fmt::print("peak reserved:  {} ({} bytes)\n", format_bytes(result.peak_reserved_bytes()),
             result.peak_reserved_bytes());
  fmt::print("fragmentation (peak reserved / peak allocated): {:.4f}\n", result.fragmentation());
  if (result.peak_reserved_location != 0) {
    const spillway::AllocationEvent at{.location = result.peak_reserved_location};
    fmt::print("peak reserved first reached at {} (alloc of {}), with {} allocated\n",
               loaded.trace.where(at), format_bytes(result.peak_reserved_request_bytes),
               format_bytes(result.allocated_at_peak_reserved));
  }
  fmt::print("device mallocs: {}, device frees: {}, alloc retries: {}\n",
             result.stats.num_device_alloc, result.stats.num_device_free,
             result.stats.num_alloc_retries);
  fmt::print("out-of-memories: {}\n", result.stats.num_ooms);
  if (result.unmatched_frees != 0)
    fmt::print(
        "note: {} frees of addresses not live then (never allocated, or freed already) were "
        "skipped\n",
        result.unmatched_frees);
  if (binary && trace.recorded_peak_reserved_bytes != 0)
    fmt::print("as recorded: peak reserved {} ({} bytes), {} out-of-memories\n",
               format_bytes(trace.recorded_peak_reserved_bytes), trace.recorded_peak_reserved_bytes,
               trace.recorded_ooms);
  if (snapshot) {
    fmt::print(
        "PyTorch's allocator, as recorded: peak allocated {} ({} bytes), peak reserved {} "
        "({} bytes), {} out-of-memories\n",
        format_bytes(trace.recorded_peak_allocated_bytes), trace.recorded_peak_allocated_bytes,
        format_bytes(trace.recorded_peak_reserved_bytes), trace.recorded_peak_reserved_bytes,
        trace.recorded_ooms);
    fmt::print("PyTorch's fragmentation (peak reserved / peak allocated): {:.4f}\n",
               trace.recorded_fragmentation());
  }

  fmt::print("metric replay_peak_allocated_bytes {} bytes\n", result.peak_allocated_bytes());
  fmt::print("metric replay_peak_reserved_bytes {} bytes\n", result.peak_reserved_bytes());
  fmt::print("metric replay_fragmentation {:.4f} ratio\n", result.fragmentation());
  fmt::print("metric replay_device_mallocs {} count\n", result.stats.num_device_alloc);
  fmt::print("metric replay_ooms {} count\n", result.stats.num_ooms);
  if (snapshot && trace.recorded_fragmentation() > 0 && result.fragmentation() > 0) {
    fmt::print("metric native_fragmentation {:.4f} ratio\n", trace.recorded_fragmentation());
    fmt::print("metric native_peak_reserved_bytes {} bytes\n", trace.recorded_peak_reserved_bytes);
    // Peak reserved against peak reserved: the same requests, where the two
    // fragmentation figures divide by allocated bytes counted differently.
    fmt::print("metric replay_vs_native {:.4f} ratio\n",
               static_cast<double>(result.peak_reserved_bytes()) /
                   static_cast<double>(trace.recorded_peak_reserved_bytes));
  }
  return 0;
}

}  // namespace

// Note [A tool fails out loud] (tools/common/tool_main.h).
int main(int argc, char** argv) {
  return spillway::run_tool("spillway-replay", [&] { return tool_main(argc, argv); });
}
