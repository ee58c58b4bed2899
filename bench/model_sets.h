#pragma once
// The parameter sets fogo's step benchmarks time (bench_step.cpp, bench_dist_step.cpp): the
// matrices of GPT-2 small and of ResNet-18, and the FOGO preset the paper uses for each.
#include <fogo/fogo_options.h>

#include <cstdint>
#include <vector>

namespace fogo::bench {

using Shape = std::vector<int64_t>;

/// set 0, GPT-2 small (124M): its 48 matrices, 12 x {768x2304 qkv, 768x768 attention proj,
/// 3072x768 MLP fc, 768x3072 MLP proj}, 84.9M weights (`layers` < 12: the first ones only).
/// set 1, ResNet-18 for CIFAR (11.17M): its 21 conv and fc weights, 11.16M.
inline std::vector<Shape> model_shapes(int64_t set, int layers = 12) {
  std::vector<Shape> shapes;
  if (set == 0) {
    for (int layer = 0; layer < layers; ++layer) {
      for (const Shape& s : {Shape{768, 2304}, Shape{768, 768}, Shape{3072, 768}, Shape{768, 3072}})
        shapes.push_back(s);
    }
    return shapes;
  }
  shapes.push_back({64, 3, 3, 3});
  int64_t in = 64;
  for (const int64_t out : {64, 128, 256, 512}) {
    for (int block = 0; block < 2; ++block) {
      shapes.push_back({out, block == 0 ? in : out, 3, 3});
      shapes.push_back({out, out, 3, 3});
      if (block == 0 && in != out) shapes.push_back({out, in, 1, 1});  // downsample shortcut
    }
    in = out;
  }
  shapes.push_back({10, 512});
  return shapes;
}

inline const char* set_name(int64_t set) { return set == 0 ? "gpt2-small" : "resnet18"; }

/// GPT-2: C 256, d 512; ResNet: the class-imbalanced backbone, C 96, d 128.
inline FOGOOptions fogo_preset(int64_t set, c10::ScalarType ns_dtype) {
  return (set == 0 ? presets::gpt2() : presets::class_imbalanced_backbone()).ns_dtype(ns_dtype);
}

}  // namespace fogo::bench
