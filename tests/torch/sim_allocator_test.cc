// On the simulated device spillway is torch's CPU allocator (Note [torch's CPU
// allocator on the sim device] in hooks/torch/sim_torch_allocator.cc):
// activations, temporaries and a stock optimizer's state share the device
// budget with the chunks, a request that does not fit spills chunks, and only
// when nothing can spill does it fail, as torch's c10::OutOfMemoryError, after
// which training goes on. Memory made before the install is freed through the
// allocator that made it.
//
// One configuration for the program (the process runtime is configured once):
// 2 MiB chunks under a 16 MiB budget, strict residency. The small GPT's
// parameters and gradients (about 15 MiB) and its activations (about 6 MiB at
// batch 4) each fit in the budget, but not together.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Context.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "allocator/runtime.h"
#include "hooks/torch/sim_torch_allocator.h"
#include "hooks/torch/spillway_torch.h"

namespace {

using spillway::torch_bridge::HostWorkScope;

constexpr const char* kConf =
    "device:sim,strict_residency:true,chunk_size:2MiB,device_budget:16MiB,sim_capacity:256MiB,"
    "policy:lru";
constexpr std::int64_t kBudgetBytes = std::int64_t{16} << 20;

// --- What torch allocated before spillway activated --------------------------

// Made by static initialisation, before main and so before any test
// activates spillway: memory torch's own CPU allocator handed out.
struct BeforeActivation {
  BeforeActivation() {
    torch::manual_seed(7);
    allocator = c10::GetAllocator(c10::DeviceType::CPU);
    freed_later = torch::arange(1024, torch::kFloat);
    resized_later = torch::arange(256, torch::kFloat);
    raw = allocator->raw_allocate(4096);
    std::memset(raw, 0x5A, 4096);
    conv_input = torch::randn({2, 3, 16, 16});
    conv_weight = torch::randn({4, 3, 3, 3});
    conv_bias = torch::randn({4});
    if (mkldnn_usable()) conv_output = mkldnn_conv();
  }
  static bool mkldnn_usable() { return at::hasMKLDNN() && at::globalContext().userEnabledMkldnn(); }
  // oneDNN's convolution: its scratch memory comes from raw_allocate.
  torch::Tensor mkldnn_conv() const {
    return at::mkldnn_convolution(conv_input, conv_weight, conv_bias, /*padding=*/{1, 1},
                                  /*stride=*/{1, 1}, /*dilation=*/{1, 1}, /*groups=*/1);
  }

  c10::Allocator* allocator = nullptr;
  torch::Tensor freed_later;
  torch::Tensor resized_later;
  void* raw = nullptr;
  torch::Tensor conv_input, conv_weight, conv_bias, conv_output;
};
BeforeActivation& before_activation() {
  static BeforeActivation* const made = new BeforeActivation();  // lives to the end
  return *made;
}
[[maybe_unused]] const bool g_made_before_main = (before_activation(), true);

// --- Helpers -----------------------------------------------------------------

void activate() {
  torch::set_num_threads(1);
  spillway::configure(kConf);
  spillway::activate();
  ASSERT_TRUE(spillway::torch_bridge::sim_torch_allocator_installed());
}

nlohmann::json stats() { return nlohmann::json::parse(spillway::memory_stats_json()); }

std::int64_t stat(const std::string& key) {
  const nlohmann::json json = stats();
  return json.contains(key) ? json.at(key).get<std::int64_t>() : 0;
}

// Bytes allocated outside chunks (activations, temporaries, state outside
// chunks).
std::int64_t non_model_bytes() {
  return stats().at("allocated_bytes.non_model.current").get<std::int64_t>();
}

std::string holdings() { return spillway::Runtime::process().chunk_manager().describe_holdings(); }

// The number of chunks the chunk manager holds ("chunk manager: N chunks of").
int chunk_count() {
  const std::string text = holdings();
  const std::size_t at = text.find(": ");
  return at == std::string::npos ? -1 : std::stoi(text.substr(at + 2));
}

// --- A small GPT ---------------------------------------------------------------

constexpr std::int64_t kVocab = 512;
constexpr std::int64_t kModel = 256;
constexpr std::int64_t kHeads = 4;
constexpr std::int64_t kSequence = 32;
constexpr std::int64_t kSmallBatch = 4;
constexpr std::int64_t kHugeBatch = 256;  // activations far beyond the budget
constexpr int kSteps = 4;

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kModel})));
    qkv = register_module("qkv", torch::nn::Linear(kModel, 3 * kModel));
    proj = register_module("proj", torch::nn::Linear(kModel, kModel));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kModel})));
    fc = register_module("fc", torch::nn::Linear(kModel, 4 * kModel));
    out = register_module("out", torch::nn::Linear(4 * kModel, kModel));
  }
  torch::Tensor forward(const torch::Tensor& x) {  // [batch, sequence, model]
    const std::int64_t batch = x.size(0), sequence = x.size(1), head = kModel / kHeads;
    const std::vector<torch::Tensor> parts = qkv->forward(ln1->forward(x)).chunk(3, -1);
    auto heads = [&](const torch::Tensor& t) {
      return t.view({batch, sequence, kHeads, head}).transpose(1, 2);
    };
    const torch::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    const torch::Tensor causal =
        torch::ones({sequence, sequence}, torch::kBool).triu(1);  // true above the diagonal
    const torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(head));
    const torch::Tensor attention = torch::softmax(scores.masked_fill(causal, -1e9), -1);
    const torch::Tensor mixed =
        torch::matmul(attention, v).transpose(1, 2).reshape({batch, sequence, kModel});
    const torch::Tensor h = x + proj->forward(mixed);
    return h + out->forward(torch::gelu(fc->forward(ln2->forward(h))));
  }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, out{nullptr};
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  GptImpl() {
    tokens = register_module("tokens", torch::nn::Embedding(kVocab, kModel));
    positions = register_module("positions", torch::nn::Embedding(kSequence, kModel));
    block0 = register_module("block0", Block());
    block1 = register_module("block1", Block());
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kModel})));
    head = register_module("head",
                           torch::nn::Linear(torch::nn::LinearOptions(kModel, kVocab).bias(false)));
  }
  torch::Tensor loss(const torch::Tensor& ids, const torch::Tensor& targets) {
    const torch::Tensor where = torch::arange(ids.size(1), torch::kLong);
    torch::Tensor x = tokens->forward(ids) + positions->forward(where);
    x = block1->forward(block0->forward(x));
    const torch::Tensor logits = head->forward(ln->forward(x));
    return torch::cross_entropy_loss(logits.view({-1, kVocab}), targets.view({-1}));
  }
  torch::nn::Embedding tokens{nullptr}, positions{nullptr};
  Block block0{nullptr}, block1{nullptr};
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Gpt);

