// spillway-chunksize: for a model description and a device, simulates the
// training step under the planned policy at each candidate chunk size
// (tools/chunksize/chunk_size_search.h says which) and prints step time,
// bytes moved and chunk waste per size, the best size, and how it compares
// with the configuration's default chunk_size. Text, or JSON with --json.
//
//   spillway-chunksize model.json --budget 2GB
//   spillway-chunksize --gpt 32,4096,1024,1 --budget 126.9GB --json
//
// Exit status: 0 a size was chosen; 1 the description cannot be read or no
// candidate fits the budget; 2 (or CLI11's codes) for bad arguments.
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "allocator/config/options.h"
#include "tools/chunksize/chunk_size_search.h"
#include "tools/common/positive_finite.h"
#include "tools/common/tool_main.h"
#include "tools/sim/model_description.h"

namespace {

using namespace spillway;
using chunksize::CandidateResult;
using chunksize::SearchResult;

std::function<std::string(std::string&)> size_validator(std::uint64_t* out) {
  return [out](std::string& text) -> std::string {
    const auto bytes = detail::parse_size(text);
    if (!bytes) return "'" + text + "' is not a size such as 64MB (B, KB, MB, GB, KiB, MiB, GiB)";
    *out = *bytes;
    return "";
  };
}

std::string megabytes(std::uint64_t bytes) { return fmt::format("{:.1f}", bytes / 1e6); }

void print_row(const CandidateResult& row, const std::string& mark) {
  if (!row.fits) {
    fmt::print("{:>12} {:>8} {:>12}  does not fit: {}{}\n", megabytes(row.chunk_size), row.chunks,
               megabytes(row.waste_bytes), row.why_not, mark);
    return;
  }
  fmt::print("{:>12} {:>8} {:>12} {:>6.2f}% {:>12.3f} {:>12.3f} {:>7.3f} {:>14}{}\n",
             megabytes(row.chunk_size), row.chunks, megabytes(row.waste_bytes),
             100.0 * row.waste_bytes / row.capacity_bytes, row.step_ns / 1e6, row.bound_ns / 1e6,
             row.step_ns / row.bound_ns, megabytes(row.moved_bytes()), mark);
}

void print_text(const sim::ModelSpec& model, const SearchResult& search) {
  fmt::print("{}: {} layers, model data {} MB, largest tensor {} ({} MB)\n", model.name,
             model.layers.size(), megabytes(model.model_bytes()), search.largest_tensor,
             megabytes(search.largest_tensor_bytes));
  fmt::print("{:>12} {:>8} {:>12} {:>7} {:>12} {:>12} {:>7} {:>14}\n", "chunk MB", "chunks",
             "waste MB", "waste", "step ms", "bound ms", "/bound", "moved MB/step");
  for (std::size_t i = 0; i < search.candidates.size(); ++i) {
    print_row(search.candidates[i], i == search.best ? "  <- best" : "");
  }
  const CandidateResult& best = search.best_result();
  fmt::print("best: {} bytes ({} MB): step {:.3f} ms, {} MB moved per step, {} MB waste\n",
             best.chunk_size, megabytes(best.chunk_size), best.step_ns / 1e6,
             megabytes(best.moved_bytes()), megabytes(best.waste_bytes));
  const CandidateResult& fallback = search.default_size;
  if (!fallback.fits) {
    fmt::print("default chunk_size {} bytes cannot run: {}\n", fallback.chunk_size,
               fallback.why_not);
  } else {
    fmt::print(
        "default chunk_size {} bytes: step {:.3f} ms, {} MB moved, {} MB waste; best / default "
        "step {:.3f}\n",
        fallback.chunk_size, fallback.step_ns / 1e6, megabytes(fallback.moved_bytes()),
        megabytes(fallback.waste_bytes), best.step_ns / fallback.step_ns);
  }
}

nlohmann::json row_json(const CandidateResult& row) {
  nlohmann::json out{{"chunk_size", row.chunk_size},
                     {"fits", row.fits},
                     {"chunks", row.chunks},
                     {"waste_bytes", row.waste_bytes},
                     {"capacity_bytes", row.capacity_bytes}};
  if (!row.fits) {
    out["why_not"] = row.why_not;
    return out;
  }
  out["step_ns"] = row.step_ns;
  out["stall_ns"] = row.stall_ns;
  out["bound_ns"] = row.bound_ns;
  out["h2d_bytes"] = row.h2d_bytes;
  out["d2h_bytes"] = row.d2h_bytes;
  out["moved_bytes"] = row.moved_bytes();
  return out;
}

void print_json(const sim::ModelSpec& model, const chunksize::SearchOptions& options,
                const SearchResult& search) {
  nlohmann::json out{{"model", model.name},
                     {"model_bytes", model.model_bytes()},
                     {"device_budget", options.device.device_budget},
                     {"largest_tensor", search.largest_tensor},
                     {"largest_tensor_bytes", search.largest_tensor_bytes},
                     {"candidates", nlohmann::json::array()},
                     {"best", row_json(search.best_result())},
                     {"default", row_json(search.default_size)}};
  for (const CandidateResult& row : search.candidates) out["candidates"].push_back(row_json(row));
  if (search.default_size.fits) {
    out["best_vs_default_step"] = search.best_result().step_ns / search.default_size.step_ns;
  }
  fmt::print("{}\n", out.dump(2));
}

}  // namespace

