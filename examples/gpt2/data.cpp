#include "data.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "common/cli.h"

namespace gpt2 {

// The formats store little-endian integers, read here in place from the map.
static_assert(std::endian::native == std::endian::little, "token files are little-endian");

namespace fs = std::filesystem;

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<int64_t> ids(text.size());
  std::transform(text.begin(), text.end(), ids.begin(),
                 [](char c) { return static_cast<int64_t>(static_cast<unsigned char>(c)); });
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    TORCH_CHECK(ids[i] >= 0 && ids[i] < kVocabSize, "ByteTokenizer::decode: token ", ids[i],
                " at position ", i, " is not a byte (vocab 256)");
    text[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
  }
  return text;
}

DataFormat parse_data_format(const std::string& name) {
  if (name == "auto") return DataFormat::Auto;
  if (name == "text") return DataFormat::Text;
  if (name == "nanogpt") return DataFormat::NanoGPT;
  if (name == "llmc") return DataFormat::LlmC;
  throw fogo::trainer::Cli::error("format",
                                  "expected one of auto,text,nanogpt,llmc, got '" + name + "'");
}

std::string to_string(DataFormat format) {
  switch (format) {
    case DataFormat::Auto:
      return "auto";
    case DataFormat::Text:
      return "text";
    case DataFormat::NanoGPT:
      return "nanogpt";
    case DataFormat::LlmC:
      return "llmc";
  }
  return "?";
}

namespace {

// SIGBUS on a mapped data file: the file shrank (truncated, rewritten in place) after it was
// mapped, and a read touched a page past its new end. Without a handler the process dies with no
// word; with it, the message names the file. Each mapping has a slot holding its address range
// and its message, made when mapped: the handler only compares and writes (async-signal-safe).
struct MappingSlot {
  std::atomic<uintptr_t> begin{0}, end{0};
  char message[512] = {};
  size_t length = 0;
};
constexpr size_t kSlots = 256;
MappingSlot g_slots[kSlots];
struct sigaction g_previous {};

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (auto& slot : g_slots) {
    const uintptr_t begin = slot.begin.load();
    if (begin != 0 && addr >= begin && addr < slot.end.load()) {
      [[maybe_unused]] const ssize_t w = ::write(2, slot.message, slot.length);
      ::_exit(1);
    }
  }
  // Not a data file's: what would have happened without this handler.
  if ((g_previous.sa_flags & SA_SIGINFO) && g_previous.sa_sigaction) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    ::signal(SIGBUS, SIG_DFL);  // the faulting access repeats and ends the process
  }
}

void watch_mapping(const void* data, int64_t size, const std::string& path) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &g_previous);
  });
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  for (auto& slot : g_slots) {
    if (slot.begin.load() != 0) continue;
    const std::string text = "error: data file " + path + " changed size while training read it (" +
                             std::to_string(size) +
                             " bytes when opened; truncated or rewritten since?); stopping (exit "
                             "status 1)\n";
    slot.length = std::min(text.size(), sizeof slot.message);
    std::memcpy(slot.message, text.data(), slot.length);
    slot.end = reinterpret_cast<uintptr_t>(data) + static_cast<uintptr_t>(size);
    slot.begin = reinterpret_cast<uintptr_t>(data);
    return;
  }
  // More mapped files than slots: this one dies without a message, as before.
}

void unwatch_mapping(const void* data) {
  for (auto& slot : g_slots) {
    if (slot.begin.load() == reinterpret_cast<uintptr_t>(data)) slot.begin = 0;
  }
}

}  // namespace

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "cannot open data file ", path_, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    TORCH_CHECK(false, "cannot stat data file ", path_, ": ", std::strerror(err));
  }
  size_ = static_cast<int64_t>(st.st_size);
  if (size_ == 0) {
    ::close(fd);
    TORCH_CHECK(false, "data file ", path_, " is empty");
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  TORCH_CHECK(map != MAP_FAILED, "cannot mmap data file ", path_, ": ", std::strerror(err));
  // Training reads windows at random offsets; read-ahead would only waste page cache.
  ::madvise(map, static_cast<size_t>(size_), MADV_RANDOM);
  data_ = static_cast<const uint8_t*>(map);
  watch_mapping(data_, size_, path_);
}

MappedFile::~MappedFile() {
  if (!data_) return;
  unwatch_mapping(data_);
  ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
}

