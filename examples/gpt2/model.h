#pragma once
// GPT-2 in LibTorch, nanoGPT's layout and parameter names, with the FOGO paper's changes
// selectable ("Detailed Experimental Setup", Language Pretraining): no linear biases, GELU,
// dropout 0, rotary position embeddings (RoPE) instead of learned positions. The classic GPT-2
// layout (learned positions, biases everywhere) is the other architecture. The output head is
// tied to the token embedding in both.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <optional>
#include <string>

namespace gpt2 {

enum class Arch {
  Paper,    ///< no biases, RoPE, GELU, dropout 0 (the FOGO paper's GPT-2)
  Classic,  ///< GPT-2 as released: learned positions, biases in linears and LayerNorms
};

Arch parse_arch(const std::string& name);  // "paper" | "classic"; throws naming the value
std::string to_string(Arch arch);

struct GPTConfig {
  Arch arch = Arch::Paper;
  int64_t vocab_size = 50257;
  int64_t block_size = 1024;  ///< context length
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  double dropout = 0.0;
  double rope_base = 10000.0;

  bool bias() const { return arch == Arch::Classic; }
  bool rope() const { return arch == Arch::Paper; }

  /// Sizes by name: "tiny" (tests), "mini" (a CPU toy), "small" (a few-minute CPU run),
  /// "124m" (GPT-2 small: 12 layers, 12 heads, 768 wide, context 1024). Throws on other names.
  static GPTConfig preset(const std::string& size, Arch arch, int64_t vocab_size);

  /// Throws naming the first invalid field.
  void validate() const;

  /// Closed form of the parameter count, the tied head counted once:
  ///   V E + [classic] T E + L (12 E^2 + b_block) + b_final,
  /// with b_block = 13 E (biases of 4 linears, weight+bias of 2 LayerNorms) for classic and 2 E
  /// (LayerNorm weights only) for paper, b_final = 2 E (classic) or E (paper).
  int64_t num_parameters() const;

  /// Forward+backward FLOPs per trained token (PaLM appendix B, as nanoGPT's estimate_mfu):
  /// 6 N + 12 L E T, with N the parameters without position embeddings.
  double flops_per_token() const;

  /// One line: "paper L12 H12 E768 T1024 V50257".
  std::string describe() const;
};

/// LayerNorm with an optional bias (torch::nn::LayerNorm has both or neither).
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t dim, bool bias);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;

 private:
  int64_t dim_;
};
TORCH_MODULE(LayerNorm);

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTConfig& config);
  /// `cos`/`sin`: RoPE tables [T, head_dim] (undefined for learned positions).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};

  /// QK-Clip (--qk-clip): while on, training forwards compute the attention from its scores
  /// (instead of the fused kernel, which never forms them) and keep each head's largest logit
  /// (softmax input, 1/sqrt(d) included; causal positions only), the running max since the
  /// last take_max_logits(): one reduction over the scores they form anyway.
  bool record_max_logits = false;
  /// The heads' largest logits since the last call ([n_head], float32; undefined before any
  /// recorded forward), and forgets them.
  torch::Tensor take_max_logits();

 private:
  int64_t n_head_, n_embd_;
  double dropout_;
  torch::Tensor max_logits_;
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};

 private:
  double dropout_;
};
TORCH_MODULE(MLP);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  /// Initialises as nanoGPT: N(0, 0.02) weights, zero biases, residual projections (c_proj)
  /// N(0, 0.02/sqrt(2 L)). Parameter values come from the global generator (torch::manual_seed).
  explicit GPTImpl(GPTConfig config);

  /// idx [B, T] int64 token ids (T <= block_size) -> logits [B, T, vocab_size].
  torch::Tensor forward(const torch::Tensor& idx);

  /// Mean next-token cross entropy of `idx` against `targets` (both [B, T]), computed in fp32.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);

  /// Appends `max_new_tokens` sampled tokens to `prompt` ([T0] int64, T0 >= 1), feeding at most
  /// block_size tokens of context. temperature > 0; top_k <= 0 means the whole vocabulary.
  /// Sampling uses a CPU generator seeded by `seed`, so output is reproducible on any device.
  torch::Tensor generate(const torch::Tensor& prompt, int64_t max_new_tokens, double temperature,
                         int64_t top_k, uint64_t seed);

  const GPTConfig& config() const { return config_; }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  LayerNorm ln_f{nullptr};

 private:
  GPTConfig config_;
  torch::Tensor rope_cos_, rope_sin_;  // [block_size, head_dim], buffers (follow .to(device))
};
TORCH_MODULE(GPT);

}  // namespace gpt2
