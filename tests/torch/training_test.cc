// Training under spillway gives exactly PyTorch's results: an MLP trained
// with torch::optim::Adam and SGD (momentum), its parameters and gradients in
// chunks that a small device budget forces out and back every step, on the
// sim device with strict_residency (a missed fetch faults). Losses and final
// parameters must be bit-identical to the same program without spillway, and
// the stats must show that chunks moved.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "allocator/runtime.h"
#include "hooks/torch/sim_torch_allocator.h"
#include "hooks/torch/spillway_torch.h"

namespace {

// 2 MiB chunks under a 6 MiB budget (3 chunks); the MLP's parameters and
// gradients fill about a dozen chunks, so every step moves most of them.
// On the sim device the budget also holds what torch allocates outside chunks
// (Note [torch's CPU allocator on the sim device]): the stock optimizer's
// state and the activations. Each managed run widens the allocator's budget
// by what those need (set_budget_for), so that the chunks still get 3 chunks'
// room and spill every step.
// The policy is LRU's, or SPILLWAY_TRAINING_TEST_POLICY's (tests/torch/
// CMakeLists.txt runs every test again under policy:planned).
std::string conf() {
  const char* policy = std::getenv("SPILLWAY_TRAINING_TEST_POLICY");
  return std::string(
             "device:sim,strict_residency:true,chunk_size:2MiB,device_budget:6MiB,"
             "sim_capacity:256MiB,policy:") +
         (policy != nullptr ? policy : "lru");
}

constexpr std::size_t kChunkRoomBytes = std::size_t{6} << 20;  // device_budget above
constexpr std::size_t kSlabBytes = std::size_t{2} << 20;
// Activations, temporaries and the small pool's partly filled slabs.
constexpr std::size_t kActivationRoomBytes = std::size_t{4} << 20;

constexpr int kSteps = 6;
constexpr int kBatch = 16;
constexpr int kInputs = 128;
constexpr int kWidth = 512;
constexpr int kOutputs = 16;

// A model under test: its module, how to run it, and its data's shapes.
struct ModelUnderTest {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::vector<int64_t> input_shape;   // one micro-batch
  std::vector<int64_t> target_shape;  // one micro-batch
};

ModelUnderTest make_mlp() {
  torch::nn::Sequential mlp(
      torch::nn::Linear(kInputs, kWidth), torch::nn::ReLU(), torch::nn::Linear(kWidth, kWidth),
      torch::nn::ReLU(), torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU(),
      torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU(), torch::nn::Linear(kWidth, kWidth),
      torch::nn::Tanh(), torch::nn::Linear(kWidth, kOutputs));
  return {mlp.ptr(),
          [mlp](const torch::Tensor& x) mutable { return mlp->forward(x); },
          {kBatch, kInputs},
          {kBatch, kOutputs}};
}

// Two pre-norm-free encoder layers (attention, layer norm, feed-forward)
// between an input and an output projection; about 12 MiB of parameters and
// gradients. Dropout is off so that the runs are deterministic.
struct TinyTransformerImpl : torch::nn::Module {
  static constexpr int64_t kModel = 256;
  static constexpr int64_t kSequence = 8;
  TinyTransformerImpl() {
    const auto layer = torch::nn::TransformerEncoderLayerOptions(kModel, 4)
                           .dim_feedforward(4 * kModel)
                           .dropout(0.0);
    embed = register_module("embed", torch::nn::Linear(kInputs, kModel));
    block0 = register_module("block0", torch::nn::TransformerEncoderLayer(layer));
    block1 = register_module("block1", torch::nn::TransformerEncoderLayer(layer));
    head = register_module("head", torch::nn::Linear(kModel, kOutputs));
  }
  torch::Tensor forward(const torch::Tensor& x) {  // x: [sequence, batch, inputs]
    return head->forward(block1->forward(block0->forward(embed->forward(x))));
  }
  torch::nn::Linear embed{nullptr}, head{nullptr};
  torch::nn::TransformerEncoderLayer block0{nullptr}, block1{nullptr};
};
TORCH_MODULE(TinyTransformer);

// A trunk and two heads; the head a micro-batch goes through alternates, and
// the first step reaches only head A, so head B has no gradient then: torch's
// optimizers leave it alone (no weight decay, no momentum), and so must
// spillway (Note [A gradient is undefined until a backward defines it]).
ModelUnderTest make_two_headed_mlp() {
  torch::nn::Sequential trunk(torch::nn::Linear(kInputs, kWidth), torch::nn::ReLU(),
                              torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU(),
                              torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU(),
                              torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU(),
                              torch::nn::Linear(kWidth, kWidth), torch::nn::Tanh());
  torch::nn::Linear head_a(kWidth, kOutputs);
  torch::nn::Linear head_b(kWidth, kOutputs);
  auto model = std::make_shared<torch::nn::Module>();
  model->register_module("trunk", trunk);
  model->register_module("head_a", head_a);
  model->register_module("head_b", head_b);
  auto calls = std::make_shared<int>(0);
  return {model,
          [trunk, head_a, head_b, calls](const torch::Tensor& x) mutable {
            const torch::Tensor features = trunk->forward(x);
            return (*calls)++ % 3 == 0 ? head_a->forward(features) : head_b->forward(features);
          },
          {kBatch, kInputs},
          {kBatch, kOutputs}};
}

// The MLP with batch norm after each hidden layer: its running statistics,
// buffers that change every step, are managed too.
ModelUnderTest make_batch_norm_mlp() {
  torch::nn::Sequential mlp;
  mlp->push_back(torch::nn::Linear(kInputs, kWidth));
  for (int layer = 0; layer < 6; ++layer) {
    mlp->push_back(torch::nn::BatchNorm1d(kWidth));
    mlp->push_back(torch::nn::ReLU());
    mlp->push_back(torch::nn::Linear(kWidth, layer == 5 ? kOutputs : kWidth));
  }
  return {mlp.ptr(),
          [mlp](const torch::Tensor& x) mutable { return mlp->forward(x); },
          {kBatch, kInputs},
          {kBatch, kOutputs}};
}

ModelUnderTest make_tiny_transformer() {
  TinyTransformer model;
  return {model.ptr(),
          [model](const torch::Tensor& x) mutable { return model->forward(x); },
          {TinyTransformerImpl::kSequence, 4, kInputs},
          {TinyTransformerImpl::kSequence, 4, kOutputs}};
}

// When and how gradients are cleared: optimizer.zero_grad() before each step
// (torch's default, set to none), by hand to none, zero_grad() after each
// step, so the first backward meets whatever gradient manage() left, or
// zero_grad(set_to_none=false) before each step (zeros, kept).
enum class ZeroGrad { in_place, set_to_none, after_step, to_zeros };

struct TrainingSetup {
  std::function<ModelUnderTest()> make_model = make_mlp;
  std::uint64_t model_seed = 0;
  std::uint64_t data_seed = 1;
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>
      make_optimizer;
  ZeroGrad zero_grad = ZeroGrad::in_place;
  int micro_batches = 1;  // gradient accumulation
  // Managed runs: unmanage after this many steps and train on without
  // spillway (-1: never).
  int unmanage_after = -1;
  // Frozen (requires_grad false) parameters, from the first.
  int freeze_first_parameters = 0;
  // Tensors of the parameter's size the optimizer keeps per parameter, outside
  // chunks (Adam's exp_avg and exp_avg_sq: 2; SGD's momentum: 1).
  int optimizer_state_slots = 0;
  // Managed runs: spillway::step() after each step. Without it, the planned
  // policy finds the steps in the access stream (Note [Steps found in the
  // access stream] in allocator/policy/planned_policy.h).
  bool mark_steps = true;
  // After this step's update (-1: never), the first parameter gets new data of
  // its layout with set_data, in both runs (Note [set_data on a managed
  // parameter] in hooks/torch/param_rebinding.cc).
  int set_data_after = -1;
  // The plain run: after this step (-1: never), torch::save of the model and
  // the optimizer into checkpoint_dir. Both runs: after load_after,
  // torch::load of what the plain run saved.
  int save_after = -1;
  int load_after = -1;
  std::string checkpoint_dir;
  // Managed runs: the first parameter's gradient tensor is held from the
  // optimizer step through the next backward, as `g = p.grad` would.
  bool hold_first_gradient = false;
};

std::string checkpoint_path(const std::string& dir, const std::string& what) {
  return dir + "/" + what + ".pt";
}

struct TrainingResult {
  std::vector<torch::Tensor> losses;
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> buffers;                   // batch norm's running statistics, say
  std::vector<std::uint64_t> bytes_fetched_after_step;  // managed runs only
  // Managed runs: whether each parameter's gradient, after the last step, is
  // still the tensor spillway bound after the first step that reached it
  // (autograd accumulated in place, or it was re-bound).
  std::vector<bool> grad_still_bound;
  // Managed runs: whether each parameter's storage is still in a chunk at
  // the end (set_data's new data included).
  std::vector<bool> params_in_chunks;
  std::uint64_t evictions_before_load = 0;  // managed runs that load
  // Managed runs, after each step: whether every gradient in grad chunks
  // reads as zeros (Note [A gradient set to none is not fetched]).
  std::vector<bool> gradients_zero_after_step;
  // Managed runs, each step after its (first) forward: whether every
  // gradient in grad chunks is discarded (state free).
  std::vector<bool> gradients_discarded_after_forward;
  // hold_first_gradient: whether the held gradient kept its values through
  // each zero_grad, backward and step boundary.
  bool held_gradient_kept = true;
};

// Whether every gradient in grad chunks reads as zeros (read on the host).
bool gradients_in_chunks_read_as_zeros() {
  spillway::ChunkManager& chunks = spillway::Runtime::process().chunk_manager();
  bool zeros = true;
  for (std::uint32_t client = 0; client < 64; ++client)
    for (const spillway::TensorId id : chunks.tensors_of(spillway::ClientId{client})) {
      const auto info = chunks.tensor_info(id);
      if (!info || info->kind != spillway::TensorKind::grad) continue;
      void* data = nullptr;
      EXPECT_EQ(chunks.acquire_host(id, &data, spillway::AccessMode::read), spillway::Status::ok)
          << spillway::ChunkManager::last_error();
      const auto* bytes = static_cast<const unsigned char*>(data);
      zeros =
          zeros && std::all_of(bytes, bytes + info->bytes, [](unsigned char b) { return b == 0; });
      EXPECT_EQ(chunks.release_host(id), spillway::Status::ok);
    }
  return zeros;
}

// Whether every gradient in grad chunks is discarded: its bytes do not matter.
bool gradients_in_chunks_discarded() {
  spillway::ChunkManager& chunks = spillway::Runtime::process().chunk_manager();
  for (std::uint32_t client = 0; client < 64; ++client)
    for (const spillway::TensorId id : chunks.tensors_of(spillway::ClientId{client})) {
      const auto info = chunks.tensor_info(id);
      if (info && info->kind == spillway::TensorKind::grad &&
          info->state != spillway::TensorState::free)
        return false;
    }
  return true;
}

std::uint64_t stat(const std::string& key) {
  const nlohmann::json stats = nlohmann::json::parse(spillway::memory_stats_json());
  if (!stats.contains(key)) return 0;
  return stats.at(key).get<std::uint64_t>();
}

// One training run, a step at a time, so that two can be interleaved.
class Training {
 public:
  Training(const TrainingSetup& setup, bool managed) : setup_(setup), managed_(managed) {
    // The reference runs on torch's own memory, also when an earlier test of
    // this process activated spillway.
    if (!managed_) host_work_.emplace();
    torch::set_num_threads(1);
    torch::manual_seed(setup.model_seed);
    model_ = setup.make_model();
    if (setup.freeze_first_parameters > 0) {
      auto params = model_.module->parameters();
      for (int i = 0; i < setup.freeze_first_parameters; ++i) params[i].requires_grad_(false);
    }
    if (managed_) {
      spillway::configure(conf());
      spillway::activate();
      set_budget_for({this});
      spillway::manage(*model_.module);
      // As torch: no gradient before a backward defines it.
      for (const torch::Tensor& param : model_.module->parameters())
        EXPECT_FALSE(param.grad().defined()) << "manage() defined a gradient";
    }
    optimizer_ = setup.make_optimizer(model_.module->parameters());
    torch::manual_seed(setup.data_seed);
    auto shape = [&](const std::vector<int64_t>& micro_batch) {
      std::vector<int64_t> full{kSteps, setup.micro_batches};
      full.insert(full.end(), micro_batch.begin(), micro_batch.end());
      return full;
    };
    inputs_ = torch::randn(shape(model_.input_shape));
    targets_ = torch::randn(shape(model_.target_shape));
  }

