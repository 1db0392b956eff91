#include "tools/train_demo/gpt.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace spillway::train_demo {

namespace nn = torch::nn;

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& config) : heads_(config.heads) {
  if (config.d_model % config.heads != 0)
    throw std::invalid_argument("d_model must be a multiple of the number of heads");
  qkv_ = register_module("qkv", nn::Linear(config.d_model, 3 * config.d_model));
  projection_ = register_module("projection", nn::Linear(config.d_model, config.d_model));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const std::int64_t batch = x.size(0), time = x.size(1), width = x.size(2);
  const std::int64_t head_width = width / heads_;
  const auto split_heads = [&](const torch::Tensor& t) {
    return t.view({batch, time, heads_, head_width}).transpose(1, 2);  // [b, h, t, hw]
  };
  const std::vector<torch::Tensor> qkv = qkv_->forward(x).chunk(3, -1);
  const torch::Tensor q = split_heads(qkv[0]), k = split_heads(qkv[1]), v = split_heads(qkv[2]);
  torch::Tensor scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(double(head_width));
  // Built per call rather than held as a buffer: it is tiny, and a buffer
  // would be model state that spillway does not manage.
  const torch::Tensor future =
      torch::ones({time, time}, torch::dtype(torch::kBool).device(x.device())).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  const torch::Tensor mixed = scores.softmax(-1).matmul(v);  // [b, h, t, hw]
  return projection_->forward(mixed.transpose(1, 2).contiguous().view({batch, time, width}));
}

GptBlockImpl::GptBlockImpl(const GptConfig& config) {
  const std::vector<std::int64_t> width{config.d_model};
  attention_norm_ = register_module("attention_norm", nn::LayerNorm(nn::LayerNormOptions(width)));
  attention_ = register_module("attention", CausalSelfAttention(config));
  mlp_norm_ = register_module("mlp_norm", nn::LayerNorm(nn::LayerNormOptions(width)));
  mlp_in_ = register_module("mlp_in", nn::Linear(config.d_model, 4 * config.d_model));
  mlp_out_ = register_module("mlp_out", nn::Linear(4 * config.d_model, config.d_model));
}

torch::Tensor GptBlockImpl::forward(torch::Tensor x) {
  x = x + attention_->forward(attention_norm_->forward(x));
  return x + mlp_out_->forward(torch::gelu(mlp_in_->forward(mlp_norm_->forward(x))));
}

GptImpl::GptImpl(const GptConfig& config) : config_(config) {
  token_embedding_ =
      register_module("token_embedding", nn::Embedding(config.vocab, config.d_model));
  position_embedding_ =
      register_module("position_embedding", nn::Embedding(config.sequence, config.d_model));
  blocks_ = register_module("blocks", nn::ModuleList());
  for (std::int64_t i = 0; i < config.layers; ++i) blocks_->push_back(GptBlock(config));
  final_norm_ = register_module(
      "final_norm", nn::LayerNorm(nn::LayerNormOptions(std::vector<std::int64_t>{config.d_model})));
  head_ = register_module("head", nn::Linear(config.d_model, config.vocab));
}

torch::Tensor GptImpl::forward(const torch::Tensor& tokens) {
  const std::int64_t time = tokens.size(1);
  if (time > config_.sequence)
    throw std::invalid_argument("sequence longer than the position table");
  const torch::Tensor positions =
      torch::arange(time, torch::dtype(torch::kLong).device(tokens.device()));
  torch::Tensor x = token_embedding_->forward(tokens) + position_embedding_->forward(positions);
  for (const auto& block : *blocks_) x = block->as<GptBlockImpl>()->forward(x);
  return head_->forward(final_norm_->forward(x));
}

}  // namespace spillway::train_demo
