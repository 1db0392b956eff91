// A small GPT-style language model, built from basic LibTorch ops (attention
// spelt out rather than scaled_dot_product_attention, whose kernel choice
// varies by device and version): token and
// position embeddings, pre-LayerNorm blocks of causal multi-head
// self-attention and a GELU MLP, a final LayerNorm and an untied LM head.
// It has no dropout, so a step is a pure function of the parameters and the
// batch: the demo relies on that to compare runs bit for bit.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace spillway::train_demo {

struct GptConfig {
  std::int64_t vocab = 64;
  std::int64_t sequence = 16;  // the longest context the position table holds
  std::int64_t d_model = 256;
  std::int64_t heads = 4;
  std::int64_t layers = 4;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // [batch, time, d_model]

 private:
  std::int64_t heads_;
  torch::nn::Linear qkv_{nullptr};
  torch::nn::Linear projection_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class GptBlockImpl : public torch::nn::Module {
 public:
  explicit GptBlockImpl(const GptConfig& config);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::LayerNorm attention_norm_{nullptr};
  CausalSelfAttention attention_{nullptr};
  torch::nn::LayerNorm mlp_norm_{nullptr};
  torch::nn::Linear mlp_in_{nullptr};
  torch::nn::Linear mlp_out_{nullptr};
};
TORCH_MODULE(GptBlock);

class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const GptConfig& config);
  // tokens: [batch, time] int64, time <= config.sequence. Logits: [batch, time, vocab].
  torch::Tensor forward(const torch::Tensor& tokens);
  const GptConfig& config() const { return config_; }

 private:
  GptConfig config_;
  torch::nn::Embedding token_embedding_{nullptr};
  torch::nn::Embedding position_embedding_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm final_norm_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(Gpt);

}  // namespace spillway::train_demo
