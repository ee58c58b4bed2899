// The evaluation stage of a Run: the scenario's accuracies, forgetting and AP/AF/BWT.
#include <fogo/fogo_optimizer.h>
#include <torch/torch.h>

#include <cstdio>
#include <sstream>

#include "run.h"

namespace fogo::resnet {

using trainer::Record;

// Class-imbalanced: at each epoch's end; continual: at each task's end (then the task
// boundary, unless it was the last task); both: every --eval-every steps. Data-parallel,
// rank 0 evaluates, and every rank checks that the ranks hold one model (and FOGO memory and
// replay buffer).
void Run::evaluate_if_due(int64_t t, bool task_end, bool epoch_end, trainer::Progress& progress) {
  const bool periodic = c_.eval_every > 0 && step_ % c_.eval_every == 0;
  // Each rank's BatchNorm running statistics follow its own rows. Only rank 0's are ever read
  // (it evaluates and writes checkpoints), so they are broadcast here, before the ranks are
  // compared, rather than every step: rank 0's own never change by it.
  const auto check_lockstep = [&] {
    dp_.broadcast_buffers(*model_);
    std::vector<std::pair<std::string, torch::Tensor>> replay;
    if (buffer_ && buffer_->size() > 0) {
      replay = {{"replay.images", buffer_->images()},
                {"replay.labels", buffer_->labels()},
                {"replay.logits", buffer_->logits()}};
    }
    dp_.check_lockstep(*model_, dynamic_cast<const fogo::FOGO*>(optimizer_->matrix_optimizer()),
                       replay);
  };
  if (imbalanced_ && (epoch_end || periodic)) {
    if (dp_.main()) evaluate_imbalanced(progress);
    check_lockstep();
  } else if (!imbalanced_ && (task_end || periodic)) {
    if (dp_.main()) evaluate_tasks(t, task_end, progress);
    check_lockstep();
    if (task_end && t + 1 < static_cast<int64_t>(plan_.train.size())) {
      optimizer_->task_boundary();
    }
  }
}

void Run::evaluate_imbalanced(trainer::Progress& progress) {
  const auto [correct, total, hit] = class_counts(model_, plan_.test[0], plan_.normalize,
                                                  c_.eval_batch_size, plan_.num_classes, autocast_);
  auto rare = torch::zeros({plan_.num_classes}, torch::kBool);
  for (const int64_t k : c_.rare_classes) rare[k] = true;
  // Sample-level forgetting events of the rare classes since the previous evaluation.
  const auto rare_hit = hit.masked_select(rare.index_select(0, plan_.test[0].labels.cpu()));
  ForgettingEvents events;
  if (rare_correct_.defined()) events = forgetting_events(rare_correct_, rare_hit);
  const double forget_rate = rare_correct_.defined() ? events.rate() : kNaN;
  rare_correct_ = rare_hit;
  const double acc = percent(correct, total);
  const double rare_acc = percent(correct.masked_select(rare), total.masked_select(rare));
  const double nonrare_acc = percent(correct.masked_select(~rare), total.masked_select(~rare));
  best_rare_ = std::max(best_rare_, rare_acc);
  const double forgetting = best_rare_ - rare_acc;
  const double epoch = static_cast<double>(step_) / static_cast<double>(steps_per_epoch_[0]);
  result_.x.push_back(epoch);
  result_.curve.push_back({acc, rare_acc, nonrare_acc, forgetting, forget_rate});
  Record r;
  r.set("step", step_)
      .set("epoch", epoch)
      .set("acc", acc)
      .set("rare_acc", rare_acc)
      .set("nonrare_acc", nonrare_acc)
      .set("best_rare_acc", best_rare_)
      .set("rare_forgetting", forgetting)
      .set("rare_forget_events", events.events)
      .set("rare_forget_rate", forget_rate);
  for (int64_t k = 0; k < plan_.num_classes; ++k) {
    r.set("acc_class" + std::to_string(k),
          percent(correct.slice(0, k, k + 1), total.slice(0, k, k + 1)));
  }
  eval_log_->write(r);
  char line[160];
  std::snprintf(line, sizeof line,
                "  eval epoch %.2f: acc %.2f%%  rare %.2f%%  non-rare %.2f%%  rare forgetting "
                "%.2f",
                epoch, acc, rare_acc, nonrare_acc, forgetting);
  progress.note(line);
}

void Run::evaluate_tasks(int64_t t, bool task_end, trainer::Progress& progress) {
  const int64_t T = static_cast<int64_t>(plan_.train.size());
  std::vector<double> accs;
  Record r;
  r.set("step", step_).set("task", t).set("kind", task_end ? "task_end" : "periodic");
  double seen = 0;
  for (int64_t j = 0; j < T; ++j) {
    const auto [correct, total, hit] = class_counts(
        model_, plan_.test[j], plan_.normalize, c_.eval_batch_size, plan_.num_classes, autocast_);
    accs.push_back(percent(correct, total));
    r.set("acc_task" + std::to_string(j), accs.back());
    if (j <= t) seen += accs.back() / static_cast<double>(t + 1);
  }
  r.set("acc_seen", seen);
  double ap = kNaN, af = kNaN, af_clip = kNaN, bwt = kNaN;
  if (task_end) {
    R_[t] = accs;
    ap = average_performance(R_, t);
    af = average_forgetting(R_, t);
    af_clip = average_forgetting_clipped(R_, t);
    bwt = backward_transfer(R_, t);
    result_.x.push_back(static_cast<double>(t + 1));
    result_.curve.push_back({ap, af, bwt});
  }
  r.set("AP", ap).set("AF", af).set("AF_clip", af_clip).set("BWT", bwt);
  eval_log_->write(r);
  std::ostringstream line;
  line.precision(4);
  line << "  eval after " << (task_end ? "task " : "step ")
       << (task_end ? std::to_string(t + 1) + "/" + std::to_string(T) : std::to_string(step_))
       << ": seen-task acc " << seen << "%";
  if (task_end) line << "  AP " << ap << "  AF " << af << "  BWT " << bwt;
  progress.note(line.str());
}

}  // namespace fogo::resnet