struct Batch {
  torch::Tensor ids, targets;
};

std::vector<Batch> gpt_batches(std::uint64_t seed, std::int64_t batch, int steps) {
  torch::manual_seed(seed);
  std::vector<Batch> batches;
  for (int step = 0; step < steps; ++step)
    batches.push_back({torch::randint(kVocab, {batch, kSequence}, torch::kLong),
                       torch::randint(kVocab, {batch, kSequence}, torch::kLong)});
  return batches;
}

Gpt make_gpt() {
  torch::manual_seed(3);
  return Gpt();
}

torch::Tensor gpt_step(Gpt& model, torch::optim::Optimizer& optimizer, const Batch& batch,
                       bool managed) {
  optimizer.zero_grad();
  const torch::Tensor loss = model->loss(batch.ids, batch.targets);
  loss.backward();
  optimizer.step();
  if (managed) spillway::step();
  return loss.detach().clone();
}

struct Trained {
  std::vector<torch::Tensor> losses;
  std::vector<torch::Tensor> params;
};

std::vector<torch::Tensor> params_copy(Gpt& model) {
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& param : model->parameters()) params.push_back(param.detach().clone());
  return params;
}

// The reference: plain torch on torch's own memory (a HostWorkScope keeps it
// off the simulated device), never managed.
Trained plain_gpt_run(const std::vector<Batch>& data) {
  HostWorkScope host;
  Gpt model = make_gpt();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  Trained trained;
  for (const Batch& batch : data)
    trained.losses.push_back(gpt_step(model, optimizer, batch, /*managed=*/false));
  trained.params = params_copy(model);
  return trained;
}

void expect_equal(const Trained& plain, const std::vector<torch::Tensor>& losses,
                  const std::vector<torch::Tensor>& params) {
  ASSERT_EQ(plain.losses.size(), losses.size());
  for (std::size_t step = 0; step < losses.size(); ++step)
    EXPECT_TRUE(torch::equal(plain.losses[step], losses[step]))
        << "step " << step << ": " << plain.losses[step].item<float>() << " plain, "
        << losses[step].item<float>() << " under spillway";
  ASSERT_EQ(plain.params.size(), params.size());
  for (std::size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::equal(plain.params[i], params[i])) << "parameter " << i << " differs";
}

// --- Tests ------------------------------------------------------------------------

