#pragma once
// What fogo's matrix optimizers (FOGO, Muon) do with a gradient they cannot use: NaN or Inf, or a
// norm so large that the update's arithmetic overflows (detail/checks.h). An option of each
// param group: FOGOOptions::nonfinite, MuonOptions::nonfinite.

#include <cstdint>

namespace fogo {

/// What a step does with a gradient holding NaN or Inf.
enum class NonFinitePolicy : int64_t {
  Raise = 0,  ///< throw naming the parameter; nothing is changed (default)
  Skip = 1,   ///< skip the whole step, leave every parameter and state untouched
  /// No check: the step reads nothing back from the device (no host synchronisation on a GPU),
  /// and NaN or Inf gradients reach the parameters, as with torch.optim's optimizers. For
  /// training loops that check the gradients themselves (a loss scaler's inf check, say).
  Unchecked = 2,
  /// Skip on the device: the step is computed, and where a gradient is unusable every parameter
  /// and state tensor (momenta; FOGO's codebook) keeps its value (selected on the device), so a
  /// steady-state step reads nothing back (no host synchronisation on a GPU; what CUDA-graph
  /// capture needs). FOGO: unlike Skip, the skipped step still counts: the step counter
  /// (re-seeding cadence) and the CPU random stream advance as if it had been taken; telemetry's
  /// skipped_steps counts them; a group's first step (the codebook is built from it) is checked on
  /// the host as with Skip.
  Mask = 3,
};

/// One of the four policies (a value read from a checkpoint or another language may be none).
inline bool is_known(NonFinitePolicy p) {
  return p == NonFinitePolicy::Raise || p == NonFinitePolicy::Skip ||
         p == NonFinitePolicy::Unchecked || p == NonFinitePolicy::Mask;
}

}  // namespace fogo
