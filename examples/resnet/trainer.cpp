#include "trainer.h"

#include <fogo/fogo_optimizer.h>
#include <fogo/hybrid.h>
#include <torch/torch.h>

#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <set>
#include <sstream>

#include "common/checkpoint.h"
#include "common/cli.h"
#include "common/data_parallel.h"
#include "common/metrics.h"
#include "common/optimizers.h"
#include "common/progress.h"
#include "common/run_dir.h"
#include "common/runtime.h"
#include "common/signature.h"
#include "optimizers.h"
#include "resnet.h"

namespace fogo::resnet {
namespace {

using trainer::Record;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Purposes of derived generators, so the streams of one run never coincide.
enum Stream : uint64_t { kOrder = 1, kStep = 2 };

// What a run trains on and is tested on, already on the training device.
struct Plan {
  std::vector<std::string> task_names;
  std::vector<Dataset> train, test;  ///< per task (class-imbalanced: one task, one test set)
  Normalizer normalize;
  int64_t in_channels = 1, num_classes = 10;
};

}  // namespace

torch::Tensor test_selection(const Config& c, const torch::Tensor& labels, int64_t num_classes) {
  return per_class_subset(labels, c.test_per_class, num_classes, kTestSelectionSeed);
}

namespace {

Plan make_plan(const Config& c, const DataSplit& data, const torch::Device& device) {
  Plan plan;
  plan.num_classes = data.num_classes;
  plan.in_channels = data.train.images.size(1);
  Dataset train = data.train.select(
      per_class_subset(data.train.labels, c.train_per_class, data.num_classes, c.seed));
  Dataset test = data.test.select(test_selection(c, data.test.labels, data.num_classes));
  if (c.eval_split == "val") {
    // Held out from the training images by a fixed seed: the test set is never looked at.
    const auto val =
        validation_subset(train.labels, c.val_fraction, data.num_classes, kValidationSeed);
    auto rest = torch::ones({train.size()}, torch::kBool);
    rest.index_fill_(0, val, false);
    test = train.select(val);
    train = train.select(rest.nonzero().flatten());
  }
  plan.normalize = Normalizer(train.to(device));
  if (c.scenario == "class-imbalanced") {
    plan.task_names = {"all"};
    plan.train = {train
                      .select(imbalanced_subset(train.labels, c.rare_classes, c.rare_fraction,
                                                data.num_classes, c.seed))
                      .to(device)};
    plan.test = {test.to(device)};
  } else if (c.scenario == "class-il") {
    for (const auto& classes : parse_task_order(c.task_order, data.num_classes)) {
      std::string name;
      for (const int64_t k : classes) name += (name.empty() ? "" : ",") + std::to_string(k);
      plan.task_names.push_back("{" + name + "}");
      plan.train.push_back(train.select(class_subset(train.labels, classes)).to(device));
      plan.test.push_back(test.select(class_subset(test.labels, classes)).to(device));
    }
  } else {
    const Dataset train_dev = train.to(device), test_dev = test.to(device);
    for (const int64_t d : c.domain_order) {
      // Domains do not depend on the run seed: every run of a comparison sees the same ones.
      auto transform = [&](const Dataset& x) {
        if (c.domains == "rotate") return rotated(x, static_cast<double>(d) * c.rotation_step);
        return d == 0 ? x : permuted(x, static_cast<uint64_t>(d));
      };
      plan.task_names.push_back(c.domains + std::to_string(d));
      plan.train.push_back(transform(train_dev));
      plan.test.push_back(transform(test_dev));
    }
  }
  for (size_t t = 0; t < plan.train.size(); ++t) {
    if (plan.train[t].size() < c.batch_size) {
      throw std::invalid_argument(
          "--batch-size: task " + plan.task_names[t] + " has only " +
          std::to_string(plan.train[t].size()) + " training images, fewer than one batch of " +
          std::to_string(c.batch_size) + " (raise --train-per-class or lower --batch-size)");
    }
    if (plan.test[t].size() == 0) {
      throw std::invalid_argument("--test-per-class: task " + plan.task_names[t] +
                                  " has no test images");
    }
  }
  return plan;
}

// Per-class correct and total counts of `model` on `data` ([num_classes] each, CPU int64), and
// the per-sample correctness (bool [N], CPU).
struct Counts {
  torch::Tensor correct, total, hit;
};
Counts class_counts(ResNet18& model, const Dataset& data, const Normalizer& normalize,
                    int64_t batch_size, int64_t num_classes, bool autocast) {
  torch::NoGradGuard no_grad;
  trainer::AutocastGuard guard(data.labels.device().type(), autocast);
  model->eval();
  auto correct = torch::zeros({num_classes}, torch::kLong).to(data.labels.device());
  auto total = torch::zeros_like(correct);
  std::vector<torch::Tensor> hits;
  for (int64_t begin = 0; begin < data.size(); begin += batch_size) {
    const int64_t end = std::min(begin + batch_size, data.size());
    const auto y = data.labels.slice(0, begin, end);
    const auto pred = model->forward(normalize(data.images.slice(0, begin, end))).argmax(1);
    hits.push_back(pred == y);
    correct += torch::bincount(y.masked_select(pred == y), {}, num_classes);
    total += torch::bincount(y, {}, num_classes);
  }
  model->train();
  return {correct.cpu(), total.cpu(), torch::cat(hits).cpu()};
}

double percent(const torch::Tensor& correct, const torch::Tensor& total) {
  const double n = static_cast<double>(total.sum().item<int64_t>());
  return n > 0 ? 100.0 * static_cast<double>(correct.sum().item<int64_t>()) / n : kNaN;
}

// The whole of one run: state, events and persistence. run() names the stages; each stage is
// one member function, so that another driver (distributed training, say) can enter them.
class Run {
 public:
  Run(const Config& c, const DataSplit& data, std::ostream& log)
      : c_(c),
        dp_(trainer::DataParallel::process(std::chrono::seconds(c.data_parallel.dist_timeout),
                                           trainer::parse_device(c.device))),
        log_(dp_.main_only(log)),
        device_(trainer::parse_device(c.device)),
        dir_(run_dir(c)),
        ckpt_path_(dir_ + "/" + trainer::kCheckpointFile) {
    trainer::set_threads(c.threads);
    if (c.autocast == "bf16" && !device_.is_cuda()) {
      throw trainer::Cli::error("autocast", "bf16 autocast is for CUDA devices only (device " +
                                                device_.str() + "); use auto or off");
    }
    autocast_ = device_.is_cuda() && c.autocast != "off";
    trainer::make_deterministic(c.seed);  // the model's initial weights come from this seed
    plan_ = make_plan(c, data, device_);
    build_model_and_optimizer();
    check_ranks_agree();
    dp_.on_main([&] {
      claim_.emplace(dir_,
                     std::vector<std::string>{trainer::kCheckpointFile, "train.jsonl", "train.csv",
                                              "eval.jsonl", "eval.csv", "result.jsonl"},
                     c_.resume, c_.overwrite);
    });
    if (dp_.distributed()) join_ranks();
    schedule_steps();
    lay_out_result();
  }

