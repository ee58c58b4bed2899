#pragma once
// The trainers' checkpoints: fogo's public checkpoint files (fogo/checkpoint.h: atomic replace,
// checksummed trailer, NaN/Inf refused), under the names the trainers give them in a run folder.

#include <fogo/checkpoint.h>

namespace fogo::trainer {

/// The checkpoint files in a run's output folder: its latest state, and (gpt2) the state of its
/// lowest validation loss.
inline constexpr const char* kCheckpointFile = "checkpoint.pt";
inline constexpr const char* kBestCheckpointFile = "best.pt";

using fogo::checkpoint_exists;
using fogo::CheckpointReader;
using fogo::CheckpointWriter;
using fogo::History;
using fogo::replace_file;

}  // namespace fogo::trainer
