#include <fcntl.h>
#include <fogo/checkpoint.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "fogo_private/frame/integrity.h"

namespace fogo {
namespace {

// The trailer after a checkpoint's archive: magic, the archive's length, its checksum.
constexpr char kTrailerMagic[8] = {'F', 'O', 'G', 'O', 'C', 'K', 'S', '1'};
constexpr size_t kTrailerSize = 24;

// A file replaced atomically: written to `path`.tmp through checked write(2) calls, synced,
// renamed over `path`. Every failure (ENOSPC, EIO, ...) is remembered, never thrown from inside
// a writer callback (LibTorch's zip writer aborts the process when its sink throws), and
// reported by commit() naming the file; a .tmp not committed is removed.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    const std::filesystem::path target(path_);
    if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create");
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Returns n whatever happens (the writer's contract); the first failure is kept.
  size_t write(const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    for (size_t left = n; left > 0 && error_.empty();) {
      const ssize_t w = ::write(fd_, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        fail("cannot write");
        break;
      }
      p += w;
      left -= static_cast<size_t>(w);
    }
    written_ += n;
    return n;
  }
  size_t written() const { return written_; }

  // Throws unless everything was written; then syncs, closes and renames.
  void commit() {
    if (error_.empty() && ::fsync(fd_) != 0) fail("cannot flush to disk");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 && error_.empty()) fail("cannot close");
    if (!error_.empty()) {
      throw std::runtime_error("'" + path_ + "': " + error_ + "; " + path_ +
                               " keeps its previous contents");
    }
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
    if (ec) {
      throw std::runtime_error("'" + path_ + "': cannot rename " + tmp_ +
                               " over it: " + ec.message());
    }
    committed_ = true;
    // The rename itself reaches the disk with the folder's entry.
    const auto parent = std::filesystem::path(path_).parent_path();
    const int dir = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY);
    if (dir >= 0) {
      ::fsync(dir);
      ::close(dir);
    }
  }

 private:
  void fail(const char* what) {
    if (error_.empty()) error_ = std::string(what) + " " + tmp_ + ": " + std::strerror(errno);
  }
  std::string path_, tmp_, error_;
  int fd_ = -1;
  size_t written_ = 0;
  bool committed_ = false;
};

// The first floating-point tensor holding NaN or Inf in `value` (at any depth of objects, lists,
// tuples and dicts), as a path below `name`; empty when none.
std::string first_nonfinite(const c10::IValue& value, const std::string& name) {
  if (value.isTensor()) {
    const auto& t = value.toTensor();
    const bool bad = t.is_floating_point() && !at::isfinite(t).all().item<bool>();
    return bad ? name : std::string();
  }
  std::string found;
  const auto visit = [&](const c10::IValue& v, const std::string& n) {
    if (found.empty()) found = first_nonfinite(v, n);
  };
  if (value.isObject()) {
    const torch::jit::Module module(value.toObject());
    for (const auto& attr : module.named_attributes(/*recurse=*/false)) {
      visit(attr.value, name + "/" + attr.name);
    }
  } else if (value.isList()) {
    const auto list = value.toListRef();
    for (size_t k = 0; k < list.size(); ++k) visit(list[k], name + "/" + std::to_string(k));
  } else if (value.isTuple()) {
    const auto& items = value.toTupleRef().elements();
    for (size_t k = 0; k < items.size(); ++k) visit(items[k], name + "/" + std::to_string(k));
  } else if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict()) {
      visit(item.value(), name + "/" + (item.key().isString() ? item.key().toStringRef() : "?"));
    }
  }
  return found;
}

// The archive held by a checkpoint file's bytes: the trailer checked and cut off.
void load_verified(torch::serialize::InputArchive& archive, const std::string& path,
                   const std::string& bytes, c10::optional<torch::Device> device) {
  size_t size = bytes.size();
  if (size >= kTrailerSize &&
      std::memcmp(bytes.data() + size - kTrailerSize, kTrailerMagic, 8) == 0) {
    uint64_t length = 0, stored = 0;
    std::memcpy(&length, bytes.data() + size - 16, 8);
    std::memcpy(&stored, bytes.data() + size - 8, 8);
    const bool whole = length == size - kTrailerSize;
    if (!whole || fogo::detail::Checksum().bytes(bytes.data(), length).value() != stored) {
      throw std::runtime_error(
          "checkpoint '" + path + "' is corrupted: " +
          (whole ? std::string("its bytes do not match the checksum stored with them")
                 : "it holds " + std::to_string(size - kTrailerSize) + " bytes of the " +
                       std::to_string(length) + " written") +
          " (changed on disk or in transfer); it cannot be trusted. Resume from another copy, or "
          "start afresh");
    }
    size = length;
  } else {
    std::cerr << "warning: checkpoint '" << path
              << "' has no checksum (written before fogo stored them); reading it unverified\n";
  }
  try {
    archive.load_from(bytes.data(), size, device);
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint '" + path + "': not a readable LibTorch archive (" +
                             std::string(e.what()).substr(0, 200) + ")");
  }
}

