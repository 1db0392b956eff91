// Data parallel training across ranks (Note [Data parallel over chunk groups]
// in hooks/torch/data_parallel.cc) against an in-process oracle.
//
// Each test spawns this binary once per rank (only the test itself, with the
// rank in the environment); the ranks meet through a FileStore in a
// temporary folder and talk over Gloo on localhost, wrapped in torch's
// ProcessGroupWrapper, which checks that every rank issues the same
// collective. Each rank trains under spillway on the sim device with strict
// residency and a chunk budget that spills every step, then saves its
// parameters and its optimizer state. The test process itself runs the
// oracle without spillway: the same model on the same micro-batches, each
// rank's gradient computed on its own, summed in rank order and divided by
// the world size, then the same optimizer step. Parameters and state must
// match bit for bit; against one process on the concatenated batch, within
// torch's default fp32 tolerances.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupWrapper.hpp>

#include "allocator/runtime.h"
#include "hooks/torch/data_parallel.h"
#include "hooks/torch/rank_layout.h"
#include "hooks/torch/sharded_params.h"
#include "hooks/torch/sim_torch_allocator.h"
#include "hooks/torch/spillway_torch.h"

extern char** environ;

namespace {

// 2 MiB chunks (the smallest) under an 8 MiB cap on resident chunks
// (use_conf): the model's 7.6 MiB of parameters and as much again of
// gradients spill every step.
constexpr char kConf[] =
    "device:sim,strict_residency:true,chunk_size:2MiB,sim_capacity:256MiB,policy:lru";
constexpr std::size_t kChunkBudgetBytes = std::size_t{8} << 20;
constexpr std::int64_t kIn = 256;
constexpr std::int64_t kHidden = 512;
constexpr std::int64_t kWide = 1536;  // the wide layer's 3 MiB weight outgrows a chunk
constexpr std::int64_t kOut = 16;
constexpr std::int64_t kBatch = 8;  // per rank and micro-batch

// Parameter order is layout order; the same on every rank. `extra` is
// reached only by some micro-batches, and on some steps by none; `mix` is a
// transposed leaf, whose strides are not contiguous.
struct Mlp : torch::nn::Module {
  Mlp() {
    input = register_module("input", torch::nn::Linear(kIn, kHidden));
    for (int i = 0; i < 3; ++i)
      hidden.push_back(
          register_module("hidden" + std::to_string(i), torch::nn::Linear(kHidden, kHidden)));
    extra = register_module("extra", torch::nn::Linear(kHidden, kHidden));
    wide = register_module("wide", torch::nn::Linear(kHidden, kWide));
    head = register_module("head", torch::nn::Linear(kWide, kOut));
    // Strides that are not contiguous: a transposed leaf.
    mix = register_parameter("mix", torch::randn({kOut, kOut}).t());
  }
  torch::Tensor forward(torch::Tensor x, bool use_extra) {
    x = torch::relu(input(x));
    for (auto& layer : hidden) x = torch::relu(layer(x));
    if (use_extra) x = x + torch::tanh(extra(x));
    return head(torch::relu(wide(x))).matmul(mix);
  }
  torch::nn::Linear input{nullptr}, extra{nullptr}, wide{nullptr}, head{nullptr};
  std::vector<torch::nn::Linear> hidden;
  torch::Tensor mix;
};

// torch's Adam and SGD, and spillway's chunked Adam (state in chunks).
enum class Optimizer { adam, sgd_momentum, chunked_adam };

struct Scenario {
  int world = 2;
  int steps = 3;
  int micro_batches = 1;  // per rank and step: gradient accumulation
  Optimizer optimizer = Optimizer::adam;
  // A second model (a critic, seeded apart) with an SGD optimizer of its
  // own, trained in turn with the first: each reduced on its own.
  bool two_models = false;
  // Launched by torchrun, the ranks joining through dist:env.
  bool torchrun = false;
  // Above 0: gradients clipped to this norm before each step, by
  // spillway::clip_grad_norm_ on the ranks and torch's on the oracle.
  double clip_norm = 0;
  // The model's dtype. bf16 gradients travel as bf16 and are summed in fp32
  // (Note [Gradients travel in their own dtype]), as the oracle does.
  torch::Dtype dtype = torch::kFloat;
  // How gradients reach their owners. Gloo's reduce-scatter sums in an order
  // of its own: bit for bit with the oracle at N = 2 only (a + b = b + a),
  // within torch's fp32 tolerances beyond.
  spillway::torch_bridge::GradientReduction reduction =
      spillway::torch_bridge::GradientReduction::by_device;
  // Above 0: after `steps` steps a checkpoint by owner is saved, and this
  // many ranks load it and train `resumed_steps` more.
  int resumed_world = 0;
  int resumed_steps = 0;
  // dist_params:sharded: each rank keeps what it owns and gathers the rest
  // for each use (Note [Parameters gathered for their use]). Every rank must
  // then use the same layers, so `extra` is reached by all or none.
  bool sharded = false;
  int world_at(int step) const {
    return resumed_world > 0 && step >= steps ? resumed_world : world;
  }
  bool bit_for_bit() const {
    return reduction != spillway::torch_bridge::GradientReduction::reduce_scatter || world == 2;
  }
};

constexpr int kCriticSeed = 8;
constexpr int kCriticBatches = 100;  // its batches: step + 100

// The extra layer: on some (step, rank, micro-batch) only; with 2 ranks,
// step 1 reaches it on no rank. With sharded parameters, on some (step,
// micro-batch) on every rank: steps 1 and 2 reach it on none.
bool uses_extra(const Scenario& scenario, int step, int rank, int micro) {
  return (step + (scenario.sharded ? 0 : rank) + micro) % 3 == 0;
}

std::pair<torch::Tensor, torch::Tensor> batch(int step, int rank, int micro) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 * step + 10 * rank + micro);
  torch::Tensor x = at::randn({kBatch, kIn}, generator);
  torch::Tensor y = at::randn({kBatch, kOut}, generator);
  return {x, y};
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Optimizer kind,
                                                        std::vector<torch::Tensor> params) {
  if (kind == Optimizer::adam)
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
  if (kind == Optimizer::chunked_adam)
    return std::make_unique<spillway::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
}

// A parameter's optimizer state as tensors (empty: none on this rank).
std::vector<torch::Tensor> state_of(torch::optim::Optimizer& optimizer, const torch::Tensor& p) {
  if (auto* chunked = dynamic_cast<spillway::optim::ChunkedOptimizer*>(&optimizer)) {
    const auto state = chunked->param_state(p);
    if (!state.has_value() || !state->started) return {};
    std::vector<torch::Tensor> tensors = state->slots;
    tensors.push_back(torch::tensor(state->step, torch::kLong));
    return tensors;
  }
  const auto& state = optimizer.state();
  const auto found = state.find(p.unsafeGetTensorImpl());
  if (found == state.end()) return {};
  if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(found->second.get()))
    return {adam->exp_avg().clone(), adam->exp_avg_sq().clone(),
            torch::tensor(adam->step(), torch::kLong)};
  auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(found->second.get());
  return {sgd->momentum_buffer().clone()};
}

// What a run ends with: per parameter its values and its optimizer state.
struct RunResult {
  std::vector<torch::Tensor> params;
  std::vector<std::vector<torch::Tensor>> states;
  std::vector<double> clip_norms;  // per step, when clipping
};

// Writes `result` flat: per parameter, its values, its state count, its state.
void save_result(const RunResult& result, const std::string& path) {
  std::vector<torch::Tensor> flat;
  for (std::size_t i = 0; i < result.params.size(); ++i) {
    flat.push_back(result.params[i]);
    flat.push_back(torch::tensor(static_cast<std::int64_t>(result.states[i].size())));
    for (const auto& s : result.states[i]) flat.push_back(s);
  }
  flat.push_back(torch::tensor(result.clip_norms, torch::kDouble));
  torch::save(flat, path);
}

RunResult load_result(const std::string& path) {
  std::vector<torch::Tensor> flat;
  torch::load(flat, path);
  RunResult result;
  const torch::Tensor norms = flat.back();
  flat.pop_back();
  for (std::int64_t i = 0; i < norms.numel(); ++i)
    result.clip_norms.push_back(norms[i].item<double>());
  for (std::size_t i = 0; i < flat.size();) {
    result.params.push_back(flat[i++]);
    const std::int64_t count = flat[i++].item<std::int64_t>();
    result.states.emplace_back(flat.begin() + static_cast<std::ptrdiff_t>(i),
                               flat.begin() + static_cast<std::ptrdiff_t>(i + count));
    i += static_cast<std::size_t>(count);
  }
  return result;
}

// --- The ranks -----------------------------------------------------------

struct RankEnvironment {
  int rank = 0;
  int world = 1;
  std::string folder;  // the FileStore and the results
};

// A rank torchrun started: RANK and WORLD_SIZE are torchrun's.
std::optional<RankEnvironment> torchrun_rank_environment() {
  const char* folder = std::getenv("SPILLWAY_DP_TEST_TORCHRUN_FOLDER");
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  if (folder == nullptr || rank == nullptr || world == nullptr) return std::nullopt;
  return RankEnvironment{std::atoi(rank), std::atoi(world), folder};
}

std::optional<RankEnvironment> rank_environment() {
  const char* rank = std::getenv("SPILLWAY_DP_TEST_RANK");
  const char* world = std::getenv("SPILLWAY_DP_TEST_WORLD");
  const char* folder = std::getenv("SPILLWAY_DP_TEST_FOLDER");
  if (rank == nullptr || world == nullptr || folder == nullptr) return std::nullopt;
  return RankEnvironment{std::atoi(rank), std::atoi(world), folder};
}

// Gloo over the loopback, with a short timeout.
c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo_backend(c10::intrusive_ptr<c10d::Store> store,
                                                        int rank, int world) {
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  options->timeout = std::chrono::seconds(60);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(std::move(store), rank, world, options);
}

c10::intrusive_ptr<c10d::ProcessGroup> connect(const RankEnvironment& env) {
  auto store = c10::make_intrusive<c10d::FileStore>(env.folder + "/store", env.world);
  auto backend = [&](const std::string& prefix) {
    return gloo_backend(c10::make_intrusive<c10d::PrefixStore>(prefix, store), env.rank, env.world);
  };
  // The wrapper checks each collective's kind and shapes across ranks first.
  auto checked = c10::make_intrusive<c10d::ProcessGroupWrapper>(backend("main"), backend("check"));
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, env.rank, env.world);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, checked);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
}

std::string result_path(const std::string& folder, int rank) {
  return folder + "/rank" + std::to_string(rank) + ".pt";
}

// Evictions so far, from the statistics.
std::int64_t evictions() {
  return nlohmann::json::parse(spillway::memory_stats_json())["evictions"].get<std::int64_t>();
}

// The chunk manager's cap is what spills; the allocator's budget is wide, as
// reduce_gradients stages a group's gradients in fp32 beside the chunks.
void use_conf(bool dist_env = false, bool sharded = false) {
  spillway::configure(std::string(kConf) + (dist_env ? ",dist:env" : "") +
                      (sharded ? ",dist_params:sharded" : ""));
  spillway::activate();
  spillway::Runtime::process().active_allocator()->set_budget_bytes(std::size_t{96} << 20);
  spillway::Runtime::process().chunk_manager().set_device_budget_bytes(kChunkBudgetBytes);
}

// Capacity of the chunks of the given kinds; with `materialized`, only of
// those that hold bytes (on either side).
std::int64_t chunk_bytes(std::initializer_list<spillway::TensorKind> kinds, bool materialized) {
  spillway::ChunkManager& chunks = spillway::Runtime::process().chunk_manager();
  std::int64_t bytes = 0;
  for (std::uint32_t client = 0; client < 64; ++client)
    for (const spillway::ChunkId chunk : chunks.chunks_of(spillway::ClientId{client})) {
      const auto info = chunks.chunk_info(chunk);
      if (info.has_value() && (!materialized || info->location != spillway::Location::none) &&
          std::ranges::find(kinds, info->kind) != kinds.end())
        bytes += static_cast<std::int64_t>(info->capacity_bytes);
    }
  return bytes;
}

// Bytes of optimizer-state and master chunks that hold bytes: state chunks
// never written take no memory.
std::int64_t materialized_state_bytes() {
  return chunk_bytes({spillway::TensorKind::optimizer_state, spillway::TensorKind::master},
                     /*materialized=*/true);
}

// What a rank's parameter chunks hold: every one's capacity, the most that
// held bytes at a step boundary, and the most after a backward.
struct ParamBytes {
  std::int64_t total = 0;
  std::int64_t at_step_boundary = 0;
  std::int64_t after_backward = 0;
  std::int64_t gathers = 0;        // DataParallelTraffic::parameter_gathers
  std::int64_t gathers_ahead = 0;  // DataParallelTraffic::parameter_gathers_ahead
};

