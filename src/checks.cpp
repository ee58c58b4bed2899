#include "fogo/detail/checks.h"

#include <ATen/ATen.h>
#include <c10/util/flat_hash_map.h>
#include <fogo/fogo_options.h>
#include <fogo/muon.h>
#include <fogo/step_shard.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

namespace fogo::detail {

void check_range(const char* optimizer, const char* option, double value, double lo, double hi) {
  TORCH_CHECK(std::isfinite(value) && value >= lo && value <= hi, optimizer, ": option '", option,
              "' must be finite and in [", lo, ", ", hi, "], got ", value);
}

std::string describe_param(size_t group, size_t index, const at::Tensor& param) {
  std::ostringstream out;
  out << "parameter " << index << " of group " << group << " (shape " << param.sizes() << ")";
  return out.str();
}

void check_grad_kind(const char* optimizer, size_t group, size_t index, const at::Tensor& param,
                     const at::Tensor& grad) {
  TORCH_CHECK(
      !param.is_complex() && !grad.is_complex(), optimizer,
      " does not support complex parameters or gradients: ", describe_param(group, index, param));
  TORCH_CHECK(!grad.is_sparse(), optimizer,
              " does not support sparse gradients: ", describe_param(group, index, param));
  TORCH_CHECK(grad.sizes() == param.sizes(), optimizer, ": gradient of ",
              describe_param(group, index, param), " has shape ", grad.sizes());
}

namespace {

// The largest finite value of a parameter's dtype.
double largest(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return static_cast<double>(std::numeric_limits<c10::Half>::max());
    case at::kBFloat16:
      return static_cast<double>(std::numeric_limits<c10::BFloat16>::max());
    case at::kFloat:
      return std::numeric_limits<float>::max();
    default:
      return std::numeric_limits<double>::max();
  }
}

// The decoupled weight decay of fogo's options (0 for others).
double weight_decay_of(const torch::optim::OptimizerOptions& options) {
  if (const auto* o = dynamic_cast<const MuonOptions*>(&options)) return o->weight_decay();
  if (const auto* o = dynamic_cast<const FOGOOptions*>(&options)) return o->weight_decay();
  return 0.0;
}

// The step's scalars must be representable in the parameter's dtype, where the update multiplies
// by them: lr 1e39 is Inf in float32 (ATen refuses it half-way through a step, naming nothing),
// and the decay factor 1 - lr x weight_decay flips the parameters' sign and grows them (Inf
// within a few steps, silently) once lr x weight_decay exceeds 1.
void check_step_scalars(const char* optimizer, size_t group, size_t index, const at::Tensor& param,
                        const torch::optim::OptimizerOptions& options) {
  double lr = 0;
  try {
    lr = options.get_lr();
  } catch (const c10::Error&) {
    return;  // options without a learning rate: nothing to check
  }
  const double max = largest(param.scalar_type());
  TORCH_CHECK(std::abs(lr) <= max, optimizer, ": option 'lr' of param group ", group, " is ", lr,
              ", beyond the largest ", param.scalar_type(), " (", max, "), the dtype of ",
              describe_param(group, index, param), "; the step was not applied");
  const double wd = weight_decay_of(options);
  TORCH_CHECK(lr * wd <= 1.0, optimizer, ": options 'lr' x 'weight_decay' of param group ", group,
              " is ", lr, " x ", wd, " = ", lr * wd,
              " > 1: the decay factor 1 - lr x weight_decay would flip the sign of ",
              describe_param(group, index, param),
              " and grow it without bound (Inf within a few steps); the step was not applied");
}

}  // namespace

GradItems collect_grads(const char* optimizer,
                        const std::vector<torch::optim::OptimizerParamGroup>& groups,
                        const std::function<void(size_t)>& check_group,
                        const std::function<void(size_t, size_t, const at::Tensor&)>& check_param) {
  // Python's torch.optim refuses a parameter listed twice at construction; LibTorch's
  // add_param_group only notices one that already has state, which fogo creates lazily. Stepped
  // once per listing through one shared state, it would silently move twice as far.
  ska::flat_hash_map<const c10::TensorImpl*, std::pair<size_t, size_t>> seen;
  GradItems items;
  for (size_t g = 0; g < groups.size(); ++g) {
    check_group(g);
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      const auto [first, inserted] = seen.emplace(p.unsafeGetTensorImpl(), std::make_pair(g, i));
      TORCH_CHECK(inserted, optimizer, ": ", describe_param(g, i, p), " is also ",
                  describe_param(first->second.first, first->second.second, p),
                  ": a parameter may not appear in more than one parameter group (or twice in "
                  "one)");
      if (!p.grad().defined()) continue;
      check_param(g, i, p);
      check_grad_kind(optimizer, g, i, p, p.grad());
      check_step_scalars(optimizer, g, i, p, groups[g].options());
      items.params.push_back(p);
      items.grads.push_back(p.grad());
      items.where.emplace_back(g, i);
    }
  }
  return items;
}

namespace {
// A gradient's Frobenius norm, accumulated in float32 at least (as the Newton–Schulz input's
// normalisation and AdamW's second moment are).
at::Tensor grad_norm(const at::Tensor& grad) {
  const auto dtype = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return at::linalg_vector_norm(grad, 2, {}, /*keepdim=*/false, dtype);
}

double max_grad_norm(const at::Tensor& grad) {
  return grad.scalar_type() == at::kDouble ? kMaxGradNormDouble : kMaxGradNorm;
}
}  // namespace

