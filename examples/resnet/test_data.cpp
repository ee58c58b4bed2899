// Readers (on files written here in the exact IDX and CIFAR-10 formats), the model's size, the
// scenario selections and the continual-learning metrics.
#include <fogo/fogo.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/cli.h"
#include "common/metrics.h"
#include "common/optimizers.h"
#include "config.h"
#include "continual.h"
#include "data.h"
#include "optimizers.h"
#include "resnet.h"
#include "trainer.h"

namespace fs = std::filesystem;
using namespace fogo::resnet;

namespace {

// A fresh directory per call (std::filesystem::remove_all is unsafe with the torch wheel).
std::string temp_dir() {
  std::string pattern = (fs::temp_directory_path() / "fogo_resnet_XXXXXX").string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data,
                               uint8_t type = 0x08) {
  std::vector<uint8_t> out{0, 0, type, static_cast<uint8_t>(dims.size())};
  for (const uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(d >> s));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_raw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// 3 images of 2x2 with pixel values 0..11, labels 2, 0, 9.
const std::vector<uint8_t> kPixels{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
const std::vector<uint8_t> kLabels{2, 0, 9};

}  // namespace

TEST(Idx, ReadsGzipAndPlainFiles) {
  const std::string dir = temp_dir();
  write_gz(dir + "/img.gz", idx_bytes({3, 2, 2}, kPixels));
  write_raw(dir + "/lab", idx_bytes({3}, kLabels));
  const Dataset d = read_idx_dataset(dir + "/img.gz", dir + "/lab");
  EXPECT_EQ(d.images.sizes(), (std::vector<int64_t>{3, 1, 2, 2}));
  EXPECT_EQ(d.images.dtype(), torch::kUInt8);
  EXPECT_EQ(d.images[1][0][1][0].item<int>(), 6);
  EXPECT_TRUE(torch::equal(d.labels, torch::tensor({2, 0, 9}, torch::kLong)));
}

TEST(Idx, ClearErrorsOnBadFiles) {
  const std::string dir = temp_dir();
  auto full = idx_bytes({3, 2, 2}, kPixels);
  write_raw(dir + "/short", std::vector<uint8_t>(full.begin(), full.end() - 1));
  EXPECT_NE(error_of([&] { read_idx(dir + "/short"); }).find("truncated: the header promises 12"),
            std::string::npos);
  // A truncated gzip stream.
  write_gz(dir + "/full.gz", full);
  std::ifstream in(dir + "/full.gz", std::ios::binary);
  std::vector<char> gz((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(dir + "/cut.gz", std::ios::binary)
      .write(gz.data(), static_cast<long>(gz.size() / 2));
  EXPECT_NE(error_of([&] { read_idx(dir + "/cut.gz"); }).find("truncated"), std::string::npos);
  auto bad = full;
  bad[0] = 0x1f;
  write_raw(dir + "/magic", bad);
  const std::string magic = error_of([&] { read_idx(dir + "/magic"); });
  EXPECT_NE(magic.find("not an IDX file: magic number 0x1f000803"), std::string::npos) << magic;
  EXPECT_NE(magic.find(dir + "/magic"), std::string::npos);
  write_raw(dir + "/float", idx_bytes({1}, {0, 0, 0, 0}, 0x0D));
  EXPECT_NE(error_of([&] { read_idx(dir + "/float"); }).find("element type 0x0d"),
            std::string::npos);
  write_raw(dir + "/long", idx_bytes({2}, {1, 2, 3}));
  EXPECT_NE(error_of([&] { read_idx(dir + "/long"); }).find("1 unexpected bytes"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_idx(dir + "/none"); }).find("no such file"), std::string::npos);
  write_raw(dir + "/img", full);
  write_raw(dir + "/lab", idx_bytes({3}, {2, 0, 10}));
  EXPECT_NE(error_of([&] {
              read_idx_dataset(dir + "/img", dir + "/lab");
            }).find("label 10 at sample 2 is not a class in [0, 10)"),
            std::string::npos);
  write_raw(dir + "/lab2", idx_bytes({2}, {2, 0}));
  EXPECT_NE(error_of([&] {
              read_idx_dataset(dir + "/img", dir + "/lab2");
            }).find("2 labels for 3 images"),
            std::string::npos);
}

TEST(Cifar10, ReadsRecordsAndRejectsBadFiles) {
  const std::string dir = temp_dir();
  std::vector<uint8_t> bytes;
  for (int r = 0; r < 3; ++r) {
    bytes.push_back(static_cast<uint8_t>(7 - r));
    for (int k = 0; k < 3072; ++k) bytes.push_back(static_cast<uint8_t>((k / 1024) * 10 + r));
  }
  write_raw(dir + "/b1.bin", bytes);
  write_raw(dir + "/b2.bin", std::vector<uint8_t>(bytes.begin(), bytes.begin() + 3073));
  const Dataset d = read_cifar10({dir + "/b1.bin", dir + "/b2.bin"});
  EXPECT_EQ(d.images.sizes(), (std::vector<int64_t>{4, 3, 32, 32}));
  EXPECT_TRUE(torch::equal(d.labels, torch::tensor({7, 6, 5, 7}, torch::kLong)));
  EXPECT_EQ(d.images[1][2][31][31].item<int>(), 21);  // blue plane of record 1
  EXPECT_EQ(d.images[2][0][0][0].item<int>(), 2);

  write_raw(dir + "/cut.bin", std::vector<uint8_t>(bytes.begin(), bytes.end() - 100));
  EXPECT_NE(error_of([&] {
              read_cifar10({dir + "/cut.bin"});
            }).find("truncated or not CIFAR-10 binary: 9119 bytes"),
            std::string::npos);
  auto badlabel = bytes;
  badlabel[3073] = 200;
  write_raw(dir + "/lab.bin", badlabel);
  EXPECT_NE(error_of([&] { read_cifar10({dir + "/lab.bin"}); }).find("label 200 at sample 1"),
            std::string::npos);
  // A whole folder: the loader names the missing batch and the flag.
  EXPECT_NE(error_of([&] { load_cifar10(dir); }).find("--data-dir: data_batch_1.bin not found"),
            std::string::npos);
}

TEST(Model, StandardResNet18HasTheKnownSize) {
  ResNet18 standard;
  EXPECT_EQ(count_parameters(*standard), 11173962);
  ResNet18 small(ResNetOptions{1, 10, 8, 16});
  const auto y = small->forward(torch::randn({2, 1, 28, 28}));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 10}));
  std::set<std::string> stages;
  for (const auto& p : small->named_parameters()) stages.insert(stage(p.key()));
  EXPECT_EQ(stages, (std::set<std::string>{"stem", "layer1", "layer2", "layer3", "layer4",
                                           "head_fc", "fc"}));
}