  RunResult run() {
    const bool resumed = c_.resume && resume_from_checkpoint();
    open_logs(resumed);
    announce(resumed);
    train();
    return finish();
  }

 private:
  // --- set-up ------------------------------------------------------------------------------

  void build_model_and_optimizer() {
    model_ = ResNet18(ResNetOptions{plan_.in_channels, plan_.num_classes, c_.width, *c_.head_fc});
    model_->to(device_);
    optimizer_ = std::make_unique<TrainOptimizer>(c_, model_);
    if (c_.replay != "none") {
      buffer_ = std::make_unique<ReplayBuffer>(c_.buffer_size, plan_.num_classes);
    }
  }

  // Every rank must run the same job: the signature, and the flags that steer the ranks'
  // collectives or their data (a rank resuming alone, stopping earlier, reading another folder).
  void check_ranks_agree() const {
    trainer::RunSignature launch = signature();
    launch.add("data-dir", c_.data_dir)
        .add("resume", c_.resume)
        .add("overwrite", c_.overwrite)
        .add("stop-at-step", c_.stop_at_step)
        .add("shard-step", c_.data_parallel.shard_step);
    if (!c_.sync_bn) launch.add("sync-bn", false);  // the signature lists it when on
    dp_.check_same_settings(launch);
  }