std::string param_bytes_path(const std::string& folder, int rank) {
  return folder + "/rank" + std::to_string(rank) + ".param_bytes";
}

std::string state_bytes_path(const std::string& folder, int rank) {
  return folder + "/rank" + std::to_string(rank) + ".state_bytes";
}

// One rank's training under spillway.
void train_rank(const RankEnvironment& env, const Scenario& scenario) {
  use_conf(scenario.torchrun, scenario.sharded);
  // A bf16 model is half the bytes: half the budget still spills.
  if (scenario.dtype != torch::kFloat)
    spillway::Runtime::process().chunk_manager().set_device_budget_bytes(
        kChunkBudgetBytes * torch::elementSize(scenario.dtype) / 4);
  torch::manual_seed(7);
  Mlp model;
  model.to(scenario.dtype);
  torch::manual_seed(kCriticSeed);
  Mlp critic;
  spillway::torch_bridge::set_gradient_reduction(scenario.reduction);
  if (!scenario.torchrun) spillway::set_process_group(connect(env));
  spillway::manage(model);  // with dist:env, joins torchrun's group first
  EXPECT_EQ(spillway::data_parallel_world_size(), env.world);
  EXPECT_EQ(spillway::data_parallel_rank(), env.rank);
  if (scenario.two_models) spillway::manage(critic);
  auto optimizer = make_optimizer(scenario.optimizer, model.parameters());
  auto critic_optimizer = make_optimizer(Optimizer::sgd_momentum, critic.parameters());
  RunResult result;
  ParamBytes param_bytes;
  const auto materialized_params = [] {
    return chunk_bytes({spillway::TensorKind::param}, /*materialized=*/true);
  };
  auto train = [&](Mlp& trained, torch::optim::Optimizer& trainer, int step, int batch_offset) {
    trainer.zero_grad();
    for (int micro = 0; micro < scenario.micro_batches; ++micro) {
      auto [x, y] = batch(step + batch_offset, env.rank, micro);
      // Only the last micro-batch's backward reduces (Note [Reducing while
      // backward runs]).
      std::optional<spillway::NoSync> accumulating;
      if (micro + 1 < scenario.micro_batches) accumulating.emplace();
      torch::mse_loss(
          trained.forward(x.to(scenario.dtype), uses_extra(scenario, step, env.rank, micro)),
          y.to(scenario.dtype))
          .backward();
    }
    param_bytes.after_backward = std::max(param_bytes.after_backward, materialized_params());
    // Clipping reduces the gradients itself: the reduction below must then
    // reduce nothing more (Note [A reduction reduces what backward wrote
    // since the last]).
    if (scenario.clip_norm > 0)
      result.clip_norms.push_back(
          spillway::clip_grad_norm_(trained.parameters(), scenario.clip_norm));
    if (scenario.two_models)
      spillway::reduce_gradients(trained.parameters());  // this model's only
    else
      spillway::reduce_gradients();
    trainer.step();
    spillway::step();
    param_bytes.at_step_boundary = std::max(param_bytes.at_step_boundary, materialized_params());
  };
  for (int step = 0; step < scenario.steps; ++step) {
    train(model, *optimizer, step, 0);
    if (scenario.two_models) train(critic, *critic_optimizer, step, kCriticBatches);
  }
  param_bytes.total = chunk_bytes({spillway::TensorKind::param}, /*materialized=*/false);
  std::ofstream(param_bytes_path(env.folder, env.rank))
      << param_bytes.total << ' ' << param_bytes.at_step_boundary << ' '
      << param_bytes.after_backward << ' ' << spillway::data_parallel_traffic().parameter_gathers
      << ' ' << spillway::data_parallel_traffic().parameter_gathers_ahead;
  // Before state_of, which reads (and so materializes) every state chunk.
  std::ofstream(state_bytes_path(env.folder, env.rank)) << materialized_state_bytes();
  EXPECT_GT(evictions(), 0) << "the budget should have spilled chunks: "
                            << spillway::memory_stats_json();
  for (const auto& p : model.parameters()) {
    EXPECT_TRUE(spillway::is_managed(p));
    result.params.push_back(p.detach().clone());
    result.states.push_back(state_of(*optimizer, p));
  }
  if (scenario.two_models) {
    for (const auto& p : critic.parameters()) {
      EXPECT_TRUE(spillway::is_managed(p));
      result.params.push_back(p.detach().clone());
      result.states.push_back(state_of(*critic_optimizer, p));
    }
  }
  save_result(result, result_path(env.folder, env.rank));
}

// --- The test process ----------------------------------------------------