TEST(Selection, ImbalanceKeepsTheRareFraction) {
  // 10 classes, class k has 20 + k samples.
  std::vector<int64_t> labels;
  for (int64_t k = 0; k < 10; ++k) labels.insert(labels.end(), 20 + k, k);
  const auto y = torch::tensor(labels);
  const auto keep = imbalanced_subset(y, {4, 5, 6, 7, 8}, 0.1, 10, 3);
  const auto counts = torch::bincount(y.index_select(0, keep), {}, 10);
  for (int64_t k = 0; k < 10; ++k) {
    const int64_t n = 20 + k;
    const int64_t expect = (k >= 4 && k <= 8) ? (n + 9) / 10 : n;  // ceil(0.1 n)
    EXPECT_EQ(counts[k].item<int64_t>(), expect) << "class " << k;
  }
  EXPECT_TRUE(torch::equal(keep, std::get<0>(keep.sort())));  // dataset order kept
  EXPECT_TRUE(torch::equal(keep, imbalanced_subset(y, {4, 5, 6, 7, 8}, 0.1, 10, 3)));
  EXPECT_FALSE(torch::equal(keep, imbalanced_subset(y, {4, 5, 6, 7, 8}, 0.1, 10, 4)));

  const auto few = per_class_subset(y, 5, 10, 1);
  EXPECT_TRUE(torch::equal(torch::bincount(y.index_select(0, few), {}, 10),
                           torch::full({10}, 5, torch::kLong)));
  const auto task = class_subset(y, {3, 9});
  EXPECT_EQ(task.numel(), 23 + 29);
  EXPECT_TRUE(((y.index_select(0, task) == 3) | (y.index_select(0, task) == 9)).all().item<bool>());
}

TEST(Selection, TaskOrdersAndDomains) {
  EXPECT_EQ(parse_task_order("paper", 10),
            (std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}}));
  EXPECT_EQ(parse_task_order("order1", 10),
            (std::vector<std::vector<int64_t>>{{0, 1}, {8, 9}, {3, 5}, {4, 7}, {2, 6}}));
  EXPECT_EQ(parse_task_order("order2", 10),
            (std::vector<std::vector<int64_t>>{{3, 7, 9, 0}, {1, 5}, {4, 8}, {2}, {6}}));
  EXPECT_EQ(parse_task_order("5,1/2", 10), (std::vector<std::vector<int64_t>>{{5, 1}, {2}}));
  EXPECT_NE(error_of([] { parse_task_order("0,1/1,2", 10); }).find("class 1 appears twice"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_task_order("0,10", 10); }).find("--task-order: class 10"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_task_order("0//1", 10); }).find("an empty task"),
            std::string::npos);

  Dataset d{torch::arange(2 * 16, torch::kUInt8).view({2, 1, 4, 4}), torch::tensor({0, 1})};
  EXPECT_TRUE(torch::equal(rotated(d, 0).images, d.images));
  // 90 degrees about the centre of a 4x4 image is an exact pixel rotation.
  const auto r = rotated(d, 90).images;
  EXPECT_TRUE(torch::equal(r, d.images.rot90(1, {2, 3})) ||
              torch::equal(r, d.images.rot90(-1, {2, 3})));
  const auto p = permuted(d, 1).images;
  EXPECT_TRUE(torch::equal(std::get<0>(p.view({2, -1}).sort(1)), d.images.view({2, -1})));
  EXPECT_FALSE(torch::equal(p, d.images));
  EXPECT_TRUE(torch::equal(p, permuted(d, 1).images));
}

