#include "common/checkpoint.h"

#include <fcntl.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <stdexcept>

namespace fogo::trainer {
namespace {

// The rename is atomic, but without fsync a power cut could still expose an empty file under
// the new name on some filesystems; syncing the data first closes that window.
void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("checkpoint '" + path + "': cannot reopen to sync");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw std::runtime_error("checkpoint '" + path + "': fsync failed");
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
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    sub.write(archive_key(item.key()), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    sub.write(archive_key(item.key()), item.value(), /*is_buffer=*/true);
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

void CheckpointWriter::commit(const std::string& path) {
  const std::filesystem::path target(path);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
  const std::string tmp = path + ".tmp";
  try {
    archive_.save_to(tmp);
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint '" + tmp + "': write failed: " + e.what());
  }
  fsync_file(tmp);
  std::filesystem::rename(tmp, target);
}

CheckpointReader::CheckpointReader(const std::string& path, c10::optional<torch::Device> device)
    : path_(path) {
  if (!std::filesystem::is_regular_file(path)) {
    throw std::runtime_error("checkpoint '" + path + "': no such file");
  }
  try {
    archive_.load_from(path, device);
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint '" + path + "': not a readable LibTorch archive (" +
                             std::string(e.what()).substr(0, 200) + ")");
  }
}

CheckpointReader::CheckpointReader(const std::string& path, const std::string& bytes,
                                   c10::optional<torch::Device> device)
    : path_(path) {
  try {
    archive_.load_from(bytes.data(), bytes.size(), device);
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint '" + path + "': not a readable LibTorch archive (" +
                             std::string(e.what()).substr(0, 200) + ")");
  }
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

}  // namespace fogo::trainer
