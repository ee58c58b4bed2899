#pragma once
// What a step does with a gradient it cannot use: NaN or Inf, or a norm so large that the
// update's arithmetic overflows. The policy is an option of each param group
// (FOGOOptions::nonfinite, MuonOptions::nonfinite); decide_nonfinite() is the one rule that turns
// the policies and the gradients of a step into what the step does, for every optimizer of fogo
// (the step frame, the hybrid) and for the Python package (fogo._C.decide_nonfinite).

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace fogo {

/// What a step does with a gradient holding NaN or Inf (or a norm past the overflow limit).
enum class NonFinitePolicy : int64_t {
  Raise = 0,  ///< throw naming the parameter; nothing is changed (default)
  Skip = 1,   ///< skip the whole step: nothing is changed, and the step is not counted
  /// No check: the step reads nothing back from the device (no host synchronisation on a GPU),
  /// and NaN or Inf gradients reach the parameters, as with torch.optim's optimizers. For
  /// training loops that check the gradients themselves (a loss scaler's inf check, say).
  Unchecked = 2,
  /// Skip on the device: the step is computed, and where a gradient is unusable every parameter
  /// and state tensor of the step (momenta, FOGO's codebook, the hybrid's AdamW moments) keeps
  /// its value (selected on the device), so a steady-state step reads nothing back (no host
  /// synchronisation on a GPU; what CUDA-graph capture needs). Unlike Skip, the masked step
  /// counts: step counters (FOGO's, the hybrid's AdamW's) and FOGO's CPU random stream advance as
  /// if it had been taken; FOGO's telemetry skipped_steps counts such steps. A step that cannot
  /// be masked (a FOGO group's first step, whose codebook is built from it; an AdamW parameter
  /// without state yet) is checked on the host, as Skip.
  Mask = 3,
};

/// One of the four policies (a value read from a checkpoint or another language may be none).
inline bool is_known(NonFinitePolicy p) {
  return p == NonFinitePolicy::Raise || p == NonFinitePolicy::Skip ||
         p == NonFinitePolicy::Unchecked || p == NonFinitePolicy::Mask;
}

/// What a step does about its gradients, decided once for all of them (decide_nonfinite).
struct NonFiniteDecision {
  enum class Kind {
    Step,   ///< every gradient checked is usable (or none is checked): step, nothing masked
    Skip,   ///< change nothing; the step is not taken and not counted
    Raise,  ///< throw naming gradient `item`; change nothing
    Mask,   ///< step, with every tensor of the step put back where `ok` is false
  };
  Kind kind = Kind::Step;
  /// Raise: the first item (in the order given) with policy Raise whose gradient is unusable;
  /// Skip: the first unusable item among those checked on the host; else -1.
  int64_t item = -1;
  /// Mask: a 0-d bool on the device (the first Mask item's flag's), true when every Mask item's
  /// gradient is usable: every parameter and state tensor of the step, whatever its own
  /// policy, keeps its bits where it is false. Undefined otherwise.
  at::Tensor ok;
};

/// The decision for one step over its items (one per gradient the step takes, in the step's
/// order): `policies[k]`, and `usable[k]`, a 0-d bool tensor true when gradient k is usable
/// (detail::grad_usable; may be undefined for an Unchecked item). `maskable`: whether every
/// tensor of the step can be put back on the device now; when false, Mask items are checked on
/// the host as Skip items.
///
///   1. The Raise and Skip items' flags are read to the host, all in one read (one
///      synchronisation on a GPU; none without such items). If one is unusable: Raise when an
///      unusable one is a Raise item (`item`: the first such), else Skip.
///   2. Else, with Mask items: Mask, `ok` the AND of their flags, on the device (nothing read).
///   3. Else Step. Unchecked items are never tested.
///
/// It changes nothing; what the kinds mean for the step is the caller's to apply, for every
/// item alike: Skip and Raise change nothing, Mask masks the whole step.
NonFiniteDecision decide_nonfinite(const std::vector<NonFinitePolicy>& policies,
                                   const std::vector<at::Tensor>& usable, bool maskable = true);

}  // namespace fogo
