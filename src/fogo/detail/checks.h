#pragma once
// Input validation and checkpoint helpers shared by fogo's optimizers. Every error names the
// optimizer, the option or parameter (group g, index i, shape) and what is wrong with it.

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace fogo::detail {

/// Throws unless `value` is finite and inside [lo, hi] (inclusive ends).
void check_range(const char* optimizer, const char* option, double value, double lo, double hi);

/// "parameter i of group g (shape [..])", for messages.
std::string describe_param(size_t group, size_t index, const at::Tensor& param);

/// For an optimizer option cuda_graph(true): throws unless `param` is on a CUDA device (and fogo
/// was built with CUDA), naming the option and the parameter.
void check_graph_device(const char* optimizer, size_t group, size_t index, const at::Tensor& param);

/// Rejects gradients fogo's matrix optimizers cannot handle: complex or sparse tensors.
void check_grad_kind(const char* optimizer, size_t group, size_t index, const at::Tensor& param,
                     const at::Tensor& grad);

/// The parameters of an optimizer that have gradients, in group order, with (group, index).
struct GradItems {
  std::vector<at::Tensor> params, grads;
  std::vector<std::pair<size_t, size_t>> where;
};

/// Collects the parameters with gradients after validating everything, before anything changes:
/// `check_group(g)` for each group (its options), that no parameter is listed twice (in one group
/// or two), `check_param(g, i, param)` for each parameter with a gradient, and check_grad_kind on
/// its gradient.
GradItems collect_grads(const char* optimizer,
                        const std::vector<torch::optim::OptimizerParamGroup>& groups,
                        const std::function<void(size_t)>& check_group,
                        const std::function<void(size_t, size_t, const at::Tensor&)>& check_param);

/// Largest Frobenius norm a float32/bf16/fp16 (double) gradient may have. Above about 1.8e19
/// (1.3e154) its square overflows: the Newton–Schulz input's normalisation X / |X| would give a
/// silent zero update, AdamW's second moment Inf. The margin of ~180 covers the momentum buffer,
/// which sums up to 1 / (1 - momentum) gradients (momentum <= 0.994).
inline constexpr double kMaxGradNorm = 1e17;
inline constexpr double kMaxGradNormDouble = 1e151;

/// Index of the first gradient that holds a NaN or an infinity or whose norm exceeds
/// kMaxGradNorm, or -1: one reduction per gradient and one host synchronisation for the list.
int64_t first_unusable_grad(const std::vector<at::Tensor>& grads);

/// The same test on the device, nothing read back: a 0-d bool, true when every gradient is usable
/// (NonFinitePolicy::Mask), on the first gradient's device (one test per device, combined there).
at::Tensor grads_usable(const std::vector<at::Tensor>& grads);

/// first_unusable_grad over the gradients of `items` whose group `checked(group)` accepts:
/// the index into `items` of the first unusable one, or -1.
int64_t first_unusable_item(const GradItems& items, const std::function<bool(size_t)>& checked);

/// NonFinitePolicy::Mask's restore, for every optimizer: copies of the tensors a step may change,
/// taken when the scope is made, put back by restore() wherever the step's flag `ok` is false
/// (where it is true every tensor keeps its bits). Nothing is copied when `ok` is undefined (the
/// step is not masked) or for an undefined tensor.
class MaskScope {
 public:
  MaskScope(at::Tensor ok, std::vector<at::Tensor> tensors);
  /// Into `now`: the same tensors, in the same order, as they are after the step (a step may
  /// have replaced one by a new tensor).
  void restore(const std::vector<at::Tensor>& now) const;
  void restore() const { restore(tensors_); }

 private:
  at::Tensor ok_;
  std::vector<at::Tensor> tensors_, before_;
};

/// How many times first_unusable_grad has read its flags back to the host on this thread (on a
/// GPU, each is a host synchronisation): what tests count.
int64_t unusable_grad_reads();

/// The error for the unusable gradient of `param` (parameter `index` of group `group`): what is
/// wrong with it (non-finite, or its norm too large) and that nothing was changed.
[[noreturn]] void throw_unusable_grad(const char* optimizer, size_t group, size_t index,
                                      const at::Tensor& param);

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
  /// An option's value: a number, a bool, an enumeration or a tuple of them.
  template <class T>
  Checksum& option(const T& v) {
    if constexpr (std::is_floating_point_v<T>) {
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

/// The state `what` made for parameter `p` (group g, index i) at an earlier step still has its
/// shape: a parameter resized since (model surgery, a reallocation) is refused naming it and
/// both shapes, before anything changes (the step would otherwise fail half-way in ATen).
void check_state_shape(const char* optimizer, size_t g, size_t i, const at::Tensor& p,
                       const at::Tensor& state, const char* what);

/// Writes `sum` under `key`; verify_checksum compares it with the sum of what was loaded. An
/// archive without the key (written by a fogo older than checksums) is accepted with a warning;
/// a mismatch throws naming `optimizer` and saying the checkpoint is corrupted. An archive built
/// in memory from a state dict (the Python package's load_state_dict) says so with
/// kInMemoryArchive = true: it was never on a disk, carries no checksum and loads without one.
inline constexpr const char* kInMemoryArchive = "fogo/in_memory";
void write_checksum(torch::serialize::OutputArchive& archive, const char* key, uint64_t sum);
void verify_checksum(torch::serialize::InputArchive& archive, const char* optimizer,
                     const char* key, uint64_t sum);

/// Throws unless every element of the floating-point `tensor` is finite, naming `optimizer` and
/// `what` (a checkpoint's state that would poison every later step).
void check_finite_state(const char* optimizer, const std::string& what, const at::Tensor& tensor);

}  // namespace fogo::detail