namespace {

int tool_main(int argc, char** argv) {
  CLI::App app{"Chooses a chunk size for a model by simulating its step at candidate sizes."};
  std::string model_path;
  std::vector<std::uint64_t> gpt;
  std::string budget_text, margin_text, min_text, max_text, default_text;
  chunksize::SearchOptions options;
  double over_budget = 0, h2d_gbps = 55, d2h_gbps = 0;
  bool json = false;
  app.add_option("MODEL", model_path, "model description (JSON; docs/planner.md)");
  app.add_option("--gpt", gpt, "GPT generator instead of a file: N_LAYERS,D_MODEL,SEQ,BATCH")
      ->delimiter(',')
      ->expected(4)
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 24));
  app.add_option("--budget", budget_text, "device budget")
      ->check(CLI::Validator(size_validator(&options.device.device_budget), "SIZE"));
  app.add_option("--model-over-budget", over_budget,
                 "instead of --budget: budget = model data / this")
      ->check(spillway::positive_finite());
  app.add_option("--margin", margin_text, "budget kept free besides activations")
      ->check(CLI::Validator(size_validator(&options.device.margin_bytes), "SIZE"));
  app.add_option("--h2d-gbps", h2d_gbps, "host-to-device bandwidth, GB/s")
      ->check(spillway::positive_finite())
      ->capture_default_str();
  app.add_option("--d2h-gbps", d2h_gbps, "device-to-host bandwidth, GB/s (default: h2d's)")
      ->check(spillway::positive_finite());
  app.add_option("--min-chunk-size", min_text,
                 "smallest candidate (default: the smallest that holds the largest tensor)")
      ->check(CLI::Validator(size_validator(&options.min_chunk_size), "SIZE"));
  app.add_option("--max-chunk-size", max_text, "largest candidate (default: 16x the smallest)")
      ->check(CLI::Validator(size_validator(&options.max_chunk_size), "SIZE"));
  app.add_option("--default-chunk-size", default_text,
                 "the size to compare with (default: the configuration's chunk_size, 64MB)")
      ->check(CLI::Validator(size_validator(&options.default_chunk_size), "SIZE"));
  app.add_option("--steps", options.steps, "steps to simulate; the last is reported")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--prefetch-reserve", options.plan_options.prefetch_reserve,
                 "planned: chunks of each moment kept free for prefetches")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--json", json, "print JSON instead of a table");
  CLI11_PARSE(app, argc, argv);

  sim::ModelSpec model;
  try {
    if (!gpt.empty()) {
      model = sim::gpt_model({gpt[0], gpt[1], gpt[2], gpt[3]});
    } else if (!model_path.empty()) {
      model = sim::load_model(model_path);
    } else {
      std::fprintf(stderr, "spillway-chunksize: give a MODEL file or --gpt\n");
      return 2;
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "spillway-chunksize: %s\n", error.what());
    return 1;
  }
  if (over_budget > 0) {
    options.device.device_budget =
        static_cast<std::uint64_t>(static_cast<double>(model.model_bytes()) / over_budget);
  }
  if (options.device.device_budget == 0) {
    std::fprintf(stderr, "spillway-chunksize: give --budget or --model-over-budget\n");
    return 2;
  }
  if (options.steps < 2) {
    // Step 1 of the planned policy is the LRU warmup; it needs a planned step after it.
    std::fprintf(stderr, "spillway-chunksize: --steps must be at least 2\n");
    return 2;
  }
  if (h2d_gbps <= 0 || d2h_gbps < 0) {
    std::fprintf(stderr, "spillway-chunksize: --h2d-gbps must be positive, --d2h-gbps >= 0\n");
    return 2;
  }
  options.device.h2d_bytes_per_s = h2d_gbps * 1e9;
  options.device.d2h_bytes_per_s = (d2h_gbps > 0 ? d2h_gbps : h2d_gbps) * 1e9;
  try {
    const SearchResult search = chunksize::search_chunk_size(model, options);
    if (json) {
      print_json(model, options, search);
    } else {
      print_text(model, search);
    }
  } catch (const chunksize::ChunkSizeError& error) {
    std::fprintf(stderr, "spillway-chunksize: %s\n", error.what());
    return 1;
  }
  return 0;
}

}  // namespace

// Note [A tool fails out loud] (tools/common/tool_main.h).
int main(int argc, char** argv) {
  return spillway::run_tool("spillway-chunksize", [&] { return tool_main(argc, argv); });
}