namespace {
thread_local int64_t reads = 0;  // first_unusable_grad's read-backs on this thread, for tests
}  // namespace

void check_graph_device(const char* optimizer, size_t group, size_t index,
                        const at::Tensor& param) {
#ifdef FOGO_WITH_CUDA
  TORCH_CHECK(param.is_cuda(), optimizer,
              ": option 'cuda_graph' captures the step on a CUDA device, but ",
              describe_param(group, index, param), " is on ", param.device(),
              "; set cuda_graph(false) for this param group");
#else
  (void)param, (void)index;
  TORCH_CHECK(false, optimizer, ": option 'cuda_graph' needs fogo built with CUDA ",
              "(FOGO_WITH_CUDA); param group ", group, " sets it");
#endif
}

int64_t unusable_grad_reads() { return reads; }

int64_t first_unusable_grad(const std::vector<at::Tensor>& grads) {
  if (grads.empty()) return -1;
  ++reads;
  std::vector<at::Tensor> flags;
  flags.reserve(grads.size());
  // NaN <= x and Inf <= x are false: one reduction per gradient tests all three conditions.
  for (const auto& g : grads) flags.push_back(grad_norm(g) <= max_grad_norm(g));
  const at::Tensor ok = at::stack(flags).cpu();  // the one synchronisation
  const bool* data = ok.data_ptr<bool>();
  for (size_t k = 0; k < grads.size(); ++k) {
    if (!data[k]) return static_cast<int64_t>(k);
  }
  return -1;
}

at::Tensor grads_usable(const std::vector<at::Tensor>& grads) {
  if (grads.empty()) return {};
  // One stacked test per device, in first-seen order, combined on the first device.
  std::vector<std::pair<at::Device, std::vector<at::Tensor>>> by_device;
  for (const auto& g : grads) {
    auto it = std::find_if(by_device.begin(), by_device.end(),
                           [&](const auto& d) { return d.first == g.device(); });
    if (it == by_device.end()) it = by_device.insert(by_device.end(), {g.device(), {}});
    it->second.push_back(grad_norm(g) <= max_grad_norm(g));
  }
  at::Tensor ok;
  for (const auto& [device, flags] : by_device) {
    const at::Tensor here = at::stack(flags).all();
    ok = ok.defined() ? at::logical_and(ok, here.to(ok.device())) : here;
  }
  return ok;
}

int64_t first_unusable_item(const GradItems& items, const std::function<bool(size_t)>& checked) {
  std::vector<at::Tensor> grads;
  std::vector<size_t> item;
  for (size_t k = 0; k < items.grads.size(); ++k) {
    if (checked(items.where[k].first)) {
      grads.push_back(items.grads[k]);
      item.push_back(k);
    }
  }
  const int64_t bad = first_unusable_grad(grads);
  return bad < 0 ? -1 : static_cast<int64_t>(item[bad]);
}

MaskScope::MaskScope(at::Tensor ok, std::vector<at::Tensor> tensors)
    : ok_(std::move(ok)), tensors_(std::move(tensors)) {
  if (!ok_.defined()) return;
  for (const at::Tensor& t : tensors_) before_.push_back(t.defined() ? t.clone() : t);
}

void MaskScope::restore(const std::vector<at::Tensor>& now) const {
  if (!ok_.defined()) return;
  TORCH_INTERNAL_ASSERT(now.size() == before_.size(), "MaskScope::restore: ", now.size(),
                        " tensors for ", before_.size(), " copies");
  for (size_t k = 0; k < now.size(); ++k) {
    if (!before_[k].defined()) continue;
    at::Tensor t = now[k];
    t.copy_(at::where(ok_.to(t.device()), t, before_[k]));
  }
}

void throw_unusable_grad(const char* optimizer, size_t group, size_t index,
                         const at::Tensor& param) {
  const at::Tensor& grad = param.grad();
  const bool finite = at::isfinite(grad).all().item<bool>();
  TORCH_CHECK(false, optimizer, ": gradient of ", describe_param(group, index, param),
              finite ? " has Frobenius norm " + std::to_string(grad_norm(grad).item<double>()) +
                           " above " + std::to_string(max_grad_norm(grad)) +
                           ", where the update's arithmetic would overflow (a silent zero or Inf "
                           "update)"
                     : std::string(" contains NaN or Inf"),
              "; the step was not applied (the parameters are unchanged)");
}

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

void check_state_shape(const char* optimizer, size_t g, size_t i, const at::Tensor& p,
                       const at::Tensor& state, const char* what) {
  if (!state.defined()) return;
  TORCH_CHECK(state.sizes() == p.sizes(), optimizer, ": ", describe_param(g, i, p), " has shape ",
              p.sizes(), " but its ", what, " from earlier steps has shape ", state.sizes(),
              ": the parameter was resized; give the optimizer its new parameters (a new "
              "optimizer, or a load of a checkpoint for them). Nothing was changed");
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

void check_finite_state(const char* optimizer, const std::string& what, const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.is_floating_point()) return;
  TORCH_CHECK(at::isfinite(tensor).all().item<bool>(), optimizer, "::load: the checkpoint's ", what,
              " holds NaN or Inf; every later step would spread it to the parameters, so the "
              "checkpoint is refused and nothing was loaded");
}

}  // namespace fogo::detail

namespace fogo {

bool StepShard::enabled(const char* optimizer) const {
  TORCH_CHECK(static_cast<bool>(owns) == static_cast<bool>(exchange), optimizer,
              ": a StepShard needs both owns and exchange, or neither");
  return static_cast<bool>(owns);
}

}  // namespace fogo
