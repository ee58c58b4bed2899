#include "data.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/vision.h>
#include <torch/torch.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numbers>
#include <stdexcept>

namespace fogo::resnet {
namespace {

namespace fs = std::filesystem;

std::runtime_error file_error(const std::string& path, const std::string& what) {
  return std::runtime_error("'" + path + "': " + what);
}

// zlib reads gzip streams and, transparently, plain files: one reader for .gz and raw IDX.
std::vector<uint8_t> read_bytes(const std::string& path) {
  if (!fs::is_regular_file(path)) throw file_error(path, "no such file");
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) throw file_error(path, "cannot open");
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> chunk(1 << 20);
  while (true) {
    const int n = gzread(file, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      const std::string msg = gzerror(file, &code);
      gzclose(file);
      throw file_error(path, "corrupt gzip data (" + msg + ")");
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + n);
  }
  int code = 0;
  const std::string msg = gzerror(file, &code);
  gzclose(file);
  // A gzip stream cut short reads as far as it goes and then reports Z_BUF_ERROR.
  if (code == Z_BUF_ERROR) throw file_error(path, "truncated gzip stream (" + msg + ")");
  if (code != Z_OK && code != Z_STREAM_END) throw file_error(path, "read failed (" + msg + ")");
  return bytes;
}

uint32_t big_endian(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

torch::Tensor to_tensor(std::vector<uint8_t>&& bytes, size_t offset, std::vector<int64_t> shape) {
  auto t = torch::empty(shape, torch::kUInt8);
  std::memcpy(t.data_ptr<uint8_t>(), bytes.data() + offset, static_cast<size_t>(t.numel()));
  return t;
}

void check_labels(const torch::Tensor& labels, int64_t num_classes, const std::string& path) {
  if (labels.numel() == 0) return;
  const int64_t max = labels.max().item<int64_t>();
  if (max >= num_classes) {
    const int64_t at = (labels >= num_classes).nonzero()[0][0].item<int64_t>();
    throw file_error(path, "label " + std::to_string(labels[at].item<int64_t>()) + " at sample " +
                               std::to_string(at) + " is not a class in [0, " +
                               std::to_string(num_classes) + ")");
  }
}

std::string first_existing(const std::vector<std::string>& candidates, const std::string& what) {
  for (const auto& c : candidates) {
    if (fs::is_regular_file(c)) return c;
  }
  std::string tried;
  for (const auto& c : candidates) tried += (tried.empty() ? "" : ", ") + c;
  throw std::invalid_argument("--data-dir: " + what + " not found (looked for " + tried + ")");
}

uint64_t mix(uint64_t h, uint64_t v) {
  // splitmix64 step: decorrelates nearby seeds (seed 0 step 1 vs seed 1 step 0).
  h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
  h += 0x9E3779B97F4A7C15ULL;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL;
  return h ^ (h >> 31);
}

}  // namespace

at::Generator derived_generator(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x5EED5EED5EED5EEDULL;
  for (const uint64_t p : parts) h = mix(h, p);
  return at::make_generator<at::CPUGeneratorImpl>(h);
}

Dataset Dataset::select(const torch::Tensor& index) const {
  const auto idx = index.to(images.device(), torch::kLong);
  return {images.index_select(0, idx), labels.index_select(0, idx)};
}

Dataset Dataset::to(const torch::Device& device) const {
  return {images.to(device), labels.to(device)};
}

torch::Tensor read_idx(const std::string& path) {
  std::vector<uint8_t> bytes = read_bytes(path);
  if (bytes.size() < 4) {
    throw file_error(path, "truncated: " + std::to_string(bytes.size()) +
                               " bytes, shorter than the 4-byte IDX magic number");
  }
  if (bytes[0] != 0 || bytes[1] != 0) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", big_endian(bytes.data()));
    throw file_error(path, std::string("not an IDX file: magic number ") + buf +
                               " (an IDX file starts with 0x0000 then type and rank)");
  }
  if (bytes[2] != 0x08) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", bytes[2]);
    throw file_error(path, std::string("IDX element type ") + buf +
                               " is not supported; only unsigned bytes (0x08) are");
  }
  const int rank = bytes[3];
  if (rank < 1 || rank > 4) {
    throw file_error(path, "IDX rank " + std::to_string(rank) + " is not in 1..4");
  }
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() < header) {
    throw file_error(path, "truncated inside the IDX header (" + std::to_string(bytes.size()) +
                               " of " + std::to_string(header) + " bytes)");
  }
  std::vector<int64_t> shape;
  size_t expected = 1;
  for (int d = 0; d < rank; ++d) {
    shape.push_back(big_endian(bytes.data() + 4 + 4 * d));
    expected *= static_cast<size_t>(shape.back());
  }
  const size_t have = bytes.size() - header;
  if (have < expected) {
    throw file_error(path, "truncated: the header promises " + std::to_string(expected) +
                               " data bytes, the file holds " + std::to_string(have));
  }
  if (have > expected) {
    throw file_error(path, std::to_string(have - expected) +
                               " unexpected bytes after the data the header describes");
  }
  return to_tensor(std::move(bytes), header, shape);
}