// A temporary folder, removed with what it holds.
struct TemporaryFolder {
  TemporaryFolder() {
    char pattern[] = "/tmp/spillway-dp-XXXXXX";
    if (mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = pattern;
  }
  ~TemporaryFolder() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string path;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Starts `args` with `extra_env` added to this process's environment, its
// output to `log`; throws when it cannot.
pid_t spawn_logged(std::vector<std::string> args, std::vector<std::string> extra_env,
                   const std::string& log) {
  for (char** e = environ; *e != nullptr; ++e) extra_env.emplace_back(*e);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : extra_env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int failed =
      posix_spawn(&pid, args[0].c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (failed != 0)
    throw std::runtime_error("posix_spawn " + args[0] + ": " + std::strerror(failed));
  return pid;
}

constexpr auto kRankTimeLimit = std::chrono::seconds(240);

// The wait statuses of `children`; those still running at the time limit
// are killed, and the test fails.
std::vector<int> wait_for_children(const std::vector<pid_t>& children) {
  const auto deadline = std::chrono::steady_clock::now() + kRankTimeLimit;
  std::vector<std::optional<int>> status(children.size());
  std::size_t running = children.size();
  while (running > 0) {
    for (std::size_t r = 0; r < children.size(); ++r) {
      int s = 0;
      if (!status[r].has_value() && waitpid(children[r], &s, WNOHANG) == children[r]) {
        status[r] = s;
        --running;
      }
    }
    if (running > 0 && std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "a process did not finish within " << kRankTimeLimit.count() << " s";
      for (std::size_t r = 0; r < children.size(); ++r) {
        if (status[r].has_value()) continue;
        kill(children[r], SIGKILL);
        int s = 0;
        waitpid(children[r], &s, 0);
        status[r] = s;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<int> result;
  for (const auto& s : status) result.push_back(*s);
  return result;
}

bool exited_cleanly(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// This binary, by its real path, and the filter that runs only this test.
std::vector<std::string> this_test_command() {
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0)
    throw std::runtime_error("readlink /proc/self/exe failed");
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return {self, std::string("--gtest_filter=") + test->test_suite_name() + "." + test->name()};
}

// Runs this test in `world` processes of this binary, one per rank, each
// one's output in FOLDER/rankR.log; returns their wait statuses
// (wait_for_children's).
std::vector<int> run_ranks_to_the_end(int world, const std::string& folder,
                                      const std::vector<std::string>& more_environment = {}) {
  std::vector<pid_t> children;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> environment{"SPILLWAY_DP_TEST_RANK=" + std::to_string(rank),
                                         "SPILLWAY_DP_TEST_WORLD=" + std::to_string(world),
                                         "SPILLWAY_DP_TEST_FOLDER=" + folder, "OMP_NUM_THREADS=1"};
    environment.insert(environment.end(), more_environment.begin(), more_environment.end());
    children.push_back(spawn_logged(this_test_command(), environment,
                                    folder + "/rank" + std::to_string(rank) + ".log"));
  }
  return wait_for_children(children);
}

// Runs this test in `world` processes of this binary, one per rank, and
// fails the test, with each failing rank's output, unless all pass within
// the time limit. `killed_rank` is expected to die of SIGKILL instead.
void run_ranks(int world, const std::string& folder, int killed_rank = -1,
               const std::vector<std::string>& more_environment = {}) {
  const std::vector<int> status = run_ranks_to_the_end(world, folder, more_environment);
  for (int r = 0; r < world; ++r) {
    if (r == killed_rank) {
      EXPECT_TRUE(WIFSIGNALED(status[r]) && WTERMSIG(status[r]) == SIGKILL)
          << "rank " << r << " should have been killed";
      continue;
    }
    EXPECT_TRUE(exited_cleanly(status[r]))
        << "rank " << r << " failed; its output:\n"
        << read_file(folder + "/rank" + std::to_string(r) + ".log");
  }
}

// Runs this test under torchrun (--standalone, `world` processes on this
// machine), each rank joining through dist:env; fails the test with
// torchrun's output unless it succeeds within the time limit.
void run_torchrun(int world, const std::string& folder) {
  std::vector<std::string> command{SPILLWAY_TEST_PYTHON,
                                   "-m",
                                   "torch.distributed.run",
                                   "--standalone",
                                   "--nproc-per-node",
                                   std::to_string(world),
                                   "--no-python"};
  for (std::string& part : this_test_command()) command.push_back(std::move(part));
  const std::string log = folder + "/torchrun.log";
  const pid_t torchrun = spawn_logged(
      command, {"SPILLWAY_DP_TEST_TORCHRUN_FOLDER=" + folder, "OMP_NUM_THREADS=1"}, log);
  EXPECT_TRUE(exited_cleanly(wait_for_children({torchrun})[0])) << "torchrun failed:\n"
                                                                << read_file(log);
}

// The oracle: each rank's micro-batches on one model, gradients summed in
// rank order and divided by the world size (what reduce_gradients computes),
// then the optimizer step. With `concatenated`, one backward over every
// rank's micro-batches at once instead (the one-process run).
RunResult oracle(const Scenario& scenario, bool concatenated) {
  // Off the simulated device's budget, where an earlier test of this process
  // activated spillway: the oracle's memory is not what is under test.
  spillway::torch_bridge::HostWorkScope host_memory;
  torch::manual_seed(7);
  Mlp model;
  model.to(scenario.dtype);
  torch::manual_seed(kCriticSeed);
  Mlp critic;
  // spillway's optimizer needs spillway: the oracle runs it too, without a
  // process group.
  if (scenario.optimizer == Optimizer::chunked_adam) {
    use_conf();
    spillway::manage(model);
  }
  auto optimizer = make_optimizer(scenario.optimizer, model.parameters());
  auto critic_optimizer = make_optimizer(Optimizer::sgd_momentum, critic.parameters());
  RunResult result;
  auto train = [&](Mlp& trained, torch::optim::Optimizer& trainer, int step, int batch_offset) {
    const auto params = trained.parameters();
    std::vector<torch::Tensor> sums(params.size());
    std::vector<bool> reached(params.size(), false);
    const int world = scenario.world_at(step);
    for (int rank = 0; rank < world; ++rank) {
      trainer.zero_grad();
      for (int micro = 0; micro < scenario.micro_batches; ++micro) {
        auto [x, y] = batch(step + batch_offset, rank, micro);
        torch::Tensor loss = torch::mse_loss(
            trained.forward(x.to(scenario.dtype), uses_extra(scenario, step, rank, micro)),
            y.to(scenario.dtype));
        if (concatenated) loss = loss / world;
        loss.backward();
      }
      for (std::size_t i = 0; i < params.size(); ++i) {
        const torch::Tensor grad = params[i].grad();
        reached[i] = reached[i] || grad.defined();
        // Summed wide (fp32 for bf16), as the owners sum what they receive.
        const torch::Tensor values =
            (grad.defined() ? grad : torch::zeros_like(params[i]))
                .to(c10::promoteTypes(params[i].scalar_type(), torch::kFloat));
        if (concatenated)
          sums[i] = rank == 0 ? values.clone() : sums[i] + values;
        else if (rank == 0)
          sums[i] = values.clone();
        else
          sums[i].add_(values);
      }
    }
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto param = params[i];
      if (!reached[i]) {
        param.mutable_grad().reset();
        continue;
      }
      param.mutable_grad() = (concatenated ? sums[i] : sums[i].div_(static_cast<double>(world)))
                                 .to(param.scalar_type());
    }
    if (scenario.clip_norm > 0)
      result.clip_norms.push_back(torch::nn::utils::clip_grad_norm_(params, scenario.clip_norm));
    trainer.step();
  };
  for (int step = 0; step < scenario.steps + scenario.resumed_steps; ++step) {
    train(model, *optimizer, step, 0);
    if (scenario.two_models) train(critic, *critic_optimizer, step, kCriticBatches);
  }
  for (const auto& p : model.parameters()) {
    result.params.push_back(p.detach().clone());
    result.states.push_back(state_of(*optimizer, p));
  }
  if (scenario.two_models) {
    for (const auto& p : critic.parameters()) {
      result.params.push_back(p.detach().clone());
      result.states.push_back(state_of(*critic_optimizer, p));
    }
  }
  return result;
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(),
                     static_cast<std::size_t>(a.numel() * a.element_size())) == 0;
}

// Runs `scenario` on its ranks and compares each rank with the oracle:
// every rank holds the oracle's parameters; each parameter's optimizer state
// is on exactly one rank (its owner) and equals the oracle's.
void expect_ranks_match_the_oracle(const Scenario& scenario) {
  if (auto env = scenario.torchrun ? torchrun_rank_environment() : rank_environment()) {
    train_rank(*env, scenario);
    return;
  }
  at::set_num_threads(1);
  TemporaryFolder folder;
  if (scenario.torchrun)
    run_torchrun(scenario.world, folder.path);
  else
    run_ranks(scenario.world, folder.path);
  if (::testing::Test::HasFailure()) return;
  const RunResult expected = oracle(scenario, /*concatenated=*/false);
  const RunResult one_process = oracle(scenario, /*concatenated=*/true);
  std::vector<RunResult> ranks;
  for (int rank = 0; rank < scenario.world; ++rank)
    ranks.push_back(load_result(result_path(folder.path, rank)));

  // Every rank clipped by the oracle's norm, to the bit, and some step did clip.
  for (int rank = 0; rank < scenario.world; ++rank)
    EXPECT_EQ(ranks[rank].clip_norms, expected.clip_norms) << "rank " << rank;
  if (scenario.clip_norm > 0)
    EXPECT_TRUE(std::ranges::any_of(expected.clip_norms, [&](double norm) {
      return norm > scenario.clip_norm;
    })) << "no step was clipped: the test would not tell";

  const auto matches = [&](const torch::Tensor& got, const torch::Tensor& oracle) {
    if (scenario.bit_for_bit()) return same_bits(got, oracle);
    return got.sizes() == oracle.sizes() && torch::allclose(got, oracle, 1.3e-6, 1e-5);
  };
  std::int64_t state_elements_total = 0;
  std::vector<std::int64_t> state_elements(static_cast<std::size_t>(scenario.world), 0);
  for (std::size_t i = 0; i < expected.params.size(); ++i) {
    for (int rank = 0; rank < scenario.world; ++rank)
      EXPECT_TRUE(matches(ranks[rank].params[i], expected.params[i]))
          << "rank " << rank << ", parameter #" << i;
    // torch's default fp32 tolerances; a bf16 model rounds its gradients
    // before the sum, so only the bit-for-bit oracle applies to it.
    if (scenario.dtype == torch::kFloat)
      EXPECT_TRUE(torch::allclose(expected.params[i], one_process.params[i], 1.3e-6, 1e-5))
          << "parameter #" << i << " against one process on the concatenated batch: max |diff| "
          << (expected.params[i] - one_process.params[i]).abs().max().item<double>();
    int holders = 0;
    for (int rank = 0; rank < scenario.world; ++rank) {
      const auto& state = ranks[rank].states[i];
      if (state.empty()) continue;
      ++holders;
      ASSERT_EQ(state.size(), expected.states[i].size()) << "parameter #" << i;
      for (std::size_t s = 0; s < state.size(); ++s) {
        EXPECT_TRUE(matches(state[s], expected.states[i][s]))
            << "rank " << rank << ", parameter #" << i << ", state " << s;
        state_elements[static_cast<std::size_t>(rank)] += state[s].numel();
        state_elements_total += state[s].numel();
      }
    }
    EXPECT_EQ(holders, expected.states[i].empty() ? 0 : 1)
        << "parameter #" << i << ": its optimizer state should be on its owner alone";
  }
  // Each rank holds about 1/N of the state: within one chunk's worth of
  // parameters (2 MiB of fp32 elements, times the state tensors per parameter).
  const std::int64_t slots = scenario.optimizer == Optimizer::sgd_momentum ? 1 : 2;
  const std::int64_t models = scenario.two_models ? 2 : 1;  // one chunk's slack each
  const std::int64_t chunk_elements =
      (std::int64_t{2} << 20) / torch::elementSize(scenario.dtype) * slots * models;
  for (int rank = 0; rank < scenario.world; ++rank)
    EXPECT_LE(std::abs(state_elements[rank] * scenario.world - state_elements_total),
              chunk_elements * scenario.world)
        << "rank " << rank << " holds " << state_elements[rank] << " of " << state_elements_total
        << " state elements";
  // Parameters: replicated, every rank holds every chunk; sharded, each
  // holds its own at step boundaries (together, each chunk once), and
  // between them at most kGatheredGroupsPerModel groups of the others' per
  // model.
  std::vector<ParamBytes> param_bytes(static_cast<std::size_t>(scenario.world));
  std::int64_t owned_in_all = 0;
  for (int rank = 0; rank < scenario.world; ++rank) {
    ParamBytes& held = param_bytes[static_cast<std::size_t>(rank)];
    std::ifstream(param_bytes_path(folder.path, rank)) >> held.total >> held.at_step_boundary >>
        held.after_backward >> held.gathers >> held.gathers_ahead;
    ASSERT_GT(held.total, 0) << "rank " << rank;
    // Replicated, nothing is gathered for an op; sharded, every step's
    // forward gathers at least one group, and where a step gathers more
    // than one, the steps after the first follow its plan, issuing gathers
    // ahead of their use.
    if (scenario.sharded) {
      EXPECT_GE(held.gathers, scenario.steps) << "rank " << rank;
      if (held.gathers >= 2 * scenario.steps) EXPECT_GT(held.gathers_ahead, 0) << "rank " << rank;
      EXPECT_LE(held.gathers_ahead, held.gathers) << "rank " << rank;
    } else {
      EXPECT_EQ(held.gathers, 0) << "rank " << rank;
      EXPECT_EQ(held.gathers_ahead, 0) << "rank " << rank;
    }
    owned_in_all += held.at_step_boundary;
    if (!scenario.sharded) {
      EXPECT_EQ(held.at_step_boundary, held.total) << "rank " << rank;
      continue;
    }
    constexpr std::int64_t kLargestChunk = std::int64_t{3} << 20;  // the wide layer's
    const std::int64_t models = scenario.two_models ? 2 : 1;
    EXPECT_LE(held.at_step_boundary * scenario.world,
              held.total + models * kLargestChunk * scenario.world)
        << "rank " << rank << " holds " << held.at_step_boundary << " of " << held.total
        << " parameter chunk bytes at a step boundary";
    EXPECT_LE(held.after_backward,
              held.at_step_boundary +
                  models *
                      static_cast<std::int64_t>(spillway::torch_bridge::kGatheredGroupsPerModel) *
                      (scenario.world - 1) * kLargestChunk)
        << "rank " << rank;
  }
  if (scenario.sharded)
    EXPECT_EQ(owned_in_all, param_bytes[0].total)
        << "at a step boundary every parameter chunk should be on its owner alone";
  // spillway's optimizer: the state chunks of what other ranks own are never
  // written, so they take no memory.
  if (scenario.optimizer == Optimizer::chunked_adam) {
    for (int rank = 0; rank < scenario.world; ++rank) {
      std::int64_t bytes = 0;
      std::ifstream(state_bytes_path(folder.path, rank)) >> bytes;
      EXPECT_GT(bytes, 0) << "rank " << rank;
      EXPECT_LE(bytes * scenario.world,
                state_elements_total * 4 + chunk_elements * 4 * scenario.world)
          << "rank " << rank << " holds " << bytes << " bytes of state chunks, of "
          << state_elements_total * 4 << " in all";
    }
  }
}

TEST(DataParallel, TwoRanksAdamMatchTheOracleBitForBit) {
  expect_ranks_match_the_oracle({.world = 2, .steps = 3, .optimizer = Optimizer::adam});
}

TEST(DataParallel, TwoRanksBf16AdamMatchTheOracleBitForBit) {
  expect_ranks_match_the_oracle(
      {.world = 2, .steps = 3, .optimizer = Optimizer::adam, .dtype = torch::kBFloat16});
}

TEST(DataParallel, FourRanksSgdWithMomentumMatchTheOracleBitForBit) {
  expect_ranks_match_the_oracle({.world = 4, .steps = 3, .optimizer = Optimizer::sgd_momentum});
}

// The reduction NCCL groups take (Note [Reduce-scatter where the collectives
// run on a GPU]), here over Gloo: bf16 gradients widened to fp32 before they
// travel, flags summed beside them, a layer no rank reaches on step 1.
TEST(DataParallel, TwoRanksReduceScatterMatchTheOracleBitForBit) {
  using spillway::torch_bridge::GradientReduction;
  expect_ranks_match_the_oracle({.world = 2,
                                 .steps = 3,
                                 .optimizer = Optimizer::adam,
                                 .reduction = GradientReduction::reduce_scatter});
}

TEST(DataParallel, TwoRanksBf16ReduceScatterMatchTheOracleBitForBit) {
  using spillway::torch_bridge::GradientReduction;
  expect_ranks_match_the_oracle({.world = 2,
                                 .steps = 3,
                                 .optimizer = Optimizer::adam,
                                 .dtype = torch::kBFloat16,
                                 .reduction = GradientReduction::reduce_scatter});
}

TEST(DataParallel, FourRanksReduceScatterMatchTheOracleWithinRounding) {
  expect_ranks_match_the_oracle(
      {.world = 4,
       .steps = 3,
       .optimizer = Optimizer::sgd_momentum,
       .reduction = spillway::torch_bridge::GradientReduction::reduce_scatter});
}

TEST(DataParallel, TwoRanksChunkedAdamKeepStateOnTheOwnerOnly) {
  expect_ranks_match_the_oracle({.world = 2, .steps = 3, .optimizer = Optimizer::chunked_adam});
}

// Two models with optimizers of their own, trained in turn (actor and
// critic): each reduce_gradients(params) reduces its own model only, after
// its own backward.
TEST(DataParallel, TwoModelsWithTwoOptimizersMatchTheOracle) {
  expect_ranks_match_the_oracle(
      {.world = 2, .steps = 2, .optimizer = Optimizer::adam, .two_models = true});
}

// torchrun starts the ranks; dist:env joins them at the first manage().
TEST(DataParallel, TorchrunRanksJoinThroughDistEnv) {
  expect_ranks_match_the_oracle(
      {.world = 2, .steps = 2, .optimizer = Optimizer::adam, .torchrun = true});
}

// spillway::clip_grad_norm_ clips by the norm of the mean gradient: the
// oracle's torch::nn::utils::clip_grad_norm_ on the mean, to the bit, on
// every rank; the reduction after it reduces nothing again. SGD, not Adam:
// Adam's first steps move a parameter by about lr whatever the size of its
// gradient, so on gradients clipped this small the concatenated batch's
// rounding alone would flip some signs and exceed torch's tolerances.
TEST(DataParallel, ClippingTakesTheNormOfTheMeanGradientOnEveryRank) {
  expect_ranks_match_the_oracle(
      {.world = 3, .steps = 3, .optimizer = Optimizer::sgd_momentum, .clip_norm = 0.05});
}

TEST(DataParallel, GradientAccumulationOverMicroBatchesMatchesTheOracle) {
  expect_ranks_match_the_oracle(
      {.world = 2, .steps = 2, .micro_batches = 2, .optimizer = Optimizer::adam});
}

// --- Sharded parameters (Note [Parameters gathered for their use]) ----------

// Runs `world` ranks of the current test to the end, each expected to fail
// (a nonzero exit), and returns their logs.
std::vector<std::string> logs_of_failed_ranks(int world, const std::string& folder) {
  const std::vector<int> status = run_ranks_to_the_end(world, folder);
  std::vector<std::string> logs;
  for (int rank = 0; rank < world; ++rank) {
    logs.push_back(read_file(folder + "/rank" + std::to_string(rank) + ".log"));
    EXPECT_FALSE(exited_cleanly(status[static_cast<std::size_t>(rank)])) << "rank " << rank << ":\n"
                                                                         << logs.back();
  }
  return logs;
}

// Ranks that use different parameters gather different groups: each rank's
// op fails with an error that names both groups, rather than exchanging
// the bytes of different groups (or hanging). The op hook cannot fail the
// op, so the rank stops with the error (Note [An op never runs on bytes
// that are not resident]).
TEST(DataParallelSharded, RanksThatUseDifferentParametersFailNamingTheGroups) {
  if (auto env = rank_environment()) {
    use_conf(/*dist_env=*/false, /*sharded=*/true);
    torch::manual_seed(7);
    Mlp model;
    spillway::set_process_group(connect(*env));
    spillway::manage(model);  // drops what this rank does not own
    const auto layouts = spillway::torch_bridge::rank_layouts(
        spillway::Runtime::process().chunk_manager(), env->world);
    ASSERT_EQ(layouts.size(), 1u);
    ASSERT_GE(layouts[0].groups.size(), 2u) << "the model should span two chunk groups";
    // Rank r reads a parameter of group r.
    const auto& member = layouts[0].groups[static_cast<std::size_t>(env->rank)].members[0];
    ASSERT_FALSE(member.empty());
    const torch::Tensor read = member.front()->param;
    std::printf("sum %f\n", read.sum().item<double>());
    return;
  }
  at::set_num_threads(1);
  TemporaryFolder folder;
  const std::vector<std::string> logs = logs_of_failed_ranks(2, folder.path);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string& log = logs[static_cast<std::size_t>(rank)];
    EXPECT_THAT(log, ::testing::HasSubstr("every rank must use the same parameters in the same "
                                          "order"))
        << "rank " << rank;
    EXPECT_THAT(log, ::testing::ContainsRegex("rank [01] gathers chunk group [0-9]+ of model"))
        << "rank " << rank;
    EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("sum "))) << "rank " << rank;
  }
}
// An op one rank alone runs on a parameter whose group is present issues
// no collective, so nothing fails at the op; the step boundary compares the
// ranks' uses (Note [Gathers issued ahead of their use]), and every rank
// fails there naming the rank that differs, rather than plan from uses
// that differ.
TEST(DataParallelSharded, RanksWhoseUsesDifferFailAtTheStepNamingTheRank) {
  if (auto env = rank_environment()) {
    use_conf(/*dist_env=*/false, /*sharded=*/true);
    torch::manual_seed(7);
    Mlp model;
    spillway::set_process_group(connect(*env));
    spillway::manage(model);
    torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.05));
    auto [x, y] = batch(0, env->rank, 0);
    const torch::Tensor out = model.forward(x, /*use_extra=*/false);
    // A parameter of a group present (no gather), other than the group of
    // `mix`, the forward's last (a use of the same group again is the same
    // use).
    using spillway::torch_bridge::managed_param_bound_to;
    const std::int32_t last = managed_param_bound_to(model.mix)->shard_group.load();
    torch::Tensor present;
    for (const torch::Tensor& p : model.parameters()) {
      const auto managed = managed_param_bound_to(p);
      const std::int32_t group = managed->shard_group.load();
      if (group >= 0 && group != last && !managed->shard_dropped.load()) present = p;
    }
    ASSERT_TRUE(present.defined()) << "the window should keep a group besides mix's";
    if (env->rank == 1) std::printf("norm %f\n", present.norm().item<double>());
    torch::mse_loss(out, y).backward();
    spillway::reduce_gradients();
    optimizer.step();
    spillway::step();
    std::printf("stepped\n");
    return;
  }
  at::set_num_threads(1);
  TemporaryFolder folder;
  const std::vector<std::string> logs = logs_of_failed_ranks(2, folder.path);
  for (const std::string& log : logs) {
    EXPECT_THAT(log, ::testing::HasSubstr("rank 1 used sharded parameters differently from rank 0"))
        << log;
    EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("stepped"))) << log;
  }
  EXPECT_THAT(logs[1], ::testing::HasSubstr("norm "));
}