std::string archive_key(const std::string& name) {
  std::string out = name;
  for (char& c : out) c = c == '.' ? '/' : c;
  return out;
}

std::string describe(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.scalar_type() << t.sizes();
  return out.str();
}

}  // namespace

void CheckpointWriter::put(const std::string& key, const c10::IValue& value) {
  archive_.write(key, value);
}

void CheckpointWriter::put_tensor(const std::string& key, const torch::Tensor& tensor) {
  archive_.write(key, tensor, /*is_buffer=*/true);
}

void CheckpointWriter::put_module(const std::string& key, const torch::nn::Module& module) {
  // A flat list of parameters and buffers by their full names ('.' becomes '/'), rather than
  // Module::save's nesting, so that load_module can check every shape before copying anything.
  torch::serialize::OutputArchive sub(archive_.compilation_unit());
  const auto check = [&](const std::string& name, const torch::Tensor& t) {
    if (nonfinite_.empty() && t.is_floating_point() && !at::isfinite(t).all().item<bool>()) {
      nonfinite_ = key + "/" + name;
    }
  };
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    sub.write(archive_key(item.key()), item.value());
    check(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    sub.write(archive_key(item.key()), item.value(), /*is_buffer=*/true);
    check(item.key(), item.value());
  }
  archive_.write(key, sub);
}

void CheckpointWriter::put_generator(const std::string& key, const at::Generator& generator) {
  put_tensor(key, generator.get_state());
}

void CheckpointWriter::put_history(const std::string& key, const History& rows) {
  const int64_t columns = rows.empty() ? 0 : static_cast<int64_t>(rows.front().size());
  auto t = torch::empty({static_cast<int64_t>(rows.size()), columns}, torch::kDouble);
  double* out = t.data_ptr<double>();
  for (const auto& row : rows) {
    if (static_cast<int64_t>(row.size()) != columns) {
      throw std::invalid_argument("checkpoint key '" + key + "': history rows of " +
                                  std::to_string(columns) + " and " + std::to_string(row.size()) +
                                  " values");
    }
    out = std::copy(row.begin(), row.end(), out);
  }
  put_tensor(key, t);
}

void CheckpointWriter::find_nonfinite(const std::string& key,
                                      torch::serialize::OutputArchive& sub) {
  if (!nonfinite_.empty()) return;
  // An OutputArchive cannot be read: its bytes are read back (in memory) and walked.
  std::ostringstream bytes;
  sub.save_to(bytes);
  const std::string data = bytes.str();
  torch::serialize::InputArchive in;
  in.load_from(data.data(), data.size());
  for (const auto& name : in.keys()) {
    c10::IValue value;
    if (in.try_read(name, value)) nonfinite_ = first_nonfinite(value, key + "/" + name);
    if (!nonfinite_.empty()) return;
  }
}

void CheckpointWriter::commit(const std::string& path) {
  if (!nonfinite_.empty()) {
    throw std::runtime_error("checkpoint '" + path + "' not written: '" + nonfinite_ +
                             "' holds NaN or Inf (the run diverged); the previous checkpoint is "
                             "kept. Lower the learning rate or resume from it");
  }
  try {
    AtomicFile file(path);
    fogo::detail::Checksum sum;
    archive_.save_to([&](const void* data, size_t n) {
      sum.bytes(data, n);
      return file.write(data, n);
    });
    const uint64_t length = file.written(), checksum = sum.value();
    file.write(kTrailerMagic, 8);
    file.write(&length, 8);
    file.write(&checksum, 8);
    file.commit();
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("checkpoint ") + e.what());
  }
}

