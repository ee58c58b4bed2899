// Model shape facts (parameter counts, causality, optimizer split) and the data formats.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "data.h"
#include "model.h"
#include "optim.h"
#include "test_util.h"
#include "train.h"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;

using test::expect_error;
using test::TempDir;

void write_bytes(const fs::path& path, const void* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
}

std::vector<uint16_t> ramp(int64_t n, int64_t start) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>((start + i) % 1000);
  return t;
}

void write_tokens(const fs::path& path, const std::vector<uint16_t>& tokens) {
  write_bytes(path, tokens.data(), tokens.size() * 2);
}

void write_llmc(const fs::path& path, const std::vector<uint16_t>& tokens,
                int32_t magic = kLlmcMagic, int32_t version = kLlmcVersion, int64_t count = -1) {
  std::vector<int32_t> header(kLlmcHeaderInts, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count >= 0 ? count : static_cast<int64_t>(tokens.size()));
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(header.data()), kLlmcHeaderInts * 4);
  f.write(reinterpret_cast<const char*>(tokens.data()),
          static_cast<std::streamsize>(tokens.size() * 2));
}

// Every window must be consecutive tokens of a ramp (t+1 follows t mod 1000), and y = x shifted.
void expect_ramp_windows(const torch::Tensor& x, const torch::Tensor& y) {
  auto xa = x.accessor<int64_t, 2>();
  auto ya = y.accessor<int64_t, 2>();
  for (int64_t r = 0; r < x.size(0); ++r) {
    for (int64_t t = 0; t < x.size(1); ++t) {
      ASSERT_EQ(ya[r][t], (xa[r][t] + 1) % 1000) << "row " << r << " position " << t;
    }
  }
}

// ---------------------------------------------------------------------------------- tokenizer

TEST(ByteTokenizer, RoundTripsEveryByteAndUtf8) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string text = "In the beginning — Ἐν ἀρχῇ\n" + all;
  const auto ids = ByteTokenizer::encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (auto id : ids) ASSERT_TRUE(id >= 0 && id < 256);
  EXPECT_EQ(ByteTokenizer::decode(ids), text);
  EXPECT_EQ(ids[0], 'I');
}

TEST(ByteTokenizer, RejectsNonByteIds) {
  expect_error([] { ByteTokenizer::decode({65, 256}); }, {"token 256", "position 1"});
  expect_error([] { ByteTokenizer::decode({-1}); }, {"token -1"});
}

// -------------------------------------------------------------------------------------- model

TEST(GPTModel, Classic124MHas124439808Parameters) {
  const auto config = GPTConfig::preset("124m", Arch::Classic, 50257);
  EXPECT_EQ(config.num_parameters(), 124'439'808);
  GPT model(config);
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  EXPECT_EQ(n, 124'439'808);
}

TEST(GPTModel, Paper124MParameterCountMatchesTheFormula) {
  // V E + L (12 E^2 + 2 E) + E: no position table, no biases, LayerNorm weights only.
  const int64_t V = 50257, E = 768, L = 12;
  const int64_t expected = V * E + L * (12 * E * E + 2 * E) + E;
  EXPECT_EQ(expected, 123'551'232);
  const auto config = GPTConfig::preset("124m", Arch::Paper, V);
  EXPECT_EQ(config.num_parameters(), expected);
  GPT model(config);
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  EXPECT_EQ(n, expected);
  for (const auto& item : model->named_parameters()) {
    EXPECT_FALSE(item.key().ends_with(".bias")) << item.key();
  }
  EXPECT_TRUE(model->wpe.is_empty());
}

TEST(GPTModel, FormulaMatchesOddSizes) {
  for (Arch arch : {Arch::Paper, Arch::Classic}) {
    GPTConfig c;
    c.arch = arch;
    c.vocab_size = 77, c.block_size = 19, c.n_layer = 3, c.n_head = 3, c.n_embd = 24;
    GPT model(c);
    int64_t n = 0;
    for (const auto& p : model->parameters()) n += p.numel();
    EXPECT_EQ(n, c.num_parameters()) << to_string(arch);
  }
}

TEST(GPTModel, FutureTokensCannotChangeEarlierLogits) {
  for (Arch arch : {Arch::Paper, Arch::Classic}) {
    torch::manual_seed(0);
    GPT model(GPTConfig::preset("tiny", arch, 256));
    model->eval();
    torch::NoGradGuard no_grad;
    auto idx = torch::randint(0, 256, {2, 32}, torch::kLong);
    const auto before = model->forward(idx);
    for (int64_t t : {0, 7, 31}) {
      auto changed = idx.clone();
      changed.index_put_({torch::indexing::Slice(), t}, (idx.index({0, t}) + 1) % 256);
      const auto after = model->forward(changed);
      EXPECT_TRUE(torch::equal(before.narrow(1, 0, t), after.narrow(1, 0, t)))
          << to_string(arch) << ": a change at position " << t << " moved an earlier logit";
      EXPECT_FALSE(torch::allclose(before.narrow(1, t, 1), after.narrow(1, t, 1)))
          << to_string(arch) << ": position " << t << " ignores its own token";
    }
  }
}

