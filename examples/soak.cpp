// fogo_soak: FOGO over a long non-stationary stream, to see that nothing drifts or leaks.
//
// A small MLP (matrices to FOGO, biases to AdamW, one hybrid) trains on Fashion-MNIST whose
// domain changes every --steps-per-task steps: the images rotate by k x --rotation-step degrees,
// k cycling through --domains, with FOGO's task_boundary() at every change (so the frozen bank
// grows and candidate sampling runs). Every --report-every steps it prints live centroids,
// codebook entropy and frozen-bank size (averaged over the codebook groups), the count of
// non-finite losses, gradients and parameters seen so far, and the process's resident memory.
// It exits non-zero when any non-finite value was seen or resident memory grew by more than
// --max-rss-growth between the first report and the last. Not a ctest test: minutes long.
#include <c10/util/Exception.h>
#include <fogo/fogo.h>
#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "common/cli.h"
#include "data.h"

namespace {

struct Config {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t steps = 12000;
  int64_t steps_per_task = 1500;
  int64_t domains = 4;
  double rotation_step = 45.0;
  int64_t batch_size = 64;
  int64_t hidden = 256;
  int64_t report_every = 1000;
  int64_t threads = 1;
  int64_t seed = 0;
  double max_rss_growth = 0.10;
};

// Resident set size of this process in MiB (Linux /proc; 0 where it cannot be read).
double resident_mib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      double kib = 0;
      status >> kib;
      return kib / 1024.0;
    }
    status.ignore(1 << 20, '\n');
  }
  return 0;
}

bool all_finite(const std::vector<torch::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (t.defined() && !torch::isfinite(t).all().item<bool>()) return false;
  }
  return true;
}

// The training images rotated into each domain: float [N, 784] in [0, 1], one per domain.
std::vector<torch::Tensor> domain_images(const Config& c, const fogo::resnet::Dataset& train) {
  std::vector<torch::Tensor> images;
  for (int64_t k = 0; k < c.domains; ++k) {
    const auto rotated = fogo::resnet::rotated(train, c.rotation_step * static_cast<double>(k));
    images.push_back(rotated.images.reshape({rotated.size(), -1}).to(torch::kFloat) / 255.0);
  }
  return images;
}

void print_banner(const Config& c, int64_t pixels, size_t groups) {
  std::cout << "fogo_soak: MLP " << pixels << "-" << c.hidden << "-" << c.hidden << "-10, "
            << c.steps << " steps, a new domain (rotation by " << c.rotation_step
            << " degrees more) every " << c.steps_per_task << " steps over " << c.domains
            << " domains, batch " << c.batch_size << ", FOGO presets::domain_il_backbone on "
            << groups << " codebook groups\n";
  std::cout << std::setw(7) << "step" << std::setw(6) << "task" << std::setw(9) << "loss"
            << std::setw(7) << "live" << std::setw(9) << "entropy" << std::setw(8) << "frozen"
            << std::setw(10) << "nonfinite" << std::setw(10) << "rss MiB" << std::setw(9) << "s"
            << "\n";
}

// What the run has seen: non-finite events, resident memory at the first and latest report, and
// the losses since the last report.
struct Tally {
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  int64_t nonfinite = 0;
  double first_rss = 0, last_rss = 0, loss_sum = 0;
  int64_t loss_count = 0;
};

// One report line: the mean loss since the last report, FOGO's telemetry averaged over the
// codebook groups, the non-finite count, resident memory and seconds so far.
void report(int64_t step, int64_t task, const fogo::FOGO& fogo_side, Tally& tally) {
  const auto telemetry = fogo_side.telemetry();
  double live = 0, entropy = 0, frozen = 0;
  for (const auto& t : telemetry) {
    live += static_cast<double>(t.live_centroids);
    entropy += t.codebook_entropy;
    frozen += static_cast<double>(t.frozen);
  }
  const double groups = static_cast<double>(telemetry.size());
  tally.last_rss = resident_mib();
  if (tally.first_rss == 0) tally.first_rss = tally.last_rss;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - tally.start).count();
  std::cout << std::fixed << std::setw(7) << step + 1 << std::setw(6) << task
            << std::setprecision(4) << std::setw(9)
            << tally.loss_sum / std::max<int64_t>(tally.loss_count, 1) << std::setprecision(1)
            << std::setw(7) << live / groups << std::setprecision(3) << std::setw(9)
            << entropy / groups << std::setprecision(1) << std::setw(8) << frozen / groups
            << std::setw(10) << tally.nonfinite << std::setw(10) << tally.last_rss << std::setw(9)
            << seconds << std::endl;
  tally.loss_sum = 0;
  tally.loss_count = 0;
}

