#include "continual.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "common/checkpoint.h"

namespace fogo::resnet {
namespace {

void check_rows(const AccuracyMatrix& R, size_t t) {
  if (t >= R.size()) {
    throw std::out_of_range("accuracy matrix: row " + std::to_string(t) + " of " +
                            std::to_string(R.size()));
  }
  for (size_t i = 0; i <= t; ++i) {
    if (R[i].size() <= t) throw std::out_of_range("accuracy matrix: row too short");
  }
}

}  // namespace

double average_performance(const AccuracyMatrix& R, size_t t) {
  check_rows(R, t);
  double sum = 0;
  for (size_t j = 0; j <= t; ++j) sum += R[t][j];
  return sum / static_cast<double>(t + 1);
}

namespace {

// Mean over the earlier tasks j < t of (best accuracy on j before t) - (accuracy on j at t), each
// term passed through `term` (identity: Chaudhry et al.; clipped at 0: DER++'s code).
template <class Term>
double forgetting(const AccuracyMatrix& R, size_t t, const Term& term) {
  check_rows(R, t);
  if (t == 0) return 0.0;
  double sum = 0;
  for (size_t j = 0; j < t; ++j) {
    double best = -std::numeric_limits<double>::infinity();
    for (size_t l = j; l < t; ++l) best = std::max(best, R[l][j]);
    sum += term(best - R[t][j]);
  }
  return sum / static_cast<double>(t);
}

}  // namespace

double average_forgetting(const AccuracyMatrix& R, size_t t) {
  return forgetting(R, t, [](double drop) { return drop; });
}

double average_forgetting_clipped(const AccuracyMatrix& R, size_t t) {
  return forgetting(R, t, [](double drop) { return std::max(0.0, drop); });
}

double ForgettingEvents::rate() const {
  return previously_correct > 0
             ? 100.0 * static_cast<double>(events) / static_cast<double>(previously_correct)
             : std::numeric_limits<double>::quiet_NaN();
}

ForgettingEvents forgetting_events(const torch::Tensor& before, const torch::Tensor& after) {
  TORCH_CHECK(before.sizes() == after.sizes() && before.dim() == 1,
              "forgetting_events: per-sample correctness of one test set, got ", before.sizes(),
              " and ", after.sizes());
  const auto b = before.to(torch::kCPU, torch::kBool), a = after.to(torch::kCPU, torch::kBool);
  return {(b & ~a).sum().item<int64_t>(), b.sum().item<int64_t>()};
}

double backward_transfer(const AccuracyMatrix& R, size_t t) {
  check_rows(R, t);
  if (t == 0) return 0.0;
  double sum = 0;
  for (size_t j = 0; j < t; ++j) sum += R[t][j] - R[j][j];
  return sum / static_cast<double>(t);
}

std::vector<std::vector<int64_t>> parse_task_order(const std::string& spec, int64_t num_classes) {
  std::string text = spec;
  if (spec == "paper") text = "0,1/2,3/4,5/6,7/8,9";
  if (spec == "order1") text = "0,1/8,9/3,5/4,7/2,6";
  if (spec == "order2") text = "3,7,9,0/1,5/4,8/2/6";
  auto fail = [&](const std::string& what) {
    return std::invalid_argument("--task-order: " + what + " in '" + spec +
                                 "' (use paper, order1, order2 or e.g. 0,1/2,3/4,5)");
  };
  std::vector<std::vector<int64_t>> tasks;
  std::vector<bool> used(static_cast<size_t>(num_classes), false);
  std::stringstream tasks_in(text);
  for (std::string task; std::getline(tasks_in, task, '/');) {
    tasks.emplace_back();
    std::stringstream classes_in(task);
    for (std::string item; std::getline(classes_in, item, ',');) {
      size_t end = 0;
      int64_t c = -1;
      try {
        c = std::stoll(item, &end);
      } catch (const std::exception&) {
        end = 0;
      }
      if (item.empty() || end != item.size()) throw fail("'" + item + "' is not a class number");
      if (c < 0 || c >= num_classes) {
        throw fail("class " + item + " is not in [0, " + std::to_string(num_classes) + ")");
      }
      if (used[c]) throw fail("class " + item + " appears twice");
      used[c] = true;
      tasks.back().push_back(c);
    }
    if (tasks.back().empty()) throw fail("an empty task");
  }
  if (tasks.empty()) throw fail("no tasks");
  return tasks;
}

ReplayBuffer::ReplayBuffer(int64_t capacity, int64_t num_classes)
    : capacity_(capacity), num_classes_(num_classes) {
  if (capacity < 1) throw std::invalid_argument("--buffer-size: must be >= 1");
}

void ReplayBuffer::add(const torch::Tensor& images_u8, const torch::Tensor& labels,
                       const torch::Tensor& logits, at::Generator& generator) {
  if (!images_.defined()) {
    auto shape = images_u8.sizes().vec();
    shape[0] = capacity_;
    images_ = torch::zeros(shape, images_u8.options());
    labels_ = torch::zeros({capacity_}, labels.options());
    logits_ = torch::zeros({capacity_, num_classes_}, logits.options().dtype(torch::kFloat));
  }
  // Reservoir sampling (Vitter's algorithm R): sample number k (0-based) goes to slot k while
  // there is room, afterwards to a uniform slot in [0, k] if that slot is < capacity.
  const int64_t n = labels.size(0);
  const auto draws = torch::rand({n}, generator, torch::kDouble);
  const double* u = draws.data_ptr<double>();
  std::vector<int64_t> src, dst;
  for (int64_t k = 0; k < n; ++k, ++seen_) {
    int64_t slot = seen_;
    if (seen_ >= capacity_) slot = static_cast<int64_t>(u[k] * static_cast<double>(seen_ + 1));
    if (slot < capacity_) {
      // A later sample of the same batch may take the same slot; the later one wins, as in a
      // sample-by-sample reservoir.
      auto it = std::find(dst.begin(), dst.end(), slot);
      if (it != dst.end()) {
        src[it - dst.begin()] = k;
      } else {
        src.push_back(k);
        dst.push_back(slot);
      }
    }
  }
  size_ = std::min(seen_, capacity_);
  // Slot by slot rather than index_copy_: the slots are distinct, but CUDA's index_copy_ is
  // flagged nondeterministic and would warn on every step under deterministic mode.
  const auto stored_logits = logits.detach().to(torch::kFloat);
  for (size_t k = 0; k < src.size(); ++k) {
    images_[dst[k]].copy_(images_u8[src[k]]);
    labels_[dst[k]].copy_(labels[src[k]]);
    logits_[dst[k]].copy_(stored_logits[src[k]]);
  }
}

torch::Tensor ReplayBuffer::sample(int64_t n, at::Generator& generator) const {
  const int64_t k = std::min(n, size_);
  return torch::randperm(size_, generator, torch::kLong).slice(0, 0, k).to(images_.device());
}

void ReplayBuffer::save(CheckpointWriter& out, const std::string& prefix) const {
  out.put(prefix + "/size", size_);
  out.put(prefix + "/seen", seen_);
  if (images_.defined()) {
    out.put_tensor(prefix + "/images", images_);
    out.put_tensor(prefix + "/labels", labels_);
    out.put_tensor(prefix + "/logits", logits_);
  }
}

void ReplayBuffer::load(CheckpointReader& in, const std::string& prefix,
                        const torch::Device& device) {
  size_ = in.get_int(prefix + "/size");
  seen_ = in.get_int(prefix + "/seen");
  if (size_ > capacity_) {
    throw std::runtime_error("checkpoint '" + in.path() + "': replay buffer holds " +
                             std::to_string(size_) + " samples, more than --buffer-size " +
                             std::to_string(capacity_));
  }
  if (seen_ > 0) {
    images_ = in.get_tensor(prefix + "/images").to(device);
    labels_ = in.get_tensor(prefix + "/labels").to(device);
    logits_ = in.get_tensor(prefix + "/logits").to(device);
    if (images_.size(0) != capacity_) {
      throw std::runtime_error("checkpoint '" + in.path() + "': replay buffer of capacity " +
                               std::to_string(images_.size(0)) + ", this run has --buffer-size " +
                               std::to_string(capacity_));
    }
  }
}

}  // namespace fogo::resnet