  void run_step(int step) {
    if (setup_.zero_grad == ZeroGrad::in_place) {
      optimizer_->zero_grad();
    } else if (setup_.zero_grad == ZeroGrad::set_to_none) {
      for (torch::Tensor& param : model_.module->parameters()) param.mutable_grad().reset();
    } else if (setup_.zero_grad == ZeroGrad::to_zeros) {
      optimizer_->zero_grad(/*set_to_none=*/false);
    }
    torch::Tensor step_loss = torch::zeros({});
    for (int micro = 0; micro < setup_.micro_batches; ++micro) {
      const torch::Tensor output = model_.forward(inputs_[step][micro]);
      if (managed_ && micro == 0)
        result_.gradients_discarded_after_forward.push_back(gradients_in_chunks_discarded());
      const torch::Tensor loss = torch::mse_loss(output, targets_[step][micro]);
      loss.backward();
      step_loss = step_loss + loss.detach();
    }
    check_held_gradient();
    held_gradient_.reset();  // `g` goes once the backward has run
    optimizer_->step();
    if (managed_ && setup_.hold_first_gradient) {
      const torch::Tensor grad = model_.module->parameters().front().grad();
      torch::Tensor values;
      {
        spillway::torch_bridge::HostWorkScope off_budget;  // the copy takes no device room
        values = grad.clone();
      }
      held_gradient_.emplace(grad, std::move(values));
    }
    if (setup_.zero_grad == ZeroGrad::after_step) optimizer_->zero_grad();
    if (step == setup_.set_data_after) {
      torch::Tensor first = model_.module->parameters().front();
      torch::Tensor halved;
      {
        torch::NoGradGuard no_grad;
        halved = first.detach() * 0.5;
      }
      first.set_data(halved);
    }
    if (!managed_ && step == setup_.save_after) {
      torch::save(model_.module, checkpoint_path(setup_.checkpoint_dir, "model"));
      torch::save(*optimizer_, checkpoint_path(setup_.checkpoint_dir, "optimizer"));
    }
    if (step == setup_.load_after) {
      if (managed_) result_.evictions_before_load = stat("evictions");
      // Module::load gives each parameter the loaded storage with set_ (Note
      // [set_ on a managed parameter]).
      torch::load(model_.module, checkpoint_path(setup_.checkpoint_dir, "model"));
      torch::load(*optimizer_, checkpoint_path(setup_.checkpoint_dir, "optimizer"));
    }
    if (managed_ && step == setup_.unmanage_after) {
      spillway::unmanage(*model_.module);
      managed_ = false;
    }
    if (managed_) {
      if (setup_.mark_steps) spillway::step();
      result_.bytes_fetched_after_step.push_back(stat("bytes_moved.h2d"));
      result_.gradients_zero_after_step.push_back(gradients_in_chunks_read_as_zeros());
      check_held_gradient();
      // Each gradient as first bound into its chunk, after the first step
      // that reached its parameter.
      const std::vector<torch::Tensor> params = model_.module->parameters();
      bound_grads_.resize(params.size(), nullptr);
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (bound_grads_[i] == nullptr && params[i].grad().defined())
          bound_grads_[i] = params[i].grad().storage().unsafeGetStorageImpl();
      }
    }
    result_.losses.push_back(step_loss.clone());
  }