  // Data-parallel (under torchrun): every rank starts from rank 0's model, gradients are
  // averaged over the ranks, and each rank trains on its rows of every global batch.
  void join_ranks() {
    if (c_.sync_bn) model_->sync_batch_norm([this](torch::Tensor& t) { dp_.sum_in_place(t); });
    dp_.broadcast_module(*model_);
    dp_.average_gradients_of(*model_);
    if (c_.data_parallel.shard_step && optimizer_->hybrid()) dp_.shard_step(*optimizer_->hybrid());
  }

  // The global batch: --batch-size rows on each rank.
  int64_t global_batch() const { return c_.batch_size * dp_.world_size(); }

  // What checkpoints are checked against: the settings, with the global batches.
  trainer::RunSignature signature() const {
    Config global = c_;
    global.batch_size = global_batch();
    global.ns_dtype = trainer::resolved_ns_dtype(c_.ns_dtype, device_);  // auto as it resolves here
    if (buffer_) global.replay_batch = c_.replay_batch * dp_.world_size();
    return run_signature(global);
  }

  // Steps per epoch of each task, the run's total, and where this session stops.
  void schedule_steps() {
    for (const auto& d : plan_.train) steps_per_epoch_.push_back(d.size() / global_batch());
    for (const int64_t spe : steps_per_epoch_) total_ += spe * *c_.epochs;
    last_ = c_.stop_at_step > 0 ? std::min(total_, c_.stop_at_step) : total_;
  }

  // The scenario's curves and summary metrics, and the accuracy matrix of the continual ones.
  void lay_out_result() {
    const size_t T = plan_.train.size();
    R_.assign(T, std::vector<double>(T, kNaN));
    imbalanced_ = c_.scenario == "class-imbalanced";
    if (imbalanced_) {
      result_.x_name = "epoch";
      result_.curve_names = {"acc", "rare_acc", "nonrare_acc", "rare_forgetting",
                             "rare_forget_rate"};
      result_.summary_names = {"acc",
                               "rare_acc",
                               "nonrare_acc",
                               "rare_forgetting",
                               "mean_rare_forgetting",
                               "rare_forget_rate"};
    } else {
      result_.x_name = "tasks learned";
      result_.curve_names = {"AP", "AF", "BWT"};
      result_.summary_names = {"AP", "AF", "AF_clip", "BWT"};
    }
  }

  // --resume: the run's checkpoint, when there is one (its settings checked); true if loaded.
  // Data-parallel: rank 0's checkpoint, sent to every rank.
  bool resume_from_checkpoint() {
    if (dp_.distributed()) {
      const auto bytes = dp_.read_on_main(ckpt_path_);
      if (!bytes) return false;
      trainer::CheckpointReader in(ckpt_path_, *bytes, device_);
      signature().check(in);
      load_checkpoint(in);
      return true;
    }
    auto in = trainer::open_for_resume(ckpt_path_, signature(), device_);
    if (!in) return false;
    load_checkpoint(*in);
    return true;
  }