// Each rank keeps its own parameter chunks and gathers the others' for each
// op that uses them: the same values, bit for bit, and at step boundaries
// each parameter chunk on its owner alone (expect_ranks_match_the_oracle).

// Twenty-four 1 MiB layers, the first used again last, as a tied
// embedding is: thirteen chunks, seven groups at N = 2, more than the
// window holds.
// A rank's results with no optimizer state: values, then figures.
void save_tensors(const RankEnvironment& env, std::vector<torch::Tensor> tensors) {
  RunResult result;
  result.params = std::move(tensors);
  result.states.resize(result.params.size());
  save_result(result, result_path(env.folder, env.rank));
}

// Runs the test's ranks replicated, then sharded; each rank's results but
// the last `figures` (counts, not values) must be the same bits in both.
// Returns both runs' results by rank, none where a run failed.
struct ReplicatedAndSharded {
  RunResult replicated, sharded;
};
std::vector<ReplicatedAndSharded> sharded_runs_matching_replicated(int world, std::size_t figures) {
  TemporaryFolder replicated, sharded;
  run_ranks(world, replicated.path);
  run_ranks(world, sharded.path, -1, {"SPILLWAY_DP_TEST_SHARDED=1"});
  if (::testing::Test::HasFailure()) return {};
  // Off the simulated device's budget, where an earlier test of this process
  // activated spillway: every rank's results of both runs stay loaded.
  spillway::torch_bridge::HostWorkScope host_memory;
  std::vector<ReplicatedAndSharded> results;
  for (int rank = 0; rank < world; ++rank) {
    RunResult expected = load_result(result_path(replicated.path, rank));
    RunResult got = load_result(result_path(sharded.path, rank));
    EXPECT_EQ(got.params.size(), expected.params.size()) << "rank " << rank;
    if (got.params.size() != expected.params.size()) return {};
    for (std::size_t i = 0; i + figures < got.params.size(); ++i)
      EXPECT_TRUE(same_bits(got.params[i], expected.params[i])) << "rank " << rank << ", #" << i;
    results.push_back({std::move(expected), std::move(got)});
  }
  return results;
}