  void check_held_gradient() {
    if (held_gradient_ && !torch::equal(held_gradient_->first, held_gradient_->second))
      result_.held_gradient_kept = false;
  }

  // Bytes this run holds outside chunks (the optimizer's state), whole slabs.
  std::size_t outside_chunks_bytes() const {
    std::size_t param_bytes = 0;
    for (const torch::Tensor& param : model_.module->parameters())
      param_bytes += static_cast<std::size_t>(param.numel()) * param.element_size();
    std::size_t outside = param_bytes * static_cast<std::size_t>(setup_.optimizer_state_slots);
    // Unmanaged, parameters and gradients are ordinary tensors on the device,
    // as they would be on a GPU: the training after unmanage needs room for them.
    if (setup_.unmanage_after >= 0) outside += 2 * param_bytes;
    return (outside + kSlabBytes - 1) / kSlabBytes * kSlabBytes;
  }

  // The allocator's budget: 3 chunks' room beside what `runs` hold outside
  // chunks and their activations.
  static void set_budget_for(std::initializer_list<const Training*> runs) {
    std::size_t budget = kChunkRoomBytes + kActivationRoomBytes;
    for (const Training* run : runs) budget += run->outside_chunks_bytes();
    spillway::Runtime::process().active_allocator()->set_budget_bytes(budget);
  }

  torch::nn::Module& module() { return *model_.module; }

  TrainingResult finish() {
    std::size_t index = 0;
    for (const torch::Tensor& param : model_.module->parameters()) {
      result_.params.push_back(param.detach().clone());
      if (managed_) result_.params_in_chunks.push_back(spillway::is_managed(param));
      // Undefined (set to none, and no backward reached it since) is torch's
      // state too; a defined gradient must be the bound one.
      if (!bound_grads_.empty())
        result_.grad_still_bound.push_back(!param.grad().defined() ||
                                           param.grad().storage().unsafeGetStorageImpl() ==
                                               bound_grads_[index]);
      ++index;
    }
    for (const torch::Tensor& buffer : model_.module->buffers())
      result_.buffers.push_back(buffer.clone());
    return std::move(result_);
  }