void TokenStream::add(std::shared_ptr<const MappedFile> file, int64_t offset, int64_t count,
                      int width) {
  TORCH_CHECK(width == 1 || width == 2, "TokenStream: token width must be 1 or 2 bytes");
  TORCH_CHECK(offset >= 0 && count >= 0 && offset + count * width <= file->size(),
              "TokenStream: span outside ", file->path());
  if (count == 0) return;
  spans_.push_back({std::move(file), offset, count, width});
  num_tokens_ += count;
}

std::pair<TokenStream, TokenStream> TokenStream::split(double fraction) const {
  std::pair<TokenStream, TokenStream> out;
  for (const auto& s : spans_) {
    const auto tail = static_cast<int64_t>(std::floor(fraction * static_cast<double>(s.count)));
    out.first.add(s.file, s.offset, s.count - tail, s.width);
    out.second.add(s.file, s.offset + (s.count - tail) * s.width, tail, s.width);
  }
  return out;
}

int64_t TokenStream::num_windows(int64_t len) const {
  int64_t n = 0;
  for (const auto& s : spans_) n += std::max<int64_t>(0, s.count - len + 1);
  return n;
}

void TokenStream::copy_window(int64_t index, int64_t len, int64_t vocab_size, int64_t* out) const {
  for (const auto& s : spans_) {
    const int64_t n = std::max<int64_t>(0, s.count - len + 1);
    if (index >= n) {
      index -= n;
      continue;
    }
    const uint8_t* base = s.file->data() + s.offset;
    if (s.width == 1) {
      for (int64_t t = 0; t < len; ++t) out[t] = base[index + t];
    } else {
      uint16_t v;
      for (int64_t t = 0; t < len; ++t) {
        std::memcpy(&v, base + 2 * (index + t), 2);  // shards need not be 2-byte aligned
        out[t] = v;
      }
    }
    for (int64_t t = 0; t < len; ++t) {
      TORCH_CHECK(out[t] < vocab_size, "data file ", s.file->path(), ": token id ", out[t],
                  " at byte offset ", s.offset + (index + t) * s.width,
                  " is >= the model's vocab "
                  "size ",
                  vocab_size, " (wrong --vocab-size, or not a token file for this model)");
    }
    return;
  }
  TORCH_CHECK(false, "TokenStream::copy_window: window ", index, " out of range");
}