struct TiedDeep : torch::nn::Module {
  static constexpr int kLayers = 24;
  TiedDeep() {
    for (int i = 0; i < kLayers; ++i)
      layers.push_back(
          register_module("layer" + std::to_string(i), torch::nn::Linear(kHidden, kHidden)));
  }
  // `observe` runs after each layer.
  torch::Tensor forward(torch::Tensor x, const std::function<void()>& observe) {
    for (auto& layer : layers) {
      x = torch::tanh(layer(x));
      observe();
    }
    x = layers.front()(x);
    observe();
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};

// A rank of the TiedDeep tests: the model, managed with sharded parameters
// where the run is the sharded one, and SGD with momentum over it.
struct TiedDeepRank {
  explicit TiedDeepRank(const RankEnvironment& env) : seeded(configure()) {
    spillway::set_process_group(connect(env));
    spillway::manage(model);
    optimizer.emplace(model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  static bool configure() {
    use_conf(/*dist_env=*/false, /*sharded=*/std::getenv("SPILLWAY_DP_TEST_SHARDED") != nullptr);
    torch::manual_seed(7);
    return true;
  }
  bool seeded;  // first: the model's values come from the seed
  TiedDeep model;
  std::optional<torch::optim::SGD> optimizer;
};

// Through many groups, each rank holds its own chunks and at most
// kGatheredGroupsPerModel groups of the others' (the window), and a group used again after it was
// dropped is gathered again: the same values, bit for bit, as with
// replicated parameters, whose training matches the oracle above; and so
// are the values unmanage() hands back.
TEST(DataParallelSharded, ManyGroupsAndATiedLayerTrainAsReplicatedWithinTheWindow) {
  constexpr int kWorld = 2;
  if (auto env = rank_environment()) {
    TiedDeepRank rank(*env);
    TiedDeep& model = rank.model;
    torch::optim::SGD& optimizer = *rank.optimizer;
    std::int64_t most = 0;
    std::int64_t at_boundary = 0;
    const auto observe = [&] {
      most = std::max(most, chunk_bytes({spillway::TensorKind::param}, /*materialized=*/true));
    };
    std::vector<std::int64_t> gathers;  // per step, then those issued ahead in all
    for (int step = 0; step < 4; ++step) {
      const std::int64_t before = spillway::data_parallel_traffic().parameter_gathers;
      optimizer.zero_grad();
      const torch::Tensor x =
          batch(step, env->rank, 0).first.narrow(1, 0, 1).expand({kBatch, kHidden});
      model.forward(x * 0.1, observe).square().mean().backward();
      observe();
      spillway::reduce_gradients();
      optimizer.step();
      spillway::step();
      at_boundary = std::max(at_boundary, chunk_bytes({spillway::TensorKind::param}, true));
      gathers.push_back(spillway::data_parallel_traffic().parameter_gathers - before);
    }
    gathers.push_back(spillway::data_parallel_traffic().parameter_gathers_ahead);
    const std::int64_t total = chunk_bytes({spillway::TensorKind::param}, false);
    // Unmanaged, each parameter takes its values along: gathered first
    // where this rank dropped them.
    spillway::unmanage(model.parameters());
    std::vector<torch::Tensor> results;
    for (const auto& p : model.parameters()) {
      EXPECT_FALSE(spillway::is_managed(p));
      results.push_back(p.detach().clone());
    }
    results.push_back(torch::tensor(gathers));
    results.push_back(torch::tensor({most, at_boundary, total}));
    save_tensors(*env, std::move(results));
    return;
  }
  at::set_num_threads(1);
  // The values and those unmanage() hands back; then the figures.
  const std::vector<ReplicatedAndSharded> runs = sharded_runs_matching_replicated(kWorld, 2);
  for (int rank = 0; rank < static_cast<int>(runs.size()); ++rank) {
    const RunResult& expected = runs[static_cast<std::size_t>(rank)].replicated;
    const RunResult& got = runs[static_cast<std::size_t>(rank)].sharded;
    // The first step gathers on demand, through the window; the others
    // follow its plan (Note [Gathers issued ahead of their use]), which
    // gathers no more often, issuing gathers ahead of their use.
    const torch::Tensor gathers = got.params[got.params.size() - 2];
    const std::int64_t steps = gathers.numel() - 1;
    for (std::int64_t step = 1; step < steps; ++step) {
      EXPECT_LE(gathers[step].item<std::int64_t>(), gathers[0].item<std::int64_t>())
          << "rank " << rank << ", step " << step;
      EXPECT_EQ(gathers[step].item<std::int64_t>(), gathers[1].item<std::int64_t>())
          << "rank " << rank << ", step " << step << ": the same plan each step";
    }
    EXPECT_GE(gathers[steps].item<std::int64_t>(), steps - 1) << "rank " << rank;
    const torch::Tensor held = got.params.back();
    const std::int64_t most = held[0].item<std::int64_t>();
    const std::int64_t at_boundary = held[1].item<std::int64_t>();
    const std::int64_t total = held[2].item<std::int64_t>();
    constexpr std::int64_t kChunk = std::int64_t{2} << 20;
    EXPECT_LE(at_boundary, total / kWorld + kChunk) << "rank " << rank;
    // Its own chunks and the window's groups of the other rank's, one chunk each.
    constexpr auto kWindow =
        static_cast<std::int64_t>(spillway::torch_bridge::kGatheredGroupsPerModel);
    EXPECT_LE(most, at_boundary + kWindow * (kWorld - 1) * kChunk) << "rank " << rank;
    EXPECT_LT(most, total) << "rank " << rank << " held every parameter chunk at once";
    EXPECT_EQ(expected.params.back()[1].item<std::int64_t>(), total)
        << "replicated, rank " << rank << " should hold every parameter chunk";
  }
}

// A loop that evaluates every other step (a no_grad forward, no step mark)
// makes intervals of two kinds that begin alike: the training step alone,
// and the eval's forward with the next training step. Each kind's step
// follows the other's plan through the forward and switches to its own
// (Note [Steps that begin alike and part later] in gather_plan.cc), so
// from the third step on each step gathers no more than its kind's first
// and issues its gathers ahead, as a loop of one kind does; the values and
// the evals' outputs are the replicated run's, bit for bit.
TEST(DataParallelSharded, AnEvalEveryOtherStepIsPlannedLikeTheTrainingSteps) {
  constexpr int kWorld = 2;
  constexpr int kSteps = 8;
  if (auto env = rank_environment()) {
    TiedDeepRank rank(*env);
    TiedDeep& model = rank.model;
    torch::optim::SGD& optimizer = *rank.optimizer;
    std::vector<std::int64_t> gathers, ahead;  // per step, the eval before it included
    std::vector<torch::Tensor> evals;
    const auto nothing = [] {};
    for (int step = 0; step < kSteps; ++step) {
      const spillway::DataParallelTraffic before = spillway::data_parallel_traffic();
      const torch::Tensor x =
          batch(step, env->rank, 0).first.narrow(1, 0, 1).expand({kBatch, kHidden});
      if (step % 2 == 1) {
        torch::NoGradGuard no_grad;
        evals.push_back(model.forward(x * 0.2, nothing).sum().reshape({1}));
      }
      optimizer.zero_grad();
      model.forward(x * 0.1, nothing).square().mean().backward();
      spillway::reduce_gradients();
      optimizer.step();
      spillway::step();
      const spillway::DataParallelTraffic after = spillway::data_parallel_traffic();
      gathers.push_back(after.parameter_gathers - before.parameter_gathers);
      ahead.push_back(after.parameter_gathers_ahead - before.parameter_gathers_ahead);
    }
    spillway::unmanage(model.parameters());
    std::vector<torch::Tensor> results;
    for (const auto& p : model.parameters()) results.push_back(p.detach().clone());
    results.push_back(torch::cat(evals));
    results.push_back(torch::tensor(gathers));
    results.push_back(torch::tensor(ahead));
    save_tensors(*env, std::move(results));
    return;
  }
  at::set_num_threads(1);
  // The values, then the evals' outputs; then the figures.
  const std::vector<ReplicatedAndSharded> runs = sharded_runs_matching_replicated(kWorld, 2);
  for (int rank = 0; rank < static_cast<int>(runs.size()); ++rank) {
    const RunResult& got = runs[static_cast<std::size_t>(rank)].sharded;
    const torch::Tensor gathers = got.params[got.params.size() - 2];
    const torch::Tensor ahead = got.params.back();
    for (std::int64_t step = 2; step < kSteps; ++step) {
      const std::int64_t kind_first = step % 2;
      EXPECT_LE(gathers[step].item<std::int64_t>(), gathers[kind_first].item<std::int64_t>())
          << "rank " << rank << ", step " << step;
      // All but the step's first gather (nothing issues it ahead) and the
      // one at the switch (what the other plan dropped is gathered at its use).
      EXPECT_GE(ahead[step].item<std::int64_t>(), gathers[step].item<std::int64_t>() - 2)
          << "rank " << rank << ", step " << step << " of " << gathers[step].item<std::int64_t>()
          << " gathers";
    }
  }
}

TEST(DataParallelSharded, TwoRanksAdamMatchTheOracleBitForBit) {
  expect_ranks_match_the_oracle(
      {.world = 2, .steps = 4, .optimizer = Optimizer::adam, .sharded = true});
}

TEST(DataParallelSharded, FourRanksSgdWithMomentumMatchTheOracleBitForBit) {
  expect_ranks_match_the_oracle(
      {.world = 4, .steps = 3, .optimizer = Optimizer::sgd_momentum, .sharded = true});
}

TEST(DataParallelSharded, TwoRanksBf16ChunkedAdamMatchTheOracleBitForBit) {
  expect_ranks_match_the_oracle({.world = 2,
                                 .steps = 3,
                                 .optimizer = Optimizer::chunked_adam,
                                 .dtype = torch::kBFloat16,
                                 .sharded = true});
}

TEST(DataParallelSharded, GradientAccumulationAndClippingMatchTheOracle) {
  expect_ranks_match_the_oracle({.world = 3,
                                 .steps = 2,
                                 .micro_batches = 2,
                                 .optimizer = Optimizer::sgd_momentum,
                                 .clip_norm = 0.05,
                                 .sharded = true});
}

TEST(DataParallelSharded, TwoModelsWithTwoOptimizersMatchTheOracle) {
  expect_ranks_match_the_oracle(
      {.world = 2, .steps = 2, .optimizer = Optimizer::adam, .two_models = true, .sharded = true});
}

// Elementwise ops only (LibTorch's CPU kernels have no fp16 matmul). Each
// parameter is 1.5 MiB of fp16, so each fills a chunk of its own: with two
// ranks, rank 0 owns the weight and rank 1 the bias.
struct Elementwise : torch::nn::Module {
  static constexpr std::int64_t kSize = 3 << 18;
  Elementwise() {
    weight = register_parameter("weight", torch::full({kSize}, 0.5));
    bias = register_parameter("bias", torch::zeros({kSize}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x * weight + bias; }
  torch::Tensor weight, bias;
};

// Tests that run with replicated parameters and with sharded ones (Note
// [Parameters gathered for their use]): the parameter is whether sharded.
class DataParallelModes : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(, DataParallelModes, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Sharded" : "Replicated";
                         });

// The engine with gradient_accumulation_steps 2 on two ranks: its backward
// runs inside NoSync but at the window's last micro-batch (Note [Reducing
// while backward runs]), so each window is reduced once, and the ranks end
// bit for bit where one process ends that sums each rank's scaled
// micro-batches, then the ranks in order, and divides by 2. Without NoSync
// the second micro-batch's backward would throw.
TEST_P(DataParallelModes, TheEnginesAccumulationReducesOncePerWindow) {
  constexpr int kWorld = 2;
  constexpr int kSteps = 2;
  constexpr int kMicroBatches = 2;
  const auto input = [](int step, int rank, int micro) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(100 * step + 10 * micro + rank);
    return at::randn({Elementwise::kSize}, generator);
  };
  const auto loss_of = [](Elementwise& model, const torch::Tensor& x) {
    return (model.forward(x) - 0.25).pow(2).sum();
  };
  if (auto env = rank_environment()) {
    use_conf(/*dist_env=*/false, /*sharded=*/GetParam());
    spillway::set_process_group(connect(*env));
    auto engine = spillway::initialize(std::make_shared<Elementwise>(), R"({
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        "gradient_accumulation_steps": 2})");
    for (int step = 0; step < kSteps; ++step)
      for (int micro = 0; micro < kMicroBatches; ++micro) {
        engine.backward(loss_of(*engine.module(), input(step, env->rank, micro)));
        engine.step();
      }
    torch::save(std::vector<torch::Tensor>{engine.module()->weight.detach().clone(),
                                           engine.module()->bias.detach().clone()},
                result_path(env->folder, env->rank));
    return;
  }
  TemporaryFolder folder;
  run_ranks(kWorld, folder.path);
  if (::testing::Test::HasFailure()) return;

  Elementwise oracle;
  std::vector<torch::Tensor> params{oracle.weight, oracle.bias};
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.01));
  for (int step = 0; step < kSteps; ++step) {
    std::vector<torch::Tensor> sums(params.size());
    for (int rank = 0; rank < kWorld; ++rank) {
      optimizer.zero_grad();
      for (int micro = 0; micro < kMicroBatches; ++micro)  // scaled as the engine scales
        (loss_of(oracle, input(step, rank, micro)).to(torch::kFloat) * (1.0 / kMicroBatches))
            .backward();
      for (std::size_t i = 0; i < params.size(); ++i)
        sums[i] = rank == 0 ? params[i].grad().clone() : sums[i].add_(params[i].grad());
    }
    for (std::size_t i = 0; i < params.size(); ++i)
      params[i].mutable_grad() = sums[i].div_(static_cast<double>(kWorld));
    optimizer.step();
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    std::vector<torch::Tensor> got;
    torch::load(got, result_path(folder.path, rank));
    ASSERT_EQ(got.size(), params.size());
    for (std::size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(same_bits(got[i], params[i].detach())) << "rank " << rank << ", parameter " << i;
  }
}

// The engine under fp16 with clipping, on two ranks: at step 1 rank 1's
// batch overflows its gradients while rank 0's stay finite. The loss scaler
// must skip that step on both ranks, and the norm each rank clips by must
// be the same (the mean gradient's), so the ranks stay identical.
TEST_P(DataParallelModes, AnFp16OverflowOnOneRankSkipsTheStepOnEveryRank) {
  constexpr int kSteps = 4;
  constexpr int kOverflowStep = 1;
  if (auto env = rank_environment()) {
    use_conf(/*dist_env=*/false, /*sharded=*/GetParam());
    spillway::set_process_group(connect(*env));
    auto engine = spillway::initialize(std::make_shared<Elementwise>(), R"({
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}}, "gradient_clipping": 1.0,
        "fp16": {"enabled": true, "initial_scale_power": 4, "hysteresis": 1}})");
    std::vector<double> applied, scales, norms;
    for (int step = 0; step < kSteps; ++step) {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(10 * step + env->rank);
      torch::Tensor x = at::randn({Elementwise::kSize}, generator);
      // Large inputs: the weight's gradient, about x^2 times the scale 16,
      // is past fp16's 65504.
      if (step == kOverflowStep && env->rank == 1) x.narrow(0, 0, 64).fill_(300);
      x = x.to(torch::kHalf);
      // The overflow step's gradients stay on their ranks for the check
      // below; the engine's step() reduces them then.
      std::optional<spillway::NoSync> local;
      if (step == kOverflowStep) local.emplace();
      engine.backward((engine.forward(x).to(torch::kFloat) - 0.25).pow(2).sum());
      local.reset();
      if (step == kOverflowStep) {
        bool finite = true;
        for (const auto& p : engine.module()->parameters())
          finite = finite && torch::isfinite(p.grad()).all().item<bool>();
        EXPECT_EQ(finite, env->rank == 0) << "the overflow should be on rank 1 only";
      }
      applied.push_back(engine.step() ? 1 : 0);
      scales.push_back(engine.loss_scale());
      norms.push_back(engine.last_gradient_norm());
    }
    torch::save(
        std::vector<torch::Tensor>{torch::tensor(applied), torch::tensor(scales),
                                   torch::tensor(norms), engine.module()->weight.detach().clone(),
                                   engine.module()->bias.detach().clone()},
        result_path(env->folder, env->rank));
    return;
  }
  TemporaryFolder folder;
  run_ranks(2, folder.path);
  if (::testing::Test::HasFailure()) return;
  std::vector<std::vector<torch::Tensor>> ranks(2);
  for (int rank = 0; rank < 2; ++rank) torch::load(ranks[rank], result_path(folder.path, rank));
  const auto applied = ranks[0][0];
  for (int step = 0; step < kSteps; ++step)
    EXPECT_EQ(applied[step].item<double>(), step == kOverflowStep ? 0 : 1) << "step " << step;
  EXPECT_LT(ranks[0][1][kOverflowStep].item<double>(), ranks[0][1][0].item<double>())
      << "the overflow should have lowered the loss scale";
  for (std::size_t i = 0; i < ranks[0].size(); ++i)
    EXPECT_TRUE(same_bits(ranks[1][i], ranks[0][i]))
        << "rank 1 differs from rank 0 in result #" << i
        << " (applied steps, scales, norms, weight, bias)";
}

// A rank that manages a model of another shape: every rank's manage() fails
// with an error that names the first parameter that differs.
TEST(DataParallel, RanksWithDifferentModelsAreRefusedNamingTheParameter) {
  if (auto env = rank_environment()) {
    use_conf();
    torch::manual_seed(7);
    spillway::set_process_group(connect(*env));
    torch::nn::Sequential model(torch::nn::Linear(64, 64),
                                torch::nn::Linear(64, env->rank == 0 ? 32 : 48));
    try {
      spillway::manage(*model);
      ADD_FAILURE() << "manage() should have refused the differing layouts";
    } catch (const std::runtime_error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("parameter #2"), std::string::npos) << message;
      EXPECT_NE(message.find("'1.weight'"), std::string::npos) << message;
      EXPECT_NE(message.find(env->rank == 0 ? "[32, 64]" : "[48, 64]"), std::string::npos)
          << message;
    }
    return;
  }
  TemporaryFolder folder;
  run_ranks(2, folder.path);
}

// A rank killed mid-step: the others' next collective fails within seconds
// (not Gloo's 60 s timeout) with an error that names the rank gone missing.
TEST_P(DataParallelModes, ARankKilledMidStepIsNamedByTheOthers) {
  constexpr int kKilled = 2;
  if (auto env = rank_environment()) {
    use_conf(/*dist_env=*/false, /*sharded=*/GetParam());
    torch::manual_seed(7);
    Mlp model;
    spillway::set_process_group(connect(*env));
    spillway::manage(model);
    torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.01));
    for (int step = 0; step < 2; ++step) {
      optimizer.zero_grad();
      auto [x, y] = batch(step, env->rank, 0);
      torch::mse_loss(model.forward(x, false), y).backward();
      if (step == 1 && env->rank == kKilled) raise(SIGKILL);
      const auto start = std::chrono::steady_clock::now();
      try {
        spillway::reduce_gradients();
      } catch (const std::runtime_error& e) {
        EXPECT_EQ(step, 1) << e.what();
        const std::string message = e.what();
        EXPECT_NE(message.find("rank 2 never reached it"), std::string::npos) << message;
        EXPECT_NE(message.find("failed on rank " + std::to_string(env->rank) + " of 3"),
                  std::string::npos)
            << message;
        EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30)) << message;
        return;
      }
      optimizer.step();
      spillway::step();
    }
    ADD_FAILURE() << "reduce_gradients went on without rank " << kKilled;
    return;
  }
  TemporaryFolder folder;
  run_ranks(3, folder.path, kKilled);
}

