#pragma once
// Token data for the GPT-2 trainer: three on-disk formats, memory-mapped, and a batcher whose
// batches are a pure function of (seed, step, micro-step), so every optimizer of a comparison
// sees the same data order and a resumed run continues exactly where it stopped.
//
// Formats
//   text     raw bytes, byte-level tokens (vocab 256); split into train/val by chunks
//   nanogpt  DIR/train.bin, DIR/val.bin: raw little-endian uint16 GPT-2 tokens
//   llmc     DIR/*train*.bin, DIR/*val*.bin: llm.c shards, a 256 x int32 header
//            (magic 20240520, version 1, token count, zeros) then that many uint16 tokens

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpt2 {

/// Byte-level tokenizer: token id = byte value, so any file is valid input and decoding is exact.
struct ByteTokenizer {
  static constexpr int64_t kVocabSize = 256;
  static std::vector<int64_t> encode(std::string_view text);
  /// Throws naming the first id outside [0, 256).
  static std::string decode(const std::vector<int64_t>& ids);
};

enum class DataFormat { Auto, Text, NanoGPT, LlmC };
DataFormat parse_data_format(const std::string& name);  // auto | text | nanogpt | llmc
std::string to_string(DataFormat format);

constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;  // uint16 (GPT-2) tokens; llm.c's version 2 is uint32
constexpr int64_t kLlmcHeaderInts = 256;

/// A read-only memory map of a whole file; throws naming the path when it cannot be mapped.
class MappedFile {
 public:
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

/// A sequence of token spans, each inside a mapped file (a shard, or a chunk of a text file).
/// Windows never cross a span boundary.
class TokenStream {
 public:
  /// `count` tokens of `width` bytes (1: text bytes, 2: uint16) starting at byte `offset`.
  void add(std::shared_ptr<const MappedFile> file, int64_t offset, int64_t count, int width);
  int64_t num_tokens() const { return num_tokens_; }
  size_t num_spans() const { return spans_.size(); }
  /// Number of distinct windows of `len` consecutive tokens.
  int64_t num_windows(int64_t len) const;
  /// Copies window `index` (in [0, num_windows(len))) into `out`; throws naming the file and
  /// token offset when a token is >= vocab_size.
  void copy_window(int64_t index, int64_t len, int64_t vocab_size, int64_t* out) const;
  /// The stream cut in two: of every span, the last floor(fraction * count) tokens go to the
  /// second stream, the rest to the first (no token in both; windows never cross a cut).
  std::pair<TokenStream, TokenStream> split(double fraction) const;

 private:
  struct Span {
    std::shared_ptr<const MappedFile> file;
    int64_t offset, count;
    int width;
  };
  std::vector<Span> spans_;
  int64_t num_tokens_ = 0;
};

struct Corpus {
  TokenStream train, val;
  int64_t vocab_size = 0;  ///< of the tokenizer that produced the data
  DataFormat format = DataFormat::Auto;
  std::string description;  ///< one line for logs
};

struct DataOptions {
  std::string path;  ///< text file, or directory of .bin files
  DataFormat format = DataFormat::Auto;
  /// text: fraction of chunks held out for validation, spread evenly over the file.
  double val_fraction = 0.1;
  int64_t chunk_bytes = 32 * 1024;  ///< text: split granularity
  /// > 0: a tuning split for learning-rate sweeps. The last tune_fraction of every span of the
  /// training split becomes the corpus's validation split (`val`), the rest its training split;
  /// the real validation split is then not used at all.
  double tune_fraction = 0.0;
};

/// Opens and validates the corpus (headers, sizes). Throws a fogo::trainer::CliError naming the
/// flag when --data (or a split in its directory) is missing or of the wrong kind, a c10::Error
/// naming the file and the problem when a file is malformed. Reads no token payload: only
/// headers are touched until batches are drawn.
Corpus load_corpus(const DataOptions& options);

/// Batches of `batch_size` windows of block_size + 1 tokens: inputs x = window[:-1], targets
/// y = window[1:], both int64 [batch_size, block_size] on the CPU.
class Batcher {
 public:
  Batcher(TokenStream stream, std::string name, int64_t block_size, int64_t vocab_size,
          uint64_t seed);
  /// Training batch for (step, micro): windows drawn uniformly, independently of any state.
  /// Row r of (step, micro) is the same window whatever the batch size: rows [first_row,
  /// first_row + batch_size) are one rank's shard of a global batch (first_row = rank x
  /// batch_size), so that the ranks together read the single-process batch of world x batch_size.
  std::pair<torch::Tensor, torch::Tensor> train_batch(int64_t step, int64_t micro,
                                                      int64_t batch_size,
                                                      int64_t first_row = 0) const;
  /// Evaluation batch k of n: the n * batch_size windows are spread evenly over the stream, so
  /// the evaluation set is fixed and covers the whole split.
  std::pair<torch::Tensor, torch::Tensor> eval_batch(int64_t k, int64_t n,
                                                     int64_t batch_size) const;
  /// Windows [begin, end) of the fixed evaluation set of `total` windows spread evenly over the
  /// stream (window i starts at floor(i * windows / total)): the set depends on `total` alone,
  /// not on how it is cut into batches.
  std::pair<torch::Tensor, torch::Tensor> eval_windows(int64_t begin, int64_t end,
                                                       int64_t total) const;

 private:
  std::pair<torch::Tensor, torch::Tensor> gather(const std::vector<int64_t>& windows) const;
  TokenStream stream_;
  std::string name_;
  int64_t block_size_, vocab_size_, windows_;
  uint64_t seed_;
};

/// Writes the King James Bible text (`bible -f Gen1:1-Rev22:21`, Debian package bible-kjv) to
/// `path` atomically. Throws when the program is missing or fails.
void prepare_kjv(const std::string& path);

}  // namespace gpt2