namespace {

std::shared_ptr<const MappedFile> map_file(const fs::path& path) {
  return std::make_shared<const MappedFile>(path.string());
}

void add_nanogpt(TokenStream& stream, const fs::path& path) {
  auto file = map_file(path);
  TORCH_CHECK(file->size() % 2 == 0, "nanoGPT token file ", path.string(), " has ", file->size(),
              " bytes, an odd number: not raw uint16 tokens (truncated?)");
  stream.add(file, 0, file->size() / 2, 2);
}

void add_llmc(TokenStream& stream, const fs::path& path) {
  auto file = map_file(path);
  const int64_t header_bytes = kLlmcHeaderInts * 4;
  TORCH_CHECK(file->size() >= header_bytes, "llm.c shard ", path.string(), " has ", file->size(),
              " bytes, less than its ", header_bytes, "-byte header (truncated)");
  int32_t header[3];
  std::memcpy(header, file->data(), sizeof(header));
  TORCH_CHECK(header[0] == kLlmcMagic, "llm.c shard ", path.string(), ": bad magic ", header[0],
              " (expected ", kLlmcMagic, ")");
  TORCH_CHECK(header[1] == kLlmcVersion, "llm.c shard ", path.string(), ": version ", header[1],
              " is not supported (only version ", kLlmcVersion, ", uint16 GPT-2 tokens)");
  const int64_t count = header[2];
  const int64_t expected = header_bytes + 2 * count;
  TORCH_CHECK(count >= 0, "llm.c shard ", path.string(), ": negative token count ", count);
  TORCH_CHECK(file->size() >= expected, "llm.c shard ", path.string(),
              " is truncated: the header "
              "says ",
              count, " tokens (", expected, " bytes) but the file has ", file->size());
  TORCH_CHECK(file->size() == expected, "llm.c shard ", path.string(), " has ",
              file->size() - expected, " bytes after its ", count, " tokens (corrupt header?)");
  stream.add(file, header_bytes, count, 2);
}

bool starts_with_llmc_magic(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  int32_t magic = 0;
  return in.read(reinterpret_cast<char*>(&magic), 4) && magic == kLlmcMagic;
}

// llm.c names shards <name>_train[_NNNNNN].bin / <name>_val[_NNNNNN].bin; sorted by name.
std::vector<fs::path> shards(const fs::path& dir, const std::string& split) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto name = entry.path().filename().string();
    if (entry.is_regular_file() && entry.path().extension() == ".bin" &&
        name.find(split) != std::string::npos) {
      out.push_back(entry.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Chunk i goes to validation when floor((i+1) f) > floor(i f): val chunks spread evenly over
// the file for any fraction, and the split depends only on the file and the options.
void split_text(Corpus& corpus, const fs::path& path, double val_fraction, int64_t chunk) {
  auto file = map_file(path);
  const int64_t chunks = (file->size() + chunk - 1) / chunk;
  for (int64_t i = 0; i < chunks; ++i) {
    const bool val =
        static_cast<int64_t>((i + 1) * val_fraction) > static_cast<int64_t>(i * val_fraction);
    const int64_t begin = i * chunk, count = std::min(chunk, file->size() - begin);
    (val ? corpus.val : corpus.train).add(file, begin, count, 1);
  }
}

// --format auto: a file is text; a directory is nanoGPT when it has a train.bin without the
// llm.c magic, llm.c otherwise.
DataFormat detect_format(const fs::path& path) {
  if (!fs::is_directory(path)) return DataFormat::Text;
  if (fs::exists(path / "train.bin") && !starts_with_llmc_magic(path / "train.bin")) {
    return DataFormat::NanoGPT;
  }
  return DataFormat::LlmC;
}

// The train and validation splits of corpus.format from `path`, and the vocabulary size.
void read_splits(Corpus& corpus, const fs::path& path, const DataOptions& options) {
  using fogo::trainer::Cli;
  switch (corpus.format) {
    case DataFormat::Text:
      Cli::require(options.val_fraction > 0.0 && options.val_fraction < 1.0, "val-fraction",
                   "must be in (0, 1), got " + fogo::trainer::flag_text(options.val_fraction));
      Cli::require(options.chunk_bytes >= 1, "chunk-bytes", "must be >= 1");
      split_text(corpus, path, options.val_fraction, options.chunk_bytes);
      corpus.vocab_size = ByteTokenizer::kVocabSize;
      break;
    case DataFormat::NanoGPT:
      for (const char* split : {"train", "val"}) {
        const auto file = path / (std::string(split) + ".bin");
        Cli::require(fs::exists(file), "data",
                     "nanoGPT directory " + options.path + " has no " + file.filename().string());
        add_nanogpt(split == std::string("train") ? corpus.train : corpus.val, file);
      }
      corpus.vocab_size = 50257;
      break;
    case DataFormat::LlmC:
      for (const char* split : {"train", "val"}) {
        const auto files = shards(path, split);
        Cli::require(!files.empty(), "data",
                     "llm.c directory " + options.path + " has no *" + split + "*.bin shard");
        for (const auto& f : files)
          add_llmc(split == std::string("train") ? corpus.train : corpus.val, f);
      }
      corpus.vocab_size = 50257;
      break;
    case DataFormat::Auto:
      break;
  }
}

}  // namespace

// What the flags name must be there: a refused command line (CliError) otherwise. What is there
// must be well formed: a c10::Error naming the file otherwise.
Corpus load_corpus(const DataOptions& options) {
  using fogo::trainer::Cli;
  Cli::require(!options.path.empty(), "data", "no path given");
  const fs::path path(options.path);
  Cli::require(
      fs::exists(path), "data",
      options.path + " does not exist" +
          (options.path.ends_with("kjv.txt") ? " (create it with: gpt2 prepare-kjv)" : ""));
  Corpus corpus;
  corpus.format = options.format == DataFormat::Auto ? detect_format(path) : options.format;
  const bool dir_format = corpus.format != DataFormat::Text;
  Cli::require(dir_format == fs::is_directory(path), "data",
               "format " + to_string(corpus.format) +
                   (dir_format ? " needs a directory, but " : " needs a file, but ") +
                   options.path + (dir_format ? " is not one" : " is a directory"));

  read_splits(corpus, path, options);
  corpus.description = to_string(corpus.format) + " " + options.path + ": " +
                       std::to_string(corpus.train.num_tokens()) + " train / " +
                       std::to_string(corpus.val.num_tokens()) + " val tokens";
  if (options.tune_fraction > 0.0) {
    Cli::require(options.tune_fraction < 1.0, "tune-fraction",
                 "must be in [0, 1), got " + fogo::trainer::flag_text(options.tune_fraction));
    auto [train, tune] = corpus.train.split(options.tune_fraction);
    corpus.train = std::move(train);
    corpus.val = std::move(tune);
    corpus.description += "; tuning split: the last " +
                          fogo::trainer::flag_text(options.tune_fraction) +
                          " of every training span replaces the validation split";
  }
  return corpus;
}

namespace {

// SplitMix64: a counter-based generator, so batch contents need no stored RNG state.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

Batcher::Batcher(TokenStream stream, std::string name, int64_t block_size, int64_t vocab_size,
                 uint64_t seed)
    : stream_(std::move(stream)),
      name_(std::move(name)),
      block_size_(block_size),
      vocab_size_(vocab_size),
      windows_(stream_.num_windows(block_size + 1)),
      seed_(seed) {
  TORCH_CHECK(windows_ > 0, "the ", name_, " split has ", stream_.num_tokens(), " tokens in ",
              stream_.num_spans(), " span(s); a sequence needs block_size + 1 = ", block_size + 1,
              " consecutive tokens (use more data, a smaller --block-size, or for text a larger "
              "--chunk-bytes)");
}

std::pair<torch::Tensor, torch::Tensor> Batcher::train_batch(int64_t step, int64_t micro,
                                                             int64_t batch_size,
                                                             int64_t first_row) const {
  TORCH_CHECK(first_row >= 0, "train_batch: first row ", first_row);
  std::vector<int64_t> windows(batch_size);
  const uint64_t key =
      mix(mix(mix(seed_) ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(micro));
  for (int64_t r = 0; r < batch_size; ++r) {
    windows[r] = static_cast<int64_t>(mix(key ^ static_cast<uint64_t>(first_row + r)) %
                                      static_cast<uint64_t>(windows_));
  }
  return gather(windows);
}

std::pair<torch::Tensor, torch::Tensor> Batcher::eval_batch(int64_t k, int64_t n,
                                                            int64_t batch_size) const {
  TORCH_CHECK(k >= 0 && k < n, "eval_batch: batch ", k, " of ", n);
  return eval_windows(k * batch_size, (k + 1) * batch_size, n * batch_size);
}

std::pair<torch::Tensor, torch::Tensor> Batcher::eval_windows(int64_t begin, int64_t end,
                                                              int64_t total) const {
  TORCH_CHECK(0 <= begin && begin < end && end <= total, "eval_windows: [", begin, ", ", end,
              ") of ", total);
  std::vector<int64_t> windows;
  const double stride = static_cast<double>(windows_) / static_cast<double>(total);
  for (int64_t i = begin; i < end; ++i) {
    windows.push_back(
        std::min<int64_t>(windows_ - 1, static_cast<int64_t>(static_cast<double>(i) * stride)));
  }
  return gather(windows);
}

std::pair<torch::Tensor, torch::Tensor> Batcher::gather(const std::vector<int64_t>& windows) const {
  const int64_t B = static_cast<int64_t>(windows.size()), len = block_size_ + 1;
  auto buffer = torch::empty({B, len}, torch::kLong);
  int64_t* out = buffer.data_ptr<int64_t>();
  for (int64_t r = 0; r < B; ++r) stream_.copy_window(windows[r], len, vocab_size_, out + r * len);
  return {buffer.narrow(1, 0, block_size_).contiguous(),
          buffer.narrow(1, 1, block_size_).contiguous()};
}

void prepare_kjv(const std::string& path) {
  const char* command = "bible -f Gen1:1-Rev22:21 2>&1";
  FILE* pipe = ::popen(command, "r");
  TORCH_CHECK(pipe, "prepare-kjv: cannot run `", command, "`: ", std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) text.append(buf, n);
  const int status = ::pclose(pipe);
  TORCH_CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "prepare-kjv: `bible -f Gen1:1-Rev22:21` failed (is the Debian package bible-kjv "
              "installed?): ",
              text.substr(0, 300));
  // The whole KJV is ~4.4 MB; anything far smaller is an error message, not the text.
  TORCH_CHECK(text.size() > 1000000, "prepare-kjv: `bible` printed only ", text.size(),
              " bytes: ", text.substr(0, 300));
  const fs::path out(path);
  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  const fs::path tmp = out.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    TORCH_CHECK(f, "prepare-kjv: cannot write ", tmp.string());
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    TORCH_CHECK(f.flush(), "prepare-kjv: writing ", tmp.string(), " failed");
  }
  fs::rename(tmp, out);
}

}  // namespace gpt2