TEST(Augment, IsDeterministicAndKeepsShapes) {
  const auto x = torch::randint(0, 256, {8, 3, 6, 6}, torch::kLong).to(torch::kUInt8);
  auto g1 = derived_generator({1, 2}), g2 = derived_generator({1, 2});
  const auto a = augment(x, 2, true, g1), b = augment(x, 2, true, g2);
  EXPECT_EQ(a.sizes(), x.sizes());
  EXPECT_EQ(a.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(a, b));
  auto g3 = derived_generator({1, 2});
  // With no padding only flips happen: every image is itself or its mirror, and some are
  // mirrored.
  const auto f = augment(x, 0, true, g3);
  int64_t mirrored = 0;
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(torch::equal(f[i], x[i]) || torch::equal(f[i], x[i].flip(2)));
    mirrored += !torch::equal(f[i], x[i]);
  }
  EXPECT_GT(mirrored, 0);
  // Without flip and padding nothing changes.
  auto g4 = derived_generator({1, 2});
  EXPECT_TRUE(torch::equal(augment(x, 0, false, g4), x));
}

TEST(Augment, CropPadsWithBlackPixelsBeforeNormalising) {
  // Every output must be one of the (2p+1)^2 crops of the image padded with 0 (black), as
  // torchvision's RandomCrop(padding=p) before Normalize; with flip off, never a mirror.
  const int64_t p = 2;
  const auto x = torch::randint(1, 256, {16, 1, 5, 5}, torch::kLong).to(torch::kUInt8);
  auto gen = derived_generator({7});
  const auto y = augment(x, p, false, gen);
  const auto padded = torch::zeros({16, 1, 5 + 2 * p, 5 + 2 * p}, torch::kUInt8);
  padded.slice(2, p, p + 5).slice(3, p, p + 5).copy_(x);
  int64_t shifted = 0;
  for (int64_t i = 0; i < 16; ++i) {
    bool found = false;
    for (int64_t dy = 0; dy <= 2 * p && !found; ++dy) {
      for (int64_t dx = 0; dx <= 2 * p && !found; ++dx) {
        found = torch::equal(y[i], padded[i].slice(1, dy, dy + 5).slice(2, dx, dx + 5));
      }
    }
    EXPECT_TRUE(found) << "sample " << i << " is no black-padded crop";
    shifted += (y[i] == 0).any().item<bool>();
  }
  EXPECT_GT(shifted, 0);  // some crops show the border
  // Normalised afterwards, the border is black's value (-mean/std), not 0 (the mean).
  const Dataset d{x, torch::zeros({16}, torch::kLong)};
  const Normalizer normalize(d);
  const auto z = normalize(y);
  const float black = normalize(torch::zeros({1, 1, 1, 1}, torch::kUInt8)).item<float>();
  EXPECT_LT(black, -1.0f);
  EXPECT_TRUE(
      torch::equal(z.masked_select(y == 0), torch::full({(y == 0).sum().item<int64_t>()}, black)));
}

TEST(Augment, DomainIlNeverMixesDomains) {
  Config c;
  c.crop_pad = 2;
  c.scenario = "class-imbalanced";
  EXPECT_EQ(augmentation(c).crop_pad, 2);
  EXPECT_TRUE(augmentation(c).flip);
  c.scenario = "class-il";
  EXPECT_TRUE(augmentation(c).flip);
  // Rotated domains: a mirrored 45-degree image is a -45-degree one; shifts keep the angle.
  c.scenario = "domain-il";
  c.domains = "rotate";
  EXPECT_EQ(augmentation(c).crop_pad, 2);
  EXPECT_FALSE(augmentation(c).flip);
  // Permuted domains: any spatial change after the shuffle breaks the permutation.
  c.domains = "permute";
  EXPECT_EQ(augmentation(c).crop_pad, 0);
  EXPECT_FALSE(augmentation(c).flip);
  c.scenario = "class-imbalanced";
  c.augment = false;
  EXPECT_EQ(augmentation(c).crop_pad, 0);
  EXPECT_FALSE(augmentation(c).flip);
}

TEST(Selection, ValidationSplitIsPerClassAndFixed) {
  const auto labels = torch::arange(1000, torch::kLong) % 10;
  const auto val = validation_subset(labels, 0.1, 10, kValidationSeed);
  EXPECT_TRUE(torch::equal(torch::bincount(labels.index_select(0, val), {}, 10),
                           torch::full({10}, 10, torch::kLong)));
  EXPECT_TRUE(torch::equal(val, validation_subset(labels, 0.1, 10, kValidationSeed)));
  EXPECT_FALSE(torch::equal(val, validation_subset(labels, 0.1, 10, kValidationSeed + 1)));
  EXPECT_TRUE(torch::equal(std::get<0>(val.sort()), val));  // dataset order
}

