#pragma once
/// \file
/// Checkpoint files for exact resume, public API (the example trainers use it as any installed
/// user would): model, optimizer, random generators and step counters in one LibTorch archive,
/// replaced atomically so a crash mid-write never leaves a half-written file where the last good
/// checkpoint was.
//
//   CheckpointWriter ckpt;
//   ckpt.put("step", step);                      // any c10::IValue: ints, doubles, strings, lists
//   ckpt.put_module("model", *model);            // parameters and buffers (BatchNorm stats)
//   ckpt.put_optimizer("optimizer", optimizer);  // anything with save(OutputArchive&) const
//   ckpt.put_generator("data_rng", generator);   // CPU or CUDA generator state
//   ckpt.commit("runs/x/checkpoint.pt");         // write .tmp, fsync, rename over the old one
//
//   CheckpointReader in("runs/x/checkpoint.pt", device);
//   step = in.get_int("step");
//   in.load_module("model", *model);           // checks names, shapes, dtypes before copying
//   in.load_optimizer("optimizer", optimizer);   // anything with load(InputArchive&)
//   in.load_generator("data_rng", generator);
//
// Every reader error is a std::runtime_error naming the file and the key.
//
// Integrity: the file is the LibTorch archive followed by a 24-byte trailer ("FOGOCKS1", the
// archive's length and a 64-bit checksum of its bytes: the checksum fogo's optimizer archives
// carry); the reader refuses
// a file whose bytes no longer match it (LibTorch's zip reader does not check its CRCs, so flipped
// bytes would otherwise load silently). A file without the trailer (written before checksums) is
// read with a warning on stderr. commit() refuses a model or optimizer state holding NaN or Inf,
// naming the first such tensor, so a diverged run never replaces its last good checkpoint; and it
// reports a failed write (a full disk) naming the file and the cause, leaving the old file and no
// .tmp behind.
//
// Histories (loss curves, accuracy matrices: rows of numbers of one length) travel as
// [rows, columns] double tensors: put_history / get_history.

#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

#include <string>
#include <vector>

namespace fogo {

/// Rows of numbers of one length (loss curves, accuracy matrices), stored as a [rows, columns]
/// double tensor.
using History = std::vector<std::vector<double>>;

class CheckpointWriter {
 public:
  void put(const std::string& key, const c10::IValue& value);
  void put_tensor(const std::string& key, const torch::Tensor& tensor);
  void put_module(const std::string& key, const torch::nn::Module& module);
  void put_generator(const std::string& key, const at::Generator& generator);
  /// Throws std::invalid_argument when the rows differ in length.
  void put_history(const std::string& key, const History& rows);
  template <class Optimizer>
  void put_optimizer(const std::string& key, const Optimizer& optimizer) {
    torch::serialize::OutputArchive sub(archive_.compilation_unit());
    optimizer.save(sub);
    find_nonfinite(key, sub);
    archive_.write(key, sub);
  }
  /// Writes `path` + ".tmp" with its checksum, flushes it to disk, renames it to `path` (creating
  /// parent folders). Throws std::runtime_error, writing nothing, when a module or optimizer put
  /// here holds NaN or Inf (naming the first such tensor); and, removing the .tmp and keeping the
  /// old `path`, when the write fails.
  void commit(const std::string& path);

 private:
  /// Records the first tensor of `sub` (at any depth) holding NaN or Inf, as "key/...".
  void find_nonfinite(const std::string& key, torch::serialize::OutputArchive& sub);
  torch::serialize::OutputArchive archive_;
  std::string nonfinite_;  ///< the first non-finite tensor put, or empty
};

class CheckpointReader {
 public:
  /// Tensors are mapped onto `device` (a CUDA checkpoint can be resumed on the CPU and back).
  explicit CheckpointReader(const std::string& path, c10::optional<torch::Device> device = {});
  /// A checkpoint's bytes already in memory (read by another process, say); `path` names it in
  /// errors.
  CheckpointReader(const std::string& path, const std::string& bytes,
                   c10::optional<torch::Device> device = {});

  bool has(const std::string& key);
  c10::IValue get(const std::string& key);
  int64_t get_int(const std::string& key);
  double get_double(const std::string& key);
  std::string get_string(const std::string& key);
  torch::Tensor get_tensor(const std::string& key);
  History get_history(const std::string& key);
  void load_module(const std::string& key, torch::nn::Module& module);
  void load_generator(const std::string& key, at::Generator& generator);
  template <class Optimizer>
  void load_optimizer(const std::string& key, Optimizer& optimizer) {
    torch::serialize::InputArchive sub = sub_archive(key);
    try {
      optimizer.load(sub);
    } catch (const std::exception& e) {
      throw std::runtime_error(where(key) + ": cannot restore the optimizer: " + e.what());
    }
  }
  const std::string& path() const { return path_; }

 private:
  torch::serialize::InputArchive sub_archive(const std::string& key);
  std::string where(const std::string& key) const;
  std::string path_;
  torch::serialize::InputArchive archive_;
};

/// Whether `path` names an existing checkpoint file (what `--resume auto` looks for).
bool checkpoint_exists(const std::string& path);

/// Replaces the file `path` by `contents` atomically: written to `path` + ".tmp", flushed to
/// disk, renamed over `path`. When any of it fails (a full disk, say) throws std::runtime_error
/// naming the file and the system's reason; the .tmp is removed and `path` keeps its contents.
void replace_file(const std::string& path, const std::string& contents);

}  // namespace fogo
