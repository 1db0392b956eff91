// Traces built in memory for the report tests. Format version 2 traces are
// assembled as TraceFileContents directly: they exercise the model without
// depending on the file writer's version.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tracer/trace_file.h"

namespace spillway::report::testing {

// A short version 2 trace whose totals the tests check by hand (see
// report_model_test.cc): two clients, a refetch, an eviction, a writeback,
// two stalls, an out-of-memory and two steps.
inline TraceFileContents small_v2_trace() {
  using K = TraceEventKind;
  TraceFileContents trace;
  trace.format_version = 2;
  trace.finished = true;
  trace.metadata = {{"device", "sim (4.00 GiB)"},
                    {"device_budget_bytes", "1000000"},
                    {"chunk_size_bytes", "4096"}};
  trace.events = {
      {1000, K::segment_alloc, 0, 0xA000, 4096},
      {1100, K::alloc, 0, 0xA000, 1024},            // a chunk's device copy,
      {1100, K::chunk_fetch, 1024, 1, 1000, 0, 0},  // client 0 fetching chunk 1
      {1200, K::alloc, 0, 0xA400, 2048},
      {1200, K::chunk_fetch, 2048, 2, 2000, kTraceDetailPrefetch, 1},  // client 1 prefetches 2
      {1300, K::alloc, 0, 0xAC00, 512},                                // an activation
      {1400, K::stall, 0, 2, 50, 0, 1},
      {1500, K::step, 0, 1, 0},
      {1600, K::chunk_writeback, 1024, 1, 800, 0, 0},
      {1700, K::free, 0, 0xA000, 1024},
      {1700, K::chunk_drop, 1024, 1, 1024, kTraceDetailEviction, 0},
      {1800, K::alloc, 0, 0xA000, 1024},
      {1800, K::chunk_fetch, 1024, 1, 1000, 0, 0},  // refetch
      {1850, K::chunk_fetch, 2048, 2, 2000, 0, 1},  // already resident: copies, no new memory
      {1900, K::oom, 0, 0, 8192},
      {2000, K::stall, 0, 1, 150, 0, 0},
      {2100, K::free, 0, 0xAC00, 512},
      {2200, K::step, 0, 2, 0},
  };
  return trace;
}

// A longer, more realistic version 2 trace for the HTML page and its
// screenshot: three clients (parameters, gradients, optimizer state) cycling
// chunks through a budget that holds about half of them, with activations
// rising and falling inside each step.
inline TraceFileContents demo_v2_trace(int steps = 6) {
  using K = TraceEventKind;
  constexpr std::uint64_t kChunk = 64ull << 20;
  constexpr int kChunksPerClient = 6;
  constexpr int kResidentLimit = 8;  // chunks the budget holds
  TraceFileContents trace;
  trace.format_version = 2;
  trace.finished = true;
  trace.metadata = {{"writer", "tests/report/synthetic_traces.h"},
                    {"device", "sim (1.50 GiB)"},
                    {"device_kind", "sim"},
                    {"device_budget_bytes", std::to_string(16 * kChunk)},
                    {"chunk_size_bytes", std::to_string(kChunk)}};
  std::uint64_t now = 1'000'000;
  std::vector<TraceEvent>& ev = trace.events;
  for (int s = 0; s < 11; ++s)
    ev.push_back({now, K::segment_alloc, 0, 0x1000 + s * kChunk, kChunk});
  std::vector<std::pair<std::uint32_t, std::uint64_t>> resident;  // (client, chunk), oldest first
  const auto address_of = [&](std::uint32_t client, std::uint64_t chunk) {
    return 0x100000000ull + (client * kChunksPerClient + chunk) * kChunk;
  };
  std::uint64_t next_activation = 0x900000000ull;
  for (int step = 1; step <= steps; ++step) {
    std::vector<TraceEvent> activations;  // live until the step ends
    for (std::uint32_t client = 0; client < 3; ++client) {
      for (std::uint64_t chunk = 0; chunk < kChunksPerClient; ++chunk) {
        now += 40'000;
        const std::pair<std::uint32_t, std::uint64_t> key{client, chunk};
        if (std::find(resident.begin(), resident.end(), key) != resident.end()) continue;
        if (static_cast<int>(resident.size()) >= kResidentLimit) {
          const auto [old_client, old_chunk] = resident.front();
          resident.erase(resident.begin());
          ev.push_back({now, K::chunk_writeback, kChunk, old_chunk, kChunk, 0, old_client});
          ev.push_back({now + 5'000, K::free, 0, address_of(old_client, old_chunk), kChunk});
          ev.push_back({now + 5'000, K::chunk_drop, kChunk, old_chunk, kChunk, kTraceDetailEviction,
                        old_client});
        }
        const bool prefetch = chunk % 2 == 1;
        ev.push_back({now + 10'000, K::chunk_fetch, kChunk, chunk, kChunk,
                      static_cast<std::uint16_t>(prefetch ? kTraceDetailPrefetch : 0), client});
        ev.push_back({now + 10'000, K::alloc, 0, address_of(client, chunk), kChunk});
        if (!prefetch) ev.push_back({now + 30'000, K::stall, 0, chunk, 20'000, 0, client});
        resident.push_back(key);
        activations.push_back(
            {now + 31'000, K::alloc, 0, next_activation, (2ull << 20) * (1 + chunk)});
        next_activation += 1ull << 30;
        ev.push_back(activations.back());
      }
    }
    now += 50'000;
    for (const TraceEvent& activation : activations) {
      ev.push_back({now, K::free, 0, activation.address, activation.size});
    }
    ev.push_back({now, K::step, 0, static_cast<std::uint64_t>(step), 0});
  }
  return trace;
}

}  // namespace spillway::report::testing