TEST(Selection, TestSetIsTheSameForEverySeed) {
  const auto labels = torch::arange(600, torch::kLong) % 10;
  Config c;
  c.test_per_class = 7;
  const auto a = test_selection(resolve(c, "adam", 0), labels, 10);
  const auto b = test_selection(resolve(c, "muon", 5), labels, 10);
  EXPECT_EQ(a.numel(), 70);
  EXPECT_TRUE(torch::equal(a, b));
  // Still a seeded subset, not simply the first images.
  EXPECT_FALSE(torch::equal(a, torch::arange(70, torch::kLong)));
  EXPECT_TRUE(torch::equal(torch::bincount(labels.index_select(0, a), {}, 10),
                           torch::full({10}, 7, torch::kLong)));
}

TEST(Metrics, ApAfBwtOnAHandMadeMatrix) {
  // Rows: after task i; columns: task j (only j <= i are used).
  const AccuracyMatrix R{{90, 0, 0}, {60, 80, 0}, {50, 70, 85}};
  EXPECT_DOUBLE_EQ(average_performance(R, 0), 90);
  EXPECT_DOUBLE_EQ(average_performance(R, 1), 70);
  EXPECT_DOUBLE_EQ(average_performance(R, 2), (50.0 + 70 + 85) / 3);
  EXPECT_DOUBLE_EQ(average_forgetting(R, 0), 0);
  EXPECT_DOUBLE_EQ(average_forgetting(R, 1), 30);
  // Task 0: best before the end max(90, 60) = 90 -> 40; task 1: 80 -> 10.
  EXPECT_DOUBLE_EQ(average_forgetting(R, 2), (40.0 + 10) / 2);
  EXPECT_DOUBLE_EQ(backward_transfer(R, 2), ((50.0 - 90) + (70.0 - 80)) / 2);
  // Forgetting uses the best earlier accuracy, BWT the one right after learning the task.
  const AccuracyMatrix G{{50, 0, 0}, {70, 80, 0}, {60, 80, 85}};
  EXPECT_DOUBLE_EQ(average_forgetting(G, 2), (10.0 + 0) / 2);
  EXPECT_DOUBLE_EQ(backward_transfer(G, 2), (10.0 + 0) / 2);
  EXPECT_THROW(average_performance(R, 3), std::out_of_range);
}

TEST(Schedule, CosineWithLinearWarmup) {
  // 10 steps, 2 of warmup: 0.5, 1 (peak), then the cosine over the remaining 8 steps.
  EXPECT_DOUBLE_EQ(cosine_factor(0, 10, 2, 0.0), 0.5);
  EXPECT_DOUBLE_EQ(cosine_factor(1, 10, 2, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(cosine_factor(2, 10, 2, 0.0), 1.0);
  EXPECT_NEAR(cosine_factor(6, 10, 2, 0.0), 0.5, 1e-12);  // half way: cos(pi/2) = 0
  EXPECT_NEAR(cosine_factor(4, 10, 2, 0.0), 0.5 * (1 + std::sqrt(0.5)), 1e-12);
  EXPECT_NEAR(cosine_factor(9, 10, 2, 0.1), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 7 / 8)), 1e-12);
  EXPECT_DOUBLE_EQ(cosine_factor(0, 10, 0, 0.0), 1.0);
  // Resolved: cosine for the paper-sized width, constant for the small CPU widths.
  Config c;
  EXPECT_EQ(resolve(c, "adam", 0).lr_schedule, "cosine");
  c.width = 8;
  EXPECT_EQ(resolve(c, "adam", 0).lr_schedule, "constant");
  c.lr_schedule = "cosine";
  EXPECT_EQ(resolve(c, "adam", 0).lr_schedule, "cosine");
  c.warmup_frac = 1.0;
  EXPECT_THROW(
      {
        try {
          resolve(c, "adam", 0);
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("--warmup-frac"), std::string::npos) << e.what();
          throw;
        }
      },
      std::invalid_argument);
}

TEST(Metrics, ClippedForgettingIsDerppsConvention) {
  // Task 0 improves after it was learned (50 -> 70): Chaudhry's AF term is -20, DER++'s code
  // (max over every row, the last included) counts 0.
  const AccuracyMatrix G{{50, 0, 0}, {40, 80, 0}, {70, 75, 85}};
  EXPECT_DOUBLE_EQ(average_forgetting(G, 2), ((50.0 - 70) + (80.0 - 75)) / 2);
  EXPECT_DOUBLE_EQ(average_forgetting_clipped(G, 2), (0.0 + 5) / 2);
  // Where nothing improved the two agree.
  const AccuracyMatrix R{{90, 0, 0}, {60, 80, 0}, {50, 70, 85}};
  EXPECT_DOUBLE_EQ(average_forgetting_clipped(R, 2), average_forgetting(R, 2));
  EXPECT_DOUBLE_EQ(average_forgetting_clipped(R, 0), 0);
}