// Chunks plus activations exceed the budget: the activations' allocations
// spill chunks, and training stays bit-identical to plain torch.
TEST(SimTorchAllocator, SmallGptWhoseChunksAndActivationsExceedTheBudgetIsBitIdentical) {
  activate();
  const std::vector<Batch> data = gpt_batches(11, kSmallBatch, kSteps);
  const Trained plain = plain_gpt_run(data);

  Gpt model = make_gpt();
  spillway::manage(*model);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  spillway::Runtime::process().active_allocator()->reset_peak_stats();
  const std::int64_t evictions_before = stat("evictions");
  std::vector<torch::Tensor> losses;
  std::int64_t peak_non_model = 0;
  for (const Batch& batch : data) {
    optimizer.zero_grad();
    const torch::Tensor loss = model->loss(batch.ids, batch.targets);
    peak_non_model = std::max(peak_non_model, non_model_bytes());  // the activations, held
    loss.backward();
    optimizer.step();
    spillway::step();
    losses.push_back(loss.detach().clone());
  }
  expect_equal(plain, losses, params_copy(model));

  const std::int64_t chunk_bytes = stat("chunk_bytes.device") + stat("chunk_bytes.host");
  std::cout << "chunks " << chunk_bytes << " bytes, activations after forward " << peak_non_model
            << " bytes, allocated peak " << stat("allocated_bytes.all.peak") << ", budget "
            << kBudgetBytes << "\n";
  EXPECT_GT(chunk_bytes + peak_non_model, kBudgetBytes) << "the test must not fit";
  // Activations count, and allocations spilled chunks.
  EXPECT_GT(peak_non_model, 2 << 20);
  EXPECT_GE(stat("allocated_bytes.non_model.peak"), peak_non_model);
  EXPECT_GE(stat("allocated_bytes.all.peak"), peak_non_model);
  EXPECT_GT(stat("allocated_bytes.model.peak"), 0);
  EXPECT_GT(stat("num_spills_for_allocation"), 0);
  EXPECT_LE(stat("reserved_bytes.all.peak"), kBudgetBytes);
  EXPECT_GT(stat("evictions"), evictions_before) << "allocations spilled no chunk";
}

// A batch whose activations alone exceed the budget fails with torch's
// out-of-memory error, naming the figures; then the same process trains on
// at a smaller batch, exactly as a run that never tried the large one.
TEST(SimTorchAllocator, TooLargeABatchThrowsTorchsOutOfMemoryErrorAndTrainingGoesOn) {
  activate();
  const std::vector<Batch> data = gpt_batches(12, kSmallBatch, kSteps);
  const Trained plain = plain_gpt_run(data);

  Gpt model = make_gpt();
  spillway::manage(*model);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  std::vector<torch::Tensor> losses;
  losses.push_back(gpt_step(model, optimizer, data[0], /*managed=*/true));
  const Batch huge = gpt_batches(13, kHugeBatch, 1)[0];
  const int chunks_before = chunk_count();
  const std::int64_t non_model_before = non_model_bytes();
  const std::int64_t ooms_before = stat("num_ooms");

  try {
    gpt_step(model, optimizer, huge, /*managed=*/true);
    FAIL() << "a batch of " << kHugeBatch << " fitted in " << kBudgetBytes << " bytes";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string message = e.what();
    std::cout << "the error: " << message.substr(0, message.find('\n')) << "\n";
    for (const char* figure :
         {"torch asked for", "Budget 16.00 MiB", "in model chunks", "in other tensors", "reserved",
          "largest free block", "in compute", "smaller batch", "raise device_budget"})
      EXPECT_NE(message.find(figure), std::string::npos) << "no '" << figure << "' in: " << message;
  }
  EXPECT_GT(stat("num_ooms"), ooms_before);
  // Consistent afterwards: no chunk pinned, none lost (and their bytes intact:
  // the training below is bit-identical), the failed step's tensors all freed.
  EXPECT_NE(holdings().find("(0 in compute)"), std::string::npos) << holdings();
  EXPECT_EQ(chunk_count(), chunks_before) << holdings();
  EXPECT_EQ(non_model_bytes(), non_model_before);

  for (int step = 1; step < kSteps; ++step)
    losses.push_back(gpt_step(model, optimizer, data[step], /*managed=*/true));
  expect_equal(plain, losses, params_copy(model));
}

// torch::optim::Adam makes its state (exp_avg, exp_avg_sq) at the first
// step, as ordinary tensors: they count against the budget.
TEST(SimTorchAllocator, AdamsLazilyCreatedStateCountsAgainstTheBudget) {
  activate();
  torch::manual_seed(5);
  torch::nn::Sequential model(torch::nn::Linear(256, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 256));
  spillway::manage(*model);
  std::int64_t param_bytes = 0;
  for (const torch::Tensor& param : model->parameters())
    param_bytes += param.numel() * static_cast<std::int64_t>(param.element_size());
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  adam.zero_grad();
  model->forward(torch::randn({8, 256})).sum().backward();
  spillway::step();  // autograd's fresh gradients (set-to-none zero_grad) into their chunks
  const std::int64_t before = non_model_bytes();
  adam.step();
  const std::int64_t after = non_model_bytes();
  EXPECT_GE(after - before, 2 * param_bytes) << "Adam's state is not on the device";
}

