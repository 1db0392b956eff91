// spillway-train-demo: a small GPT trained with LibTorch while spillway keeps
// its parameters and gradients in chunks on a device budget several times too
// small for them, so chunks leave the device and come back every step.
//
// It prints the loss of every step, the model data against the budget, and
// at the end spillway's statistics (evictions, bytes moved, prefetches, stall
// time measured and expected, peak reserved). On the simulated device it
// first trains the same model without spillway, whose step times are printed
// beside spillway's. With --no-spillway it trains the same model on the same data
// without spillway and prints the same losses; --check runs both in one
// process and compares losses and final parameters bit for bit (exit status
// 1 on a difference), which is what the ctest and tools/gpu_check.sh run.
//
// The configuration comes from SPILLWAY_CONF, or else kDefaultConf: the
// simulated GPU, which any machine has.
//
// --cuda trains on the GPU instead, with spillway as torch's CUDA allocator
// (use_as_torch_cuda_allocator: LibTorch's CUDAPluggableAllocator), so the
// activations share spillway's budget with the chunks (kCudaConf unless
// SPILLWAY_CONF says otherwise). The allocator is process-wide and must be
// chosen before torch's first CUDA allocation, so there --check trains the
// reference in a child process with torch's own allocator
// (--no-spillway --save-result FILE) and compares with what it saved. Both
// runs use torch's deterministic algorithms, as bit-identity needs on a GPU.
// Each run prints its tokens per second.
//
// --nproc N trains data parallel (docs/data-parallel.md) in N processes of
// this program on this machine, each a rank on the simulated device: the
// launcher starts them with torchrun's environment (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT) and dist:env added to the configuration, so the
// first manage() joins them in a Gloo group. Each step draws N micro-batches
// and rank r trains the r-th. Rank 0's output is the demo's; each rank ends
// with the optimizer state it holds, about 1/N of the model's. With --check
// the launcher then trains one process without spillway on the same N
// micro-batches per step, their gradients averaged as spillway's reduction
// averages them, and compares every rank's final parameters and rank 0's
// losses with it, bit for bit.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "allocator/runtime.h"
#include "hooks/torch/spillway_torch.h"
#include "tools/train_demo/trainer.h"
#include "tracer/trace_file.h"