 private:
  const TrainingSetup& setup_;
  bool managed_;
  ModelUnderTest model_;
  std::vector<const c10::StorageImpl*> bound_grads_;
  // hold_first_gradient: the gradient tensor held, and its values then.
  std::optional<std::pair<torch::Tensor, torch::Tensor>> held_gradient_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  torch::Tensor inputs_;
  torch::Tensor targets_;
  TrainingResult result_;
  std::optional<spillway::torch_bridge::HostWorkScope> host_work_;  // reference runs
};

TrainingResult train(const TrainingSetup& setup, bool managed) {
  Training training(setup, managed);
  for (int step = 0; step < kSteps; ++step) training.run_step(step);
  return training.finish();
}

void expect_same_results(const TrainingResult& plain, const TrainingResult& spilled) {
  ASSERT_EQ(plain.losses.size(), spilled.losses.size());
  for (std::size_t step = 0; step < plain.losses.size(); ++step) {
    EXPECT_TRUE(torch::equal(plain.losses[step], spilled.losses[step]))
        << "step " << step << ": loss " << plain.losses[step].item<float>() << " without spillway, "
        << spilled.losses[step].item<float>() << " with it";
  }
  ASSERT_EQ(plain.buffers.size(), spilled.buffers.size());
  for (std::size_t i = 0; i < plain.buffers.size(); ++i)
    EXPECT_TRUE(torch::equal(plain.buffers[i], spilled.buffers[i])) << "buffer " << i << " differs";
  ASSERT_EQ(plain.params.size(), spilled.params.size());
  for (std::size_t i = 0; i < plain.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain.params[i], spilled.params[i]))
        << "parameter " << i << " differs; max abs difference "
        << (plain.params[i] - spilled.params[i]).abs().max().item<float>();
  }
}

void expect_bit_identical(const TrainingSetup& setup) {
  const TrainingResult plain = train(setup, /*managed=*/false);
  const TrainingResult spilled = train(setup, /*managed=*/true);
  expect_same_results(plain, spilled);

  // Gradients stayed in their grad chunks (re-bound after set-to-none).
  for (std::size_t i = 0; i < spilled.grad_still_bound.size(); ++i)
    EXPECT_TRUE(spilled.grad_still_bound[i]) << "parameter " << i << "'s gradient left its chunk";
  for (std::size_t i = 0; i < spilled.params_in_chunks.size(); ++i)
    EXPECT_TRUE(spilled.params_in_chunks[i]) << "parameter " << i << " left its chunk";

  // Chunks moved in and out, every step.
  std::uint64_t before = 0;
  for (std::size_t step = 0; step < spilled.bytes_fetched_after_step.size(); ++step) {
    EXPECT_GT(spilled.bytes_fetched_after_step[step], before) << "no fetch in step " << step;
    before = spilled.bytes_fetched_after_step[step];
  }
  EXPECT_GT(stat("evictions"), 0u);
  EXPECT_GT(stat("bytes_moved.h2d"), 0u);
  EXPECT_GT(stat("bytes_moved.d2h"), 0u);
  // Under policy:planned the plan was followed: step 1 (with manage()'s own
  // accesses) departs from step 2, step 3 is traced again, later steps follow.
  const nlohmann::json policy = nlohmann::json::parse(spillway::memory_stats_json())["policy"];
  if (policy["name"] == "planned") {
    EXPECT_GE(policy["planned_steps"].get<int>(), kSteps - 4) << policy.dump();
  }
  std::cout << "spillway stats: " << spillway::memory_stats_json() << "\n";
}

TrainingSetup adam_setup() {
  TrainingSetup setup;
  setup.make_optimizer = [](std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(1e-3));
  };
  setup.optimizer_state_slots = 2;
  return setup;
}

TrainingSetup sgd_momentum_setup() {
  TrainingSetup setup;
  setup.make_optimizer = [](std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(
        std::move(params), torch::optim::SGDOptions(1e-2).momentum(0.9).weight_decay(1e-4));
  };
  setup.optimizer_state_slots = 1;
  return setup;
}

TEST(TorchBridgeTraining, MlpWithAdamIsBitIdentical) { expect_bit_identical(adam_setup()); }

TEST(TorchBridgeTraining, MlpWithSgdMomentumIsBitIdentical) {
  expect_bit_identical(sgd_momentum_setup());
}

TEST(TorchBridgeTraining, SetToNoneZeroGradIsBitIdentical) {
  TrainingSetup setup = adam_setup();
  setup.zero_grad = ZeroGrad::set_to_none;
  expect_bit_identical(setup);
}

// Note [A gradient set to none is not fetched]: zeroed after the optimizer
// step, every gradient is discarded at spillway::step(), so its chunk reads
// as zeros (nothing of the last step's gradients is kept or fetched).
TEST(TorchBridgeTraining, GradientsSetToNoneAfterTheStepAreDiscardedThere) {
  TrainingSetup setup = adam_setup();
  setup.zero_grad = ZeroGrad::after_step;
  const TrainingResult plain = train(setup, /*managed=*/false);
  const TrainingResult spilled = train(setup, /*managed=*/true);
  expect_same_results(plain, spilled);
  for (std::size_t step = 0; step < spilled.gradients_zero_after_step.size(); ++step)
    EXPECT_TRUE(spilled.gradients_zero_after_step[step]) << "step " << step;
}

