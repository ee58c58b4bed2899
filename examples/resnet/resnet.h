#pragma once
// CIFAR-style ResNet-18: a 3x3 stride-1 stem without max-pool (small images keep their
// resolution into layer1), four stages of two BasicBlocks at widths w, 2w, 4w, 8w, global average
// pooling and a linear classifier. w = 64 with 3 input channels and 10 classes is the standard
// model of the paper (11,173,962 parameters); a smaller w trains on a CPU.
//
// Parameter names, which decide FOGO's codebook groups (stage()):
//   conv1, bn1                     stem
//   layer{1..4}.{0,1}.*            residual stages
//   head_fc.*                      optional intermediate head FC (the paper's class-IL head)
//   fc.*                           classifier

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>

#include "batch_norm.h"

namespace fogo::resnet {

struct ResNetOptions {
  int64_t in_channels = 3;
  int64_t num_classes = 10;
  int64_t width = 64;   ///< channels of the stem and layer1; later stages double it
  int64_t head_fc = 0;  ///< > 0: a ReLU FC layer of this width before the classifier
};

/// The sum over ranks the BatchNorm layers of one network use; empty: each process's own
/// statistics (set by ResNet18Impl::sync_batch_norm).
using SharedRankSum = std::shared_ptr<RankSum>;

class BasicBlockImpl : public torch::nn::Module {
 public:
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride, SharedRankSum sum);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential shortcut{nullptr};   ///< 1x1 conv + BN when the shape changes
  torch::nn::Conv2d shortcut_conv{nullptr};  ///< shortcut's children
  torch::nn::BatchNorm2d shortcut_bn{nullptr};
  SharedRankSum sum_;
};
TORCH_MODULE(BasicBlock);

class ResNet18Impl : public torch::nn::Module {
 public:
  explicit ResNet18Impl(const ResNetOptions& options = {});
  /// [N, in_channels, H, W] float -> [N, num_classes] logits.
  torch::Tensor forward(const torch::Tensor& x);
  const ResNetOptions& options() const { return options_; }
  /// Width of the pooled features (8 * width).
  int64_t feature_dim() const { return 8 * options_.width; }
  /// Data-parallel: every BatchNorm layer normalizes over the rows of every rank, summing its
  /// statistics with `sum` (batch_norm.h); an empty function returns to per-process statistics.
  void sync_batch_norm(RankSum sum) { *sum_ = std::move(sum); }

 private:
  SharedRankSum sum_ = std::make_shared<RankSum>();
  ResNetOptions options_;
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear head_fc{nullptr}, fc{nullptr};
};
TORCH_MODULE(ResNet18);

/// The part of the network a parameter belongs to, from its name: "stem", "layer1".."layer4",
/// "head_fc" or "fc".
std::string stage(const std::string& param_name);

/// Number of trainable parameters.
int64_t count_parameters(const torch::nn::Module& module);

}  // namespace fogo::resnet
