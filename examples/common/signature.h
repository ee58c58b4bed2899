#pragma once
// A run's signature: the settings that decide its trajectory, as (flag, value) pairs in the
// order the trainer lists them, each value as it would be typed to reproduce the run (defaults
// left as "auto" are resolved first). Every checkpoint stores it; --resume refuses a checkpoint
// whose signature differs, naming each differing flag with both values, so that a resumed run
// is the run that was interrupted and never a silent blend of two.
//
//   RunSignature sig("gpt2");                      // the program that writes the checkpoints
//   sig.add("model", "mini").add("dropout", 0.1).add("batch-size", int64_t{16});
//   CheckpointWriter w;
//   sig.write(w);                                   // keys "signature", "signature_program"
//   ...
//   if (auto in = open_for_resume(path, sig, device)) step = in->get_int("step");
//   // a mismatch throws std::invalid_argument:
//   //   --resume: checkpoint 'runs/x/checkpoint.pt' belongs to a run with other settings
//   //   (--dropout was 0.1, now 0); use another --out or drop --resume to start afresh
//
// Settings that leave the trajectory alone (output folder, logging cadence, threads, device)
// stay out, so a run can be resumed elsewhere or with other logging.

#include <c10/core/Device.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/checkpoint.h"

namespace fogo::trainer {

class RunSignature {
 public:
  /// `program` names the trainer: a checkpoint of another program is refused as such.
  explicit RunSignature(std::string program) : program_(std::move(program)) {}

  /// Appends --flag with its value. Throws std::logic_error when the flag is already listed or
  /// the value holds a newline (the stored form is one "flag=value" line per flag).
  RunSignature& add(const std::string& flag, const std::string& value);
  RunSignature& add(const std::string& flag, const char* value);
  RunSignature& add(const std::string& flag, int64_t value);
  RunSignature& add(const std::string& flag, int value) {
    return add(flag, static_cast<int64_t>(value));
  }
  RunSignature& add(const std::string& flag, double value);  ///< shortest exact text (flag_text)
  RunSignature& add(const std::string& flag, bool value);
  RunSignature& add(const std::string& flag, const std::vector<int64_t>& values);  ///< "1,2,3"

  const std::string& program() const { return program_; }
  const std::vector<std::pair<std::string, std::string>>& entries() const { return entries_; }

  /// "flag=value" lines, the stored form.
  std::string to_text() const;
  static RunSignature from_text(std::string program, const std::string& text);

  /// "--flag was <stored>, now <this>" for every flag whose value differs from `stored`'s, in
  /// this signature's order, then the flags only `stored` has; "(absent)" stands for a flag one
  /// side lacks. Empty when the two agree.
  std::vector<std::string> differences(const RunSignature& stored) const;

  void write(CheckpointWriter& out) const;
  /// Throws std::invalid_argument naming the checkpoint when another program wrote it (or one
  /// without signatures), and every differing flag when its signature is not this one.
  void check(CheckpointReader& in) const;

 private:
  std::string program_;
  std::vector<std::pair<std::string, std::string>> entries_;
};

/// The checkpoint to continue from under --resume: nullopt when `path` does not exist (the run
/// starts afresh), else the opened checkpoint once `signature` has been checked against it.
std::optional<CheckpointReader> open_for_resume(const std::string& path,
                                                const RunSignature& signature,
                                                c10::optional<c10::Device> device = {});

}  // namespace fogo::trainer
