#include "trainer.h"

#include <fogo/hybrid.h>
#include <torch/torch.h>

#include <chrono>
#include <iostream>
#include <set>

#include "common/cli.h"
#include "run.h"

namespace fogo::resnet {

using trainer::Record;

torch::Tensor test_selection(const Config& c, const torch::Tensor& labels, int64_t num_classes) {
  return per_class_subset(labels, c.test_per_class, num_classes, kTestSelectionSeed);
}

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

Run::Run(const Config& c, const DataSplit& data, std::ostream& log)
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

RunResult Run::run() {
  const bool resumed = c_.resume && resume_from_checkpoint();
  open_logs(resumed);
  announce(resumed);
  train();
  return finish();
}

// --- set-up --------------------------------------------------------------------------------

void Run::build_model_and_optimizer() {
  model_ = ResNet18(ResNetOptions{plan_.in_channels, plan_.num_classes, c_.width, *c_.head_fc});
  model_->to(device_);
  optimizer_ = std::make_unique<TrainOptimizer>(c_, model_);
  if (c_.replay != "none") {
    buffer_ = std::make_unique<ReplayBuffer>(c_.buffer_size, plan_.num_classes);
  }
}

// Every rank must run the same job: the signature, and the flags that steer the ranks'
// collectives or their data (a rank resuming alone, stopping earlier, reading another folder).
void Run::check_ranks_agree() const {
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
void Run::join_ranks() {
  if (c_.sync_bn) model_->sync_batch_norm([this](torch::Tensor& t) { dp_.sum_in_place(t); });
  dp_.broadcast_module(*model_);
  dp_.average_gradients_of(*model_);
  if (c_.data_parallel.shard_step && optimizer_->hybrid()) dp_.shard_step(*optimizer_->hybrid());
}

// What checkpoints are checked against: the settings, with the global batches.
trainer::RunSignature Run::signature() const {
  Config global = c_;
  global.batch_size = global_batch();
  global.ns_dtype = trainer::resolved_ns_dtype(c_.ns_dtype, device_);  // auto as it resolves here
  if (buffer_) global.replay_batch = c_.replay_batch * dp_.world_size();
  return run_signature(global);
}

// Steps per epoch of each task, the run's total, and where this session stops.
void Run::schedule_steps() {
  for (const auto& d : plan_.train) steps_per_epoch_.push_back(d.size() / global_batch());
  for (const int64_t spe : steps_per_epoch_) total_ += spe * *c_.epochs;
  last_ = c_.stop_at_step > 0 ? std::min(total_, c_.stop_at_step) : total_;
}

// The scenario's curves and summary metrics, and the accuracy matrix of the continual ones.
void Run::lay_out_result() {
  const size_t T = plan_.train.size();
  R_.assign(T, std::vector<double>(T, kNaN));
  imbalanced_ = c_.scenario == "class-imbalanced";
  if (imbalanced_) {
    result_.x_name = "epoch";
    result_.curve_names = {"acc", "rare_acc", "nonrare_acc", "rare_forgetting", "rare_forget_rate"};
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
bool Run::resume_from_checkpoint() {
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
void Run::open_logs(bool resumed) {
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

void Run::announce(bool resumed) {
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
