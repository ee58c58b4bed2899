#include "resnet.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>

#include <stdexcept>

namespace fogo::resnet {
namespace {

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel)
                               .stride(stride)
                               .padding(kernel / 2)
                               .bias(false));  // BatchNorm follows every conv
}

torch::nn::Sequential stage_of(int64_t in, int64_t out, int64_t stride, const SharedRankSum& sum) {
  return torch::nn::Sequential(BasicBlock(in, out, stride, sum), BasicBlock(out, out, 1, sum));
}

torch::Tensor norm(torch::nn::BatchNorm2d& bn, const torch::Tensor& x, const SharedRankSum& sum) {
  return batch_norm(bn, x, *sum ? sum.get() : nullptr);
}

}  // namespace

BasicBlockImpl::BasicBlockImpl(int64_t in, int64_t out, int64_t stride, SharedRankSum sum)
    : sum_(std::move(sum)) {
  conv1 = register_module("conv1", conv(in, out, 3, stride));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(out));
  conv2 = register_module("conv2", conv(out, out, 3, 1));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(out));
  if (stride != 1 || in != out) {
    shortcut_conv = conv(in, out, 1, stride);
    shortcut_bn = torch::nn::BatchNorm2d(out);
    shortcut = register_module("shortcut", torch::nn::Sequential(shortcut_conv, shortcut_bn));
  }
}

torch::Tensor BasicBlockImpl::forward(const torch::Tensor& x) {
  auto y = torch::relu(norm(bn1, conv1(x), sum_));
  y = norm(bn2, conv2(y), sum_);
  return torch::relu(y + (shortcut ? norm(shortcut_bn, shortcut_conv(x), sum_) : x));
}

ResNet18Impl::ResNet18Impl(const ResNetOptions& o) : options_(o) {
  if (o.in_channels < 1 || o.num_classes < 2 || o.width < 1 || o.head_fc < 0) {
    throw std::invalid_argument(
        "ResNet18: need in_channels >= 1, num_classes >= 2, width >= 1 and head_fc >= 0");
  }
  const int64_t w = o.width;
  conv1 = register_module("conv1", conv(o.in_channels, w, 3, 1));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(w));
  layer1 = register_module("layer1", stage_of(w, w, 1, sum_));
  layer2 = register_module("layer2", stage_of(w, 2 * w, 2, sum_));
  layer3 = register_module("layer3", stage_of(2 * w, 4 * w, 2, sum_));
  layer4 = register_module("layer4", stage_of(4 * w, 8 * w, 2, sum_));
  int64_t features = 8 * w;
  if (o.head_fc > 0) {
    head_fc = register_module("head_fc", torch::nn::Linear(features, o.head_fc));
    features = o.head_fc;
  }
  fc = register_module("fc", torch::nn::Linear(features, o.num_classes));
}

torch::Tensor ResNet18Impl::forward(const torch::Tensor& x) {
  auto y = torch::relu(norm(bn1, conv1(x), sum_));
  y = layer4->forward(layer3->forward(layer2->forward(layer1->forward(y))));
  y = torch::adaptive_avg_pool2d(y, {1, 1}).flatten(1);
  if (head_fc) y = torch::relu(head_fc(y));
  return fc(y);
}

std::string stage(const std::string& name) {
  for (const char* prefix : {"layer1.", "layer2.", "layer3.", "layer4.", "head_fc.", "fc."}) {
    const std::string p(prefix);
    if (name.rfind(p, 0) == 0) return p.substr(0, p.size() - 1);
  }
  if (name.rfind("conv1.", 0) == 0 || name.rfind("bn1.", 0) == 0) return "stem";
  throw std::invalid_argument("resnet::stage: unknown parameter '" + name + "'");
}

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) {
    if (p.requires_grad()) n += p.numel();
  }
  return n;
}

}  // namespace fogo::resnet