  // train and eval metrics files: new, or trimmed to the checkpoint's step when resumed.
  void open_logs(bool resumed) {
    if (!dp_.main()) return;
    const std::string ext = "." + c_.metrics_format;
    auto open = [&](const std::string& name) {
      const std::string path = dir_ + "/" + name + ext;
      return resumed ? trainer::MetricsWriter::resume(path, step_)
                     : trainer::MetricsWriter::create(path);
    };
    train_log_.emplace(open("train"));
    eval_log_.emplace(open("eval"));
  }

  void announce(bool resumed) {
    log_ << "run " << dir_ << ": " << c_.scenario << ", " << plan_.task_names.size() << " task(s), "
         << total_ << " steps, " << count_parameters(*model_) << " parameters, "
         << trainer::describe_runtime(device_)
         << (dp_.distributed() ? ", " + std::to_string(dp_.world_size()) + " ranks (data-parallel)"
                               : "")
         << "\n  " << optimizer_->description() << "\n";
    // The routing at start-up, once per process for each table (the seeds of a configuration
    // share it; a sweep's learning rates make tables of their own).
    static std::set<std::string> printed;
    const std::string routes = optimizer_->routing_table(*model_);
    if (!routes.empty() && printed.insert(routes).second)
      log_ << "  routing (side, rule, group and update scale of each parameter):\n" << routes;
    if (resumed) log_ << "  resumed at step " << step_ << " from " << ckpt_path_ << "\n";
  }

  // --- training ----------------------------------------------------------------------------