// Ranks that initialise differently train from the owners' values: after
// manage(), every rank holds, for each parameter, what its owner had, and
// keeps it when the group goes (sharded: gathered before it goes).
TEST_P(DataParallelModes, ManageGivesEveryRankTheOwnersValues) {
  if (auto env = rank_environment()) {
    use_conf(/*dist_env=*/false, /*sharded=*/GetParam());
    torch::manual_seed(100 + env->rank);
    Mlp model;
    RunResult before;
    for (const auto& p : model.parameters()) before.params.push_back(p.detach().clone());
    before.states.resize(before.params.size());
    save_result(before, env->folder + "/before" + std::to_string(env->rank) + ".pt");
    spillway::set_process_group(connect(*env));
    spillway::manage(model);
    // Leaving data parallel: with sharded parameters, what this rank
    // dropped comes back first, so the copies below need no group.
    spillway::set_process_group(nullptr);
    RunResult after;
    for (const auto& p : model.parameters()) after.params.push_back(p.detach().clone());
    after.states.resize(after.params.size());
    save_result(after, result_path(env->folder, env->rank));
    return;
  }
  constexpr int kWorld = 3;
  TemporaryFolder folder;
  run_ranks(kWorld, folder.path);
  if (::testing::Test::HasFailure()) return;
  std::vector<RunResult> before, after;
  for (int rank = 0; rank < kWorld; ++rank) {
    before.push_back(load_result(folder.path + "/before" + std::to_string(rank) + ".pt"));
    after.push_back(load_result(result_path(folder.path, rank)));
  }
  std::vector<int> owned(kWorld, 0);
  for (std::size_t i = 0; i < after[0].params.size(); ++i) {
    int owner = -1;
    for (int rank = 0; rank < kWorld; ++rank)
      if (same_bits(after[0].params[i], before[rank].params[i])) owner = rank;
    ASSERT_NE(owner, -1) << "parameter #" << i << " holds no rank's initial values";
    ++owned[owner];
    for (int rank = 1; rank < kWorld; ++rank)
      EXPECT_TRUE(same_bits(after[rank].params[i], after[0].params[i]))
          << "rank " << rank << ", parameter #" << i;
  }
  for (int rank = 0; rank < kWorld; ++rank)
    EXPECT_GT(owned[rank], 0) << "rank " << rank << " owns no parameter";
}

// Note [What no optimizer steps comes from rank 0]: batch norm's running
// statistics, updated by each rank's own micro-batch, are rank 0's on every
// rank after step(), as DDP's broadcast makes them; a frozen parameter that
// one rank changed is rank 0's again; the trained parameters still agree.
// Parameters come first in the layout, buffers after them: with 2 MiB chunks
// the frozen layer lands in chunk 1 and the buffers in chunk 2, owned by
// ranks 1 and 2 of three, so rank 0's values are not their owners'.
struct NormedMlp : torch::nn::Module {
  NormedMlp() {
    input = register_module("input", torch::nn::Linear(kIn, kHidden));
    hidden = register_module("hidden", torch::nn::Linear(kHidden, kHidden));
    frozen = register_module("frozen", torch::nn::Linear(kHidden, kHidden));
    last = register_module("last", torch::nn::Linear(kHidden, kHidden));
    norm = register_module("norm", torch::nn::BatchNorm1d(kHidden));
    head = register_module("head", torch::nn::Linear(kHidden, kOut));
    for (auto& p : frozen->parameters()) p.set_requires_grad(false);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(hidden(torch::relu(input(x))));
    return head(norm(torch::relu(last(torch::relu(frozen(x))))));
  }
  torch::nn::Linear input{nullptr}, hidden{nullptr}, frozen{nullptr}, last{nullptr}, head{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};

TEST_P(DataParallelModes, BuffersAndFrozenParametersTakeRankZerosValues) {
  constexpr int kWorld = 3;
  if (auto env = rank_environment()) {
    use_conf(/*dist_env=*/false, /*sharded=*/GetParam());
    torch::manual_seed(7);
    NormedMlp model;
    spillway::set_process_group(connect(*env));
    spillway::manage(model);
    torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.01));
    RunResult before, after;
    for (int step = 0; step < 2; ++step) {
      optimizer.zero_grad();
      const auto [x, y] = batch(step, env->rank, 0);
      torch::mse_loss(model.forward(x), y).backward();
      if (step == 1 && env->rank != 0) {
        torch::NoGradGuard no_grad;
        model.frozen->bias.add_(1.0);  // no optimizer would: rank 0's undoes it
      }
      if (step == 1)
        for (const auto& b : model.buffers()) before.params.push_back(b.detach().clone());
      spillway::reduce_gradients();
      optimizer.step();
      spillway::step();
    }
    // Frozen once trained: from the next step on, rank 0's values. With
    // sharded parameters its bytes were dropped on all ranks but its owner,
    // so that step gathers them before it broadcasts rank 0's.
    for (auto& p : model.last->parameters()) p.set_requires_grad(false);
    spillway::step();
    for (const auto& b : model.buffers()) after.params.push_back(b.detach().clone());
    for (const auto& p : model.parameters()) after.params.push_back(p.detach().clone());
    before.states.resize(before.params.size());
    after.states.resize(after.params.size());
    save_result(before, env->folder + "/before" + std::to_string(env->rank) + ".pt");
    save_result(after, result_path(env->folder, env->rank));
    return;
  }
  TemporaryFolder folder;
  run_ranks(kWorld, folder.path);
  if (::testing::Test::HasFailure()) return;
  std::vector<RunResult> before, after;
  for (int rank = 0; rank < kWorld; ++rank) {
    before.push_back(load_result(folder.path + "/before" + std::to_string(rank) + ".pt"));
    after.push_back(load_result(result_path(folder.path, rank)));
  }
  const std::size_t buffers = before[0].params.size();
  ASSERT_EQ(buffers, 3u);  // running mean, running variance, batches tracked
  EXPECT_FALSE(same_bits(before[1].params[0], before[0].params[0]))
      << "the ranks' running means should differ before the step";
  for (int rank = 0; rank < kWorld; ++rank) {
    for (std::size_t i = 0; i < buffers; ++i)
      EXPECT_TRUE(same_bits(after[rank].params[i], before[0].params[i]))
          << "rank " << rank << ", buffer #" << i << " is not rank 0's";
    for (std::size_t i = buffers; i < after[0].params.size(); ++i) {
      EXPECT_TRUE(same_bits(after[rank].params[i], after[0].params[i]))
          << "rank " << rank << ", parameter #" << i - buffers;
      EXPECT_TRUE(after[rank].params[i].ne(0).any().item<bool>())
          << "rank " << rank << ", parameter #" << i - buffers << " is all zeros";
    }
  }
}

}  // namespace

// Six parameters of 2 MiB of fp32 each (one chunk each; in bf16, two to a
// chunk): with 3 ranks, full groups, so each step's reduction and gathering
// must move the minimum, 2(N-1)/N of the parameter bytes plus as much of the
// gradient bytes, and no more than the flags and the layout checks beside
// them (Note [Counting what the collectives move]).
struct ChunkSizedParams : torch::nn::Module {
  static constexpr std::int64_t kCount = 6;
  static constexpr std::int64_t kElements = std::int64_t{512} << 10;
  ChunkSizedParams() {
    for (std::int64_t i = 0; i < kCount; ++i)
      params.push_back(register_parameter("p" + std::to_string(i), torch::randn({512, 1024})));
  }
  torch::Tensor loss(double scale) {
    torch::Tensor total = torch::zeros({});
    for (const auto& p : params) total = total + (p * scale).square().sum();
    return total;
  }
  std::vector<torch::Tensor> params;
};

void expect_a_step_to_move_the_minimum_bytes_plus_flags(torch::Dtype dtype) {
  constexpr int kWorld = 3;
  constexpr std::int64_t kSteps = 2;
  if (auto env = rank_environment()) {
    use_conf();
    torch::manual_seed(7);
    ChunkSizedParams model;
    model.to(dtype);
    spillway::set_process_group(connect(*env));
    spillway::manage(model);
    torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.01));
    const spillway::DataParallelTraffic before = spillway::data_parallel_traffic();
    for (std::int64_t step = 0; step < kSteps; ++step) {
      optimizer.zero_grad();
      model.loss(1.0 + env->rank).backward();
      spillway::reduce_gradients();
      optimizer.step();
      spillway::step();
    }
    const spillway::DataParallelTraffic after = spillway::data_parallel_traffic();
    std::ofstream(env->folder + "/traffic" + std::to_string(env->rank))
        << (after.bytes_sent - before.bytes_sent) << " "
        << (after.bytes_received - before.bytes_received);
    return;
  }
  TemporaryFolder folder;
  run_ranks(kWorld, folder.path);
  if (::testing::Test::HasFailure()) return;
  // Each way, per step: (N-1)/N of the parameters and of the gradients, in
  // the model's dtype.
  const std::int64_t model_bytes = ChunkSizedParams::kCount * ChunkSizedParams::kElements *
                                   static_cast<std::int64_t>(torch::elementSize(dtype));
  const std::int64_t minimum = 2 * model_bytes * (kWorld - 1) / kWorld;
  std::int64_t all_sent = 0, all_received = 0;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::int64_t sent = 0, received = 0;
    std::ifstream(folder.path + "/traffic" + std::to_string(rank)) >> sent >> received;
    for (const std::int64_t moved : {sent, received}) {
      EXPECT_GE(moved, kSteps * minimum) << "rank " << rank;
      EXPECT_LE(moved, kSteps * (minimum + 1024)) << "rank " << rank;
    }
    all_sent += sent;
    all_received += received;
  }
  EXPECT_EQ(all_sent, all_received) << "what the ranks sent, they received";
}

TEST(DataParallel, AStepMovesTheMinimumBytesPlusFlags) {
  expect_a_step_to_move_the_minimum_bytes_plus_flags(torch::kFloat);
}

// bf16 gradients travel as bf16: half the bytes of fp32 (Note [Gradients
// travel in their own dtype]).
TEST(DataParallel, ABf16StepMovesTheMinimumBytesPlusFlags) {
  expect_a_step_to_move_the_minimum_bytes_plus_flags(torch::kBFloat16);
}

// Note [Reducing while backward runs]: ChunkSizedParams' backward writes
// p5's gradient first and p0's last, and with two ranks its chunk groups are
// {p0, p1}, {p2, p3}, {p4, p5}. By the time p0's gradient is computed, the
// last group has been reduced (the owner holds the mean, the other rank no
// gradient) and the middle one is under way: the reduction ran during
// backward, not after it. After backward nothing is left to reduce.
TEST(DataParallel, GroupsAreReducedWhileBackwardRuns) {
  constexpr int kWorld = 2;
  if (auto env = rank_environment()) {
    use_conf();
    torch::manual_seed(7);
    ChunkSizedParams model;
    spillway::set_process_group(connect(*env));
    spillway::manage(model);
    const std::vector<torch::Tensor>& p = model.params;
    const int owner_of_p4 = spillway::data_parallel_owners({p[4]})[0];
    ASSERT_EQ(owner_of_p4, 0);
    ASSERT_EQ(spillway::data_parallel_owners({p[5]})[0], 1);
    const std::int64_t before = spillway::data_parallel_traffic().collectives;
    std::int64_t collectives_at_p0 = 0;
    std::vector<bool> grad_at_p0;
    torch::Tensor owned_last_group_grad;
    p[0].register_hook([&](torch::Tensor grad) {
      collectives_at_p0 = spillway::data_parallel_traffic().collectives - before;
      for (const auto& param : p) grad_at_p0.push_back(param.grad().defined());
      owned_last_group_grad = p[4 + env->rank].grad().detach().clone();
      return grad;
    });
    model.loss(1.0 + env->rank).backward();
    // Comparing layouts, then the groups {p4, p5} and {p2, p3}.
    EXPECT_GE(collectives_at_p0, 3);
    ASSERT_EQ(grad_at_p0.size(), 6U);
    EXPECT_FALSE(grad_at_p0[5 - env->rank]) << "the other rank's gradient of the last group";
    EXPECT_TRUE(grad_at_p0[4 + env->rank]);
    // d/dp (p s)^2 = 2 s^2 p, and the mean of s^2 over s = 1, 2 is 2.5.
    ASSERT_TRUE(owned_last_group_grad.defined());
    EXPECT_TRUE(torch::allclose(owned_last_group_grad, 5 * p[4 + env->rank].detach()));
    for (int i = 0; i < 6; ++i)
      EXPECT_EQ(p[static_cast<std::size_t>(i)].grad().defined(), i % 2 == env->rank)
          << "p" << i << " after backward";
    const std::int64_t sent = spillway::data_parallel_traffic().bytes_sent;
    spillway::reduce_gradients();
    EXPECT_LT(spillway::data_parallel_traffic().bytes_sent - sent, 1024)
        << "reduce_gradients() after backward should move no gradient";
    return;
  }
  TemporaryFolder folder;
  run_ranks(kWorld, folder.path);
}

// Two models managed in turn on a rank: the actor (client #0), then the
// critic (client #1).
struct ActorAndCritic {
  explicit ActorAndCritic(const RankEnvironment& env) {
    use_conf();
    torch::manual_seed(7);
    actor = std::make_unique<ChunkSizedParams>();
    critic = std::make_unique<ChunkSizedParams>();
    spillway::set_process_group(connect(env));
    spillway::manage(*actor);
    spillway::manage(*critic);
  }
  std::unique_ptr<ChunkSizedParams> actor, critic;
};

