#pragma once
// Checkpoint integrity, shared by fogo's optimizers: loads that change nothing when they fail,
// checksums that tell a damaged file from a good one, and state that would poison every later
// step refused at load time.

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace fogo::detail {

/// Replaces the optimizer's state by a checkpoint's (LibTorch's load only adds entries), then runs
/// `validate(group, index, param)` on every parameter that received state. If loading or validation
/// throws, the optimizer's previous state and options are restored before the error propagates: a
/// bad checkpoint loses nothing.
void load_transactional(torch::optim::Optimizer& optimizer, const std::function<void()>& load,
                        const std::function<void(size_t, size_t, const at::Tensor&)>& validate);

/// A 64-bit checksum of what a checkpoint holds, to detect flipped or lost bytes on load
/// (LibTorch's archive reader does not verify its zip CRCs). Bytes form one stream: any split of it
/// into bytes() calls gives one value. Every step of the mix is a bijection of the running value,
/// so a change of any one 8-byte word always changes the result. Not cryptographic: it guards
/// against accidents, not against an adversary.
class Checksum {
 public:
  Checksum& bytes(const void* data, size_t n);
  Checksum& add(int64_t value);
  Checksum& add(double value);
  /// dtype, shape and contents (copied to the CPU when elsewhere); an undefined tensor adds a
  /// marker of its own.
  Checksum& add(const at::Tensor& tensor);
  /// An option's value: a number, a bool, an enumeration, a tuple of them, a list of integers
  /// or of numbers (its length, then its elements).
  template <class T>
  Checksum& option(const T& v) {
    if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      add(static_cast<int64_t>(v.size()));
      for (const int64_t x : v) add(x);
      return *this;
    } else if constexpr (std::is_same_v<T, std::vector<double>>) {
      add(static_cast<int64_t>(v.size()));  // a coefficient list, as archived: a, b, c, a, ...
      for (const double x : v) add(x);
      return *this;
    } else if constexpr (std::is_floating_point_v<T>) {
      return add(static_cast<double>(v));
    } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
      return add(static_cast<int64_t>(v));
    } else {
      std::apply([&](const auto&... x) { (option(x), ...); }, v);
      return *this;
    }
  }
  uint64_t value() const;

 private:
  void word(uint64_t w);
  uint64_t h_ = 0x243F6A8885A308D3ULL, length_ = 0;
  unsigned char pending_[8] = {};
  size_t npending_ = 0;
};

/// Writes `sum` under `key`; verify_checksum compares it with the sum of what was loaded. An
/// archive without the key (written by a fogo older than checksums) is accepted with a warning;
/// a mismatch throws naming `optimizer` and saying the checkpoint is corrupted. An archive built
/// in memory from a state dict (the Python package's load_state_dict) says so with
/// kInMemoryArchive = true: it was never on a disk, carries no checksum and loads without one.
inline constexpr const char* kInMemoryArchive = "fogo/in_memory";
void write_checksum(torch::serialize::OutputArchive& archive, const char* key, uint64_t sum);
void verify_checksum(torch::serialize::InputArchive& archive, const char* optimizer,
                     const char* key, uint64_t sum);

/// The checkpoint format an archive states under `key` (FOGO's fogo/format, Muon's muon/format,
/// the hybrid's fogo_hybrid/format): formats count up from 1, each fogo reads every format up to
/// its `newest` and writes the oldest that holds what it saves. An archive without the key has
/// format `absent` (written before the key existed), or, where `absent` is 0, is no checkpoint of
/// `optimizer` ("not a <kind> checkpoint"); one from a newer fogo (format > newest) is refused
/// naming both formats, before anything is loaded.
int64_t read_format(torch::serialize::InputArchive& archive, const char* optimizer,
                    const char* kind, const char* key, int64_t newest, int64_t absent = 0);

/// Throws unless every element of the floating-point `tensor` is finite, naming `optimizer` and
/// `what` (a checkpoint's state that would poison every later step).
void check_finite_state(const char* optimizer, const std::string& what, const at::Tensor& tensor);

}  // namespace fogo::detail