  // Every task, epoch by epoch, from the current step to last_; epochs finished before a
  // checkpoint are skipped whole.
  void train() {
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
  void train_epoch(int64_t t, int64_t e, int64_t epoch_begin, trainer::Progress& progress) {
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
  void schedule_lr(int64_t t, int64_t step) {
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
  torch::Tensor epoch_order(int64_t t, int64_t e) const {
    auto gen = derived_generator({static_cast<uint64_t>(c_.seed), kOrder, static_cast<uint64_t>(t),
                                  static_cast<uint64_t>(e)});
    return torch::randperm(plan_.train[t].size(), gen, torch::kLong).to(device_);
  }

  torch::Tensor prepare(const torch::Tensor& images_u8, at::Generator& gen) const {
    const Augmentation a = augmentation(c_);
    if (a.crop_pad == 0 && !a.flip) return plan_.normalize(images_u8);
    return plan_.normalize(augment(images_u8, a.crop_pad, a.flip, gen));
  }

  // One optimizer step on the global batch `index` of task t; returns (loss, batch accuracy %).
  // Data-parallel, the whole global batch is augmented on every rank (the same draws as one
  // process) and each rank trains on its --batch-size rows of it.
  std::pair<double, double> train_step(int64_t t, const torch::Tensor& index) {
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
  torch::Tensor replay_loss(at::Generator& gen) {
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
  std::tuple<torch::Tensor, torch::Tensor, double> replay_forward(const torch::Tensor& index,
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
  void communicate(const std::function<void()>& f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    comm_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // Backward, gradient clipping (and the norm for the log), optimizer step.
  void update(torch::Tensor& loss) {
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

  void show_progress(int64_t t, int64_t e, double loss, double acc, trainer::Progress& progress) {
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
  void after_step(int64_t t, int64_t e, bool epoch_end, double loss, double acc,
                  trainer::Progress& progress) {
    if (step_ % c_.log_every == 0 && dp_.main()) log_step(t, e, loss, acc);
    evaluate_if_due(t, epoch_end && e == *c_.epochs - 1, epoch_end, progress);
    const bool due = c_.ckpt_every > 0 ? step_ % c_.ckpt_every == 0 : epoch_end;
    if ((due || step_ == last_) && dp_.main()) save_checkpoint();
  }

  void log_step(int64_t t, int64_t e, double loss, double acc) {
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

  // --- evaluation --------------------------------------------------------------------------

  // Class-imbalanced: at each epoch's end; continual: at each task's end (then the task
  // boundary, unless it was the last task); both: every --eval-every steps. Data-parallel,
  // rank 0 evaluates, and every rank checks that the ranks hold one model (and FOGO memory and
  // replay buffer).
  void evaluate_if_due(int64_t t, bool task_end, bool epoch_end, trainer::Progress& progress) {
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

  void evaluate_imbalanced(trainer::Progress& progress) {
    const auto [correct, total, hit] = class_counts(
        model_, plan_.test[0], plan_.normalize, c_.eval_batch_size, plan_.num_classes, autocast_);
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

  void evaluate_tasks(int64_t t, bool task_end, trainer::Progress& progress) {
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

  // --- persistence -------------------------------------------------------------------------

  // The run's provenance, one list for the checkpoint, its reload and result.jsonl: the session
  // that trained the run last (command line, machine, date, the binary's commit, CPU ISA).
  template <class Result>
  static auto provenance(Result& r) {
    return std::array{std::pair{"command", &r.command}, std::pair{"machine", &r.machine},
                      std::pair{"date", &r.date}, std::pair{"commit", &r.commit},
                      std::pair{"isa", &r.isa}};
  }

  void save_checkpoint() {
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

  void load_checkpoint(trainer::CheckpointReader& in) {
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

  // --- result ------------------------------------------------------------------------------

  // The run's result (summary metrics once they exist), also written to result.jsonl.
  RunResult finish() {
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
  void share_main_result() {
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
  std::vector<double> summarize() const {
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

  void write_result() const {
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
  double wall_seconds() const {
    return wall_before_ +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count();
  }

  // First member: the session's clock starts before the rest is built.
  const std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  double wall_before_ = 0;  ///< wall time of the earlier sessions (checkpoint)
  const std::string session_machine_ = trainer::machine_description();
  const std::string session_isa_ = trainer::cpu_isa();
  Config c_;
  trainer::DataParallel& dp_;
  std::ostream& log_;
  torch::Device device_;
  std::string dir_, ckpt_path_;
  Plan plan_;
  ResNet18 model_{nullptr};
  std::unique_ptr<TrainOptimizer> optimizer_;
  std::unique_ptr<ReplayBuffer> buffer_;
  std::vector<int64_t> steps_per_epoch_;
  int64_t total_ = 0, step_ = 0;
  int64_t last_ = 0;  ///< the step this session stops after (--stop-at-step, or total_)
  double seconds_ = 0, grad_norm_ = kNaN, lr_factor_ = 1.0;
  double comm_seconds_ = 0;  ///< data-parallel: time in collectives (communicate())
  bool autocast_ = false;    ///< bf16 autocast of the forward passes (CUDA)
  trainer::UpdateRms update_rms_;
  std::vector<double> last_update_rms_;  ///< of the last logged step, per param group
  double seconds_before_ = 0;            ///< training time of the earlier sessions
  std::chrono::steady_clock::time_point session_start_;
  double best_rare_ = -std::numeric_limits<double>::infinity();
  torch::Tensor rare_correct_;  ///< per rare test sample: correct at the last evaluation
  bool imbalanced_ = true;
  AccuracyMatrix R_;
  RunResult result_;
  std::optional<trainer::MetricsWriter> train_log_, eval_log_;
  std::optional<trainer::RunDirectory> claim_;  ///< rank 0: the run's folder, claimed
};

}  // namespace

DataSplit load_data(const Config& config) {
  const std::string dir =
      config.data_dir.empty() ? "/usr/share/datasets/fashion-mnist" : config.data_dir;
  if (config.dataset == "cifar10") {
    if (config.data_dir.empty()) {
      throw std::invalid_argument("--data-dir: cifar10 needs the folder of its binary batches");
    }
    return load_cifar10(dir);
  }
  return load_fashion_mnist(dir);
}

RunResult train_run(const Config& config, const DataSplit& data, std::ostream& log) {
  Run run(config, data, log);
  return run.run();
}

}  // namespace fogo::resnet
