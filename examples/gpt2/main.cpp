// gpt2: GPT-2 pretraining with AdamW, the Muon hybrid and the FOGO hybrid.
//
//   gpt2 prepare-kjv [--out runs/kjv/kjv.txt]       write the default corpus (Debian bible-kjv)
//   gpt2 train   [flags]                            one run
//   gpt2 compare [flags] --optimizers adamw,muon,fogo   same data order and token budget each
//   gpt2 sample  --checkpoint runs/gpt2/ckpt.pt      generate text from a checkpoint
//
// `gpt2 <command> --help` lists a command's flags. docs/trainers.md (GPT-2) describes them.
#include <c10/util/Exception.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "common/cli.h"
#include "train.h"

namespace {

namespace tr = fogo::trainer;

void add_train_flags(tr::Cli& cli, gpt2::TrainConfig& c, std::string& format) {
  cli.section("Model");
  cli.choice("model", &c.model, {"tiny", "mini", "small", "124m"},
             "size: tiny (L2 E32 T32), mini (L4 E128 T128), small (L6 E192 T256), 124m (GPT-2 "
             "small: L12 H12 E768 T1024)");
  cli.choice("arch", &c.arch, {"paper", "classic"},
             "paper: no biases, RoPE, GELU (the FOGO paper); classic: learned positions, biases");
  cli.flag("n-layer", &c.n_layer, "override the size's layer count");
  cli.flag("n-head", &c.n_head, "override the size's head count");
  cli.flag("n-embd", &c.n_embd, "override the size's width");
  cli.flag("block-size", &c.block_size, "override the size's context length");
  cli.flag("vocab-size", &c.vocab_size,
           "embedding rows (default: the data's, 256 for text, 50257 for GPT-2 tokens)");
  cli.flag("dropout", &c.dropout, "dropout probability (the paper uses 0)");

  cli.section("Data");
  cli.flag("data", &c.data.path,
           "a text file (byte-level tokens), or a directory holding nanoGPT train.bin/val.bin or "
           "llm.c *train*.bin/*val*.bin shards");
  cli.choice("format", &format, {"auto", "text", "nanogpt", "llmc"},
             "data format (auto: a file is text; a directory is nanogpt when it has a train.bin "
             "without the llm.c magic, llmc otherwise)");
  cli.flag("val-fraction", &c.data.val_fraction, "text: fraction of chunks held out");
  cli.flag("chunk-bytes", &c.data.chunk_bytes, "text: size of the train/val split chunks");
  cli.flag("data-seed", &c.data_seed, "seed of the batch order");

  cli.section("Optimization");
  cli.choice("optimizer", &c.optimizer.name, {"adamw", "muon", "fogo"}, "update rule");
  cli.flag("lr", &c.optimizer.lr, "peak learning rate (AdamW side; matrix side too by default)");
  cli.flag("matrix-lr", &c.optimizer.matrix_lr, "peak learning rate of Muon/FOGO's matrices");
  cli.flag("weight-decay", &c.optimizer.weight_decay, "decoupled weight decay");
  cli.flag("beta1", &c.optimizer.beta1, "AdamW beta1");
  cli.flag("beta2", &c.optimizer.beta2, "AdamW beta2");
  cli.choice("muon-adjust", &c.optimizer.muon_adjust, {"match_rms", "original"},
             "Muon lr rule: match_rms (0.2 sqrt(max(A,B)), AdamW's update RMS) or original");
  cli.flag("steps", &c.max_steps, "optimizer steps (0: from --tokens)");
  cli.flag("tokens", &c.tokens, "training token budget when --steps is 0");
  cli.flag("batch-size", &c.batch_size, "sequences per micro-batch");
  cli.flag("grad-accum", &c.grad_accum, "micro-batches per optimizer step");
  cli.flag("warmup-steps", &c.warmup_steps, "linear warmup steps (-1: 2% of the steps)");
  cli.flag("decay-frac", &c.decay_frac, "fraction of steps of the final linear decay");
  cli.flag("min-lr-factor", &c.min_lr_factor, "lr factor at the end of the decay");
  cli.flag("grad-clip", &c.grad_clip, "max global gradient norm (0: no clipping)");

  cli.section("Evaluation and output");
  cli.flag("eval-every", &c.eval_every, "steps between validations");
  cli.flag("eval-batches", &c.eval_batches, "fixed validation batches");
  cli.flag("log-every", &c.log_every, "steps between metrics records");
  cli.flag("out", &c.out_dir, "output directory (metrics.jsonl, metrics.csv, ckpt.pt)");
  cli.flag("ckpt-every", &c.ckpt_every, "steps between checkpoints (0: at the end only)");
  cli.flag("resume", &c.resume, "continue from <out>/ckpt.pt when it exists");
  cli.flag("stop-at-step", &c.stop_at_step, "stop after this step, checkpointed (0: never)");
  cli.flag("peak-tflops", &c.peak_tflops, "device peak for MFU (-1: 989 on CUDA, none on CPU)");

  cli.section("Runtime");
  cli.flag("device", &c.device, "cpu, cuda, cuda:N or auto");
  cli.choice("autocast", &c.autocast, {"auto", "bf16", "off"},
             "bf16 autocast of the forward pass (auto: on CUDA only)");
  cli.flag("deterministic", &c.deterministic, "deterministic kernels (bitwise resume on CPU)");
  cli.flag("seed", &c.seed, "seed of the initialisation and dropout");
  cli.flag("threads", &c.threads, "CPU threads (0: torch's default)");
}

int run(int argc, const char* const* argv) {
  const std::string usage =
      "usage: gpt2 <prepare-kjv|train|compare|sample> [flags]   (gpt2 <command> --help)\n";
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::cout << usage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::string program = "gpt2 " + command;

  if (command == "prepare-kjv") {
    std::string out = "runs/kjv/kjv.txt";
    tr::Cli cli(program, "Writes the KJV text (`bible -f Gen1:1-Rev22:21`) to --out.");
    cli.flag("out", &out, "text file to write");
    if (!cli.parse(argc - 1, argv + 1)) return 0;
    gpt2::prepare_kjv(out);
    std::cout << "wrote " << out << "\n";
    return 0;
  }
  if (command == "train" || command == "compare") {
    gpt2::TrainConfig config;
    std::vector<std::string> optimizers{"adamw", "muon", "fogo"};
    std::string format = "auto";
    tr::Cli cli(program, command == "train"
                             ? "Trains GPT-2 with one optimizer."
                             : "Trains GPT-2 with each optimizer on the same data order and "
                               "token budget; writes <out>/compare.md and <out>/loss.png.");
    add_train_flags(cli, config, format);
    if (command == "compare") {
      cli.flag("optimizers", &optimizers, "optimizers to compare, in order");
    }
    if (!cli.parse(argc - 1, argv + 1)) return 0;
    config.data.format = gpt2::parse_data_format(format);
    if (command == "train") {
      const auto result = gpt2::train(config, std::cerr);
      std::cout << "final val loss " << result.val_loss.back().value << ", "
                << result.tokens_per_second << " tokens/s\n";
    } else {
      gpt2::compare(config, optimizers, std::cerr);
    }
    return 0;
  }
  if (command == "sample") {
    gpt2::SampleConfig config;
    config.checkpoint = "runs/gpt2/ckpt.pt";
    tr::Cli cli(program, "Generates text from a checkpoint.");
    cli.flag("checkpoint", &config.checkpoint, "checkpoint written by train/compare");
    cli.flag("prompt", &config.prompt, "prompt text (byte-level models)");
    cli.flag("prompt-ids", &config.prompt_ids, "prompt token ids (GPT-2 token models)");
    cli.flag("tokens", &config.tokens, "tokens to generate");
    cli.flag("temperature", &config.temperature, "softmax temperature");
    cli.flag("top-k", &config.top_k, "sample among the k likeliest tokens (0: all)");
    cli.flag("seed", &config.seed, "sampling seed");
    cli.flag("device", &config.device, "cpu, cuda, cuda:N or auto");
    if (!cli.parse(argc - 1, argv + 1)) return 0;
    std::cout << gpt2::sample(config) << "\n";
    return 0;
  }
  std::cerr << "gpt2: unknown command '" << command << "'\n" << usage;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const c10::Error& e) {
    // TORCH_CHECK messages carry a C++ backtrace; the first line is the message.
    std::cerr << "gpt2: error: " << e.what_without_backtrace() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "gpt2: error: " << e.what() << "\n";
  }
  return 1;
}
