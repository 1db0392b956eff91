// Model descriptions: the JSON format, its errors, the GPT generator's sizes
// and the step's op sequence and chunk layout.
#include <gtest/gtest.h>

#include <string>

#include "tools/sim/model_description.h"

namespace spillway::sim {
namespace {

TEST(ModelDescription, ParsesLayersWithDefaultsAndRepeat) {
  const ModelSpec model = parse_model(R"({"name": "m", "repeat": 2, "layers": [
      {"param_bytes": 100, "forward_ns": 5, "optimizer_bytes": 600}]})");
  ASSERT_EQ(model.layers.size(), 2u);
  EXPECT_EQ(model.layers[0].grad_bytes, 100u);
  EXPECT_EQ(model.layers[0].backward_ns, 10u);
  EXPECT_EQ(model.model_bytes(), 2u * 800u);
}

TEST(ModelDescription, ErrorsNameTheField) {
  try {
    parse_model(R"({"layers": [{"forward_ns": 5}]})");
    FAIL();
  } catch (const ModelError& error) {
    EXPECT_STREQ(error.what(), "layers[0]: missing \"param_bytes\"");
  }
  EXPECT_THROW(parse_model("{"), ModelError);
  EXPECT_THROW(parse_model(R"({"layers": []})"), ModelError);
  EXPECT_THROW(parse_model(R"({"layers": [{"param_bytes": -1, "forward_ns": 1}]})"), ModelError);
}

// Note [Numbers a description may hold]: each error names the field.
TEST(ModelDescription, NumbersOutOfRangeAreErrorsNamingTheField) {
  const auto message = [](const std::string& json) -> std::string {
    try {
      parse_model(json);
    } catch (const ModelError& error) {
      return error.what();
    }
    return "parsed";
  };
  EXPECT_EQ(message(R"({"layers": [{"param_bytes": 1e18, "forward_ns": 1}]})"),
            "layers[0]: \"param_bytes\" must be a non-negative number");
  EXPECT_EQ(message(R"({"layers": [{"param_bytes": 1000000000000000000, "forward_ns": 1}]})"),
            "layers[0]: \"param_bytes\" is 1000000000000000000, more than 2^50");
  EXPECT_EQ(
      message(R"({"repeat": 1000000000000, "layers": [{"param_bytes": 1, "forward_ns": 1}]})"),
      "description: 1000000000000 repeats of 1 layers are more than 100000 layers");
  EXPECT_EQ(message(R"({"name": 3, "layers": [{"param_bytes": 1, "forward_ns": 1}]})"),
            "description: \"name\" must be a string");
  EXPECT_EQ(message(R"({"layers": [{"name": [], "param_bytes": 1, "forward_ns": 1}]})"),
            "layers[0]: \"name\" must be a string");
  EXPECT_EQ(message(R"({"gpt": {"n_layers": 1, "d_model": 64, "seq": 1, "batch": 1,
                                "flops_per_s": 0}})"),
            "gpt: \"flops_per_s\" must be a positive number");
  EXPECT_NE(message(R"({"gpt": {"n_layers": 1000000, "d_model": 64, "seq": 1, "batch": 1}})")
                .find("gpt: n_layers at most 100000"),
            std::string::npos);
  // A chunk size that would make the step track more than 10 million chunks.
  const ModelSpec model =
      parse_model(R"({"layers": [{"param_bytes": 100000000, "forward_ns": 1}]})");
  EXPECT_THROW(step_trace(model, 1), ModelError);
  EXPECT_NO_THROW(step_trace(model, 1 << 20));
}

TEST(ModelDescription, GptLayerSizes) {
  const ModelSpec model = gpt_model({2, 1024, 512, 1});
  ASSERT_EQ(model.layers.size(), 2u);
  EXPECT_EQ(model.layers[0].param_bytes, 12u * 1024 * 1024 * 2);
  EXPECT_EQ(model.layers[0].optimizer_bytes, 12u * 1024 * 1024 * 12);
  EXPECT_GT(model.layers[0].forward_ns, 0u);
  EXPECT_EQ(model.layers[0].backward_ns, 2 * model.layers[0].forward_ns);
}

TEST(ModelDescription, StepIsForwardBackwardOptimizer) {
  const ModelSpec model = parse_model(R"({"layers": [
      {"name": "a", "param_bytes": 100, "activation_bytes": 7, "forward_ns": 1},
      {"name": "b", "param_bytes": 100, "activation_bytes": 3, "forward_ns": 1}]})");
  const plan::StepTrace trace = step_trace(model, 128);
  ASSERT_EQ(trace.ops.size(), 6u);
  EXPECT_EQ(trace.ops[0].name, "forward.a");
  EXPECT_EQ(trace.ops[2].name, "backward.b");
  EXPECT_EQ(trace.ops[5].name, "optimizer.b");
  EXPECT_EQ(trace.ops[1].non_model_bytes, 10u);
  EXPECT_EQ(trace.ops[3].non_model_bytes, 7u);
  // Params 0..199 span chunks 0-1 (layer b straddles them), grads start at chunk 2.
  ASSERT_EQ(trace.ops[1].chunks.size(), 2u);
  EXPECT_EQ(trace.ops[1].chunks[0].chunk, 0u);
  EXPECT_EQ(trace.ops[1].chunks[1].chunk, 1u);
  EXPECT_TRUE(trace.ops[2].chunks.back().write);
  EXPECT_EQ(trace.ops[2].chunks.back().chunk, 3u);
}

}  // namespace
}  // namespace spillway::sim