// --qk-clip's recording (issue 46): the attention computed from its scores gives the fused
// kernel's output (to rounding), and the recorded maximum of each head is its largest causal
// score of the batch, recomputed here from block 0's input (Classic: learned positions, biases);
// a take forgets it; an eval forward records nothing.
TEST(GPTModel, RecordedMaxLogitsAreTheHeadsLargestCausalScores) {
  torch::manual_seed(3);
  GPT model(GPTConfig::preset("tiny", Arch::Classic, 256));
  model->train();
  torch::NoGradGuard no_grad;
  const auto idx = torch::randint(0, 256, {2, 16}, torch::kLong);
  const auto fused = model->forward(idx);
  auto* block = model->h[0]->as<Block>();
  block->attn->record_max_logits = true;
  EXPECT_TRUE(torch::allclose(model->forward(idx), fused, 1e-5, 1e-5));
  const auto recorded = block->attn->take_max_logits();
  EXPECT_FALSE(block->attn->take_max_logits().defined());
  const auto& c = model->config();
  const int64_t H = c.n_head, D = c.n_embd / c.n_head, T = 16;
  const auto x = model->wte->forward(idx) + model->wpe->forward(torch::arange(T));
  const auto qkv = block->attn->c_attn->forward(block->ln_1->forward(x)).split(c.n_embd, 2);
  const auto q = qkv[0].view({2, T, H, D}).transpose(1, 2);
  const auto k = qkv[1].view({2, T, H, D}).transpose(1, 2);
  const auto scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D));
  const auto causal = torch::ones({T, T}, torch::kBool).tril();
  const auto want = std::get<0>(scores.masked_select(causal.expand_as(scores))
                                    .view({2, H, -1})
                                    .transpose(0, 1)
                                    .reshape({H, -1})
                                    .max(1));
  ASSERT_EQ(recorded.sizes(), torch::IntArrayRef({H}));
  EXPECT_TRUE(torch::allclose(recorded, want, 1e-5, 1e-6)) << recorded << want;
  model->eval();
  model->forward(idx);
  EXPECT_FALSE(block->attn->take_max_logits().defined());
}

TEST(GPTModel, RejectsBadConfigsAndInputs) {
  GPTConfig c = GPTConfig::preset("tiny", Arch::Paper, 256);
  c.n_embd = 30;  // head size 15: odd, no RoPE
  expect_error([&] { c.validate(); }, {"even head size"});
  c.n_embd = 33;
  expect_error([&] { c.validate(); }, {"--n-embd", "multiple of n_head"});
  expect_error([] { GPTConfig::preset("huge", Arch::Paper, 256); }, {"--model", "huge"});
  expect_error([] { parse_arch("modern"); }, {"--arch", "modern"});
  GPT model(GPTConfig::preset("tiny", Arch::Paper, 256));
  expect_error([&] { model->forward(torch::zeros({1, 33}, torch::kLong)); }, {"block_size 32"});
}

TEST(GPTModel, GenerateIsReproducibleAndKeepsThePrompt) {
  torch::manual_seed(0);
  GPT model(GPTConfig::preset("tiny", Arch::Paper, 256));
  const auto prompt = torch::tensor(std::vector<int64_t>{72, 105}, torch::kLong);
  const auto a = model->generate(prompt, 40, 1.0, 10, 7);  // longer than the 32-token context
  const auto b = model->generate(prompt, 40, 1.0, 10, 7);
  ASSERT_EQ(a.numel(), 42);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_TRUE(torch::equal(a.narrow(0, 0, 2), prompt));
}