Dataset read_idx_dataset(const std::string& images_path, const std::string& labels_path,
                         int64_t num_classes) {
  torch::Tensor images = read_idx(images_path);
  torch::Tensor labels = read_idx(labels_path);
  if (images.dim() == 3) images = images.unsqueeze(1);
  if (images.dim() != 4) {
    throw file_error(images_path, "an images file must be [N, H, W] or [N, C, H, W], got rank " +
                                      std::to_string(images.dim()));
  }
  if (labels.dim() != 1) {
    throw file_error(labels_path,
                     "a labels file must be [N], got rank " + std::to_string(labels.dim()));
  }
  if (labels.size(0) != images.size(0)) {
    throw file_error(labels_path, std::to_string(labels.size(0)) + " labels for " +
                                      std::to_string(images.size(0)) + " images in " + images_path);
  }
  labels = labels.to(torch::kLong);
  check_labels(labels, num_classes, labels_path);
  return {images, labels};
}

Dataset read_cifar10(const std::vector<std::string>& paths) {
  constexpr int64_t kPixels = 3 * 32 * 32, kRecord = 1 + kPixels;
  std::vector<torch::Tensor> images, labels;
  for (const auto& path : paths) {
    std::vector<uint8_t> bytes = read_bytes(path);
    if (bytes.empty() || bytes.size() % kRecord != 0) {
      throw file_error(path, "truncated or not CIFAR-10 binary: " + std::to_string(bytes.size()) +
                                 " bytes is not a whole number of " + std::to_string(kRecord) +
                                 "-byte records (1 label byte + 3072 pixel bytes)");
    }
    const int64_t n = static_cast<int64_t>(bytes.size()) / kRecord;
    auto records = to_tensor(std::move(bytes), 0, {n, kRecord});
    auto l = records.select(1, 0).to(torch::kLong);
    check_labels(l, 10, path);
    images.push_back(records.slice(1, 1).reshape({n, 3, 32, 32}).contiguous());
    labels.push_back(l);
  }
  if (images.empty()) throw std::runtime_error("read_cifar10: no files given");
  return {torch::cat(images), torch::cat(labels)};
}

DataSplit load_fashion_mnist(const std::string& dir) {
  auto file = [&](const std::string& stem) {
    return first_existing({dir + "/" + stem + ".gz", dir + "/" + stem}, stem);
  };
  // Looked up one by one, in this order, so a missing file is reported predictably.
  const std::string train_images = file("train-images-idx3-ubyte");
  const std::string train_labels = file("train-labels-idx1-ubyte");
  const std::string test_images = file("t10k-images-idx3-ubyte");
  const std::string test_labels = file("t10k-labels-idx1-ubyte");
  DataSplit split;
  split.name = "fashion-mnist";
  split.train = read_idx_dataset(train_images, train_labels);
  split.test = read_idx_dataset(test_images, test_labels);
  return split;
}

DataSplit load_cifar10(const std::string& dir) {
  const std::string root =
      fs::is_regular_file(dir + "/test_batch.bin") ? dir : dir + "/cifar-10-batches-bin";
  std::vector<std::string> train;
  for (int k = 1; k <= 5; ++k) {
    const std::string name = "data_batch_" + std::to_string(k) + ".bin";
    train.push_back(first_existing({root + "/" + name}, name));
  }
  DataSplit split;
  split.name = "cifar10";
  split.train = read_cifar10(train);
  split.test = read_cifar10({first_existing({root + "/test_batch.bin"}, "test_batch.bin")});
  return split;
}

namespace {

// Indices (ascending) of the first quota[c] examples of each class c in a random order drawn from
// `gen`: a class-stratified random subset.
torch::Tensor take_by_quota(const torch::Tensor& cpu_labels, const std::vector<int64_t>& quota,
                            at::Generator gen) {
  const auto order = torch::randperm(cpu_labels.size(0), gen, torch::kLong);
  std::vector<int64_t> taken(quota.size(), 0), keep;
  const auto* o = order.data_ptr<int64_t>();
  const auto* l = cpu_labels.data_ptr<int64_t>();
  for (int64_t k = 0; k < cpu_labels.size(0); ++k) {
    if (taken[l[o[k]]]++ < quota[l[o[k]]]) keep.push_back(o[k]);
  }
  std::sort(keep.begin(), keep.end());
  return torch::tensor(keep, torch::kLong);
}

}  // namespace

torch::Tensor per_class_subset(const torch::Tensor& labels, int64_t per_class, int64_t num_classes,
                               uint64_t seed) {
  const auto cpu = labels.to(torch::kCPU);
  if (per_class <= 0) return torch::arange(cpu.size(0), torch::kLong);
  return take_by_quota(cpu, std::vector<int64_t>(static_cast<size_t>(num_classes), per_class),
                       derived_generator({seed, 0x5B5E7}));
}