TEST(Metrics, SampleForgettingEventsAreConditionedOnWhatWasLearned) {
  const auto before = torch::tensor({1, 1, 1, 1, 0, 0, 0, 0}, torch::kLong).to(torch::kBool);
  const auto after = torch::tensor({1, 0, 0, 1, 1, 1, 1, 0}, torch::kLong).to(torch::kBool);
  const ForgettingEvents e = forgetting_events(before, after);
  EXPECT_EQ(e.events, 2);
  EXPECT_EQ(e.previously_correct, 4);
  EXPECT_DOUBLE_EQ(e.rate(), 50.0);
  // Accuracy rose from 50% to 62.5%, so a best-so-far drop reads 0, yet half of what was
  // known was forgotten. A model that knew nothing has nothing to forget: undefined, not 0.
  EXPECT_TRUE(std::isnan(
      forgetting_events(torch::zeros({3}, torch::kBool), torch::ones({3}, torch::kBool)).rate()));
  EXPECT_THROW(forgetting_events(before, after.slice(0, 0, 4)), c10::Error);
}

TEST(Replay, ReservoirKeepsCapacityAndCheckpointsTheSeenCount) {
  ReplayBuffer buffer(5, 10);
  auto gen = derived_generator({7});
  for (int b = 0; b < 4; ++b) {
    const auto labels = torch::full({3}, b, torch::kLong);
    buffer.add(torch::full({3, 1, 2, 2}, b, torch::kUInt8), labels, torch::randn({3, 10}), gen);
  }
  EXPECT_EQ(buffer.size(), 5);
  EXPECT_EQ(buffer.seen(), 12);
  // Images and labels stay paired.
  EXPECT_TRUE(
      torch::equal(buffer.images().flatten(1).select(1, 0).to(torch::kLong), buffer.labels()));
  const auto idx = buffer.sample(3, gen);
  EXPECT_EQ(std::get<0>(torch::_unique(idx)).numel(), 3);
}

TEST(Config, ResolveFillsPaperDefaultsAndNamesBadFlags) {
  Config c;
  Config a = resolve(c, "adam", 0), m = resolve(c, "muon", 0), f = resolve(c, "fogo", 0);
  EXPECT_DOUBLE_EQ(*a.lr, 1e-3);
  EXPECT_DOUBLE_EQ(*m.lr, 1e-2);
  EXPECT_DOUBLE_EQ(*f.lr, 1e-3);
  EXPECT_EQ(*a.epochs, 50);
  c.scenario = "class-il";
  Config cf = resolve(c, "fogo", 0);
  EXPECT_DOUBLE_EQ(*cf.lr, 2e-3);
  EXPECT_DOUBLE_EQ(*cf.head_lr, 5e-4);
  EXPECT_DOUBLE_EQ(*cf.grad_clip, 2.0);
  EXPECT_EQ(*cf.head_fc, 512);
  EXPECT_EQ(*cf.epochs, 20);
  c.rare_fraction = 0;
  c.scenario = "class-imbalanced";
  EXPECT_NE(error_of([&] { resolve(c, "adam", 0); }).find("--rare-fraction: must be in (0, 1]"),
            std::string::npos);
  c = Config{};
  c.dataset = "cifar10";
  EXPECT_NE(error_of([&] { resolve(c, "adam", 0); }).find("--data-dir"), std::string::npos);
  c = Config{};
  EXPECT_NE(error_of([&] { resolve(c, "sgd", 0); }).find("--optimizers: unknown optimizer 'sgd'"),
            std::string::npos);
  c.domain_order = {0, 0, 1, 2};
  EXPECT_NE(error_of([&] { resolve(c, "adam", 0); }).find("--domain-order"), std::string::npos);

  fogo::trainer::Cli cli("resnet_train", "");
  Config parsed;
  add_flags(cli, parsed);
  std::vector<const char*> argv{"x", "--scenario", "domain-il", "--lr", "3e-3", "--seeds", "1,2"};
  ASSERT_TRUE(cli.parse(static_cast<int>(argv.size()), argv.data()));
  EXPECT_EQ(parsed.scenario, "domain-il");
  EXPECT_DOUBLE_EQ(*resolve(parsed, "muon", 1).lr, 3e-3);
  EXPECT_EQ(parsed.seeds, (std::vector<int64_t>{1, 2}));
}

