#include "batch_norm.h"

#include <torch/autograd.h>

namespace fogo::resnet {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The channel dimensions of [N, C, H, W] reduced over, and a per-channel vector shaped to
// broadcast against it.
const std::vector<int64_t> kRows{0, 2, 3};
torch::Tensor per_channel(const torch::Tensor& v) { return v.view({1, -1, 1, 1}); }

struct SyncBatchNorm : torch::autograd::Function<SyncBatchNorm> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               torch::nn::BatchNorm2dImpl* bn, const RankSum* sum) {
    const auto xf = x.to(torch::kFloat);
    const int64_t C = xf.size(1);
    // Channel sums and the row count over the ranks, then the squared deviations from the
    // common mean (two passes, as one process computes the variance, not E[x^2] - E[x]^2).
    auto sums = torch::cat(
        {xf.sum(kRows), torch::full({1}, static_cast<double>(xf.numel() / C), xf.options())});
    (*sum)(sums);
    const auto n = sums[C];
    const auto mean = sums.slice(0, 0, C) / n;
    const auto centred = xf - per_channel(mean);
    auto squares = centred.square().sum(kRows);
    (*sum)(squares);
    const auto var = squares / n;
    const auto invstd = (var + bn->options.eps()).rsqrt();
    const auto xhat = centred * per_channel(invstd);
    {
      torch::NoGradGuard no_grad;
      const double m = *bn->options.momentum();
      bn->running_mean.mul_(1 - m).add_(mean.to(bn->running_mean.dtype()), m);
      bn->running_var.mul_(1 - m).add_((var * (n / (n - 1))).to(bn->running_var.dtype()), m);
      bn->num_batches_tracked.add_(1);
    }
    ctx->save_for_backward({xhat, invstd, weight, n});
    ctx->saved_data["sum"] = reinterpret_cast<int64_t>(sum);  // outlives the graph (the model's)
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    return (xhat * per_channel(weight.to(torch::kFloat)) + per_channel(bias.to(torch::kFloat)))
        .to(x.scalar_type());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &xhat = saved[0], &invstd = saved[1], &weight = saved[2], &n = saved[3];
    const auto* sum = reinterpret_cast<const RankSum*>(ctx->saved_data["sum"].toInt());
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const auto g = grad_outputs[0].to(torch::kFloat);
    // This rank's shares of d(weight) and d(bias); the sums over all rows couple the ranks.
    const auto grad_weight = (g * xhat).sum(kRows);
    const auto grad_bias = g.sum(kRows);
    auto both = torch::cat({grad_bias, grad_weight});
    (*sum)(both);
    const int64_t C = grad_bias.size(0);
    const auto mean_g = both.slice(0, 0, C) / n, mean_gx = both.slice(0, C) / n;
    const auto grad_x = per_channel(weight.to(torch::kFloat) * invstd) *
                        (g - per_channel(mean_g) - xhat * per_channel(mean_gx));
    return {grad_x.to(dtype), grad_weight.to(weight.scalar_type()),
            grad_bias.to(weight.scalar_type()), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor batch_norm(torch::nn::BatchNorm2d& bn, const torch::Tensor& x, const RankSum* sum) {
  if (!sum || !bn->is_training()) return bn(x);
  TORCH_CHECK(x.dim() == 4, "batch_norm: expected [N, C, H, W], got ", x.sizes());
  TORCH_CHECK(bn->options.affine() && bn->options.track_running_stats() &&
                  bn->options.momentum().has_value(),
              "batch_norm: synchronised statistics need an affine BatchNorm2d with running "
              "statistics and a momentum");
  return SyncBatchNorm::apply(x, bn->weight, bn->bias, bn.get(), sum);
}

}  // namespace fogo::resnet