torch::Tensor imbalanced_subset(const torch::Tensor& labels, const std::vector<int64_t>& rare,
                                double fraction, int64_t num_classes, uint64_t seed) {
  const auto cpu = labels.to(torch::kCPU);
  std::vector<bool> is_rare(static_cast<size_t>(num_classes), false);
  for (const int64_t c : rare) is_rare.at(static_cast<size_t>(c)) = true;
  const auto counts = torch::bincount(cpu, {}, num_classes);
  std::vector<int64_t> quota(static_cast<size_t>(num_classes));
  for (int64_t c = 0; c < num_classes; ++c) {
    const int64_t n = counts[c].item<int64_t>();
    quota[c] = is_rare[c] ? static_cast<int64_t>(std::ceil(fraction * static_cast<double>(n))) : n;
  }
  return take_by_quota(cpu, quota, derived_generator({seed, 0x1AB}));
}

torch::Tensor validation_subset(const torch::Tensor& labels, double fraction, int64_t num_classes,
                                uint64_t seed) {
  const auto cpu = labels.to(torch::kCPU);
  const auto counts = torch::bincount(cpu, {}, num_classes);
  std::vector<int64_t> quota(static_cast<size_t>(num_classes));
  for (int64_t c = 0; c < num_classes; ++c) {
    quota[c] =
        static_cast<int64_t>(std::ceil(fraction * static_cast<double>(counts[c].item<int64_t>())));
  }
  return take_by_quota(cpu, quota, derived_generator({seed, 0x5A1}));
}

torch::Tensor class_subset(const torch::Tensor& labels, const std::vector<int64_t>& classes) {
  auto mask = torch::zeros_like(labels, torch::kBool);
  for (const int64_t c : classes) mask |= labels == c;
  return mask.nonzero().flatten();
}

Dataset rotated(const Dataset& data, double degrees) {
  if (std::fmod(degrees, 360.0) == 0.0) return data;
  namespace F = torch::nn::functional;
  const double rad = degrees * std::numbers::pi / 180.0;
  const double c = std::cos(rad), s = std::sin(rad);
  const auto n = data.size();
  auto theta = torch::tensor({c, -s, 0.0, s, c, 0.0}, torch::kFloat)
                   .view({1, 2, 3})
                   .expand({n, 2, 3})
                   .to(data.images.device());
  auto x = data.images.to(torch::kFloat);
  auto grid = F::affine_grid(theta, x.sizes(), /*align_corners=*/false);
  auto y = F::grid_sample(x, grid,
                          F::GridSampleFuncOptions()
                              .mode(torch::kBilinear)
                              .padding_mode(torch::kZeros)
                              .align_corners(false));
  return {y.round().clamp(0, 255).to(torch::kUInt8), data.labels};
}

Dataset permuted(const Dataset& data, uint64_t seed) {
  const auto sizes = data.images.sizes();
  const int64_t pixels = sizes[2] * sizes[3];
  auto gen = derived_generator({seed, 0xBE2});
  const auto perm = torch::randperm(pixels, gen, torch::kLong).to(data.images.device());
  auto flat = data.images.reshape({sizes[0], sizes[1], pixels}).index_select(2, perm);
  return {flat.reshape(sizes).contiguous(), data.labels};
}

Normalizer::Normalizer(const Dataset& train) {
  const auto x = train.images.to(torch::kFloat).div_(255.0);
  mean_ = x.mean({0, 2, 3}, /*keepdim=*/true);
  // A constant channel (all-black synthetic data) must not divide by zero.
  inv_std_ = 1.0 / x.std({0, 2, 3}, /*unbiased=*/false, /*keepdim=*/true).clamp_min(1e-3);
}

torch::Tensor Normalizer::operator()(const torch::Tensor& images_u8) const {
  return (images_u8.to(torch::kFloat).div_(255.0) - mean_) * inv_std_;
}

torch::Tensor augment(const torch::Tensor& images, int64_t pad, bool flip,
                      at::Generator& generator) {
  const int64_t n = images.size(0), c = images.size(1), h = images.size(2), w = images.size(3);
  const auto device = images.device();
  auto x = images;
  if (flip) {
    auto mirror = torch::randint(0, 2, {n}, generator, torch::kLong).to(device).to(torch::kBool);
    x = torch::where(mirror.view({n, 1, 1, 1}), images.flip(3), images);
  }
  if (pad <= 0) return x;
  const auto opts = torch::TensorOptions().dtype(torch::kLong);
  auto dy = torch::randint(0, 2 * pad + 1, {n}, generator, opts).to(device);
  auto dx = torch::randint(0, 2 * pad + 1, {n}, generator, opts).to(device);
  // Black borders (pixel value 0), as torchvision's RandomCrop(padding) before Normalize.
  auto padded = torch::constant_pad_nd(x, {pad, pad, pad, pad}, 0);
  // Per-sample crop as two gathers: rows dy..dy+h, then columns dx..dx+w.
  auto rows = (dy.view({n, 1}) + torch::arange(h, opts.device(device))).view({n, 1, h, 1});
  auto cropped = padded.gather(2, rows.expand({n, c, h, w + 2 * pad}));
  auto cols = (dx.view({n, 1}) + torch::arange(w, opts.device(device))).view({n, 1, 1, w});
  return cropped.gather(3, cols.expand({n, c, h, w}));
}

}  // namespace fogo::resnet
