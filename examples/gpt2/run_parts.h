#pragma once
// The parts of a GPT-2 run that are not its loop, private to the trainer's sources: the checks
// and sizes of its settings, the runtime and model set-up, the run's signature and the
// checkpoint's model configuration and curves (train.cpp's Trainer::Impl uses them; compare.cpp
// and sweep.cpp use format_double and read_model_config).

#include <torch/torch.h>

#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/data_parallel.h"
#include "common/signature.h"
#include "train.h"

namespace gpt2 {

/// Refuses a setting out of its range, naming the flag (a CliError).
void validate(const TrainConfig& c);

/// A loss curve as checkpoint history rows (step, tokens, value), and back.
fogo::trainer::History to_rows(const std::vector<Point>& points);
std::vector<Point> from_rows(const fogo::trainer::History& rows);

// The flags that decide a run's trajectory, "auto" resolved: a checkpoint must agree on every
// one with the command that resumes it. --eval-every and --eval-sequences leave the weights alone
// but define the validation curve of the run's history. Left out, as they change neither:
// --out, --log-every, --ckpt-every, --stop-at-step, --resume, --quiet, --peak-tflops; and
// --device, --threads, --deterministic, which change the arithmetic only in its rounding (a
// checkpoint may move between machines).
//
// --batch-size is recorded as the global micro-batch, per-rank batch x world size: a run may
// continue on another number of ranks when the global batch stays the same.
fogo::trainer::RunSignature run_signature(const TrainConfig& cfg, const GPTConfig& model,
                                          const Corpus& corpus, int64_t steps, int64_t warmup,
                                          bool autocast, int64_t world_size,
                                          const torch::Device& device);

/// The model's configuration in a checkpoint, and back (validated).
void write_model_config(fogo::trainer::CheckpointWriter& w, const GPTConfig& c);
GPTConfig read_model_config(fogo::trainer::CheckpointReader& r);

/// `v` with `precision` decimals; "n/a" when not finite.
std::string format_double(double v, int precision);

// Checks the settings and applies the process-wide ones (threads, determinism, TF32); returns
// the device to train on.
torch::Device set_up_runtime(const TrainConfig& cfg, const fogo::trainer::DataParallel& dp);

// The initial weights come from --seed alone, whatever ran before.
GPT make_model(const GPTConfig& mc, int64_t seed, torch::Device device);

/// The run's steps: --steps, or enough for --tokens; the warmup, checked against them.
int64_t total_steps(const TrainConfig& cfg, int64_t tokens_per_step);
int64_t warmup_steps(const TrainConfig& cfg, int64_t steps);

// The flags whose sensible size only the data and the machine bound: refused naming the cause,
// rather than met by an allocator's message (std::bad_alloc) or by what looks like a hang.
void check_sizes(const TrainConfig& cfg, const GPTConfig& mc, const Corpus& corpus);

}  // namespace gpt2