namespace spillway::train_demo {
namespace {

// 2 MiB chunks under a 48 MiB budget, strict residency so that a missed fetch
// faults. On the simulated device the budget also holds what torch allocates
// (Note [torch's CPU allocator on the sim device]): torch::optim::Adam's state
// and the activations take about 40 MiB of it, so the model data (about
// 24 MiB) has room for a few chunks and spills every step.
// policy:planned: Belady eviction from the traced first step, and prefetches
// timed by its op durations against the modelled copy bandwidth
// (sim_bandwidth; Note [Prefetch timed by op durations] in
// allocator/policy/prefetch_timing.h).
constexpr const char* kDefaultConf =
    "device:sim,strict_residency:true,chunk_size:2MiB,device_budget:48MiB,sim_capacity:256MiB,"
    "sim_bandwidth:4GB/s,policy:planned";

// The GPU: a budget that holds the demo's model data and activations, with
// room to spare (the demo measures speed and bit-identity there; the sim
// default is the one that spills).
constexpr const char* kCudaConf = "device:cuda,chunk_size:2MiB,device_budget:1GiB";

struct DemoOptions {
  TrainerOptions trainer;
  int steps = 20;
  bool no_spillway = false;
  bool check = false;
  std::string trace;
  std::string dump_trace;
  std::string optimizer = "torch-adam";
  std::string dtype = "f32";
  bool cuda = false;
  std::string save_result;        // --save-result: the run's losses and final parameters
  std::vector<std::string> argv;  // the command line, for --check's child on CUDA
  int nproc = 1;                  // --nproc: data parallel ranks on this machine
  std::string figures;            // --figures: the run's figures as JSON (bench/dp)
  int rank = -1;                  // this process's rank, when a launcher started it
};

// The launcher marks the ranks it starts with this variable (their rank).
constexpr const char* kRankVariable = "SPILLWAY_TRAIN_DEMO_RANK";

struct RunResult {
  std::vector<float> losses;
  std::vector<double> step_ms;
  std::vector<torch::Tensor> final_params;
  double seconds = 0;
  nlohmann::json figures;  // the managed run's: what --figures writes
};

double mib(double bytes) { return bytes / 1048576.0; }

double median_ms(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

nlohmann::json stats() { return nlohmann::json::parse(spillway::memory_stats_json()); }

double stat(const nlohmann::json& json, const char* key) {
  return json.contains(key) ? json.at(key).get<double>() : 0.0;
}

// SPILLWAY_CONF (or the default) with the trace key --trace asks for. A trace
// key already in the text wins only when it names the same file.
std::string configuration_text(const std::string& trace, bool cuda) {
  const char* env = std::getenv("SPILLWAY_CONF");
  std::string conf = env != nullptr && *env != '\0' ? env : cuda ? kCudaConf : kDefaultConf;
  if (trace.empty()) return conf;
  const std::string key = "trace:";
  for (std::size_t start = 0; start <= conf.size();) {
    std::size_t end = conf.find(',', start);
    if (end == std::string::npos) end = conf.size();
    const std::string item = conf.substr(start, end - start);
    if (item.rfind(key, 0) == 0) {
      if (item.substr(key.size()) == trace) return conf;
      throw std::invalid_argument("--trace " + trace + " contradicts SPILLWAY_CONF's " + item);
    }
    start = end + 1;
  }
  return conf + ",trace:" + trace;
}

void print_header(const DemoOptions& demo) {
  const GptConfig& model = demo.trainer.model;
  std::int64_t params = 0;
  // A model of its own, never managed or given to an optimizer (spillway's
  // would manage it), only counted.
  for (const auto& p : Gpt(model)->parameters()) params += p.numel();
  fmt::print(
      "model: GPT, {} layers, d_model {}, {} heads, vocab {}, sequence {}: {:.2f}M parameters\n",
      model.layers, model.d_model, model.heads, model.vocab, model.sequence, params / 1e6);
  fmt::print(
      "task: next token of a seeded random bigram chain ({} successors per token; loss "
      "floor about ln {} = {:.3f}, uniform guess ln {} = {:.3f})\n",
      MarkovTask::kSuccessors, MarkovTask::kSuccessors, std::log(double(MarkovTask::kSuccessors)),
      model.vocab, std::log(double(model.vocab)));
  fmt::print("training: {} steps, batch {}, {} (lr {}), {}, seed {}\n", demo.steps,
             demo.trainer.batch, demo.optimizer, demo.trainer.learning_rate, demo.dtype,
             demo.trainer.seed);
}

void print_budget(Trainer& trainer, OptimizerKind optimizer) {
  Runtime& runtime = Runtime::process();
  const double budget = double(runtime.active_allocator()->budget_bytes());
  const double model_data = double(trainer.model_data_bytes());
  fmt::print("spillway: {}\n", runtime.device().name());
  fmt::print(
      "model data (parameters + gradients{}) {:.1f} MiB, device budget {:.1f} MiB: {:.1f}x the "
      "budget; chunk {:.1f} MiB\n",
      optimizer == OptimizerKind::spillway_adam ? " + Adam state" : "", mib(model_data),
      mib(budget), model_data / budget, mib(double(runtime.config().chunk_size)));
}

// `plain`: the same model's run without spillway, whose step times are
// printed beside this run's.
RunResult train(const DemoOptions& demo, bool managed, const RunResult* plain = nullptr) {
  TrainerOptions options = demo.trainer;
  options.manage = managed;
  if (demo.cuda) options.device = torch::Device(torch::kCUDA, 0);
  options.ranks = demo.nproc;
  if (demo.rank >= 0)
    options.rank = demo.rank;
  else
    options.mean_of_ranks = demo.nproc > 1;  // the launcher's reference
  // The reference is torch's own Adam: spillway's would put the parameters
  // into chunks itself.
  if (!managed) options.optimizer = OptimizerKind::torch_adam;
  Trainer trainer(options);
  const char* label = managed ? "spillway" : "plain";
  if (managed) print_budget(trainer, options.optimizer);
  RunResult result;
  nlohmann::json before = managed ? stats() : nlohmann::json::object();
  const nlohmann::json at_start = before;
  const spillway::DataParallelTraffic traffic_at_start = spillway::data_parallel_traffic();
  const auto start = std::chrono::steady_clock::now();
  for (int step = 1; step <= demo.steps; ++step) {
    const auto step_start = std::chrono::steady_clock::now();
    const float loss = trainer.step();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - step_start)
            .count();
    result.losses.push_back(loss);
    result.step_ms.push_back(ms);
    std::string moves;
    if (managed) {
      const nlohmann::json now = stats();
      moves = fmt::format("  h2d {:6.1f} MiB  d2h {:6.1f} MiB  evictions {:3.0f}",
                          mib(stat(now, "bytes_moved.h2d") - stat(before, "bytes_moved.h2d")),
                          mib(stat(now, "bytes_moved.d2h") - stat(before, "bytes_moved.d2h")),
                          stat(now, "evictions") - stat(before, "evictions"));
      moves += fmt::format("  prefetches {:3.0f}  stall {:5.1f} ms (expected {:5.1f})",
                           stat(now, "prefetches") - stat(before, "prefetches"),
                           stat(now, "stall_ns.actual.last_step") / 1e6,
                           stat(now, "stall_ns.expected.last_step") / 1e6);
      if (plain != nullptr && std::size_t(step) <= plain->step_ms.size())
        moves += fmt::format("  (without spillway {:.0f} ms)", plain->step_ms[step - 1]);
      before = now;
    }
    // {} prints the shortest text that reads back as the same float, so two
    // runs' outputs can be compared as text too.
    fmt::print("[{}] step {:3}/{}  loss {:<11}  {:6.0f} ms{}\n", label, step, demo.steps, loss, ms,
               moves);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Between steps, before the copies below gather what this rank dropped.
  const spillway::ParameterChunkBytes parameter_chunks = spillway::parameter_chunk_bytes();
  result.final_params = trainer.parameter_copies();
  const double tokens = double(demo.steps) * double(options.batch) * double(options.model.sequence);
  fmt::print("[{}] {} steps in {:.2f} s: {:.0f} tokens/s ({})\n", label, demo.steps, result.seconds,
             tokens / result.seconds,
             options.optimizer == OptimizerKind::spillway_adam ? "spillway-adam" : "torch-adam");
  if (managed) {
    const nlohmann::json end = stats();
    const auto per_step = [&](const char* key) {
      return (stat(end, key) - stat(at_start, key)) / demo.steps;
    };
    fmt::print("spillway statistics (totals since activation; per training step):\n");
    fmt::print("  evictions            {:>10.0f}   {:8.1f} / step\n", stat(end, "evictions"),
               per_step("evictions"));
    fmt::print("  bytes moved h2d      {:>10.1f} MiB {:6.1f} MiB / step\n",
               mib(stat(end, "bytes_moved.h2d")), mib(per_step("bytes_moved.h2d")));
    fmt::print("  bytes moved d2h      {:>10.1f} MiB {:6.1f} MiB / step\n",
               mib(stat(end, "bytes_moved.d2h")), mib(per_step("bytes_moved.d2h")));
    fmt::print("  prefetches           {:>10.0f}   {:8.1f} / step\n", stat(end, "prefetches"),
               per_step("prefetches"));
    fmt::print("  stall time           {:>10.1f} ms  {:6.1f} ms / step\n",
               stat(end, "stall_ns") / 1e6, per_step("stall_ns") / 1e6);
    fmt::print("  stall expected       {:>10.1f} ms  {:6.1f} ms / step\n",
               stat(end, "stall_ns.expected") / 1e6, per_step("stall_ns.expected") / 1e6);
    if (plain != nullptr && !plain->step_ms.empty())
      fmt::print("  step time            {:>10.1f} ms median; without spillway {:.1f} ms\n",
                 median_ms(result.step_ms), median_ms(plain->step_ms));
    fmt::print("  peak reserved        {:>10.1f} MiB\n", mib(stat(end, "reserved_bytes.all.peak")));
    fmt::print("  peak allocated       {:>10.1f} MiB\n",
               mib(stat(end, "allocated_bytes.all.peak")));
    fmt::print("  peak model           {:>10.1f} MiB\n",
               mib(stat(end, "allocated_bytes.model.peak")));
    fmt::print("  peak non-model       {:>10.1f} MiB\n",
               mib(stat(end, "allocated_bytes.non_model.peak")));
    fmt::print("  spills for allocs    {:>10.0f}\n", stat(end, "num_spills_for_allocation"));
    fmt::print("  budget overruns      {:>10.0f}\n", stat(end, "num_budget_overruns"));
    fmt::print("  chunks on device     {:>10.1f} MiB\n", mib(stat(end, "chunk_bytes.device")));
    fmt::print("  chunks on host       {:>10.1f} MiB\n", mib(stat(end, "chunk_bytes.host")));
    fmt::print(
        "  chunk fill           {:>10.3f}   ({:.1f} MiB of tensors in {:.1f} MiB of chunks)\n",
        end.value("chunk_fill_ratio", 0.0), mib(stat(end, "chunk_bytes.tensors")),
        mib(stat(end, "chunk_bytes.capacity")));
    fmt::print("  out-of-memory errors {:>10.0f}\n", stat(end, "num_ooms"));
  }
  if (managed) {
    // Adam's two fp32 tensors per parameter, over the whole model.
    std::size_t model_state = 0, parameter_bytes = 0, gradient_bytes = 0;
    for (const torch::Tensor& param : trainer.model()->parameters()) {
      model_state += 2 * static_cast<std::size_t>(param.numel()) * sizeof(float);
      parameter_bytes += param.nbytes();
      if (param.requires_grad()) gradient_bytes += param.nbytes();
    }
    const std::size_t held = trainer.optimizer_state_bytes();
    const spillway::DataParallelTraffic traffic = spillway::data_parallel_traffic();
    const double sent = double(traffic.bytes_sent - traffic_at_start.bytes_sent) / demo.steps;
    const double received =
        double(traffic.bytes_received - traffic_at_start.bytes_received) / demo.steps;
    // Each way, per step: the gradients reduced to their owners and the
    // parameters gathered from them, (N-1)/N of each.
    const double minimum = double(parameter_bytes + gradient_bytes) * (demo.nproc - 1) / demo.nproc;
    const double gathers =
        double(traffic.parameter_gathers - traffic_at_start.parameter_gathers) / demo.steps;
    const double gathers_ahead =
        double(traffic.parameter_gathers_ahead - traffic_at_start.parameter_gathers_ahead) /
        demo.steps;
    result.figures = {{"rank", std::max(demo.rank, 0)},
                      {"ranks", demo.nproc},
                      {"steps", demo.steps},
                      {"batch", options.batch},
                      {"step_ms_median", median_ms(result.step_ms)},
                      {"parameter_bytes", parameter_bytes},
                      {"gradient_bytes", gradient_bytes},
                      {"optimizer_state_bytes", held},
                      {"parameter_chunk_bytes_held", parameter_chunks.held},
                      {"parameter_chunk_bytes", parameter_chunks.total},
                      {"model_optimizer_state_bytes", model_state},
                      {"bytes_sent_per_step", sent},
                      {"bytes_received_per_step", received},
                      {"minimum_bytes_each_way_per_step", minimum},
                      {"parameter_gathers_per_step", gathers},
                      {"parameter_gathers_ahead_per_step", gathers_ahead}};
    if (demo.rank >= 0) {
      fmt::print(
          "data parallel: rank {} of {} holds {:.1f} MiB of optimizer state, {:.3f} of the "
          "model's {:.1f} MiB (1/{} = {:.3f})\n",
          demo.rank, demo.nproc, mib(double(held)), double(held) / double(model_state),
          mib(double(model_state)), demo.nproc, 1.0 / demo.nproc);
      fmt::print(
          "data parallel: rank {} holds {:.1f} MiB of parameter chunks between steps, {:.3f} of "
          "the model's {:.1f} MiB (dist_params:{})\n",
          demo.rank, mib(double(parameter_chunks.held)),
          double(parameter_chunks.held) / double(std::max<std::size_t>(parameter_chunks.total, 1)),
          mib(double(parameter_chunks.total)),
          spillway::Runtime::process().config().dist_params == spillway::DistParams::sharded
              ? "sharded"
              : "replicated");
      fmt::print(
          "data parallel: rank {} sent {:.2f} MiB and received {:.2f} MiB per step, {:.3f} of "
          "the minimum ({:.2f} MiB each way: (N-1)/N of the parameters and of the gradients)\n",
          demo.rank, mib(sent), mib(received), (sent + received) / (2 * minimum), mib(minimum));
      if (gathers > 0)
        fmt::print(
            "data parallel: rank {} gathered {:.1f} chunk groups of parameters per step, {:.1f} "
            "of them issued ahead of their use\n",
            demo.rank, gathers, gathers_ahead);
    }
  }
  return result;
}

// Bit for bit: the same float bits, and torch::equal on every parameter.
int compare(const RunResult& plain, const RunResult& managed) {
  int mismatches = 0;
  for (std::size_t i = 0; i < plain.losses.size(); ++i) {
    if (std::memcmp(&plain.losses[i], &managed.losses[i], sizeof(float)) != 0) {
      fmt::print("check: step {} loss differs: {} without spillway, {} with\n", i + 1,
                 plain.losses[i], managed.losses[i]);
      ++mismatches;
    }
  }
  for (std::size_t i = 0; i < plain.final_params.size(); ++i) {
    if (!torch::equal(plain.final_params[i], managed.final_params[i])) {
      fmt::print("check: final parameter {} differs\n", i);
      ++mismatches;
    }
  }
  if (mismatches != 0) {
    fmt::print("check: FAILED, {} differences\n", mismatches);
    return 1;
  }
  fmt::print("check: {} losses and {} final parameters bit-identical with and without spillway\n",
             plain.losses.size(), plain.final_params.size());
  return 0;
}

// --save-result: the losses as one tensor, then the final parameters.
void save_result(const RunResult& result, const std::string& path) {
  std::vector<torch::Tensor> saved{torch::tensor(result.losses)};
  saved.insert(saved.end(), result.final_params.begin(), result.final_params.end());
  torch::save(saved, path);
}

RunResult load_result(const std::string& path) {
  std::vector<torch::Tensor> saved;
  torch::load(saved, path);
  if (saved.empty()) throw std::runtime_error(path + " holds no run result");
  RunResult result;
  const torch::Tensor losses = saved.front().contiguous();
  result.losses.assign(losses.data_ptr<float>(), losses.data_ptr<float>() + losses.numel());
  result.final_params.assign(saved.begin() + 1, saved.end());
  return result;
}

// Bit-identity on a GPU: deterministic kernels (embedding's backward
// accumulates with atomics otherwise) and cuBLAS's deterministic workspace,
// set before cuBLAS starts.
void prepare_cuda() {
  if (!torch::cuda::is_available())
    throw std::runtime_error("--cuda needs a usable GPU, and torch sees none");
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
}

// --check on CUDA: the reference run in a child process, which allocates
// with torch's own CUDA allocator; its result comes back through a file.
RunResult train_reference_in_child(const DemoOptions& demo) {
  char path[] = "/tmp/spillway-train-demo-reference-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) throw std::runtime_error(std::string("mkstemp: ") + std::strerror(errno));
  close(fd);
  std::vector<std::string> args;
  for (const std::string& arg : demo.argv)
    if (arg != "--check") args.push_back(arg);
  for (const char* arg : {"--no-spillway", "--save-result"}) args.emplace_back(arg);
  args.emplace_back(path);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  pid_t child = 0;
  const int spawn_error =
      posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
  if (spawn_error != 0)
    throw std::runtime_error(std::string("starting the reference run: ") +
                             std::strerror(spawn_error));
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::remove(path);
    throw std::runtime_error("the reference run (torch's CUDA allocator, child process) failed");
  }
  RunResult result = load_result(path);
  std::remove(path);
  return result;
}

// --figures: every rank's figures, in rank order.
void write_figures(const std::string& path, const nlohmann::json& per_rank) {
  std::ofstream out(path);
  out << nlohmann::json{{"ranks", per_rank.size()}, {"per_rank", per_rank}}.dump(2) << "\n";
  if (!out) throw std::runtime_error("--figures: could not write " + path);
}

// --- --nproc: the launcher ------------------------------------------------

// A TCP port free on the loopback now, for rank 0's store (as torchrun's
// --standalone picks one).
int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string error = std::strerror(errno);
    close(fd);
    throw std::runtime_error("finding a free port for the ranks' store: " + error);
  }
  close(fd);
  return ntohs(address.sin_port);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A temporary folder for the ranks' logs and results, removed at the end.
struct RankFolder {
  RankFolder() {
    char pattern[] = "/tmp/spillway-train-demo-XXXXXX";
    if (mkdtemp(pattern) == nullptr)
      throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
    path = pattern;
  }
  ~RankFolder() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string path;
};

// Starts rank `rank` of `demo.nproc`: this program with the same options
// (less --check), torchrun's environment and `conf`. Rank 0 writes to this
// process's output, the others to `log`; `result` and `figures`, when not
// empty, are where the rank saves its losses and final parameters, and its
// figures.
pid_t start_rank(const DemoOptions& demo, int rank, int port, const std::string& conf,
                 const std::string& log, const std::string& result, const std::string& figures) {
  std::vector<std::string> args;
  for (std::size_t i = 0; i < demo.argv.size(); ++i) {
    const std::string& arg = demo.argv[i];
    if (arg == "--figures") ++i;  // and its value: the rank writes its own
    if (arg == "--check" || arg == "--figures" || arg.rfind("--figures=", 0) == 0) continue;
    args.push_back(arg);
  }
  if (!result.empty()) {
    args.emplace_back("--save-result");
    args.push_back(result);
  }
  if (!figures.empty()) {
    args.emplace_back("--figures");
    args.push_back(figures);
  }
  std::vector<std::string> environment;
  for (char** variable = environ; *variable != nullptr; ++variable) {
    const std::string entry = *variable;
    const std::string name = entry.substr(0, entry.find('='));
    if (name != "SPILLWAY_CONF" && name != "RANK" && name != "WORLD_SIZE" && name != "LOCAL_RANK" &&
        name != "MASTER_ADDR" && name != "MASTER_PORT" && name != "TORCHELASTIC_USE_AGENT_STORE" &&
        name != kRankVariable)
      environment.push_back(entry);
  }
  for (const std::string& entry :
       {"SPILLWAY_CONF=" + conf, "RANK=" + std::to_string(rank),
        "LOCAL_RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(demo.nproc),
        std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(port),
        std::string(kRankVariable) + "=" + std::to_string(rank)})
    environment.push_back(entry);
  std::vector<char*> argv, envp;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  for (std::string& entry : environment) envp.push_back(entry.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (rank != 0) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  std::fflush(stdout);
  pid_t child = 0;
  const int error =
      posix_spawn(&child, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0)
    throw std::runtime_error(fmt::format("starting rank {}: {}", rank, std::strerror(error)));
  return child;
}

int launch_ranks(const DemoOptions& demo) {
  if (demo.cuda)
    throw std::invalid_argument(
        "--nproc trains on the simulated device (the NCCL path is not built yet); drop --cuda");
  if (demo.no_spillway) throw std::invalid_argument("--nproc trains under spillway only");
  if (!demo.trace.empty() || !demo.dump_trace.empty())
    throw std::invalid_argument("--nproc writes no trace (each rank would write the same file)");
  if (!demo.save_result.empty())
    throw std::invalid_argument("--nproc saves no result (each rank has its own)");
  std::string conf = configuration_text("", false);
  if (conf.find("dist:") == std::string::npos)
    conf += ",dist:env";
  else if (conf.find("dist:env") == std::string::npos)
    throw std::invalid_argument(
        "--nproc joins the ranks through dist:env; SPILLWAY_CONF says "
        "otherwise (" +
        conf + ")");
  const int port = free_loopback_port();
  RankFolder folder;
  auto log_of = [&](int rank) { return fmt::format("{}/rank{}.log", folder.path, rank); };
  auto result_of = [&](int rank) { return fmt::format("{}/rank{}.pt", folder.path, rank); };
  auto figures_of = [&](int rank) {
    return demo.figures.empty() ? std::string() : fmt::format("{}/rank{}.json", folder.path, rank);
  };
  fmt::print(
      "data parallel: {} ranks on this machine (Gloo, store on 127.0.0.1:{}); rank 0's output "
      "follows\n",
      demo.nproc, port);
  std::vector<pid_t> children;
  for (int rank = 0; rank < demo.nproc; ++rank)
    children.push_back(start_rank(demo, rank, port, conf, log_of(rank),
                                  demo.check ? result_of(rank) : std::string(), figures_of(rank)));
  std::vector<int> failed;
  for (int rank = 0; rank < demo.nproc; ++rank) {
    int status = 0;
    while (waitpid(children[static_cast<std::size_t>(rank)], &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed.push_back(rank);
  }
  for (int rank = 1; rank < demo.nproc; ++rank) {
    // The other ranks' state lines, so that the split shows.
    std::istringstream lines(read_text(log_of(rank)));
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("data parallel:", 0) == 0) fmt::print("{}\n", line);
  }
  if (!failed.empty()) {
    for (const int rank : failed)
      if (rank != 0)
        fmt::print(stderr, "--- rank {} failed; its output:\n{}", rank, read_text(log_of(rank)));
    throw std::runtime_error(
        fmt::format("rank(s) {} of {} failed", fmt::join(failed, ", "), demo.nproc));
  }
  if (!demo.figures.empty()) {
    nlohmann::json per_rank = nlohmann::json::array();
    for (int rank = 0; rank < demo.nproc; ++rank)
      per_rank.push_back(nlohmann::json::parse(read_text(figures_of(rank))));
    write_figures(demo.figures, per_rank);
  }
  if (!demo.check) return 0;
  fmt::print("check: one process without spillway, each step's {} micro-batches averaged\n",
             demo.nproc);
  const RunResult reference = train(demo, /*managed=*/false);
  int status = 0;
  for (int rank = 0; rank < demo.nproc; ++rank) {
    RunResult ranked = load_result(result_of(rank));
    // The losses are each rank's own micro-batch's: rank 0's are the reference's.
    if (rank != 0) ranked.losses = reference.losses;
    fmt::print("rank {}: ", rank);
    status |= compare(reference, ranked);
  }
  return status;
}

int run(const DemoOptions& demo) {
  if (demo.nproc > 1 && demo.rank < 0) return launch_ranks(demo);
  if (demo.no_spillway && !demo.check && demo.trainer.optimizer != OptimizerKind::torch_adam)
    throw std::invalid_argument("--no-spillway trains with torch-adam (" + demo.optimizer +
                                " keeps its state in spillway's chunks)");
  if (demo.dtype == "bf16" && (demo.check || demo.no_spillway))
    throw std::invalid_argument(
        "--dtype bf16 trains with spillway-adam under spillway only (--check and --no-spillway "
        "compare with torch-adam in f32)");
  if (!demo.save_result.empty() && demo.check)
    throw std::invalid_argument("--save-result saves one run; --check trains two");
  if (!demo.figures.empty() && demo.no_spillway && !demo.check)
    throw std::invalid_argument("--figures describes a run under spillway; drop --no-spillway");
  const bool managed_run = demo.check || !demo.no_spillway;
  const bool a_rank = demo.rank >= 0;
  // With two intra-op threads the two runs' final parameters differed in 5
  // of 100 processes on the 2-core machine, torch's own Adam on both sides
  // included; in none of 90 with one thread, and none of 40 with MKL's strict
  // reproducible mode (MKL_CBWR=AVX2,STRICT). The check is about spillway's
  // bytes, so it takes MKL's run-to-run variation out.
  if (demo.check && !demo.cuda) at::set_num_threads(1);
  if (demo.cuda) prepare_cuda();
  if (managed_run) spillway::configure(configuration_text(demo.trace, demo.cuda));
  // Before torch's first CUDA allocation: the allocator is chosen once per process.
  if (managed_run && demo.cuda) spillway::use_as_torch_cuda_allocator();
  print_header(demo);
  std::optional<RunResult> plain, managed;
  if (a_rank) {
    // A rank of --nproc: the managed run alone (the launcher checks).
  } else if (demo.check && demo.cuda) {
    plain = train_reference_in_child(demo);
  } else if (demo.check || demo.no_spillway || (!demo.cuda && demo.dtype != "bf16")) {
    // On the simulated device the plain run also times the same model without
    // spillway, beside the managed run's steps; not in bf16, where torch has
    // no Adam with fp32 master copies to train it with.
    plain = train(demo, /*managed=*/false);
  }
  if (managed_run) managed = train(demo, /*managed=*/true, plain ? &*plain : nullptr);
  if (!demo.save_result.empty()) save_result(managed ? *managed : *plain, demo.save_result);
  if (!demo.figures.empty() && managed) {
    if (a_rank)
      std::ofstream(demo.figures) << managed->figures.dump();  // the launcher collects them
    else
      write_figures(demo.figures, nlohmann::json::array({managed->figures}));
  }
  if (!demo.trace.empty() && managed)
    fmt::print("trace: {} (completed at exit, or an error and exit status 1)\n", demo.trace);
  if (!demo.dump_trace.empty() && managed) {
    spillway::dump_trace(demo.dump_trace);
    // Read back, so that the ctest proves the snapshot is a complete file.
    const TraceReadResult read = read_trace_file(demo.dump_trace);
    if (!read.ok()) throw std::runtime_error(read.error);
    // ... and it agrees with the statistics: every fetch and step is in it.
    std::uint64_t steps = 0, fetched_bytes = 0;
    for (const TraceEvent& event : read.trace->events) {
      if (event.kind == TraceEventKind::step) ++steps;
      if (event.kind == TraceEventKind::chunk_fetch) fetched_bytes += event.size;
    }
    const auto h2d = static_cast<std::uint64_t>(stat(stats(), "bytes_moved.h2d"));
    if (fetched_bytes != h2d || steps != static_cast<std::uint64_t>(demo.steps))
      throw std::runtime_error(fmt::format(
          "trace snapshot {} disagrees with the run: {} steps and {} bytes fetched in it, "
          "{} steps and bytes_moved.h2d {} in the statistics",
          demo.dump_trace, steps, fetched_bytes, demo.steps, h2d));
    fmt::print("trace snapshot: {}, {} events, {} steps, {} bytes fetched (as the statistics)\n",
               demo.dump_trace, read.trace->events.size(), steps, fetched_bytes);
  }
  return demo.check && !a_rank ? compare(*plain, *managed) : 0;
}

}  // namespace
}  // namespace spillway::train_demo

int main(int argc, char** argv) {
  using namespace spillway::train_demo;
  DemoOptions demo;
  GptConfig& model = demo.trainer.model;
  CLI::App app{"spillway-train-demo: a small GPT trained with its model data in spillway's chunks"};
  app.add_option("--steps", demo.steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--layers", model.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--d-model", model.d_model, "model width")->check(CLI::PositiveNumber);
  app.add_option("--heads", model.heads, "attention heads (divides d_model)")
      ->check(CLI::PositiveNumber);
  app.add_option("--vocab", model.vocab, "vocabulary size")->check(CLI::PositiveNumber);
  app.add_option("--seq", model.sequence, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--batch", demo.trainer.batch, "sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--seed", demo.trainer.seed, "seed of the weights and the data");
  app.add_option("--lr", demo.trainer.learning_rate, "learning rate");
  app.add_option("--optimizer", demo.optimizer,
                 "torch-adam (torch::optim::Adam) or spillway-adam (state in chunks); the "
                 "run without spillway always uses torch-adam")
      ->check(CLI::IsMember(optimizer_names()));
  app.add_option("--dtype", demo.dtype,
                 "f32, or bf16 (parameters, gradients and activations; fp32 master copies in "
                 "spillway-adam, which it needs)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_flag("--no-spillway", demo.no_spillway, "train without spillway (the reference)");
  app.add_flag("--check", demo.check,
               "train without and with spillway; exit 1 unless losses and final parameters are "
               "bit-identical");
  app.add_option("--trace", demo.trace,
                 "write spillway's trace file here (the `trace` configuration key)");
  app.add_option("--dump-trace", demo.dump_trace,
                 "after training, write a complete snapshot of the trace so far here "
                 "(spillway::dump_trace; needs --trace or a trace key in SPILLWAY_CONF)");
  app.add_flag("--cuda", demo.cuda,
               "train on the GPU, with spillway as torch's CUDA allocator (default "
               "configuration: " +
                   std::string(kCudaConf) + ")");
  app.add_option("--save-result", demo.save_result,
                 "write the run's losses and final parameters here (torch::save), for a "
                 "comparison in another process");
  app.add_option("--figures", demo.figures,
                 "write the run's figures here as JSON: each rank's median step time, "
                 "optimizer-state bytes and data parallel traffic per step (bench/dp reads it)");
  app.add_flag("--reduce-after-backward", demo.trainer.reduce_after_backward,
               "with --nproc: reduce the gradients after backward, not during it as each "
               "chunk group completes (bench/dp compares the two)");
  app.add_option("--nproc", demo.nproc,
                 "train data parallel in this many processes on this machine (Gloo, the "
                 "simulated device); with --check, compare every rank with one process "
                 "averaging the same micro-batches")
      ->check(CLI::PositiveNumber);
  demo.argv.assign(argv, argv + argc);
  CLI11_PARSE(app, argc, argv);
  if (const char* rank = std::getenv(kRankVariable)) demo.rank = std::atoi(rank);
  try {
    demo.trainer.optimizer = parse_optimizer(demo.optimizer);
    demo.trainer.dtype = demo.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat;
    return run(demo);
  } catch (const std::exception& e) {
    fmt::print(stderr, "spillway-train-demo: {}\n", e.what());
    return 2;
  }
}
