#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>
#include <utility>

#include "common/checkpoint.h"
#include "common/cli.h"
#include "common/data_parallel.h"
#include "common/report.h"
#include "common/runtime.h"
#include "run_parts.h"
#include "train.h"

namespace gpt2 {

namespace tr = fogo::trainer;

std::string step_time_summary(const RunResult& r) {
  constexpr size_t kSkip = 5;
  if (r.step_seconds.size() <= kSkip) return "steady state: fewer than 6 steps timed";
  const auto median = [&](const std::vector<double>& v) {
    std::vector<double> tail(v.begin() + kSkip, v.end());
    std::nth_element(tail.begin(), tail.begin() + tail.size() / 2, tail.end());
    return tail[tail.size() / 2];
  };
  const double step = median(r.step_seconds), optimizer = median(r.optimizer_seconds);
  const double tps = static_cast<double>(r.tokens_per_step) / step;
  std::ostringstream out;
  out << std::fixed << std::setprecision(2) << "steady state (steps " << kSkip + 1 << "-"
      << r.step_seconds.size() << "): median step " << 1e3 * step << " ms, optimizer "
      << 1e3 * optimizer << " ms (" << std::setprecision(1) << 100 * optimizer / step
      << "% of the step), ";
  if (r.world_size > 1) {
    const double wait = median(r.gradient_wait_seconds);
    out << std::setprecision(2) << "gradient all-reduce wait " << 1e3 * wait << " ms ("
        << std::setprecision(1) << 100 * wait / step << "%), ";
  }
  out << std::setprecision(0) << tps << " tokens/s";
  if (r.mfu >= 0 && r.tokens_per_second > 0) {
    out << std::setprecision(1) << ", MFU " << 100 * r.mfu * tps / r.tokens_per_second << "%";
  }
  return out.str();
}

namespace {

// The validation loss at each evaluated token count (one column per optimizer) and the summary
// of each run. Every run has the same schedule and evaluation cadence, so the evaluated token
// counts coincide.
std::pair<tr::Table, tr::Table> compare_tables(const std::vector<RunResult>& runs) {
  std::vector<std::string> header{"tokens"};
  for (const auto& r : runs) header.push_back(r.optimizer);
  tr::Table curve(header);
  for (size_t i = 0; i < runs[0].val_loss.size(); ++i) {
    std::vector<std::string> row{std::to_string(runs[0].val_loss[i].tokens)};
    for (const auto& r : runs) {
      row.push_back(i < r.val_loss.size() ? format_double(r.val_loss[i].value, 4) : "n/a");
    }
    curve.add_row(row);
  }
  tr::Table summary(
      {"optimizer", "final val loss", "best val loss", "tokens/s", "MFU", "train time (s)"});
  for (const auto& r : runs) {
    double best = std::numeric_limits<double>::infinity();
    for (const auto& p : r.val_loss) best = std::min(best, p.value);
    summary.add_row({r.optimizer, format_double(r.val_loss.back().value, 4), format_double(best, 4),
                     format_double(r.tokens_per_second, 0),
                     r.mfu >= 0 ? format_double(100 * r.mfu, 2) + "%" : "n/a",
                     format_double(r.train_seconds, 1)});
  }
  return {std::move(curve), std::move(summary)};
}

// One series per run of the loss curve `member`, against tokens in millions.
std::vector<tr::Series> loss_series(const std::vector<RunResult>& runs,
                                    std::vector<Point> RunResult::*member) {
  std::vector<tr::Series> all;
  for (const auto& r : runs) {
    tr::Series s{r.optimizer, {}, {}, {}};
    for (const auto& p : r.*member) {
      s.x.push_back(static_cast<double>(p.tokens) / 1e6);
      s.y.push_back(p.value);
    }
    all.push_back(std::move(s));
  }
  return all;
}

// compare.md, the tables on `log`, and loss.png.
void write_compare_report(const TrainConfig& config, const std::vector<RunResult>& runs,
                          std::ostream& log) {
  const auto [curve, summary] = compare_tables(runs);
  const std::filesystem::path out(config.out_dir);
  const auto& first = runs.front();
  std::ostringstream md;
  md << "model " << first.model.describe() << " (" << first.model.num_parameters()
     << " parameters), " << first.steps << " steps x " << first.tokens_per_step
     << " tokens = " << first.steps * first.tokens_per_step << " tokens\n"
     << first.device << "\n\n### Validation loss vs training tokens\n\n"
     << curve.to_markdown() << "\n### Summary\n\n"
     << summary.to_markdown();
  {
    std::ofstream f(out / "compare.md");
    TORCH_CHECK(f << md.str(), "compare: cannot write ", (out / "compare.md").string());
  }
  log << "\n" << curve.to_text() << "\n" << summary.to_text();
  tr::plot_png((out / "loss.png").string(),
               {{"GPT-2 training loss", "tokens (millions)", "loss",
                 loss_series(runs, &RunResult::train_loss)},
                {"GPT-2 validation loss", "tokens (millions)", "loss",
                 loss_series(runs, &RunResult::val_loss)}},
               2, log);
  log << "wrote " << (out / "compare.md").string() << " and " << (out / "loss.png").string()
      << "\n";
}

}  // namespace

std::vector<RunResult> compare(const TrainConfig& config, const std::vector<std::string>& names,
                               std::ostream& log) {
  tr::Cli::require(!names.empty(), "optimizers", "no optimizer given");
  std::vector<RunResult> runs;
  for (const auto& name : names) {
    TrainConfig c = config;
    c.optimizer.name = name;
    c.out_dir = (std::filesystem::path(config.out_dir) / name).string();
    runs.push_back(train(c, log));
    runs.back().trained = GPT(nullptr);  // keep one model in memory at a time
  }
  if (tr::DataParallel::process().main()) write_compare_report(config, runs, log);  // rank 0
  return runs;
}

std::string sample(const SampleConfig& config) {
  const torch::Device device = tr::parse_device(config.device);
  tr::CheckpointReader in(config.checkpoint, device);
  GPT model(read_model_config(in));
  in.load_module("model", *model);
  model->to(device);
  const bool bytes = in.get_string("data_format") == to_string(DataFormat::Text);

  std::vector<int64_t> prompt = config.prompt_ids;
  if (prompt.empty()) {
    TORCH_CHECK(bytes, "sample: ", config.checkpoint,
                " was trained on GPT-2 token ids, which this "
                "program cannot encode or decode; give the prompt as --prompt-ids");
    TORCH_CHECK(!config.prompt.empty(), "--prompt: empty prompt");
    prompt = ByteTokenizer::encode(config.prompt);
  }
  auto ids = model->generate(torch::tensor(prompt, torch::kLong), config.tokens, config.temperature,
                             config.top_k, static_cast<uint64_t>(config.seed));
  std::vector<int64_t> out(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  if (bytes) return ByteTokenizer::decode(out);
  std::ostringstream s;
  for (size_t i = 0; i < out.size(); ++i) s << (i ? " " : "") << out[i];
  return s.str();
}

}  // namespace gpt2
