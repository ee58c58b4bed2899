// fogo::FusedAdamW (fogo/adamw.h): torch::optim::AdamW's step through at::_fused_adamw_.
#include "fogo/adamw.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <optional>
#include <utility>
#include <vector>

#include "fogo_private/frame/closure.h"

namespace fogo {

namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

// One call of the fused kernel: parameters of one param group, device and dtype.
struct Bucket {
  Bucket(at::Device device, at::ScalarType dtype, const AdamWOptions& options)
      : device(device), dtype(dtype), options(&options) {}
  at::Device device;
  at::ScalarType dtype;
  const AdamWOptions* options;
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<AdamWParamState*> states;
};

// A tensor the kernel can take beside `param`: the kernel walks every tensor of a parameter as
// one flat array of the parameter's dtype, on its device.
bool like_param(const at::Tensor& t, const at::Tensor& param) {
  return t.defined() && t.layout() == at::kStrided && t.is_contiguous() &&
         t.scalar_type() == param.scalar_type() && t.device() == param.device() &&
         t.sizes() == param.sizes();
}

// The parameter and its gradient: the kernel has CPU and CUDA implementations for these dtypes.
bool fusable(const at::Tensor& param, const at::Tensor& grad) {
  const auto type = param.scalar_type();
  const bool floating =
      type == at::kFloat || type == at::kDouble || type == at::kBFloat16 || type == at::kHalf;
  return floating && (param.is_cpu() || param.is_cuda()) && like_param(param, param) &&
         like_param(grad, param);
}

// Its state, as torch::optim::AdamW made it (or as a checkpoint brought it).
bool fusable(const AdamWParamState& s, const at::Tensor& param, bool amsgrad) {
  return like_param(s.exp_avg(), param) && like_param(s.exp_avg_sq(), param) &&
         (!amsgrad || like_param(s.max_exp_avg_sq(), param));
}

// torch::optim::AdamW's state for a parameter's first step.
std::unique_ptr<AdamWParamState> initial_state(const at::Tensor& param, bool amsgrad) {
  auto state = std::make_unique<AdamWParamState>();
  state->step(0);
  state->exp_avg(torch::zeros_like(param, at::MemoryFormat::Preserve));
  state->exp_avg_sq(torch::zeros_like(param, at::MemoryFormat::Preserve));
  if (amsgrad) state->max_exp_avg_sq(torch::zeros_like(param, at::MemoryFormat::Preserve));
  return state;
}

// The step counts the kernel reads (after this step's increment), as the float tensors on the
// parameters' device it takes: one host-to-device copy per bucket.
std::vector<at::Tensor> step_tensors(const Bucket& b) {
  std::vector<float> steps;
  for (const AdamWParamState* s : b.states) steps.push_back(static_cast<float>(s->step()));
  at::Tensor host = at::tensor(steps, at::TensorOptions().dtype(at::kFloat));
  return host.to(b.device).unbind(0);
}

void run(Bucket& b) {
  const AdamWOptions& o = *b.options;
  for (AdamWParamState* s : b.states) s->step(s->step() + 1);
  const std::vector<at::Tensor> steps = step_tensors(b);
  at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs, steps, o.lr(),
                    std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                    o.amsgrad(), /*maximize=*/false, std::nullopt, std::nullopt);
}

using Buckets = std::vector<Bucket>;

// Adds parameter `p` (gradient `grad`, state `s`) of a group with options `o` to that group's
// bucket of its device and dtype, buckets[first...] being that group's.
void add(Buckets& buckets, size_t first, const at::Tensor& p, const at::Tensor& grad,
         AdamWParamState& s, const AdamWOptions& o) {
  size_t k = first;
  while (k < buckets.size() &&
         (buckets[k].device != p.device() || buckets[k].dtype != p.scalar_type()))
    ++k;
  if (k == buckets.size()) buckets.emplace_back(p.device(), p.scalar_type(), o);
  Bucket& b = buckets[k];
  b.params.push_back(p);
  b.grads.push_back(grad);
  b.exp_avgs.push_back(s.exp_avg());
  b.exp_avg_sqs.push_back(s.exp_avg_sq());
  if (o.amsgrad()) b.max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
  b.states.push_back(&s);
}

// Hides the gradients of `params` while it lives: torch::optim::AdamW::step skips a parameter
// without one, so it steps only the others.
class HiddenGrads {
 public:
  explicit HiddenGrads(std::vector<at::Tensor> params) : params_(std::move(params)) {
    for (auto& p : params_) {
      grads_.push_back(p.grad());
      p.mutable_grad() = at::Tensor();
    }
  }
  ~HiddenGrads() {
    for (size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = grads_[i];
  }
  HiddenGrads(const HiddenGrads&) = delete;
  HiddenGrads& operator=(const HiddenGrads&) = delete;

 private:
  std::vector<at::Tensor> params_, grads_;
};

}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  const torch::Tensor loss = detail::run_closure(closure);
  torch::NoGradGuard no_grad;
  // Plan first: each parameter with a gradient to a bucket of its group or to the base step.
  Buckets buckets;
  std::vector<at::Tensor> fused, others;
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const AdamWOptions&>(group.options());
    const size_t first = buckets.size();
    for (const auto& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      auto it = state_.find(p.unsafeGetTensorImpl());
      const bool fits = fusable(p, grad) &&
                        (it == state_.end() ||
                         fusable(static_cast<const AdamWParamState&>(*it->second), p, o.amsgrad()));
      if (!fits) {
        others.push_back(p);
        continue;
      }
      if (it == state_.end())
        it = state_.emplace(p.unsafeGetTensorImpl(), initial_state(p, o.amsgrad())).first;
      add(buckets, first, p, grad, static_cast<AdamWParamState&>(*it->second), o);
      fused.push_back(p);
    }
  }
  // The base step first: what it refuses (sparse gradients), it refuses before anything changed.
  if (!others.empty()) {
    const HiddenGrads hidden(fused);
    torch::optim::AdamW::step();
  }
  for (Bucket& bucket : buckets) run(bucket);
  last_fused_ = fused.size();
  return loss;
}

}  // namespace fogo
