// A Run's checkpoints and its result (summary metrics, result.jsonl).
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "run.h"

namespace fogo::resnet {

using trainer::Record;

void Run::save_checkpoint() {
  trainer::CheckpointWriter w;
  signature().write(w);
  w.put("step", step_);
  w.put("seconds", seconds_);
  w.put("wall_seconds", wall_seconds());
  // This session trained: the run's provenance is this session's.
  result_.command = trainer::command_line();
  result_.machine = session_machine_;
  result_.date = trainer::utc_now();
  result_.commit = trainer::build_commit();
  result_.isa = session_isa_;
  for (const auto& [key, field] : provenance(result_)) w.put(key, *field);
  w.put("comm_seconds", comm_seconds_);
  w.put("best_rare", best_rare_);
  if (rare_correct_.defined()) w.put_tensor("rare_correct", rare_correct_);
  w.put_module("model", *model_);
  optimizer_->save(w, "optimizer");
  if (buffer_) buffer_->save(w, "replay");
  w.put_tensor("curve_x", torch::tensor(result_.x, torch::kDouble));
  w.put_history("curve", result_.curve);
  w.put_history("R", R_);
  w.commit(ckpt_path_);
}

void Run::load_checkpoint(trainer::CheckpointReader& in) {
  step_ = in.get_int("step");
  if (step_ < 0 || step_ > total_) {
    throw std::runtime_error("checkpoint '" + ckpt_path_ + "': step " + std::to_string(step_) +
                             " is outside this run's 0.." + std::to_string(total_));
  }
  seconds_ = in.get_double("seconds");
  // Checkpoints written before 2026-11-26 lack the wall time: their training time, which
  // counts every evaluation but the last, stands in for it.
  wall_before_ = in.has("wall_seconds") ? in.get_double("wall_seconds") : seconds_;
  comm_seconds_ = in.has("comm_seconds") ? in.get_double("comm_seconds") : 0.0;
  for (const auto& [key, field] : provenance(result_)) {
    *field = in.has(key) ? in.get_string(key) : std::string();
  }
  best_rare_ = in.get_double("best_rare");
  rare_correct_ = in.has("rare_correct") ? in.get_tensor("rare_correct").cpu().to(torch::kBool)
                                         : torch::Tensor();
  in.load_module("model", *model_);
  optimizer_->load(in, "optimizer");
  if (buffer_) buffer_->load(in, "replay", device_);
  const auto x = in.get_tensor("curve_x").to(torch::kCPU, torch::kDouble).contiguous();
  result_.x.assign(x.data_ptr<double>(), x.data_ptr<double>() + x.numel());
  result_.curve = in.get_history("curve");
  R_ = in.get_history("R");
}

// The run's result (summary metrics once they exist), also written to result.jsonl.
RunResult Run::finish() {
  if (dp_.distributed()) share_main_result();
  result_.config = c_;
  result_.steps = step_;
  result_.total_steps = total_;
  result_.seconds = seconds_;
  result_.wall_seconds = wall_seconds();
  result_.R = R_;
  result_.summary = summarize();
  if (dp_.main()) write_result();
  if (dp_.distributed() && seconds_ > 0) {
    char line[200];
    std::snprintf(line, sizeof line,
                  "  communication %.2f s of %.2f s training (%.1f%%): the gradient all-reduce "
                  "wait after backward, the per-step sums%s\n",
                  comm_seconds_, seconds_, 100 * comm_seconds_ / seconds_,
                  buffer_ ? ", the replay logits" : "");
    log_ << line;
  }
  return result_;
}

// Data-parallel, rank 0 alone evaluates: its curves and accuracy matrix go to every rank, so
// that every rank returns the same result (an --lr-sweep chooses its lrs from them).
void Run::share_main_result() {
  std::vector<double> flat = result_.x;
  for (const auto& point : result_.curve) flat.insert(flat.end(), point.begin(), point.end());
  for (const auto& row : R_) flat.insert(flat.end(), row.begin(), row.end());
  flat = dp_.from_main(flat);
  const size_t k = result_.curve_names.size(), matrix = R_.size() * R_.size();
  const size_t points = (flat.size() - matrix) / (1 + k);
  auto at = flat.begin();
  result_.x.assign(at, at + static_cast<std::ptrdiff_t>(points));
  at += static_cast<std::ptrdiff_t>(points);
  result_.curve.assign(points, {});
  for (auto& point : result_.curve) {
    point.assign(at, at + static_cast<std::ptrdiff_t>(k));
    at += static_cast<std::ptrdiff_t>(k);
  }
  for (auto& row : R_) {
    row.assign(at, at + static_cast<std::ptrdiff_t>(row.size()));
    at += static_cast<std::ptrdiff_t>(row.size());
  }
}

// Class-imbalanced: the last evaluation and the mean rare forgetting; continual: AP, AF and
// BWT after the last task. NaN where the run stopped before them.
std::vector<double> Run::summarize() const {
  const RunResult& res = result_;
  if (imbalanced_ && !res.curve.empty()) {
    const auto& lastp = res.curve.back();
    double mean_forgetting = 0, rate_sum = 0;
    int64_t rates = 0;
    for (const auto& p : res.curve) {
      mean_forgetting += p[3] / static_cast<double>(res.curve.size());
      if (std::isfinite(p[4])) rate_sum += p[4], ++rates;
    }
    return {lastp[0], lastp[1],        lastp[2],
            lastp[3], mean_forgetting, rates > 0 ? rate_sum / static_cast<double>(rates) : kNaN};
  }
  if (!imbalanced_ && res.completed()) {
    const size_t t = R_.size() - 1;
    return {average_performance(R_, t), average_forgetting(R_, t),
            average_forgetting_clipped(R_, t), backward_transfer(R_, t)};
  }
  return std::vector<double>(res.summary_names.size(), kNaN);
}

void Run::write_result() const {
  Record r;
  r.set("optimizer", c_.optimizer).set("seed", c_.seed).set("steps", step_);
  r.set("lr", *c_.lr).set("eval_split", c_.eval_split);
  r.set("completed", result_.completed()).set("train_seconds", seconds_);
  r.set("wall_seconds", result_.wall_seconds);
  if (dp_.distributed()) r.set("communication_seconds", comm_seconds_);
  for (const auto& [key, field] : provenance(result_)) r.set(key, *field);
  for (size_t k = 0; k < result_.summary.size(); ++k) {
    r.set(result_.summary_names[k], result_.summary[k]);
  }
  trainer::MetricsWriter::create(dir_ + "/result.jsonl").write(r);
}

// The run's wall time over all its sessions: set-up, training and evaluations. Kept in the
// checkpoint, so that a run resumed or only reloaded (--resume; scripts/run.sh joins runs made
// by separate processes that way) reports the time it took, not the reload's.
double Run::wall_seconds() const {
  return wall_before_ +
         std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count();
}

}  // namespace fogo::resnet
