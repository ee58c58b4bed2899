#pragma once
// Batch normalization whose training statistics span every rank of a data-parallel job (what
// PyTorch's SyncBatchNorm does): W ranks of b rows then normalize as one process with W·b rows
// does, up to summation order. The module stays a torch::nn::BatchNorm2d (same parameters,
// buffers and checkpoints); only its training-mode forward is replaced.

#include <torch/nn/modules/batchnorm.h>
#include <torch/types.h>

#include <functional>

namespace fogo::resnet {

/// Sums a tensor over the ranks, in place on its device: every rank gets the sum.
using RankSum = std::function<void(torch::Tensor&)>;

/// `bn`'s forward on x [N, C, H, W]. Without `sum`, or in eval mode: bn(x) itself. With it, in
/// training mode: the channel means and (biased) variances over every rank's rows, the affine
/// map, and the running statistics updated as BatchNorm2d updates them (momentum, unbiased
/// variance over all rows); in backward, the two channel sums that couple the rows are summed
/// over the ranks, while the weight and bias get this rank's own share (gradient averaging
/// adds the rest). Three sums over the ranks per call: two in forward, one in backward.
/// Computed in float32 and returned in x's dtype.
torch::Tensor batch_norm(torch::nn::BatchNorm2d& bn, const torch::Tensor& x, const RankSum* sum);

}  // namespace fogo::resnet