TEST(Optimizers, HybridsSplitMatricesFromEmbeddingsAndNorms) {
  GPT model(GPTConfig::preset("tiny", Arch::Classic, 256));
  const auto split = fogo::split_parameters(*model);
  // 4 matrices per layer; the rest: wte (tied head), wpe, norms and biases.
  EXPECT_EQ(split.matrix.size(), 2u * 4u);
  for (const auto& name : split.matrix.names) EXPECT_TRUE(name.ends_with(".weight")) << name;
  for (const auto& name : split.rest.names) {
    EXPECT_TRUE(name == "wte.weight" || name == "wpe.weight" ||
                name.find("ln_") != std::string::npos || name.ends_with(".bias"))
        << name;
  }
  // FOGO's codebooks: one per shape, named after the module type.
  OptimizerConfig muon;
  muon.name = "muon";
  auto opt = make_optimizer(muon, *model);
  ASSERT_NE(opt.hybrid.matrix(), nullptr);
  ASSERT_NE(opt.hybrid.rest(), nullptr);
  EXPECT_EQ(opt.hybrid.rest()->param_groups().size(), 2u);  // decay / no decay
  const auto groups = fogo::group_by(split.matrix, fogo::shape_key);
  EXPECT_EQ(groups.groups.size(), 4u);
  EXPECT_EQ(groups.names.size(), groups.groups.size());
  OptimizerConfig adamw;
  adamw.name = "adamw";
  EXPECT_EQ(make_optimizer(adamw, *model).hybrid.matrix(), nullptr);
  OptimizerConfig bad;
  bad.name = "sgd";
  expect_error([&] { make_optimizer(bad, *model); }, {"--optimizer", "sgd"});
}