// --ns-dtype: parsed, checked by resolve(), applied to every param group of Muon and FOGO.
TEST(Config, FogoFlagsReachEveryFogoGroupOverThePresets) {
  fogo::trainer::Cli cli("resnet_train", "");
  Config c;
  add_flags(cli, c);
  std::vector<const char*> args{"x",       "--fogo",     "codebook_size=5", "--fogo",
                                "lr=0.02", "--ablation", "short-term-only", "--width",
                                "4",       "--scenario", "domain-il"};
  ASSERT_TRUE(cli.parse(static_cast<int>(args.size()), args.data()));
  const Config r = resolve(c, "fogo", 0);
  ResNet18 model(ResNetOptions{1, 10, 4, *r.head_fc});
  TrainOptimizer opt(r, model);
  const auto& groups = opt.matrix_optimizer()->param_groups();
  ASSERT_EQ(groups.size(), 6u);
  for (const auto& group : groups) {
    const auto& o = static_cast<const fogo::FOGOOptions&>(group.options());
    EXPECT_EQ(o.codebook_size(), 5);
    EXPECT_EQ(o.lr(), 0.02);
    EXPECT_EQ(o.gamma_lt(), 0.0);  // the ablation
    // The rest is still the domain-IL preset (not the library defaults).
    const int64_t k = o.freeze_per_task();
    EXPECT_TRUE(k == fogo::presets::domain_il_backbone().freeze_per_task() ||
                k == fogo::presets::domain_il_head().freeze_per_task())
        << k;
    EXPECT_NE(k, fogo::FOGOOptions().freeze_per_task());
    EXPECT_GT(o.gamma_hi(), 0.0);
  }
  // A combination the options refuse fails at resolve, naming --fogo.
  Config bad = c;
  bad.fogo_options = {"gamma_st_min=0.9", "gamma_st_max=0.1"};
  try {
    resolve(bad, "fogo", 0);
    FAIL() << "gamma_st_max < gamma_st_min accepted";
  } catch (const fogo::trainer::CliError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--fogo: ", 0), 0u) << e.what();
  }
}

TEST(Config, NsDtypeFlagReachesMuonAndFogo) {
  auto parse = [](std::vector<const char*> args) {
    fogo::trainer::Cli cli("resnet_train", "");
    Config c;
    add_flags(cli, c);
    args.insert(args.begin(), "x");
    EXPECT_TRUE(cli.parse(static_cast<int>(args.size()), args.data()));
    return c;
  };
  // The Newton-Schulz dtype of each param group of the matrix side.
  auto ns_dtypes = [](const Config& resolved) {
    ResNet18 model(ResNetOptions{1, 10, 4, *resolved.head_fc});
    TrainOptimizer opt(resolved, model);
    std::vector<c10::ScalarType> out;
    for (const auto& group : opt.matrix_optimizer()->param_groups()) {
      if (resolved.optimizer == "muon") {
        out.push_back(static_cast<const fogo::MuonOptions&>(group.options()).ns_dtype());
      } else {
        out.push_back(static_cast<const fogo::FOGOOptions&>(group.options()).ns_dtype());
      }
    }
    return out;
  };

  EXPECT_EQ(parse({}).ns_dtype, "auto");  // the library defaults
  for (const char* optimizer : {"muon", "fogo"}) {
    for (const auto& [flag, dtype] :
         {std::pair{"bf16", c10::kBFloat16}, std::pair{"fp32", c10::kFloat}}) {
      const Config c = parse({"--ns-dtype", flag});
      EXPECT_EQ(c.ns_dtype, flag);
      const auto dtypes = ns_dtypes(resolve(c, optimizer, 0));
      // Muon: one group; FOGO: one codebook group per stage (stem, layer1..4, fc).
      ASSERT_EQ(dtypes.size(), std::string(optimizer) == "muon" ? 1u : 6u) << optimizer;
      for (const auto d : dtypes) EXPECT_EQ(d, dtype) << optimizer << " --ns-dtype " << flag;
    }
    for (const auto d : ns_dtypes(resolve(parse({}), optimizer, 0))) {
      EXPECT_EQ(d, fogo::kNSDtypeAuto) << optimizer;
    }
  }
  // Adam takes the flag and ignores it.
  {
    const Config a = resolve(parse({"--ns-dtype", "fp32"}), "adam", 0);
    ResNet18 model(ResNetOptions{1, 10, 4, 0});
    TrainOptimizer opt(a, model);
    EXPECT_EQ(opt.matrix_optimizer(), nullptr);
  }
  // The value is part of the run's signature, so --resume refuses another one.
  bool found = false;
  for (const auto& [key, value] :
       run_signature(resolve(parse({"--ns-dtype", "fp32"}), "fogo", 0)).entries())
    found = found || (key == "ns-dtype" && value == "fp32");
  EXPECT_TRUE(found);

  // A bad value names the flag: on the command line, and in a config built in code.
  EXPECT_EQ(error_of([&] {
              parse({"--ns-dtype", "fp16"});
            }),
            "--ns-dtype: expected one of auto,bf16,fp32, got 'fp16'");
  Config bad;
  bad.ns_dtype = "fp16";
  EXPECT_EQ(error_of([&] { resolve(bad, "fogo", 0); }),
            "--ns-dtype: expected one of auto,bf16,fp32, got 'fp16'");
}