// Note [Reducing while backward runs]: which gradients a backward writes is
// known when it starts. Two models, the critic added after the actor; a
// backward of the critic's loss alone, which on rank 1 leaves out p5. The
// actor, which this backward does not reach, does not hold the critic
// back, nor does p5 hold back its group {p4, p5} on rank 1: that group is
// reduced before the critic's p0 gets its gradient, and p5's owner (rank
// 1) holds rank 0's gradient over two (rank 1 sent none).
TEST(DataParallel, WhatABackwardDoesNotReachHoldsNothingBack) {
  constexpr int kWorld = 2;
  if (auto env = rank_environment()) {
    ActorAndCritic models(*env);
    ChunkSizedParams& actor = *models.actor;
    ChunkSizedParams& critic = *models.critic;
    const std::vector<torch::Tensor>& p = critic.params;
    std::vector<bool> grad_at_p0;
    torch::Tensor p5_grad_at_p0;
    p[0].register_hook([&](torch::Tensor grad) {
      for (const auto& param : p) grad_at_p0.push_back(param.grad().defined());
      if (p[5].grad().defined()) p5_grad_at_p0 = p[5].grad().detach().clone();
      return grad;
    });
    torch::Tensor loss = torch::zeros({});
    for (std::size_t i = 0; i < p.size(); ++i)
      if (env->rank == 0 || i != 5) loss = loss + p[i].square().sum();
    loss.backward();
    ASSERT_EQ(grad_at_p0.size(), 6U);
    EXPECT_FALSE(grad_at_p0[5 - env->rank]) << "the group {p4, p5} was not reduced in time";
    if (env->rank == 1) {
      ASSERT_TRUE(p5_grad_at_p0.defined());
      EXPECT_TRUE(torch::allclose(p5_grad_at_p0, p[5].detach()));  // (2 p + 0) / 2
    }
    for (const auto& param : actor.parameters()) EXPECT_FALSE(param.grad().defined());
    return;
  }
  TemporaryFolder folder;
  run_ranks(kWorld, folder.path);
}

// Note [Reducing while backward runs]: a backward reduces only the groups
// some rank's backward writes, as a reentrant checkpoint's segment does.
// The model's six chunk-sized parameters form three groups at N = 2; rank 0
// writes p4 and rank 1 p5, so only {p4, p5} goes: one chunk's gradients
// sent, where reducing every group of the model would send three. Each
// owner holds the other rank's gradient over two, what no rank wrote stays
// without a gradient, and a reduction after it has nothing to send.
TEST(DataParallel, ABackwardReducesOnlyTheGroupsSomeRankWrites) {
  constexpr int kWorld = 2;
  if (auto env = rank_environment()) {
    ActorAndCritic models(*env);
    const std::vector<torch::Tensor>& p = models.actor->params;
    const std::int64_t chunk_bytes = p[0].numel() * p[0].element_size();
    models.actor->loss(1.0).backward();  // every group, once
    for (const auto& param : p) param.mutable_grad().reset();
    const spillway::DataParallelTraffic before = spillway::data_parallel_traffic();
    p[4 + env->rank].square().sum().backward();
    const spillway::DataParallelTraffic after = spillway::data_parallel_traffic();
    EXPECT_GE(after.bytes_sent - before.bytes_sent, chunk_bytes) << "{p4, p5} was not reduced";
    EXPECT_LT(after.bytes_sent - before.bytes_sent, 2 * chunk_bytes) << "more than {p4, p5}";
    const torch::Tensor& owned = p[4 + env->rank];  // rank r owns member r of each group
    ASSERT_TRUE(owned.grad().defined());
    EXPECT_TRUE(torch::equal(owned.grad(), owned.detach()));  // (2 p + 0) / 2
    for (int i = 0; i < 6; ++i)
      if (i != 4 + env->rank) EXPECT_FALSE(p[i].grad().defined()) << "p" << i;
    spillway::reduce_gradients(p);  // decides, in one small all-reduce, that nothing is left
    EXPECT_LT(spillway::data_parallel_traffic().bytes_sent - after.bytes_sent, chunk_bytes / 2)
        << "reduce_gradients() found something left";
    return;
  }
  TemporaryFolder folder;
  run_ranks(kWorld, folder.path);
}

// Note [Reducing while backward runs]: ranks whose backwards reach different
// models fail at the backward's first collectives, every one of them, naming
// the model and the ranks on each side, instead of issuing reductions that
// do not match.
TEST(DataParallel, BackwardsReachingDifferentModelsAreRefusedByName) {
  constexpr int kWorld = 2;
  if (auto env = rank_environment()) {
    ActorAndCritic models(*env);
    ChunkSizedParams& actor = *models.actor;
    ChunkSizedParams& critic = *models.critic;
    std::string message = "did not throw";
    try {
      (env->rank == 0 ? actor.loss(1.0) + critic.loss(1.0) : actor.loss(1.0)).backward();
    } catch (const std::exception& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("the backward of rank(s) 0 reaches model"), std::string::npos)
        << message;
    // The critic is the second client ("torch#1").
    EXPECT_NE(message.find("#1' and that of rank(s) 1 does not"), std::string::npos) << message;
    return;
  }
  TemporaryFolder folder;
  run_ranks(kWorld, folder.path);
}

// Note [A backward onto a reduced gradient]: a backward between a reduction
// and the zeroing of the gradients (the second micro-batch of an
// accumulation outside NoSync, say) fails on the owners, naming a
// parameter, instead of reducing the mean again. Zeroing in place (zero_grad(false))
// or setting to none before the next backward is fine.
TEST(DataParallel, ABackwardOntoReducedGradientsIsRefused) {
  constexpr int kWorld = 2;
  if (auto env = rank_environment()) {
    use_conf();
    torch::manual_seed(7);
    ChunkSizedParams model;
    spillway::set_process_group(connect(*env));
    spillway::manage(model);
    torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.01));
    for (const bool set_to_none : {true, false}) {  // correct loops pass
      optimizer.zero_grad(set_to_none);
      model.loss(1.0 + env->rank).backward();
      spillway::reduce_gradients();
      optimizer.step();
      spillway::step();
    }
    optimizer.zero_grad(false);
    model.loss(1.0).backward();
    spillway::reduce_gradients();
    std::string message = "did not throw";
    try {
      model.loss(2.0).backward();  // onto the reduced means
    } catch (const std::exception& e) {
      message = e.what();
    }
    std::ofstream(env->folder + "/message" + std::to_string(env->rank)) << message;
    return;
  }
  TemporaryFolder folder;
  run_ranks(kWorld, folder.path);
  if (::testing::Test::HasFailure()) return;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::ifstream file(folder.path + "/message" + std::to_string(rank));
    const std::string message((std::istreambuf_iterator<char>(file)),
                              std::istreambuf_iterator<char>());
    EXPECT_NE(message.find("after it was reduced across ranks"), std::string::npos)
        << "rank " << rank << ": " << message;
    EXPECT_NE(message.find("gradient of 'p"), std::string::npos)
        << "rank " << rank << ": " << message;
    // The loop that trips it most: accumulating without NoSync.
    EXPECT_NE(message.find("NoSync"), std::string::npos) << "rank " << rank << ": " << message;
  }
}

// Note [Optimizer state packed by owner] and Note [A master copy starts at
// the first step]: spillway's Adam on a bf16 model, two ranks. The chunk
// ids are the same on every rank (the same layout, made in the same
// order), so each rank lists the state and master chunks that hold bytes:
// no chunk may be on two ranks, and each rank's chunks hold its share.
TEST(DataParallel, Bf16ChunkedAdamStateChunksBelongToOneOwnerEach) {
  constexpr int kWorld = 2;  // the model is two 2 MiB chunks of bf16
  if (auto env = rank_environment()) {
    use_conf();
    torch::manual_seed(7);
    Mlp model;
    model.to(torch::kBFloat16);
    spillway::set_process_group(connect(*env));
    spillway::manage(model);
    spillway::optim::Adam optimizer(model.parameters(), torch::optim::AdamOptions(1e-3));
    for (int step = 0; step < 2; ++step) {
      optimizer.zero_grad();
      auto [x, y] = batch(step, env->rank, 0);
      torch::mse_loss(model.forward(x.to(torch::kBFloat16), true), y.to(torch::kBFloat16))
          .backward();
      spillway::reduce_gradients();
      optimizer.step();
      spillway::step();
    }
    spillway::ChunkManager& chunks = spillway::Runtime::process().chunk_manager();
    std::ofstream out(env->folder + "/chunks" + std::to_string(env->rank));
    for (std::uint32_t client = 0; client < 64; ++client)
      for (const spillway::ChunkId chunk : chunks.chunks_of(spillway::ClientId{client})) {
        const auto info = chunks.chunk_info(chunk);
        if (info.has_value() && (info->kind == spillway::TensorKind::optimizer_state ||
                                 info->kind == spillway::TensorKind::master))
          out << static_cast<std::uint64_t>(chunk) << " "
              << (info->location != spillway::Location::none ? 1 : 0) << " " << info->capacity_bytes
              << "\n";
      }
    return;
  }
  TemporaryFolder folder;
  run_ranks(kWorld, folder.path);
  if (::testing::Test::HasFailure()) return;
  std::map<std::uint64_t, int> holder;
  std::vector<std::int64_t> held(kWorld, 0);
  std::int64_t all_bytes = 0, largest = 0;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::ifstream in(folder.path + "/chunks" + std::to_string(rank));
    std::uint64_t chunk = 0;
    int holds = 0;
    std::int64_t capacity = 0;
    while (in >> chunk >> holds >> capacity) {
      if (rank == 0) all_bytes += capacity;
      largest = std::max(largest, capacity);
      if (!holds) continue;
      const auto [it, fresh] = holder.emplace(chunk, rank);
      EXPECT_TRUE(fresh) << "state chunk " << chunk << " holds bytes on ranks " << it->second
                         << " and " << rank;
      held[static_cast<std::size_t>(rank)] += capacity;
    }
  }
  ASSERT_GT(all_bytes, 0);
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_GT(held[static_cast<std::size_t>(rank)], 0) << "rank " << rank << " holds no state";
    // 1/N of the state, within one chunk per array (two moments, a master).
    EXPECT_LE(std::abs(held[static_cast<std::size_t>(rank)] * kWorld - all_bytes),
              3 * largest * kWorld)
        << "rank " << rank << " holds " << held[static_cast<std::size_t>(rank)] << " of "
        << all_bytes << " bytes of state chunks";
  }
}

// Note [The device collectives take]: a group whose backend takes CUDA
// tensors only (as one made with backend="nccl") is refused where CUDA is
// not usable, naming the backend, before any collective; a group with a CPU
// backend beside it takes the collectives on the CPU.
TEST(DataParallel, AGroupWithoutACpuBackendIsRefusedWhereCudaIsNotUsable) {
  if (at::hasCUDA()) GTEST_SKIP() << "CUDA is usable here: such a group stages on the GPU";
  TemporaryFolder folder;
  use_conf();
  torch::manual_seed(7);
  ChunkSizedParams model;
  spillway::manage(model);
  auto store = c10::make_intrusive<c10d::FileStore>(folder.path + "/store", 1);
  auto gloo = gloo_backend(store, 0, 1);
  using Backend = c10d::ProcessGroup::BackendType;

  // CUDA's alone, labelled as NCCL would be.
  auto cuda_only = c10::make_intrusive<c10d::ProcessGroup>(store, 0, 1);
  cuda_only->setBackend(c10::DeviceType::CUDA, Backend::NCCL, gloo);
  cuda_only->setDefaultBackend(Backend::NCCL);
  const std::int64_t before = spillway::data_parallel_traffic().collectives;
  std::string message = "did not throw";
  try {
    spillway::set_process_group(cuda_only);
  } catch (const std::invalid_argument& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("backend (nccl) takes tensors of cuda only"), std::string::npos)
      << message;
  EXPECT_NE(message.find("cpu:gloo,cuda:nccl"), std::string::npos) << message;
  // Not kept: a reduction then runs no collective.
  model.loss(1.0).backward();
  spillway::reduce_gradients();
  EXPECT_EQ(spillway::data_parallel_traffic().collectives, before)
      << "the refused group ran a collective";
  for (const auto& p : model.params) p.mutable_grad().reset();

  // CPU's and CUDA's: the collectives run on the CPU, and a step reduces.
  auto both = c10::make_intrusive<c10d::ProcessGroup>(store, 0, 1);
  both->setBackend(c10::DeviceType::CPU, Backend::GLOO, gloo);
  both->setBackend(c10::DeviceType::CUDA, Backend::GLOO, gloo);
  both->setDefaultBackend(Backend::GLOO);
  spillway::set_process_group(both);
  EXPECT_EQ(spillway::data_parallel_world_size(), 1);
  const std::int64_t collectives = spillway::data_parallel_traffic().collectives;
  model.loss(1.0).backward();
  spillway::reduce_gradients();
  EXPECT_GT(spillway::data_parallel_traffic().collectives, collectives);
  for (const auto& p : model.params) EXPECT_TRUE(p.grad().defined());
  spillway::set_process_group(nullptr);
}

