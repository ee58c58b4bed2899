#pragma once
// Datasets for the ResNet trainer, held whole in memory as tensors (on the training device when
// it is a GPU), and the deterministic selections and transforms the scenarios are built from.
//
// Readers (every error names the file and the problem):
//   IDX (Fashion-MNIST / MNIST): magic 0x00 0x00 <type 0x08 = unsigned byte> <ndims>, then ndims
//     big-endian uint32 sizes, then the bytes. Gzip-compressed or plain, told apart by zlib.
//   CIFAR-10 binary: records of 1 label byte + 3072 pixel bytes (1024 R, 1024 G, 1024 B, rows of
//     32), in data_batch_1..5.bin and test_batch.bin.

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fogo::resnet {

struct Dataset {
  torch::Tensor images;  ///< uint8 [N, C, H, W]
  torch::Tensor labels;  ///< int64 [N]

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  /// The samples at `index` (int64, on any device), in that order.
  Dataset select(const torch::Tensor& index) const;
  Dataset to(const torch::Device& device) const;
};

struct DataSplit {
  std::string name;
  Dataset train, test;
  int64_t num_classes = 10;
};

/// One IDX file as a uint8 tensor of the file's shape.
torch::Tensor read_idx(const std::string& path);
/// An images file ([N, H, W] or [N, C, H, W]) and a labels file ([N]) of one dataset; labels must
/// lie in [0, num_classes).
Dataset read_idx_dataset(const std::string& images_path, const std::string& labels_path,
                         int64_t num_classes = 10);
/// Concatenates CIFAR-10 binary batch files.
Dataset read_cifar10(const std::vector<std::string>& paths);

/// Fashion-MNIST from `dir` ({train,t10k}-{images-idx3,labels-idx1}-ubyte, .gz or plain).
DataSplit load_fashion_mnist(const std::string& dir);
/// CIFAR-10 binary from `dir` or `dir`/cifar-10-batches-bin.
DataSplit load_cifar10(const std::string& dir);

/// Up to `per_class` samples of every class (a seeded random choice, kept in dataset order).
/// per_class <= 0 keeps everything.
torch::Tensor per_class_subset(const torch::Tensor& labels, int64_t per_class, int64_t num_classes,
                               uint64_t seed);
/// The class-imbalanced training set: every sample of the other classes and, of each class in
/// `rare`, ceil(fraction * its count) samples chosen at random (seeded). Dataset order is kept.
torch::Tensor imbalanced_subset(const torch::Tensor& labels, const std::vector<int64_t>& rare,
                                double fraction, int64_t num_classes, uint64_t seed);
/// The validation split: ceil(fraction * its count) samples of every class, chosen at random
/// (seeded), in dataset order. The rest is what a run trains on.
torch::Tensor validation_subset(const torch::Tensor& labels, double fraction, int64_t num_classes,
                                uint64_t seed);
/// Indices of the samples whose label is one of `classes`, in dataset order.
torch::Tensor class_subset(const torch::Tensor& labels, const std::vector<int64_t>& classes);

/// Every image rotated by `degrees` about its centre (bilinear, zero fill), still uint8.
Dataset rotated(const Dataset& data, double degrees);
/// Every image with its pixels shuffled by one fixed permutation drawn from `seed`
/// (the same permutation for every channel).
Dataset permuted(const Dataset& data, uint64_t seed);

/// Per-channel mean and standard deviation of a training set; maps uint8 images to normalised
/// float32 on the images' device.
class Normalizer {
 public:
  Normalizer() = default;
  explicit Normalizer(const Dataset& train);
  torch::Tensor operator()(const torch::Tensor& images_u8) const;

 private:
  torch::Tensor mean_, inv_std_;  ///< [1, C, 1, 1]
};

/// Batch-level augmentation of raw (uint8, not yet normalised) images: a random crop after
/// padding by `pad` pixels of value 0 (black, as torchvision's RandomCrop before Normalize) and,
/// with `flip`, a random horizontal flip, both drawn per sample from `generator` (CPU), so the
/// batch is the same on every device for one generator state. Keeps the dtype.
torch::Tensor augment(const torch::Tensor& images, int64_t pad, bool flip,
                      at::Generator& generator);

/// A CPU generator seeded from several numbers (run seed, step, purpose, ...): every random
/// choice of a run derives from its position in the run, so a resumed run repeats it exactly.
at::Generator derived_generator(std::initializer_list<uint64_t> parts);

}  // namespace fogo::resnet