// FOGO's codebook groups are the hybrid's named param groups, one per stage: the telemetry's
// <group>; task_boundary() reaches FOGO through the checked accessor and is a no-op elsewhere.
TEST(Optimizers, FogoGroupsAreTheHybridsStagesNamed) {
  Config c;
  c.scenario = "class-il";
  for (const char* name : {"fogo", "muon"}) {
    const Config r = resolve(c, name, 0);
    ResNet18 model(ResNetOptions{1, 10, 4, *r.head_fc});
    TrainOptimizer opt(r, model);
    ASSERT_NE(opt.hybrid(), nullptr);
    const size_t matrix_groups = opt.matrix_optimizer()->param_groups().size();
    std::vector<std::string> names;
    for (size_t g = 0; g < matrix_groups; ++g) names.push_back(opt.hybrid()->group_name(g));
    if (std::string(name) == "muon") {
      EXPECT_EQ(names, std::vector<std::string>{"matrix"});
    } else {
      EXPECT_EQ(names, (std::vector<std::string>{"stem", "layer1", "layer2", "layer3", "layer4",
                                                 "head_fc", "fc"}));
    }
    torch::manual_seed(0);
    opt.zero_grad();
    model->forward(torch::randn({4, 1, 28, 28})).square().mean().backward();
    opt.step();
    fogo::trainer::Record record;
    opt.add_telemetry(record);
    opt.task_boundary();
    if (std::string(name) == "muon") {
      EXPECT_TRUE(record.fields().empty());
    } else {
      EXPECT_EQ(record.fields().size(), 9 * names.size());
      for (const auto& stage : names) {
        EXPECT_NE(record.get("fogo/" + stage + "/rbar"), nullptr) << stage;
      }
    }
  }
}

// --classifier adamw (issue 34: the heads matched in class-IL): for every optimizer the
// classifier's weight and bias take exactly the step of an AdamW at --classifier-lr, and the
// matrix side no longer holds them; head_fc stays with the optimizer.
TEST(Optimizers, ClassifierOnAdamWTakesAdamWsStepForEveryOptimizer) {
  Config c;
  c.scenario = "class-il";
  c.classifier = "adamw";
  c.classifier_lr = 1e-3;
  for (const char* name : {"fogo", "muon", "adam"}) {
    const Config r = resolve(c, name, 0);
    torch::manual_seed(0);
    ResNet18 model(ResNetOptions{1, 10, 4, *r.head_fc});
    TrainOptimizer opt(r, model);
    const auto named = model->named_parameters();
    const torch::Tensor fc_weight = named["fc.weight"], fc_bias = named["fc.bias"];
    if (opt.matrix_optimizer()) {
      for (const auto& group : opt.matrix_optimizer()->param_groups()) {
        for (const auto& p : group.params()) {
          EXPECT_FALSE(p.is_same(fc_weight)) << name;
        }
      }
    }
    // The reference: an AdamW of its own over copies of fc's tensors, with the same gradients.
    opt.zero_grad();
    model->forward(torch::randn({4, 1, 28, 28})).square().mean().backward();
    std::vector<torch::Tensor> copies;
    for (const auto& p : {fc_weight, fc_bias}) {
      copies.push_back(p.detach().clone().requires_grad_(true));
      copies.back().mutable_grad() = p.grad().clone();
    }
    torch::optim::AdamW reference(copies, torch::optim::AdamWOptions(1e-3).weight_decay(0.0));
    opt.step();
    reference.step();
    EXPECT_TRUE(torch::allclose(fc_weight, copies[0], 1e-6, 1e-7)) << name;
    EXPECT_TRUE(torch::allclose(fc_bias, copies[1], 1e-6, 1e-7)) << name;
    if (std::string(name) == "adam") {
      EXPECT_EQ(opt.group_names(), (std::vector<std::string>{"all", "classifier"}));
    }
    bool recorded = false;
    for (const auto& [key, value] : run_signature(r).entries()) {
      recorded = recorded || (key == "classifier" && value == "adamw");
    }
    EXPECT_TRUE(recorded) << name;
  }
  // The default keeps the classifier with the optimizer (Muon's matrices include it).
  {
    const Config r = resolve(Config{}, "muon", 0);
    ResNet18 model(ResNetOptions{1, 10, 4, 0});
    TrainOptimizer opt(r, model);
    bool has_fc = false;
    for (const auto& p : opt.matrix_optimizer()->param_groups().front().params()) {
      has_fc = has_fc || p.is_same(model->named_parameters()["fc.weight"]);
    }
    EXPECT_TRUE(has_fc);
  }
  Config bad;
  bad.classifier_lr = 1e-3;
  EXPECT_EQ(error_of([&] { resolve(bad, "fogo", 0); }),
            "--classifier-lr: applies with --classifier adamw only");
  bad = Config{};
  bad.classifier = "sgd";
  EXPECT_EQ(error_of([&] { resolve(bad, "fogo", 0); }),
            "--classifier: expected own or adamw, got 'sgd'");
}