// --- Checkpoints by owner from C++ ----------------------------------------------

namespace {

// A rank of a checkpoint test: with SPILLWAY_DP_TEST_LOAD_FROM unset, trains
// `scenario.steps` steps and saves a checkpoint by owner into its folder;
// with it set, starts from other values, loads that checkpoint and trains
// `scenario.resumed_steps` more. A 1-rank run has no group at all.
void checkpoint_rank(const RankEnvironment& env, const Scenario& scenario) {
  const char* load_from = std::getenv("SPILLWAY_DP_TEST_LOAD_FROM");
  use_conf(/*dist_env=*/false, scenario.sharded);
  torch::manual_seed(load_from != nullptr ? 99 : 7);  // resumed: the values come from the file
  Mlp model;
  if (env.world > 1) spillway::set_process_group(connect(env));
  spillway::manage(model);
  auto optimizer = make_optimizer(scenario.optimizer, model.parameters());
  int first = 0;
  int last = scenario.steps;
  if (load_from != nullptr) {
    spillway::load_checkpoint(load_from, model, optimizer.get());
    first = scenario.steps;
    last = scenario.steps + scenario.resumed_steps;
  }
  for (int step = first; step < last; ++step) {
    optimizer->zero_grad();
    auto [x, y] = batch(step, env.rank, 0);
    torch::mse_loss(model.forward(x, uses_extra(scenario, step, env.rank, 0)), y).backward();
    spillway::reduce_gradients();
    optimizer->step();
    spillway::step();
  }
  if (load_from == nullptr)
    spillway::save_checkpoint(env.folder + "/checkpoint", model, optimizer.get());
  RunResult result;
  for (const auto& p : model.parameters()) {
    result.params.push_back(p.detach().clone());
    result.states.push_back(state_of(*optimizer, p));
  }
  save_result(result, result_path(env.folder, env.rank));
}

// Saves at `scenario.world` ranks, resumes at `scenario.resumed_world`, and
// compares every resumed rank with the oracle that trains straight through
// (the world size changing at the checkpoint): parameters bit for bit on
// every rank, each parameter's state bit for bit on its owner alone.
void expect_checkpoint_resumes_as_the_oracle(const Scenario& scenario) {
  if (auto env = rank_environment()) {
    checkpoint_rank(*env, scenario);
    return;
  }
  at::set_num_threads(1);
  TemporaryFolder folder;
  const std::string saved = folder.path + "/saved";
  const std::string resumed = folder.path + "/resumed";
  std::filesystem::create_directories(saved);
  std::filesystem::create_directories(resumed);
  run_ranks(scenario.world, saved);
  if (::testing::Test::HasFailure()) return;
  EXPECT_TRUE(std::filesystem::exists(saved + "/checkpoint/manifest.json"));
  for (int rank = 0; rank < scenario.world; ++rank)
    EXPECT_TRUE(std::filesystem::exists(
        fmt::format("{}/checkpoint/rank{:05d}-of-{:05d}.pt", saved, rank, scenario.world)));
  run_ranks(scenario.resumed_world, resumed, -1,
            {"SPILLWAY_DP_TEST_LOAD_FROM=" + saved + "/checkpoint"});
  if (::testing::Test::HasFailure()) return;

  const RunResult expected = oracle(scenario, /*concatenated=*/false);
  std::vector<RunResult> ranks;
  for (int rank = 0; rank < scenario.resumed_world; ++rank)
    ranks.push_back(load_result(result_path(resumed, rank)));
  for (std::size_t i = 0; i < expected.params.size(); ++i) {
    for (int rank = 0; rank < scenario.resumed_world; ++rank)
      EXPECT_TRUE(same_bits(ranks[rank].params[i], expected.params[i]))
          << "rank " << rank << ", parameter #" << i;
    int holders = 0;
    for (int rank = 0; rank < scenario.resumed_world; ++rank) {
      const auto& state = ranks[rank].states[i];
      if (state.empty()) continue;
      ++holders;
      ASSERT_EQ(state.size(), expected.states[i].size()) << "parameter #" << i;
      for (std::size_t s = 0; s < state.size(); ++s)
        EXPECT_TRUE(same_bits(state[s], expected.states[i][s]))
            << "rank " << rank << ", parameter #" << i << ", state " << s;
    }
    EXPECT_EQ(holders, expected.states[i].empty() ? 0 : 1) << "parameter #" << i;
  }
}

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST(DataParallelCheckpoint, SavedAtTwoRanksResumesAtOneBitForBit) {
  expect_checkpoint_resumes_as_the_oracle({.world = 2,
                                           .steps = 2,
                                           .optimizer = Optimizer::adam,
                                           .resumed_world = 1,
                                           .resumed_steps = 2});
}

TEST(DataParallelCheckpoint, SavedAtTwoRanksResumesAtFourBitForBit) {
  expect_checkpoint_resumes_as_the_oracle({.world = 2,
                                           .steps = 2,
                                           .optimizer = Optimizer::adam,
                                           .resumed_world = 4,
                                           .resumed_steps = 2});
}

TEST(DataParallelCheckpoint, SgdWithMomentumSavedAtFourResumesAtTwoBitForBit) {
  expect_checkpoint_resumes_as_the_oracle({.world = 4,
                                           .steps = 2,
                                           .optimizer = Optimizer::sgd_momentum,
                                           .resumed_world = 2,
                                           .resumed_steps = 2});
}

// The files are the Python package's: its consolidation tool makes of a
// checkpoint saved from C++ at two ranks the oracle's module state_dict and
// torch.optim's Adam state_dict, bit for bit.
TEST(DataParallelCheckpoint, PythonsToolConsolidatesACheckpointSavedFromCpp) {
#ifndef SPILLWAY_TEST_PYTHON_PACKAGE_ROOT
  GTEST_SKIP() << "this build has no Python package (a sanitizer build)";
#else
  const Scenario scenario{.world = 2, .steps = 2, .optimizer = Optimizer::adam};
  if (auto env = rank_environment()) {
    checkpoint_rank(*env, scenario);
    return;
  }
  at::set_num_threads(1);
  TemporaryFolder folder;
  run_ranks(scenario.world, folder.path);
  if (::testing::Test::HasFailure()) return;
  const std::string log = folder.path + "/consolidate.log";
  const pid_t tool =
      spawn_logged({SPILLWAY_TEST_PYTHON, "-m", "spillway.consolidate", folder.path + "/checkpoint",
                    folder.path + "/model.pt", "--optimizer", folder.path + "/optimizer.pt"},
                   {std::string("PYTHONPATH=") + SPILLWAY_TEST_PYTHON_PACKAGE_ROOT}, log);
  ASSERT_TRUE(exited_cleanly(wait_for_children({tool})[0])) << read_file(log);

  const RunResult expected = oracle(scenario, /*concatenated=*/false);
  const auto module = torch::pickle_load(file_bytes(folder.path + "/model.pt")).toGenericDict();
  const auto optimizer =
      torch::pickle_load(file_bytes(folder.path + "/optimizer.pt")).toGenericDict();
  const auto state = optimizer.at("state").toGenericDict();
  spillway::torch_bridge::HostWorkScope host_memory;
  Mlp names;
  std::size_t i = 0;
  for (const auto& item : names.named_parameters()) {
    EXPECT_TRUE(same_bits(module.at(item.key()).toTensor(), expected.params[i])) << item.key();
    const auto& oracle_state = expected.states[i];
    const auto saved = state.find(static_cast<std::int64_t>(i));
    ASSERT_EQ(saved != state.end(), !oracle_state.empty()) << item.key();
    if (!oracle_state.empty()) {
      const auto adam = saved->value().toGenericDict();
      EXPECT_TRUE(same_bits(adam.at("exp_avg").toTensor(), oracle_state[0])) << item.key();
      EXPECT_TRUE(same_bits(adam.at("exp_avg_sq").toTensor(), oracle_state[1])) << item.key();
      EXPECT_EQ(adam.at("step").toTensor().item<double>(), oracle_state[2].item<double>())
          << item.key();
    }
    ++i;
  }
  EXPECT_EQ(i, expected.params.size());
  EXPECT_EQ(module.size(), i) << "the Mlp has no buffers: its state_dict is its parameters";
#endif
}

// What does not fit is refused by name, in one process without a group.
TEST(DataParallelCheckpoint, WhatDoesNotFitIsRefusedByName) {
  if (auto env = rank_environment()) {
    use_conf();
    torch::manual_seed(7);
    Mlp model;
    spillway::manage(model);
    torch::optim::Adam adam(model.parameters(), torch::optim::AdamOptions(1e-3));
    auto [x, y] = batch(0, 0, 0);
    torch::mse_loss(model.forward(x, true), y).backward();
    adam.step();
    const std::string checkpoint = env->folder + "/checkpoint";
    const auto refusal = [](const std::function<void()>& load) {
      try {
        load();
      } catch (const spillway::CheckpointError& e) {
        return std::string(e.what());
      }
      return std::string("did not throw");
    };
    torch::optim::RMSprop rmsprop(model.parameters());
    EXPECT_THAT(refusal([&] { spillway::save_checkpoint(checkpoint, model, &rmsprop); }),
                ::testing::HasSubstr("(torch::optim::RMSprop) is none of them"));
    EXPECT_THAT(refusal([&] { spillway::save_checkpoint("/proc/spillway-checkpoint", model); }),
                ::testing::HasSubstr("could not make the checkpoint folder /proc/"));
    spillway::save_checkpoint(checkpoint, model, &adam);

    torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
    EXPECT_THAT(refusal([&] { spillway::load_checkpoint(checkpoint, model, &sgd); }),
                ::testing::HasSubstr("holds the state of Adam, not of SGD"));
    torch::nn::Linear other(kIn, 3);
    EXPECT_THAT(refusal([&] { spillway::load_checkpoint(checkpoint, *other); }),
                ::testing::HasSubstr("does not fit the module: missing [weight, bias], "
                                     "unexpected [extra.bias, extra.weight,"));
    torch::optim::Adam fewer(std::vector<torch::Tensor>{model.mix}, torch::optim::AdamOptions());
    EXPECT_THAT(refusal([&] { spillway::load_checkpoint(checkpoint, model, &fewer); }),
                ::testing::HasSubstr("saved 15 parameters in 1 groups, this optimizer has 1"));

    const std::string manifest_path = checkpoint + "/manifest.json";
    const std::string manifest = read_file(manifest_path);
    nlohmann::json mistyped = nlohmann::json::parse(manifest);
    mistyped["module"]["mix"]["shard"] = "zero";
    std::ofstream(manifest_path) << mistyped.dump();
    EXPECT_THAT(refusal([&] { spillway::load_checkpoint(checkpoint, model, &adam); }),
                ::testing::HasSubstr("is not as a checkpoint by owner writes it"));
    std::ofstream(manifest_path) << manifest;

    const std::string shard = checkpoint + "/rank00000-of-00001.pt";
    const std::uintmax_t size = std::filesystem::file_size(shard);
    std::filesystem::resize_file(shard, size / 2);
    EXPECT_THAT(refusal([&] { spillway::load_checkpoint(checkpoint, model, &adam); }),
                ::testing::HasSubstr("shard 0 of the checkpoint, cannot be read"));
    std::filesystem::remove(checkpoint + "/manifest.json");
    EXPECT_THAT(refusal([&] { spillway::load_checkpoint(checkpoint, model, &adam); }),
                ::testing::HasSubstr("is not a complete checkpoint by owner"));
    return;
  }
  TemporaryFolder folder;
  run_ranks(1, folder.path);
}

// Sharded parameters at both ends: saving reads owned values only, loading
// writes every parameter (gathering each group first), and the resumed
// ranks drop what they do not own at their first step.
TEST(DataParallelCheckpoint, ShardedSavedAtTwoRanksResumesAtFourBitForBit) {
  expect_checkpoint_resumes_as_the_oracle({.world = 2,
                                           .steps = 2,
                                           .optimizer = Optimizer::adam,
                                           .resumed_world = 4,
                                           .resumed_steps = 2,
                                           .sharded = true});
}

// spillway's chunked Adam: its state is in chunks, saved and loaded through
// param_state and set_param_state, as the Python package's state_dict does.
TEST(DataParallelCheckpoint, ChunkedAdamSavedAtTwoRanksResumesAtFourBitForBit) {
  expect_checkpoint_resumes_as_the_oracle({.world = 2,
                                           .steps = 2,
                                           .optimizer = Optimizer::chunked_adam,
                                           .resumed_world = 4,
                                           .resumed_steps = 2});
}