// Zeroed before the forward (torch's zero_grad() at a step's start), every
// gradient is discarded at the forward's first op, so the forward's
// activations have the room and the backward's grad chunks can be zeroed
// on the device ahead of it.
TEST(TorchBridgeTraining, GradientsSetToNoneBeforeTheForwardAreDiscardedAtItsFirstOp) {
  TrainingSetup setup = adam_setup();
  setup.zero_grad = ZeroGrad::in_place;  // torch's zero_grad(): set to none
  const TrainingResult plain = train(setup, /*managed=*/false);
  const TrainingResult spilled = train(setup, /*managed=*/true);
  expect_same_results(plain, spilled);
  ASSERT_EQ(spilled.gradients_discarded_after_forward.size(), static_cast<std::size_t>(kSteps));
  for (std::size_t step = 0; step < spilled.gradients_discarded_after_forward.size(); ++step)
    EXPECT_TRUE(spilled.gradients_discarded_after_forward[step]) << "step " << step;
}

// Note [Ops that touch no bytes]: LibTorch's zero_grad() detaches each
// gradient before it drops it, and a view of a parameter is made before the
// op that reads it. Neither fetches an evicted chunk; the op that reads does,
// and reads the parameter's values.
TEST(TorchBridgeTraining, DetachingOrViewingEvictedTensorsFetchesNothing) {
  const TrainingSetup setup = adam_setup();  // Training keeps a reference
  Training run(setup, /*managed=*/true);
  run.run_step(0);
  std::vector<torch::Tensor> params = run.module().parameters();
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& param : params) values.push_back(param.detach().clone());
  int gradients = 0;
  for (const torch::Tensor& param : params) gradients += param.grad().defined() ? 1 : 0;
  ASSERT_GT(gradients, 0) << "the step left no gradient to detach";
  spillway::ChunkManager& chunks = spillway::Runtime::process().chunk_manager();
  for (std::uint32_t client = 0; client < 64; ++client)
    for (const spillway::TensorId id : chunks.tensors_of(spillway::ClientId{client})) {
      const spillway::ChunkId chunk = chunks.tensor_info(id)->chunk;
      ASSERT_EQ(chunks.evict(chunk), spillway::Status::ok) << spillway::ChunkManager::last_error();
      EXPECT_NE(chunks.chunk_info(chunk)->location, spillway::Location::device);
    }
  const std::uint64_t fetched_before = stat("bytes_moved.h2d");

  torch::optim::SGD(params, torch::optim::SGDOptions(0.1)).zero_grad();  // detach_, then none
  std::vector<torch::Tensor> views;
  for (const torch::Tensor& param : params) {
    views.push_back(param.dim() == 2 ? param.t() : param.view({-1}));
    views.push_back(param.detach());
  }
  EXPECT_EQ(stat("bytes_moved.h2d"), fetched_before) << "a detach or a view fetched a chunk";
  for (const torch::Tensor& param : params) EXPECT_FALSE(param.grad().defined());

  for (std::size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& value = values[i];
    EXPECT_TRUE(torch::equal(views[2 * i].clone(), value.dim() == 2 ? value.t() : value.view({-1})))
        << "parameter " << i;
    EXPECT_TRUE(torch::equal(views[2 * i + 1].clone(), value)) << "parameter " << i;
  }
  EXPECT_GT(stat("bytes_moved.h2d"), fetched_before) << "the reads fetched nothing";
}

// A gradient someone holds is not discarded: its values stay.
TEST(TorchBridgeTraining, AGradientSomeoneHoldsKeepsItsBytesThroughZeroGrad) {
  TrainingSetup setup = adam_setup();
  setup.zero_grad = ZeroGrad::after_step;
  setup.hold_first_gradient = true;
  const TrainingResult plain = train(setup, /*managed=*/false);
  const TrainingResult spilled = train(setup, /*managed=*/true);
  expect_same_results(plain, spilled);
  EXPECT_TRUE(spilled.held_gradient_kept);
  for (std::size_t step = 0; step < spilled.gradients_zero_after_step.size(); ++step)
    EXPECT_FALSE(spilled.gradients_zero_after_step[step]) << "step " << step;
}

// Note [A replaced gradient someone holds keeps its values]: held across
// zero_grad and the backward, the old gradient keeps its values, as in
// torch, and the fresh one is used by the optimizer.
TEST(TorchBridgeTraining, AGradientHeldThroughTheBackwardKeepsItsValues) {
  TrainingSetup setup = adam_setup();
  setup.zero_grad = ZeroGrad::in_place;  // torch's zero_grad(): set to none
  setup.hold_first_gradient = true;
  const TrainingResult plain = train(setup, /*managed=*/false);
  const TrainingResult spilled = train(setup, /*managed=*/true);
  expect_same_results(plain, spilled);
  EXPECT_TRUE(spilled.held_gradient_kept);
  // Held from step 0's update on, it is not discarded at the forward's first op.
  for (std::size_t step = 1; step < spilled.gradients_discarded_after_forward.size(); ++step)
    EXPECT_FALSE(spilled.gradients_discarded_after_forward[step]) << "step " << step;
}

// zero_grad(set_to_none=false): the gradients stay, as zeros the backward
// adds into.
TEST(TorchBridgeTraining, ZeroGradToZerosIsBitIdentical) {
  TrainingSetup setup = adam_setup();
  setup.zero_grad = ZeroGrad::to_zeros;
  expect_bit_identical(setup);
}

TEST(TorchBridgeTraining, GradientAccumulationIsBitIdentical) {
  TrainingSetup setup = sgd_momentum_setup();
  setup.micro_batches = 3;
  expect_bit_identical(setup);
}

TEST(TorchBridgeTraining, AHeadAStepDoesNotReachIsLeftAloneAsInTorch) {
  TrainingSetup setup = sgd_momentum_setup();  // weight decay and momentum
  setup.make_model = make_two_headed_mlp;
  setup.zero_grad = ZeroGrad::after_step;  // the first backward meets manage()'s gradients
  expect_bit_identical(setup);
}

