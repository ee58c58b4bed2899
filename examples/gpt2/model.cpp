#include "model.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <sstream>

namespace gpt2 {

Arch parse_arch(const std::string& name) {
  if (name == "paper") return Arch::Paper;
  if (name == "classic") return Arch::Classic;
  TORCH_CHECK(false, "--arch: unknown architecture '", name, "' (expected paper or classic)");
}

std::string to_string(Arch arch) { return arch == Arch::Paper ? "paper" : "classic"; }

GPTConfig GPTConfig::preset(const std::string& size, Arch arch, int64_t vocab_size) {
  GPTConfig c;
  c.arch = arch;
  c.vocab_size = vocab_size;
  // {layers, heads, width, context}
  if (size == "tiny") {
    c.n_layer = 2, c.n_head = 2, c.n_embd = 32, c.block_size = 32;
  } else if (size == "mini") {
    c.n_layer = 4, c.n_head = 4, c.n_embd = 128, c.block_size = 128;
  } else if (size == "small") {
    c.n_layer = 6, c.n_head = 6, c.n_embd = 192, c.block_size = 256;
  } else if (size == "124m") {
    c.n_layer = 12, c.n_head = 12, c.n_embd = 768, c.block_size = 1024;
  } else {
    TORCH_CHECK(false, "--model: unknown size '", size, "' (expected tiny, mini, small or 124m)");
  }
  return c;
}

void GPTConfig::validate() const {
  TORCH_CHECK(vocab_size >= 2, "model: vocab_size must be >= 2, got ", vocab_size);
  TORCH_CHECK(block_size >= 1, "model: block_size (--block-size) must be >= 1, got ", block_size);
  TORCH_CHECK(n_layer >= 1, "model: n_layer (--n-layer) must be >= 1, got ", n_layer);
  TORCH_CHECK(n_head >= 1, "model: n_head (--n-head) must be >= 1, got ", n_head);
  TORCH_CHECK(n_embd >= 1 && n_embd % n_head == 0, "model: n_embd (--n-embd) ", n_embd,
              " must be a positive multiple of n_head ", n_head);
  TORCH_CHECK(!rope() || (n_embd / n_head) % 2 == 0, "model: RoPE needs an even head size, got ",
              n_embd / n_head, " (n_embd ", n_embd, " / n_head ", n_head, ")");
  TORCH_CHECK(dropout >= 0.0 && dropout < 1.0, "model: dropout (--dropout) must be in [0, 1), got ",
              dropout);
  TORCH_CHECK(rope_base > 1.0, "model: rope_base must be > 1, got ", rope_base);
}

int64_t GPTConfig::num_parameters() const {
  const int64_t E = n_embd;
  const int64_t block = 12 * E * E + (bias() ? 13 * E : 2 * E);
  const int64_t positions = rope() ? 0 : block_size * E;
  return vocab_size * E + positions + n_layer * block + (bias() ? 2 * E : E);
}

double GPTConfig::flops_per_token() const {
  const int64_t positions = rope() ? 0 : block_size * n_embd;
  return 6.0 * static_cast<double>(num_parameters() - positions) +
         12.0 * static_cast<double>(n_layer * n_embd * block_size);
}

std::string GPTConfig::describe() const {
  std::ostringstream s;
  s << to_string(arch) << " L" << n_layer << " H" << n_head << " E" << n_embd << " T" << block_size
    << " V" << vocab_size;
  return s.str();
}

LayerNormImpl::LayerNormImpl(int64_t dim, bool with_bias) : dim_(dim) {
  weight = register_parameter("weight", torch::ones({dim}));
  if (with_bias) bias = register_parameter("bias", torch::zeros({dim}));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  return torch::layer_norm(x, {dim_}, weight, bias, 1e-5);
}

namespace {

torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// Rotates pairs (x_i, x_{i+D/2}) of the head dimension (GPT-NeoX / LLaMA "rotate half" form).
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  auto rotated = torch::cat({-x2, x1}, -1);
  return x * cos.to(x.scalar_type()) + rotated * sin.to(x.scalar_type());
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& c)
    : n_head_(c.n_head), n_embd_(c.n_embd), dropout_(c.dropout) {
  c_attn = register_module("c_attn", linear(c.n_embd, 3 * c.n_embd, c.bias()));
  c_proj = register_module("c_proj", linear(c.n_embd, c.n_embd, c.bias()));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                               const torch::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1), D = n_embd_ / n_head_;
  auto qkv = c_attn->forward(x).split(n_embd_, 2);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, n_head_, D}).transpose(1, 2); };
  auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  if (cos.defined()) {
    auto c = cos.narrow(0, 0, T), s = sin.narrow(0, 0, T);
    q = apply_rope(q, c, s);
    k = apply_rope(k, c, s);
  }
  torch::Tensor y;
  if (record_max_logits && is_training()) {
    // The scores, their per-head maximum over the batch and the causal positions, then the
    // softmax of the same scores (the fused kernel's math, its rounding aside).
    auto att = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D));
    const auto future = torch::ones({T, T}, att.options().dtype(torch::kBool)).triu(1);
    att = att.masked_fill(future, -std::numeric_limits<double>::infinity());
    const auto mine = att.detach().amax({0, 2, 3}).to(torch::kFloat);
    max_logits_ = max_logits_.defined() ? torch::maximum(max_logits_, mine) : mine;
    y = torch::dropout(torch::softmax(att, -1), dropout_, is_training()).matmul(v);
  } else {
    // Fused causal attention: flash / memory-efficient kernels on CUDA, a fused CPU kernel
    // otherwise.
    y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, is_training() ? dropout_ : 0.0,
                                         /*is_causal=*/true);
  }
  y = y.transpose(1, 2).contiguous().view({B, T, n_embd_});
  return torch::dropout(c_proj->forward(y), dropout_, is_training());
}

