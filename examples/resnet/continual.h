#pragma once
// Continual-learning pieces: task orders, the accuracy matrix metrics and a replay buffer.
//
// Accuracy matrix: R[i][j] = test accuracy on task j after training on tasks 0..i (T x T).
// With t + 1 tasks learned (rows 0..t), following Chaudhry et al. (2018) for forgetting and
// Lopez-Paz & Ranzato (2017) for backward transfer:
//   AP_t  = 1/(t+1) * sum_{j<=t} R[t][j]
//   AF_t  = 1/t * sum_{j<t} ( max_{l in [j, t-1]} R[l][j] - R[t][j] )      (AF_0 = 0)
//   BWT_t = 1/t * sum_{j<t} ( R[t][j] - R[j][j] )                          (BWT_0 = 0)
// The reported AP, AF and BWT are those at t = T - 1. AF as defined can be negative (a task
// better now than at any earlier point); DER++'s code (mammoth's forgetting()) takes the maximum
// over every row including the last, which clips each task's term at 0:
//   AF_clip_t = 1/t * sum_{j<t} max(0, max_{l in [j, t-1]} R[l][j] - R[t][j])
// Both are reported; they differ exactly when some task improved after it was learned.

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fogo {
class CheckpointWriter;
class CheckpointReader;
}  // namespace fogo

namespace fogo::resnet {

using AccuracyMatrix = std::vector<std::vector<double>>;

double average_performance(const AccuracyMatrix& R, size_t t);
double average_forgetting(const AccuracyMatrix& R, size_t t);
double average_forgetting_clipped(const AccuracyMatrix& R, size_t t);
double backward_transfer(const AccuracyMatrix& R, size_t t);

/// Sample-level forgetting events between two evaluations of one test set (Toneva et al.,
/// 2019): samples classified correctly before and wrongly after. Unlike a drop from the best
/// score so far, the rate is conditioned on what had been learned, so a model that learns
/// slowly is not credited with "no forgetting" for having had little to forget.
struct ForgettingEvents {
  int64_t events = 0;              ///< correct before, wrong after
  int64_t previously_correct = 0;  ///< correct before
  /// events / previously_correct in percent; NaN when nothing was correct before.
  double rate() const;
};
/// `before` and `after`: bool [N], per-sample correctness on the same samples in one order.
ForgettingEvents forgetting_events(const torch::Tensor& before, const torch::Tensor& after);

/// Class groups of the class-incremental tasks. `spec` is a preset or an explicit order:
///   "paper"  {0,1},{2,3},{4,5},{6,7},{8,9}      (the paper's main order)
///   "order1" {0,1},{8,9},{3,5},{4,7},{2,6}      (the paper's first extra order)
///   "order2" {3,7,9,0},{1,5},{4,8},{2},{6}      (the paper's second extra order, unbalanced)
///   "0,1/8,9/3,5/4,7/2,6"                        tasks separated by '/', classes by ','
/// Throws std::invalid_argument naming --task-order when a class is out of range or repeated, or
/// a task is empty. Classes left out of every task are simply not trained on.
std::vector<std::vector<int64_t>> parse_task_order(const std::string& spec, int64_t num_classes);

/// A fixed-size memory of past training samples filled by reservoir sampling (every sample seen
/// so far is in it with equal probability), with the logits the model gave each one when it was
/// stored (for DER++). Lives on the training device.
class ReplayBuffer {
 public:
  ReplayBuffer(int64_t capacity, int64_t num_classes);

  /// Offers a batch (uint8 images, labels, logits) to the reservoir.
  void add(const torch::Tensor& images_u8, const torch::Tensor& labels, const torch::Tensor& logits,
           at::Generator& generator);
  /// Indices of min(n, size()) distinct stored samples.
  torch::Tensor sample(int64_t n, at::Generator& generator) const;

  int64_t size() const { return size_; }
  int64_t seen() const { return seen_; }
  const torch::Tensor& images() const { return images_; }
  const torch::Tensor& labels() const { return labels_; }
  const torch::Tensor& logits() const { return logits_; }

  void save(CheckpointWriter& out, const std::string& prefix) const;
  void load(CheckpointReader& in, const std::string& prefix, const torch::Device& device);

 private:
  int64_t capacity_, num_classes_, size_ = 0, seen_ = 0;
  torch::Tensor images_, labels_, logits_;  ///< allocated on the first add
};

}  // namespace fogo::resnet