TEST(TorchBridgeTraining, BatchNormRunningStatisticsAreManagedAndStayBitIdentical) {
  TrainingSetup setup = sgd_momentum_setup();
  setup.make_model = make_batch_norm_mlp;
  expect_bit_identical(setup);
  // The chunks hold every parameter, its gradient and every buffer (of a
  // managed run while it lives: Note [A parameter only the bridge holds goes]).
  Training run(setup, /*managed=*/true);
  run.run_step(0);
  std::int64_t bytes = 0;
  for (const torch::Tensor& param : run.module().parameters()) bytes += 2 * param.nbytes();
  for (const torch::Tensor& buffer : run.module().buffers()) bytes += buffer.nbytes();
  // The run's client: the newest "torch#<N>" (earlier tests of this process
  // may have made others).
  const nlohmann::json clients = nlohmann::json::parse(spillway::memory_stats_json()).at("clients");
  int newest = -1;
  for (const auto& [name, figures] : clients.items()) {
    if (name.rfind("torch#", 0) == 0) newest = std::max(newest, std::stoi(name.substr(6)));
  }
  ASSERT_GE(newest, 0) << clients.dump();
  const nlohmann::json& client = clients.at("torch#" + std::to_string(newest));
  EXPECT_EQ(client.at("chunk_bytes.tensors").get<std::int64_t>(), bytes) << client.dump();
}

TEST(TorchBridgeTraining, NewDataOfTheSameLayoutGoesBackIntoTheChunk) {
  TrainingSetup setup = adam_setup();
  setup.set_data_after = 1;
  expect_bit_identical(setup);
}

// After step 0, `replace` gives the first parameter new data of its layout
// (half its values): the values are in its chunk at once, with no step
// boundary in between, and training goes on from them.
void expect_new_data_in_the_chunk_at_once(
    const std::function<void(torch::Tensor& param, const torch::Tensor& data)>& replace) {
  const TrainingSetup setup = adam_setup();  // Training keeps a reference
  Training run(setup, /*managed=*/true);
  run.run_step(0);
  torch::Tensor first = run.module().parameters().front();
  torch::Tensor halved;
  {
    torch::NoGradGuard no_grad;  // set_ on a leaf that requires grad
    halved = first.detach() * 0.5;
    replace(first, halved);
  }
  const torch::Tensor expected = halved.clone();
  EXPECT_TRUE(spillway::is_managed(first)) << "the parameter left its chunk";
  EXPECT_NE(first.storage().unsafeGetStorageImpl(), halved.storage().unsafeGetStorageImpl());
  EXPECT_TRUE(torch::equal(first, expected));
  run.run_step(1);
  EXPECT_TRUE(spillway::is_managed(first));
}

// Note [set_data on a managed parameter, at the call].
TEST(TorchBridgeTraining, SetDataOfTheSameLayoutGoesIntoTheChunkAtTheCall) {
  expect_new_data_in_the_chunk_at_once(
      [](torch::Tensor& param, const torch::Tensor& data) { param.set_data(data); });
}

// Note [set_ on a managed parameter]: right after the op.
TEST(TorchBridgeTraining, SetOfTheSameLayoutGoesIntoTheChunkAfterTheOp) {
  expect_new_data_in_the_chunk_at_once(
      [](torch::Tensor& param, const torch::Tensor& data) { param.set_(data); });
}

