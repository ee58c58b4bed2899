// The training stage of a Run: epochs, steps, replay, the update, the step records.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>

#include "run.h"

namespace fogo::resnet {

using trainer::Record;

// Every task, epoch by epoch, from the current step to last_; epochs finished before a
// checkpoint are skipped whole.
void Run::train() {
  trainer::Progress progress(total_, step_,
                             {c_.optimizer + " s" + std::to_string(c_.seed), "samples"},
                             dp_.main_only(std::cerr));
  session_start_ = std::chrono::steady_clock::now();
  seconds_before_ = seconds_;
  int64_t epoch_begin = 0;
  const int64_t T = static_cast<int64_t>(plan_.train.size());
  for (int64_t t = 0; t < T && step_ < last_; ++t) {
    const int64_t spe = steps_per_epoch_[t];
    for (int64_t e = 0; e < *c_.epochs && step_ < last_; ++e, epoch_begin += spe) {
      if (epoch_begin + spe <= step_) continue;  // finished before the checkpoint
      train_epoch(t, e, epoch_begin, progress);
    }
  }
  progress.finish();
}

// The batches of epoch e of task t from the current step on; epoch_begin is the run's step
// at the epoch's start.
void Run::train_epoch(int64_t t, int64_t e, int64_t epoch_begin, trainer::Progress& progress) {
  const int64_t spe = steps_per_epoch_[t];
  const torch::Tensor order = epoch_order(t, e);
  for (int64_t b = step_ - epoch_begin; b < spe && step_ < last_; ++b) {
    schedule_lr(t, e * spe + b);
    const auto [loss, acc] =
        train_step(t, order.slice(0, b * global_batch(), (b + 1) * global_batch()));
    ++step_;
    seconds_ =
        seconds_before_ +
        std::chrono::duration<double>(std::chrono::steady_clock::now() - session_start_).count();
    show_progress(t, e, loss, acc, progress);
    after_step(t, e, b == spe - 1, loss, acc, progress);
  }
}

// The learning rate of step `step` (0-based) of task t: a function of the position alone, so a
// resumed run repeats it.
void Run::schedule_lr(int64_t t, int64_t step) {
  lr_factor_ = 1.0;
  if (c_.lr_schedule == "cosine") {
    const int64_t steps = steps_per_epoch_[t] * *c_.epochs;
    const auto warmup =
        static_cast<int64_t>(std::round(c_.warmup_frac * static_cast<double>(steps)));
    lr_factor_ = cosine_factor(step, steps, warmup, c_.min_lr_factor);
  }
  optimizer_->set_lr_factor(lr_factor_);
}

// The order of task t's training images in epoch e: a function of (seed, t, e) alone.
torch::Tensor Run::epoch_order(int64_t t, int64_t e) const {
  auto gen = derived_generator(
      {static_cast<uint64_t>(c_.seed), kOrder, static_cast<uint64_t>(t), static_cast<uint64_t>(e)});
  return torch::randperm(plan_.train[t].size(), gen, torch::kLong).to(device_);
}

torch::Tensor Run::prepare(const torch::Tensor& images_u8, at::Generator& gen) const {
  const Augmentation a = augmentation(c_);
  if (a.crop_pad == 0 && !a.flip) return plan_.normalize(images_u8);
  return plan_.normalize(augment(images_u8, a.crop_pad, a.flip, gen));
}

// One optimizer step on the global batch `index` of task t; returns (loss, batch accuracy %).
// Data-parallel, the whole global batch is augmented on every rank (the same draws as one
// process) and each rank trains on its --batch-size rows of it.
std::pair<double, double> Run::train_step(int64_t t, const torch::Tensor& index) {
  const Dataset& data = plan_.train[t];
  const auto images = data.images.index_select(0, index);
  const auto labels = data.labels.index_select(0, index);
  auto gen =
      derived_generator({static_cast<uint64_t>(c_.seed), kStep, static_cast<uint64_t>(step_)});
  model_->train();
  const auto [first, end] = dp_.rows(global_batch());
  const auto local_labels = labels.slice(0, first, end);
  torch::Tensor logits, loss;
  {
    trainer::AutocastGuard autocast(device_.type(), autocast_);
    logits = model_->forward(prepare(images, gen).slice(0, first, end)).to(torch::kFloat);
    loss = torch::cross_entropy_loss(logits, local_labels);
    // Data-parallel, every rank's share of the replay batch must be non-empty.
    if (buffer_ && buffer_->size() >= dp_.world_size()) loss = loss + replay_loss(gen);
  }
  // The loss and the correct predictions summed over the ranks in one all-reduce.
  const auto local =
      torch::stack({loss.detach().to(torch::kCPU, torch::kDouble),
                    (logits.argmax(1) == local_labels).sum().to(torch::kCPU, torch::kDouble)});
  torch::Tensor sums;
  communicate([&] { sums = dp_.sum(local); });
  const double loss_value = sums[0].item<double>() / static_cast<double>(dp_.world_size());
  const double acc = 100.0 * sums[1].item<double>() / static_cast<double>(global_batch());
  if (!std::isfinite(loss_value)) {
    throw std::runtime_error("run " + dir_ + ": the loss is " + std::to_string(loss_value) +
                             " at step " + std::to_string(step_ + 1) +
                             "; lower --lr or set --grad-clip");
  }
  update(loss);
  // Every rank offers the whole global batch, with every rank's logits, to its buffer: the
  // buffers stay identical (the same draws), and equal to one process's up to the logits.
  if (buffer_) {
    torch::Tensor all_logits;
    communicate([&] { all_logits = dp_.gather_rows(logits.detach(), global_batch()); });
    buffer_->add(images, labels, all_logits, gen);
  }
  return {loss_value, acc};
}

// The replay terms of the loss on samples of the buffer: ER (labels) or DER++ (stored
// logits, and the labels of a second sample). Data-parallel, every rank draws the same global
// replay batch (--replay-batch rows per rank) and trains on its share of it.
torch::Tensor Run::replay_loss(at::Generator& gen) {
  const double alpha = *c_.replay_alpha;
  const auto i = buffer_->sample(c_.replay_batch * dp_.world_size(), gen);
  auto [out, share, weight] = replay_forward(i, gen);
  if (c_.replay == "er") {
    return alpha * weight *
           torch::cross_entropy_loss(out, buffer_->labels().index_select(0, share));
  }
  auto loss = alpha * weight * torch::mse_loss(out, buffer_->logits().index_select(0, share));
  const auto j = buffer_->sample(c_.replay_batch * dp_.world_size(), gen);
  auto [out2, share2, weight2] = replay_forward(j, gen);
  return loss + c_.der_beta * weight2 *
                    torch::cross_entropy_loss(out2, buffer_->labels().index_select(0, share2));
}

// The model's output on this rank's share of the buffer samples `index` (all of them
// augmented, as one process would), the share's indices, and the weight that turns the mean
// over the share into its part of the mean over all of `index`: averaged over the ranks (as
// the gradients are), share size x world / n times the share's mean is the mean over the n.
// Exactly 1 in a world of one and whenever the ranks' shares are equal.
std::tuple<torch::Tensor, torch::Tensor, double> Run::replay_forward(const torch::Tensor& index,
                                                                     at::Generator& gen) {
  const int64_t n = index.size(0);
  const auto [begin, end] = dp_.rows(n);
  const auto inputs = prepare(buffer_->images().index_select(0, index), gen).slice(0, begin, end);
  const double weight =
      static_cast<double>((end - begin) * dp_.world_size()) / static_cast<double>(n);
  return {model_->forward(inputs).to(torch::kFloat), index.slice(0, begin, end), weight};
}

// Runs `f` (a collective) and adds its wall time to comm_seconds_: the wait for the gradient
// all-reduce that backward did not finish, the per-step sums and the replay gathers.
void Run::communicate(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Backward, gradient clipping (and the norm for the log), optimizer step.
void Run::update(torch::Tensor& loss) {
  optimizer_->zero_grad();
  loss.backward();
  communicate([&] { dp_.finish_gradients(); });  // every gradient = (sum over ranks) / world
  if (*c_.grad_clip > 0) {
    grad_norm_ = torch::nn::utils::clip_grad_norm_(model_->parameters(), *c_.grad_clip);
  } else if ((step_ + 1) % c_.log_every == 0) {
    grad_norm_ = torch::nn::utils::clip_grad_norm_(model_->parameters(),
                                                   std::numeric_limits<double>::infinity());
  }
  const bool logged = (step_ + 1) % c_.log_every == 0;
  if (logged) update_rms_.snapshot(optimizer_->param_groups());
  optimizer_->step();
  if (logged) last_update_rms_ = update_rms_.measure(optimizer_->param_groups());
}

void Run::show_progress(int64_t t, int64_t e, double loss, double acc,
                        trainer::Progress& progress) {
  trainer::ProgressFields f;
  f.epoch = e + 1;
  f.epochs = *c_.epochs;
  f.loss = loss;
  f.acc = acc / 100.0;
  const int64_t T = static_cast<int64_t>(plan_.train.size());
  if (T > 1) f.extra = "task " + std::to_string(t + 1) + "/" + std::to_string(T);
  progress.update(step_, global_batch(), f);
}

// What follows step_ (the batch of epoch e of task t; epoch_end on its last batch): the
// metrics record, the evaluations and task boundary that are due, the checkpoint.
void Run::after_step(int64_t t, int64_t e, bool epoch_end, double loss, double acc,
                     trainer::Progress& progress) {
  if (step_ % c_.log_every == 0 && dp_.main()) log_step(t, e, loss, acc);
  evaluate_if_due(t, epoch_end && e == *c_.epochs - 1, epoch_end, progress);
  const bool due = c_.ckpt_every > 0 ? step_ % c_.ckpt_every == 0 : epoch_end;
  if ((due || step_ == last_) && dp_.main()) save_checkpoint();
}

void Run::log_step(int64_t t, int64_t e, double loss, double acc) {
  Record r;
  r.set("step", step_)
      .set("task", t)
      .set("epoch", e + 1)
      .set("loss", loss)
      .set("acc", acc)
      .set("grad_norm", grad_norm_)
      .set("lr", *c_.lr * lr_factor_)
      .set("time_s", seconds_);
  if (dp_.distributed()) r.set("comm_s", comm_seconds_);
  trainer::add_update_rms(r, optimizer_->group_names(), last_update_rms_);
  optimizer_->add_telemetry(r);
  train_log_->write(r);
}

}  // namespace fogo::resnet