CheckpointReader::CheckpointReader(const std::string& path, c10::optional<torch::Device> device)
    : path_(path) {
  if (!std::filesystem::is_regular_file(path)) {
    throw std::runtime_error("checkpoint '" + path + "': no such file");
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (!in.good() && !in.eof()) throw std::runtime_error("checkpoint '" + path + "': cannot read");
  load_verified(archive_, path, bytes.str(), device);
}

CheckpointReader::CheckpointReader(const std::string& path, const std::string& bytes,
                                   c10::optional<torch::Device> device)
    : path_(path) {
  load_verified(archive_, path, bytes, device);
}

std::string CheckpointReader::where(const std::string& key) const {
  return "checkpoint '" + path_ + "', key '" + key + "'";
}

bool CheckpointReader::has(const std::string& key) {
  c10::IValue value;
  if (archive_.try_read(key, value)) return true;
  torch::serialize::InputArchive sub;
  return archive_.try_read(key, sub);
}

c10::IValue CheckpointReader::get(const std::string& key) {
  c10::IValue value;
  if (!archive_.try_read(key, value)) throw std::runtime_error(where(key) + ": missing");
  return value;
}

int64_t CheckpointReader::get_int(const std::string& key) {
  const c10::IValue v = get(key);
  if (!v.isInt()) throw std::runtime_error(where(key) + ": not an integer");
  return v.toInt();
}

double CheckpointReader::get_double(const std::string& key) {
  const c10::IValue v = get(key);
  if (!v.isDouble()) throw std::runtime_error(where(key) + ": not a floating-point number");
  return v.toDouble();
}

std::string CheckpointReader::get_string(const std::string& key) {
  const c10::IValue v = get(key);
  if (!v.isString()) throw std::runtime_error(where(key) + ": not a string");
  return v.toStringRef();
}

torch::Tensor CheckpointReader::get_tensor(const std::string& key) {
  torch::Tensor t;
  if (!archive_.try_read(key, t, /*is_buffer=*/true)) {
    throw std::runtime_error(where(key) + ": missing tensor");
  }
  return t;
}

History CheckpointReader::get_history(const std::string& key) {
  const torch::Tensor t = get_tensor(key).to(torch::kCPU, torch::kDouble).contiguous();
  if (t.dim() != 2) throw std::runtime_error(where(key) + ": not a history (a 2-D tensor)");
  History rows(static_cast<size_t>(t.size(0)));
  const double* in = t.data_ptr<double>();
  for (auto& row : rows) {
    row.assign(in, in + t.size(1));
    in += t.size(1);
  }
  return rows;
}

torch::serialize::InputArchive CheckpointReader::sub_archive(const std::string& key) {
  torch::serialize::InputArchive sub;
  if (!archive_.try_read(key, sub)) throw std::runtime_error(where(key) + ": missing");
  return sub;
}

void CheckpointReader::load_module(const std::string& key, torch::nn::Module& module) {
  torch::serialize::InputArchive sub = sub_archive(key);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pairs;  // (destination, stored)
  auto collect = [&](const std::string& name, const torch::Tensor& dest, bool is_buffer) {
    torch::Tensor stored;
    if (!sub.try_read(archive_key(name), stored, is_buffer)) {
      throw std::runtime_error(where(key) + ": has no " + (is_buffer ? "buffer '" : "parameter '") +
                               name + "'; the checkpoint was made for a different model");
    }
    if (stored.sizes() != dest.sizes() || stored.scalar_type() != dest.scalar_type()) {
      throw std::runtime_error(where(key) + ": '" + name + "' is " + describe(stored) +
                               " in the checkpoint but " + describe(dest) +
                               " in this model; the checkpoint was made for a different model");
    }
    if (stored.is_floating_point() && !at::isfinite(stored).all().item<bool>()) {
      throw std::runtime_error(where(key) + ": '" + name +
                               "' holds NaN or Inf; a run cannot continue from it");
    }
    pairs.emplace_back(dest, stored);
  };
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    collect(item.key(), item.value(), false);
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    collect(item.key(), item.value(), true);
  }
  // Copy only once everything has been checked: a bad checkpoint leaves the model untouched.
  torch::NoGradGuard no_grad;
  for (auto& [dest, stored] : pairs) dest.copy_(stored);
}

void CheckpointReader::load_generator(const std::string& key, at::Generator& generator) {
  // Generator states are CPU byte tensors whatever the device the archive was mapped to.
  const torch::Tensor state = get_tensor(key).to(torch::kCPU);
  try {
    generator.set_state(state);
  } catch (const std::exception& e) {
    throw std::runtime_error(where(key) + ": not a state of this generator type (" +
                             std::string(e.what()).substr(0, 200) + ")");
  }
}

bool checkpoint_exists(const std::string& path) { return std::filesystem::is_regular_file(path); }

void replace_file(const std::string& path, const std::string& contents) {
  AtomicFile file(path);
  file.write(contents.data(), contents.size());
  file.commit();
}

}  // namespace fogo