TEST(Schedule, WarmupStableDecay) {
  EXPECT_DOUBLE_EQ(wsd_factor(0, 100, 10, 0.2, 0.0), 0.1);
  EXPECT_DOUBLE_EQ(wsd_factor(9, 100, 10, 0.2, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(wsd_factor(50, 100, 10, 0.2, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(wsd_factor(79, 100, 10, 0.2, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(wsd_factor(80, 100, 10, 0.2, 0.0), 0.95);
  EXPECT_DOUBLE_EQ(wsd_factor(99, 100, 10, 0.2, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(wsd_factor(99, 100, 0, 0.0, 0.0), 1.0);
}

// --------------------------------------------------------------------------------------- data

TEST(Data, TextIsSplitDeterministicallyByChunks) {
  TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "line " + std::to_string(i) + "\n";
  write_bytes(dir.path() / "corpus.txt", text.data(), text.size());
  DataOptions options{.path = (dir.path() / "corpus.txt").string(), .chunk_bytes = 1000};
  const Corpus corpus = load_corpus(options);
  EXPECT_EQ(corpus.format, DataFormat::Text);
  EXPECT_EQ(corpus.vocab_size, 256);
  EXPECT_EQ(corpus.train.num_tokens() + corpus.val.num_tokens(), static_cast<int64_t>(text.size()));
  const int64_t chunks = (static_cast<int64_t>(text.size()) + 999) / 1000;
  EXPECT_EQ(static_cast<int64_t>(corpus.val.num_spans()), chunks / 10);

  Batcher batches(corpus.train, "train", 16, 256, 3);
  auto [x, y] = batches.train_batch(5, 0, 4);
  auto [x2, y2] = batches.train_batch(5, 0, 4);
  auto [x3, y3] = batches.train_batch(6, 0, 4);
  EXPECT_TRUE(torch::equal(x, x2));
  EXPECT_FALSE(torch::equal(x, x3));
  EXPECT_TRUE(torch::equal(x.narrow(1, 1, 15), y.narrow(1, 0, 15)));
  // Each row is a substring of the text.
  for (int64_t r = 0; r < 4; ++r) {
    std::vector<int64_t> ids(x[r].data_ptr<int64_t>(), x[r].data_ptr<int64_t>() + 16);
    EXPECT_NE(text.find(ByteTokenizer::decode(ids)), std::string::npos);
  }
}

TEST(Data, NanoGPTBinaries) {
  TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  write_tokens(dir.path() / "train.bin", ramp(5000, 0));
  write_tokens(dir.path() / "val.bin", ramp(500, 3));
  const Corpus corpus = load_corpus({.path = dir.path().string()});
  EXPECT_EQ(corpus.format, DataFormat::NanoGPT);
  EXPECT_EQ(corpus.vocab_size, 50257);
  EXPECT_EQ(corpus.train.num_tokens(), 5000);
  EXPECT_EQ(corpus.val.num_tokens(), 500);
  Batcher train(corpus.train, "train", 64, 50257, 0);
  auto [x, y] = train.train_batch(0, 1, 8);
  expect_ramp_windows(x, y);
  Batcher val(corpus.val, "val", 64, 50257, 0);
  auto [vx, vy] = val.eval_batch(0, 2, 4);
  expect_ramp_windows(vx, vy);
  EXPECT_EQ(vx[0][0].item<int64_t>(), 3);  // the fixed evaluation set starts at the split's start
}

TEST(Data, NanoGPTCorruptFilesAreNamed) {
  TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  auto tokens = ramp(300, 0);
  write_tokens(dir.path() / "val.bin", tokens);
  // Missing train.bin (auto-detection then tries llm.c shards: there are none named *train*).
  expect_error([&] { load_corpus({.path = dir.path().string(), .format = DataFormat::NanoGPT}); },
               {"no train.bin"});
  // Odd size: a truncated uint16 file.
  write_bytes(dir.path() / "train.bin", tokens.data(), 301);
  expect_error([&] { load_corpus({.path = dir.path().string()}); }, {"train.bin", "odd"});
  // A token id the model cannot embed.
  tokens[150] = 60000;
  write_tokens(dir.path() / "train.bin", tokens);
  const Corpus corpus = load_corpus({.path = dir.path().string()});
  Batcher batches(corpus.train, "train", 299, 50257, 0);
  expect_error([&] { batches.eval_batch(0, 1, 1); },
               {"train.bin", "token id 60000", "byte offset 300", "vocab size 50257"});
  // Empty file.
  write_bytes(dir.path() / "val.bin", nullptr, 0);
  expect_error([&] { load_corpus({.path = dir.path().string()}); }, {"val.bin", "empty"});
}

TEST(Data, LlmcShards) {
  TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  write_llmc(dir.path() / "toy_train_000001.bin", ramp(3000, 0));
  write_llmc(dir.path() / "toy_train_000002.bin", ramp(2000, 500));
  write_llmc(dir.path() / "toy_val_000000.bin", ramp(700, 7));
  const Corpus corpus = load_corpus({.path = dir.path().string()});
  EXPECT_EQ(corpus.format, DataFormat::LlmC);
  EXPECT_EQ(corpus.train.num_tokens(), 5000);
  EXPECT_EQ(corpus.train.num_spans(), 2u);
  EXPECT_EQ(corpus.val.num_tokens(), 700);
  // Windows never straddle two shards: each is a ramp.
  Batcher train(corpus.train, "train", 100, 50257, 1);
  for (int64_t step = 0; step < 20; ++step) {
    auto [x, y] = train.train_batch(step, 0, 16);
    expect_ramp_windows(x, y);
  }
}

TEST(Data, LlmcCorruptShardsAreNamed) {
  TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  const auto tokens = ramp(400, 0);
  const auto shard = dir.path() / "x_train.bin";
  write_llmc(dir.path() / "x_val.bin", tokens);
  const auto load = [&] { load_corpus({.path = dir.path().string(), .format = DataFormat::LlmC}); };

  write_llmc(shard, tokens, 12345);
  expect_error(load, {"x_train.bin", "bad magic 12345", "20240520"});
  write_llmc(shard, tokens, kLlmcMagic, 2);
  expect_error(load, {"x_train.bin", "version 2"});
  write_llmc(shard, tokens, kLlmcMagic, kLlmcVersion, 500);
  expect_error(load, {"x_train.bin", "truncated", "500 tokens"});
  write_llmc(shard, tokens, kLlmcMagic, kLlmcVersion, 300);
  expect_error(load, {"x_train.bin", "200 bytes after"});
  write_bytes(shard, tokens.data(), 100);
  expect_error(load, {"x_train.bin", "less than its 1024-byte header"});
  write_llmc(shard, tokens);
  EXPECT_NO_THROW(load());
}

TEST(Data, ClearErrorsForPathsAndShortSplits) {
  TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  expect_error([&] { load_corpus({.path = (dir.path() / "nope.txt").string()}); },
               {"--data", "nope.txt", "does not exist"});
  expect_error([&] { load_corpus({.path = dir.path().string(), .format = DataFormat::Text}); },
               {"needs a file"});
  const std::string text(100, 'a');
  write_bytes(dir.path() / "t.txt", text.data(), text.size());
  const Corpus corpus = load_corpus({.path = (dir.path() / "t.txt").string(), .chunk_bytes = 10});
  expect_error([&] { Batcher(corpus.val, "val", 32, 256, 0); },
               {"val split has 10 tokens", "block_size + 1 = 33"});
  expect_error([&] { load_corpus({.path = (dir.path() / "t.txt").string(), .val_fraction = 1.5}); },
               {"--val-fraction"});
}

// A data file truncated while training reads it (mmap): the read past its new end raised SIGBUS
// and the process died without a word. Now it exits with status 1 naming the file.
TEST(DataFileDeathTest, TruncatedWhileReadNamesTheFile) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir("truncated");
  const std::string path = (dir.path() / "shard.txt").string();
  std::ofstream(path) << std::string(3 * 4096, 'a');
  EXPECT_EXIT(
      {
        auto file = std::make_shared<const MappedFile>(path);
        TokenStream stream;
        stream.add(file, 0, file->size(), 1);
        std::vector<int64_t> window(17);
        stream.copy_window(0, 17, 256, window.data());  // readable while whole
        std::filesystem::resize_file(path, 0);
        stream.copy_window(stream.num_windows(17) - 1, 17, 256, window.data());
        std::exit(0);
      },
      ::testing::ExitedWithCode(1), "data file .*shard.txt changed size while training read it");
}

}  // namespace
}  // namespace gpt2