TEST(SimTorchAllocator, MemoryFromBeforeTheInstallIsFreedAndResizedByItsOwnAllocator) {
  activate();
  BeforeActivation& before = before_activation();
  ASSERT_NE(c10::GetAllocator(c10::DeviceType::CPU), before.allocator);
  const std::int64_t allocated = stat("allocated_bytes.all.current");

  // resize_ grows through the storage's allocator: torch's own.
  before.resized_later.resize_({1 << 16});
  EXPECT_TRUE(
      torch::equal(before.resized_later.slice(0, 0, 256), torch::arange(256, torch::kFloat)));
  EXPECT_EQ(stat("allocated_bytes.all.current"), allocated);
  before.resized_later = torch::Tensor();
  before.freed_later = torch::Tensor();  // freed by torch's allocator, after the install
  EXPECT_EQ(stat("allocated_bytes.all.current"), allocated);

  // A tensor made now grows on the device.
  torch::Tensor now = torch::arange(256, torch::kFloat);
  now.resize_({1 << 16});
  EXPECT_GE(stat("allocated_bytes.all.current"), allocated + (1 << 18));
  now = torch::Tensor();
  EXPECT_EQ(stat("allocated_bytes.all.current"), allocated);
}

TEST(SimTorchAllocator, RawAllocationsWorkAcrossTheInstall) {
  activate();
  BeforeActivation& before = before_activation();
  c10::Allocator* allocator = c10::GetAllocator(c10::DeviceType::CPU);
  const std::int64_t allocated = stat("allocated_bytes.all.current");
  // raw_allocate'd by torch's allocator before the install, freed through ours.
  ASSERT_NE(before.raw, nullptr);
  EXPECT_EQ(static_cast<unsigned char*>(before.raw)[4095], 0x5A);
  allocator->raw_deallocate(before.raw);
  before.raw = nullptr;

  void* raw = allocator->raw_allocate(1 << 20);
  EXPECT_GE(stat("allocated_bytes.all.current"), allocated + (1 << 20));
  std::memset(raw, 1, 1 << 20);
  allocator->raw_deallocate(raw);
  EXPECT_EQ(stat("allocated_bytes.all.current"), allocated);

  void* host = nullptr;
  {
    HostWorkScope host_work;
    host = allocator->raw_allocate(4096);
  }
  EXPECT_EQ(stat("allocated_bytes.all.current"), allocated);
  allocator->raw_deallocate(host);  // the previous allocator's, by address

  // Size 0, as torch makes them.
  void* empty = allocator->raw_allocate(0);
  allocator->raw_deallocate(empty);
  const torch::Tensor none = torch::empty({0});
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(torch::cat({none, torch::ones({2})}).sum().item<float>(), 2.0f);
}

TEST(SimTorchAllocator, OneDnnConvolutionAcrossTheInstallGivesTheSameResult) {
  activate();
  BeforeActivation& before = before_activation();
  if (!BeforeActivation::mkldnn_usable()) GTEST_SKIP() << "this torch has no oneDNN";
  // oneDNN may keep what its first call here makes (its primitive cache);
  // later calls give all their memory back.
  EXPECT_TRUE(torch::equal(before.mkldnn_conv(), before.conv_output));
  const std::int64_t allocated = stat("allocated_bytes.all.current");
  for (int i = 0; i < 3; ++i) {
    const torch::Tensor now = before.mkldnn_conv();
    EXPECT_TRUE(torch::equal(now, before.conv_output));
  }
  EXPECT_EQ(stat("allocated_bytes.all.current"), allocated);
  {
    const torch::Tensor conv2d = torch::conv2d(before.conv_input, before.conv_weight,
                                               before.conv_bias, /*stride=*/1, /*padding=*/1);
    EXPECT_TRUE(torch::allclose(conv2d, before.conv_output));
  }
  const std::int64_t kept = stat("allocated_bytes.all.current");
  before.conv_output = torch::Tensor();  // made before the install: torch's own allocator frees it
  EXPECT_EQ(stat("allocated_bytes.all.current"), kept);
}

// Several threads allocating through torch at once; every block comes back.
TEST(SimTorchAllocator, ThreadsAllocatingAtOnceGetTheirOwnMemory) {
  activate();
  torch::manual_seed(9);
  const torch::Tensor a = torch::randn({64, 64});
  const torch::Tensor expected = torch::matmul(a, a).sum();
  const std::int64_t allocated = stat("allocated_bytes.all.current");
  constexpr int kThreads = 4;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const torch::Tensor own = torch::full({(t + 1) * 1000 + i}, float(t));
        const torch::Tensor product = torch::matmul(a, a).sum();
        if (!torch::equal(product, expected) || own.sum().item<float>() != float(t) * own.numel())
          ++wrong;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(stat("allocated_bytes.all.current"), allocated);
}

}  // namespace