// --muon-adjust match_rms (the per-layer RMS-matched control of issue 34): Muon's update has RMS
// close to 0.2 lr in every matrix, where the original rule gives small matrices several times
// the RMS of large ones.
TEST(Optimizers, MuonMatchRmsGivesEveryMatrixTheSameUpdateRms) {
  const auto update_rms = [](const std::string& adjust) {
    Config c;
    c.muon_adjust = adjust;
    c.lr = 1e-2;
    const Config r = resolve(c, "muon", 0);
    torch::manual_seed(0);
    ResNet18 model(ResNetOptions{1, 10, 8, 0});
    TrainOptimizer opt(r, model);
    std::vector<torch::Tensor> before;
    const auto& params = opt.matrix_optimizer()->param_groups().front().params();
    for (const auto& p : params) before.push_back(p.detach().clone());
    opt.zero_grad();
    model->forward(torch::randn({8, 1, 28, 28})).square().mean().backward();
    opt.step();
    std::vector<double> rms;
    for (size_t k = 0; k < params.size(); ++k) {
      rms.push_back((params[k].detach() - before[k]).square().mean().sqrt().item<double>());
    }
    return rms;
  };
  const auto matched = update_rms("match_rms");
  for (const double v : matched) {
    EXPECT_GT(v, 0.5 * 0.2 * 1e-2);
    EXPECT_LT(v, 1.5 * 0.2 * 1e-2);
  }
  const auto original = update_rms("original");
  EXPECT_GT(*std::max_element(original.begin(), original.end()) /
                *std::min_element(original.begin(), original.end()),
            4.0);
  // The library's name of the rule is the same rule, and the same run (one signature).
  EXPECT_EQ(update_rms("match_rms_adamw"), matched);
  Config named, alias;
  named.muon_adjust = "match_rms_adamw";
  alias.muon_adjust = "match_rms";
  const auto entries = run_signature(resolve(named, "muon", 0)).entries();
  EXPECT_EQ(entries, run_signature(resolve(alias, "muon", 0)).entries());
  EXPECT_NE(std::find(entries.begin(), entries.end(),
                      std::pair<std::string, std::string>("muon-adjust", "match_rms")),
            entries.end());
  Config bad;
  bad.muon_adjust = "rms";
  EXPECT_EQ(error_of([&] { resolve(bad, "muon", 0); }),
            "--muon-adjust: expected one of original,match_rms_adamw,spectral,spectral_unclamped,"
            "match_rms, got 'rms'");
}

// --muon-normuon (issue 47's NorMuon arm): the trainer's Muon takes the same first step as a
// fogo::Muon built with MuonOptions::normuon on the same weights and gradients, a different one
// from plain Muon's, and the run signature names it (a run without it is not resumed as one).
TEST(Optimizers, MuonNorMuonFlagBuildsNorMuon) {
  const auto first_step = [](bool normuon, bool reference) {
    Config c;
    c.muon_normuon = normuon;
    c.lr = 1e-2;
    const Config r = resolve(c, "muon", 0);
    torch::manual_seed(0);
    ResNet18 model(ResNetOptions{1, 10, 8, 0});
    TrainOptimizer opt(r, model);
    const auto params = opt.matrix_optimizer()->param_groups().front().params();
    std::vector<torch::Tensor> before;
    for (const auto& p : params) before.push_back(p.detach().clone());
    opt.zero_grad();
    model->forward(torch::randn({8, 1, 28, 28})).square().mean().backward();
    if (reference) {
      std::vector<torch::Tensor> copies;
      for (const auto& p : params) {
        copies.push_back(p.detach().clone().requires_grad_(true));
        copies.back().mutable_grad() = p.grad().clone();
      }
      fogo::Muon(copies, fogo::MuonOptions(1e-2)
                             .weight_decay(*r.weight_decay)
                             .ns_dtype(fogo::trainer::parse_ns_dtype(r.ns_dtype))
                             .adjust_lr(fogo::MuonAdjustLR::Original)
                             .normuon(true))
          .step();
      return copies;
    }
    opt.step();
    std::vector<torch::Tensor> after;
    for (const auto& p : params) after.push_back(p.detach().clone());
    return after;
  };
  const auto trainer = first_step(true, false), reference = first_step(true, true);
  const auto plain = first_step(false, false);
  ASSERT_EQ(trainer.size(), reference.size());
  bool differs = false;
  for (size_t k = 0; k < trainer.size(); ++k) {
    EXPECT_TRUE(torch::equal(trainer[k], reference[k].detach())) << "matrix " << k;
    differs = differs || !torch::equal(trainer[k], plain[k]);
  }
  EXPECT_TRUE(differs) << "NorMuon's step is plain Muon's";
  Config c;
  c.muon_normuon = true;
  EXPECT_NE(run_signature(resolve(c, "muon", 0)).to_text().find("muon-normuon"), std::string::npos);
  EXPECT_EQ(run_signature(resolve(Config{}, "muon", 0)).to_text().find("muon-normuon"),
            std::string::npos);
}