// The summary lines; 0 when nothing non-finite was seen and memory stayed within the bound.
int verdict(const Config& c, const Tally& t) {
  const double growth = t.first_rss > 0 ? t.last_rss / t.first_rss - 1 : 0;
  std::cout << "fogo_soak: " << t.nonfinite << " non-finite events; resident memory " << std::fixed
            << std::setprecision(1) << t.first_rss << " MiB at the first report, " << t.last_rss
            << " MiB at the end (" << std::showpos << 100 * growth << std::noshowpos << "%)\n";
  const bool ok = t.nonfinite == 0 && growth <= c.max_rss_growth;
  std::cout << "fogo_soak: " << (ok ? "PASS" : "FAIL") << "\n";
  return ok ? 0 : 1;
}

int run(const Config& c) {
  TORCH_CHECK(c.steps >= 1 && c.steps_per_task >= 1 && c.domains >= 1 && c.batch_size >= 1 &&
                  c.hidden >= 1 && c.report_every >= 1,
              "--steps, --steps-per-task, --domains, --batch-size, --hidden and --report-every "
              "must be >= 1");
  if (c.threads > 0) torch::set_num_threads(static_cast<int>(c.threads));
  torch::manual_seed(static_cast<uint64_t>(c.seed));
  const auto data = fogo::resnet::load_fashion_mnist(c.data_dir);
  const std::vector<torch::Tensor> images = domain_images(c, data.train);
  const torch::Tensor labels = data.train.labels;
  const int64_t n = labels.size(0), pixels = images[0].size(1);

  torch::nn::Sequential model(torch::nn::Linear(pixels, c.hidden), torch::nn::ReLU(),
                              torch::nn::Linear(c.hidden, c.hidden), torch::nn::ReLU(),
                              torch::nn::Linear(c.hidden, 10));
  fogo::ParamSplitRules rules;
  rules.rest_patterns = {};  // the classifier too is a matrix here (the paper's head groups)
  auto opt =
      fogo::make_hybrid<fogo::FOGO>(*model, fogo::presets::domain_il_backbone(),
                                    torch::optim::AdamWOptions(1e-3), rules, fogo::shape_key);
  auto& fogo_side = *opt.matrix<fogo::FOGO>();
  print_banner(c, pixels, fogo_side.param_groups().size());

  Tally tally;
  for (int64_t step = 0; step < c.steps; ++step) {
    const int64_t task = step / c.steps_per_task;
    if (step > 0 && step % c.steps_per_task == 0) fogo_side.task_boundary();
    const torch::Tensor index = torch::randint(n, {c.batch_size}, torch::kLong);
    const torch::Tensor x = images[task % c.domains].index_select(0, index);
    const torch::Tensor y = labels.index_select(0, index);
    opt.zero_grad();
    const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad());
    const double value = loss.item<double>();
    if (!std::isfinite(value) || !all_finite(grads)) {
      ++tally.nonfinite;
      continue;  // never step on a non-finite gradient; counted, and the run fails at the end
    }
    opt.step();
    if (!all_finite(model->parameters())) ++tally.nonfinite;
    tally.loss_sum += value;
    ++tally.loss_count;
    if ((step + 1) % c.report_every == 0 || step + 1 == c.steps)
      report(step, task, fogo_side, tally);
  }
  return verdict(c, tally);
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  fogo::trainer::Cli cli("fogo_soak",
                         "FOGO over a long stream of rotating Fashion-MNIST domains with task "
                         "boundaries;\nfails on any non-finite value or resident-memory growth.");
  cli.flag("data-dir", &c.data_dir, "Fashion-MNIST IDX files (.gz or plain)");
  cli.flag("steps", &c.steps, "optimizer steps in all");
  cli.flag("steps-per-task", &c.steps_per_task, "steps between domain changes (task boundaries)");
  cli.flag("domains", &c.domains, "rotations cycled through");
  cli.flag("rotation-step", &c.rotation_step, "degrees between domains");
  cli.flag("batch-size", &c.batch_size, "images per step");
  cli.flag("hidden", &c.hidden, "width of the two hidden layers");
  cli.flag("report-every", &c.report_every, "steps between report lines");
  cli.flag("threads", &c.threads, "CPU threads (0: torch's default)");
  cli.flag("seed", &c.seed, "seed of the initialisation and the batches");
  cli.flag("max-rss-growth", &c.max_rss_growth,
           "largest accepted growth of resident memory, first report to last (fraction)");
  try {
    if (!cli.parse(argc, const_cast<const char* const*>(argv))) return 0;
    return run(c);
  } catch (const fogo::trainer::CliError& e) {
    std::cerr << "fogo_soak: " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "fogo_soak: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "fogo_soak: " << e.what() << "\n";
    return 1;
  }
}