TEST(TorchBridgeTraining, SetDataOfAnotherShapeIsRefusedAndChangesNothing) {
  const TrainingSetup setup = adam_setup();  // Training keeps a reference
  Training run(setup, /*managed=*/true);
  run.run_step(0);
  torch::Tensor first = run.module().parameters().front();
  const torch::Tensor before = first.detach().clone();
  try {
    first.set_data(torch::zeros({3, 3}));
    FAIL() << "set_data accepted new data of another shape";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("nothing was changed"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("Unmanage"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(spillway::is_managed(first));
  EXPECT_TRUE(torch::equal(first, before));
  run.run_step(1);  // trains on
}

// set_ is an op, which a hook cannot refuse: the parameter keeps data of
// another layout until the step boundary raises.
TEST(TorchBridgeTraining, SetOfAnotherShapeIsAnErrorAtTheStepBoundary) {
  const TrainingSetup setup = adam_setup();  // Training keeps a reference
  Training run(setup, /*managed=*/true);
  run.run_step(0);
  torch::Tensor first = run.module().parameters().front();
  {
    torch::NoGradGuard no_grad;
    first.set_(torch::zeros({3, 3}));
  }
  auto steps = [] {
    return nlohmann::json::parse(spillway::memory_stats_json()).at("policy").at("steps").get<int>();
  };
  const int steps_before = steps();
  try {
    spillway::step();
    FAIL() << "step() accepted new data of another shape";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("was replaced"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("Unmanage"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(spillway::is_managed(first));
  EXPECT_EQ(steps(), steps_before + 1) << "the step did not end";
  // Unmanaging keeps the new data and drops the chunk's copy.
  spillway::unmanage(run.module());
  EXPECT_TRUE(torch::equal(first, torch::zeros({3, 3})));
}

TEST(TorchBridgeTraining, UnmanageByTensorsThatShareTheStoragesAsBefore) {
  const TrainingSetup setup = adam_setup();  // Training keeps a reference
  Training run(setup, /*managed=*/true);
  run.run_step(0);
  std::vector<torch::Tensor> values;
  std::vector<torch::Tensor> aliases;  // other tensors over the parameters' storages
  for (const torch::Tensor& param : run.module().parameters()) {
    values.push_back(param.detach().clone());
    aliases.push_back(param.detach());
  }
  spillway::Runtime::process().active_allocator()->set_budget_bytes(std::size_t{256} << 20);
  spillway::unmanage(aliases);
  std::size_t index = 0;
  for (const torch::Tensor& param : run.module().parameters()) {
    EXPECT_FALSE(spillway::is_managed(param)) << "parameter " << index;
    EXPECT_TRUE(torch::equal(param, values[index])) << "parameter " << index;
    ++index;
  }
}

TEST(TorchBridgeTraining, TinyTransformerWithAdamIsBitIdentical) {
  TrainingSetup setup = adam_setup();
  setup.make_model = make_tiny_transformer;
  expect_bit_identical(setup);
}

TEST(TorchBridgeTraining, TinyTransformerWithSgdMomentumIsBitIdentical) {
  TrainingSetup setup = sgd_momentum_setup();
  setup.make_model = make_tiny_transformer;
  expect_bit_identical(setup);
}

TEST(TorchBridgeTraining, FrozenParametersGetNoGradientAndStayBitIdentical) {
  TrainingSetup setup = adam_setup();
  setup.freeze_first_parameters = 2;  // the first layer's weight and bias
  expect_bit_identical(setup);
}

TEST(TorchBridgeTraining, UnmanageMidwayKeepsTraining) {
  TrainingSetup setup = adam_setup();
  setup.unmanage_after = kSteps / 2;
  expect_same_results(train(setup, /*managed=*/false), train(setup, /*managed=*/true));
}

// Note [A parameter only the bridge holds goes] (hooks/torch/dropped_params.cc):
// a model trained under a spilling budget and destroyed, with its optimizer,
// without unmanage gives its chunks back at the next step boundary. A
// parameter the program still holds, or a view of another's data, stays
// managed with its values, and goes when it is dropped too.
TEST(TorchBridgeTraining, ADestroyedModelGivesItsChunksBack) {
  auto chunk_bytes = [] { return stat("chunk_bytes.host") + stat("chunk_bytes.device"); };
  spillway::step();
  const std::uint64_t before_tensors = stat("chunk_bytes.tensors");
  const std::uint64_t before_bytes = chunk_bytes();
  torch::Tensor kept;
  torch::Tensor alias;
  std::uint64_t managed_bytes = 0;
  {
    const TrainingSetup setup = sgd_momentum_setup();
    Training run(setup, /*managed=*/true);
    for (int step = 0; step < 2; ++step) run.run_step(step);
    managed_bytes = chunk_bytes();
    ASSERT_GT(managed_bytes, before_bytes);
    const std::vector<torch::Tensor> params = run.module().parameters();
    kept = params.front();                     // the parameter itself
    alias = params[params.size() / 2].data();  // a tensor of its own over another's storage
  }
  const torch::Tensor kept_values = kept.detach().clone();
  const torch::Tensor alias_values = alias.clone();
  spillway::step();
  const std::uint64_t held_bytes = chunk_bytes();
  EXPECT_GT(held_bytes, before_bytes);
  EXPECT_LT(held_bytes, managed_bytes) << "the parameters nothing holds went";
  EXPECT_TRUE(spillway::is_managed(kept));
  EXPECT_TRUE(spillway::is_managed(alias));
  EXPECT_TRUE(torch::equal(kept.detach().clone(), kept_values));
  EXPECT_TRUE(torch::equal(alias.clone(), alias_values));
  kept = torch::Tensor();
  alias = torch::Tensor();
  spillway::step();
  EXPECT_EQ(stat("chunk_bytes.tensors"), before_tensors) << "the client went with its chunks";
  EXPECT_EQ(chunk_bytes(), before_bytes);
}

// Design section 3: one chunk manager serves every model in the process. An
// actor (Adam) and a critic (SGD), managed separately and trained in turns
// under the one budget, each match its solo run without spillway.
TEST(TorchBridgeTraining, ActorAndCriticInterleavedMatchTheirSoloRuns) {
  TrainingSetup actor = adam_setup();
  TrainingSetup critic = sgd_momentum_setup();
  critic.model_seed = 2;
  critic.data_seed = 3;
  const TrainingResult actor_solo = train(actor, /*managed=*/false);
  const TrainingResult critic_solo = train(critic, /*managed=*/false);

  Training actor_run(actor, /*managed=*/true);
  Training critic_run(critic, /*managed=*/true);
  Training::set_budget_for({&actor_run, &critic_run});
  const std::uint64_t fetched_before = stat("bytes_moved.h2d");
  for (int step = 0; step < kSteps; ++step) {
    actor_run.run_step(step);
    critic_run.run_step(step);
  }
  {
    SCOPED_TRACE("actor");
    expect_same_results(actor_solo, actor_run.finish());
  }
  {
    SCOPED_TRACE("critic");
    expect_same_results(critic_solo, critic_run.finish());
  }
  EXPECT_GT(stat("bytes_moved.h2d"), fetched_before);
  EXPECT_GT(stat("evictions"), 0u);
}

// The actor and the critic, managed, a step of each in turn under one budget.
// `before_finish` runs after the last step, before finish() reads the
// parameters (reads that depart from the step).
std::pair<TrainingResult, TrainingResult> train_in_turns(
    const TrainingSetup& actor, const TrainingSetup& critic,
    const std::function<void()>& before_finish = [] {}) {
  Training actor_run(actor, /*managed=*/true);
  Training critic_run(critic, /*managed=*/true);
  Training::set_budget_for({&actor_run, &critic_run});
  for (int step = 0; step < kSteps; ++step) {
    actor_run.run_step(step);
    critic_run.run_step(step);
  }
  before_finish();
  TrainingResult actor_result = actor_run.finish();
  return {std::move(actor_result), critic_run.finish()};
}

// Issue 16, item 2: stock torch::optim optimizers and a plain loop that never
// calls spillway::step(). The two models' accesses repeat each step, so
// policy:planned finds the step in them and follows it; both stay
// bit-identical to their solo runs under either policy.
TEST(TorchBridgeTraining, TwoModelsThatNeverMarkAStepAreFollowedAndMatchTheirSoloRuns) {
  TrainingSetup actor = adam_setup();
  TrainingSetup critic = sgd_momentum_setup();
  critic.model_seed = 2;
  critic.data_seed = 3;
  actor.mark_steps = false;
  critic.mark_steps = false;
  // ctest runs each test in a process of its own; run together with others,
  // an earlier test's step marks have already ended detection.
  const nlohmann::json before = nlohmann::json::parse(spillway::memory_stats_json());
  const bool marked_before = before.contains("policy") && before["policy"]["steps"] != 0;
  const TrainingResult actor_solo = train(actor, /*managed=*/false);
  const TrainingResult critic_solo = train(critic, /*managed=*/false);

  nlohmann::json policy;
  const auto [actor_managed, critic_managed] = train_in_turns(actor, critic, [&policy] {
    policy = nlohmann::json::parse(spillway::memory_stats_json()).at("policy");
  });
  {
    SCOPED_TRACE("actor");
    expect_same_results(actor_solo, actor_managed);
  }
  {
    SCOPED_TRACE("critic");
    expect_same_results(critic_solo, critic_managed);
  }
  EXPECT_GT(stat("evictions"), 0u);
  if (policy.at("name") != "planned") return;
  if (marked_before) GTEST_SKIP() << "an earlier test in this process marked steps";
  // Adam's first step creates its state, so steps 2 and 3 are the first two
  // alike: the step is found at the end of the third at the latest.
  EXPECT_EQ(policy.at("phase"), "following") << policy.dump();
  EXPECT_GE(policy.at("planned_steps").get<int>(), kSteps - 3) << policy.dump();
  EXPECT_EQ(policy.at("steps"), 0) << "steps found are not the program's marks: " << policy.dump();
  // (A loop found inside the first steps may have been followed and departed
  // from first: divergences are not asserted.)
  EXPECT_GT(policy.at("detected_period").get<int>(), 0) << policy.dump();
}

// A directory of its own under the test's temporary directory, made with
// mkdtemp, not std::filesystem: libtorch.so carries std::filesystem symbols of
// its own, which the dynamic linker may bind to (remove_all faults).
class CheckpointDirectory {
 public:
  CheckpointDirectory() : path_(testing::TempDir() + "spillway_checkpoint_XXXXXX") {
    if (mkdtemp(path_.data()) == nullptr)
      throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
  }
  ~CheckpointDirectory() {
    for (const char* run : {"actor", "critic"}) {
      for (const char* what : {"model", "optimizer"})
        std::remove(checkpoint_path(path_ + "/" + run, what).c_str());
      rmdir((path_ + "/" + run).c_str());
    }
    rmdir(path_.c_str());
  }
  std::string subdirectory(const std::string& name) const {
    const std::string path = path_ + "/" + name;
    mkdir(path.c_str(), 0700);
    return path;
  }

 private:
  std::string path_;
};

// Issue 16, item 4, in C++: the program of the test above (two models, stock
// torch::optim optimizers, no step marks) loads a checkpoint mid-run with
// torch::load, most chunks evicted, under strict_residency: the loaded values
// go into the managed modules' chunks (Note [set_ on a managed parameter]),
// and both runs stay bit-identical to their solo runs without spillway. The
// checkpoint is the plain run's torch::save of the same step. (torch::save of
// a managed module reads a CPU tensor's bytes with no op: on the sim device it
// faults on an evicted chunk under strict_residency, and may read a host copy
// whose write-back is still in flight without it; docs/torch-bridge.md.)
TEST(TorchBridgeCheckpoint, LoadedMidRunWithChunksEvictedAsWithoutSpillway) {
  const CheckpointDirectory directory;
  TrainingSetup actor = adam_setup();
  TrainingSetup critic = sgd_momentum_setup();
  critic.model_seed = 2;
  critic.data_seed = 3;
  actor.save_after = 1;
  actor.load_after = 3;  // back to step 1's values
  actor.checkpoint_dir = directory.subdirectory("actor");
  critic.save_after = 2;
  critic.load_after = 4;
  critic.checkpoint_dir = directory.subdirectory("critic");
  for (TrainingSetup* setup : {&actor, &critic}) setup->mark_steps = false;

  const TrainingResult actor_solo = train(actor, /*managed=*/false);
  const TrainingResult critic_solo = train(critic, /*managed=*/false);
  const auto [actor_managed, critic_managed] = train_in_turns(actor, critic);
  for (auto [name, solo, managed] : {std::tuple{"actor", &actor_solo, &actor_managed},
                                     std::tuple{"critic", &critic_solo, &critic_managed}}) {
    SCOPED_TRACE(name);
    expect_same_results(*solo, *managed);
    EXPECT_GT(managed->evictions_before_load, 0u) << "nothing was evicted before the load";
    for (std::size_t i = 0; i < managed->params_in_chunks.size(); ++i)
      EXPECT_TRUE(managed->params_in_chunks[i]) << "parameter " << i << " left its chunk";
  }
}

// A read fault kills the process with SIGSEGV, except under ASan, which
// catches the signal, reports the SEGV and then exits or aborts
// (ASAN_OPTIONS=abort_on_error) on its own.
#if defined(__SANITIZE_ADDRESS__)
auto faulted_on_a_read() {
  return [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); };
}
constexpr const char* kFaultReport = "AddressSanitizer: SEGV";
#else
testing::KilledBySignal faulted_on_a_read() { return testing::KilledBySignal(SIGSEGV); }
constexpr const char* kFaultReport = "";
#endif

// strict_residency: bytes read behind the op hooks' back (a raw data_ptr
// read, which is no op) fault for a parameter whose chunk was evicted.
TEST(TorchBridgeStrictResidencyDeathTest, RawReadOfAnEvictedParameterFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ModelUnderTest model = make_mlp();
        spillway::configure(conf());
        spillway::manage(*model.module);
        torch::optim::SGD optimizer(model.module->parameters(), torch::optim::SGDOptions(0.1));
        const torch::Tensor loss = model.forward(torch::randn({kBatch, kInputs})).sum();
        loss.backward();
        optimizer.step();
        volatile float sum = 0;
        for (const torch::Tensor& param : model.module->parameters())
          sum = sum + *param.data_ptr<float>();
        std::fprintf(stderr, "read every parameter: %f\n", static_cast<float>(sum));
        std::exit(0);
      },
      faulted_on_a_read(), kFaultReport);
}

TEST(TorchBridgeConfigure, BadConfigurationThrowsWithTheMessage) {
  try {
    spillway::configure("chunk_size:lots");
    FAIL() << "configure accepted a bad chunk_size";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("chunk_size"), std::string::npos) << e.what();
  }
}

}  // namespace
