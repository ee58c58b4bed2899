// Checkpoint integrity (fogo_private/frame/integrity.h): all-or-nothing loads, checksums, finite
// state.
#include "fogo_private/frame/integrity.h"

#include <ATen/ATen.h>
#include <c10/util/flat_hash_map.h>

#include <cstring>
#include <memory>

namespace fogo::detail {

void load_transactional(torch::optim::Optimizer& optimizer, const std::function<void()>& load,
                        const std::function<void(size_t, size_t, const at::Tensor&)>& validate) {
  ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>> saved_state;
  for (const auto& [key, state] : optimizer.state()) saved_state[key] = state->clone();
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> saved_options;
  for (const auto& group : optimizer.param_groups())
    saved_options.push_back(group.options().clone());
  try {
    // A checkpoint replaces the state (as torch.optim's load_state_dict does): LibTorch's load
    // only adds entries, which would keep newer state of parameters the checkpoint lacks.
    optimizer.state().clear();
    load();
    auto& groups = optimizer.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& params = groups[g].params();
      for (size_t i = 0; i < params.size(); ++i) validate(g, i, params[i]);
    }
  } catch (...) {
    optimizer.state() = std::move(saved_state);
    auto& groups = optimizer.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) groups[g].set_options(std::move(saved_options[g]));
    throw;
  }
}

void Checksum::word(uint64_t w) {
  // xor, multiply by an odd constant, rotate: each a bijection of h_.
  h_ = (h_ ^ w) * 0x9E3779B97F4A7C15ULL;
  h_ = (h_ << 27) | (h_ >> 37);
}

Checksum& Checksum::bytes(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  length_ += n;
  while (n > 0 && npending_ > 0) {
    pending_[npending_++] = *p++;
    --n;
    if (npending_ == 8) {
      uint64_t w;
      std::memcpy(&w, pending_, 8);
      word(w);
      npending_ = 0;
    }
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    word(w);
  }
  std::memcpy(pending_, p, n);
  npending_ += n;
  return *this;
}

Checksum& Checksum::add(int64_t value) { return bytes(&value, sizeof value); }
Checksum& Checksum::add(double value) { return bytes(&value, sizeof value); }

Checksum& Checksum::add(const at::Tensor& tensor) {
  if (!tensor.defined()) return add(int64_t{-1});
  add(static_cast<int64_t>(tensor.scalar_type())).add(tensor.dim());
  for (const int64_t s : tensor.sizes()) add(s);
  const at::Tensor t = tensor.cpu().contiguous();
  return bytes(t.data_ptr(), t.nbytes());
}

uint64_t Checksum::value() const {
  Checksum tail = *this;
  uint64_t w = 0;
  std::memcpy(&w, tail.pending_, tail.npending_);
  tail.word(w);
  tail.word(length_);
  return tail.h_;
}

void write_checksum(torch::serialize::OutputArchive& archive, const char* key, uint64_t sum) {
  archive.write(key, c10::IValue(static_cast<int64_t>(sum)));
}

void verify_checksum(torch::serialize::InputArchive& archive, const char* optimizer,
                     const char* key, uint64_t sum) {
  c10::IValue stored;
  if (!archive.try_read(key, stored)) {
    c10::IValue in_memory;
    if (archive.try_read(kInMemoryArchive, in_memory) && in_memory.isBool() && in_memory.toBool()) {
      return;  // a state dict's archive, built in memory: nothing was on a disk to check
    }
    TORCH_WARN(optimizer,
               "::load: the checkpoint has no checksum (written by a fogo older than "
               "checksums); its state is loaded unverified");
    return;
  }
  TORCH_CHECK(stored.isInt() && static_cast<uint64_t>(stored.toInt()) == sum, optimizer,
              "::load: the checkpoint is corrupted: its contents do not match the checksum stored "
              "with them (bytes changed on disk or in transfer); nothing was loaded");
}

int64_t read_format(torch::serialize::InputArchive& archive, const char* optimizer,
                    const char* kind, const char* key, int64_t newest, int64_t absent) {
  c10::IValue value;
  if (!archive.try_read(key, value)) {
    TORCH_CHECK(absent > 0, optimizer, "::load: not a ", kind, " checkpoint (it has no ", key, ")");
    return absent;
  }
  TORCH_CHECK(value.isInt() && value.toInt() >= 1, optimizer, "::load: not a ", kind,
              " checkpoint (its ", key, " is ", value, ")");
  const int64_t format = value.toInt();
  TORCH_CHECK(format <= newest, optimizer, "::load: the checkpoint has format ", format,
              ", written by a newer fogo; this fogo reads formats 1 to ", newest,
              " (load it with a fogo as new as the one that wrote it); nothing was loaded");
  return format;
}

void check_finite_state(const char* optimizer, const std::string& what, const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.is_floating_point()) return;
  TORCH_CHECK(at::isfinite(tensor).all().item<bool>(), optimizer, "::load: the checkpoint's ", what,
              " holds NaN or Inf; every later step would spread it to the parameters, so the "
              "checkpoint is refused and nothing was loaded");
}

}  // namespace fogo::detail