torch::Tensor CausalSelfAttentionImpl::take_max_logits() {
  torch::Tensor out = max_logits_;
  max_logits_ = torch::Tensor();
  return out;
}

MLPImpl::MLPImpl(const GPTConfig& c) : dropout_(c.dropout) {
  c_fc = register_module("c_fc", linear(c.n_embd, 4 * c.n_embd, c.bias()));
  c_proj = register_module("c_proj", linear(4 * c.n_embd, c.n_embd, c.bias()));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  return torch::dropout(c_proj->forward(torch::gelu(c_fc->forward(x))), dropout_, is_training());
}

BlockImpl::BlockImpl(const GPTConfig& c) {
  ln_1 = register_module("ln_1", LayerNorm(c.n_embd, c.bias()));
  attn = register_module("attn", CausalSelfAttention(c));
  ln_2 = register_module("ln_2", LayerNorm(c.n_embd, c.bias()));
  mlp = register_module("mlp", MLP(c));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                 const torch::Tensor& sin) {
  auto y = x + attn->forward(ln_1->forward(x), cos, sin);
  return y + mlp->forward(ln_2->forward(y));
}

GPTImpl::GPTImpl(GPTConfig config) : config_(std::move(config)) {
  config_.validate();
  const auto& c = config_;
  wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
  if (!c.rope()) wpe = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t l = 0; l < c.n_layer; ++l) h->push_back(Block(c));
  ln_f = register_module("ln_f", LayerNorm(c.n_embd, c.bias()));

  if (c.rope()) {
    const int64_t D = c.n_embd / c.n_head;
    auto inv_freq = torch::pow(c.rope_base, -torch::arange(0, D, 2, torch::kDouble) / D);
    auto angles = torch::outer(torch::arange(c.block_size, torch::kDouble), inv_freq);
    angles = torch::cat({angles, angles}, -1).to(torch::kFloat);  // [T, D], halves repeated
    rope_cos_ = register_buffer("rope_cos", angles.cos());
    rope_sin_ = register_buffer("rope_sin", angles.sin());
  }

  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    if (name.ends_with(".bias")) {
      p.zero_();
    } else if (name.ends_with("c_proj.weight")) {
      p.normal_(0.0, residual_std);
    } else if (p.dim() == 2) {  // embeddings and the other linears
      p.normal_(0.0, 0.02);
    }  // LayerNorm weights keep 1
  }
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) {
  TORCH_CHECK(idx.dim() == 2, "GPT::forward: expected token ids [B, T], got shape ", idx.sizes());
  const int64_t T = idx.size(1);
  TORCH_CHECK(T >= 1 && T <= config_.block_size, "GPT::forward: sequence length ", T,
              " is outside [1, block_size ", config_.block_size, "]");
  auto x = wte->forward(idx);
  if (wpe) x = x + wpe->forward(torch::arange(T, idx.options().dtype(torch::kLong)));
  x = torch::dropout(x, config_.dropout, is_training());
  for (const auto& block : *h) x = block->as<Block>()->forward(x, rope_cos_, rope_sin_);
  return torch::linear(ln_f->forward(x), wte->weight);  // weight-tied head
}

torch::Tensor GPTImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto logits = forward(idx);
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), targets.reshape({-1}));
}

torch::Tensor GPTImpl::generate(const torch::Tensor& prompt, int64_t max_new_tokens,
                                double temperature, int64_t top_k, uint64_t seed) {
  TORCH_CHECK(prompt.dim() == 1 && prompt.numel() >= 1,
              "generate: the prompt must be a non-empty "
              "1-D tensor of token ids");
  TORCH_CHECK(temperature > 0.0, "generate: temperature must be > 0, got ", temperature);
  TORCH_CHECK(max_new_tokens >= 0, "generate: max_new_tokens must be >= 0");
  TORCH_CHECK(
      prompt.max().item<int64_t>() < config_.vocab_size && prompt.min().item<int64_t>() >= 0,
      "generate: prompt token ids must be in [0, vocab_size ", config_.vocab_size, ")");
  torch::NoGradGuard no_grad;
  const bool was_training = is_training();
  eval();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto device = wte->weight.device();
  auto tokens = prompt.to(torch::kCPU, torch::kLong).clone();
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int64_t T = std::min<int64_t>(tokens.size(0), config_.block_size);
    auto context = tokens.narrow(0, tokens.size(0) - T, T).unsqueeze(0).to(device);
    auto logits = forward(context).select(1, T - 1).squeeze(0).to(torch::kCPU, torch::kFloat);
    logits = logits / temperature;
    if (top_k > 0 && top_k < logits.size(0)) {
      auto kth = std::get<0>(logits.topk(top_k)).select(0, top_k - 1);
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
    }
    auto next = at::multinomial(torch::softmax(logits, 0), 1, false, gen);
    tokens = torch::cat({tokens, next});
  }
  train(was_training);
  return tokens;
}

}  // namespace gpt2
