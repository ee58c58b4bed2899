#pragma once
// What a checkpoint records of ns_dtype auto. The options keep the user's choice ("auto"); next
// to them the archive holds the dtype each group's Newton–Schulz computed in where it was saved
// (auto resolved on the group's device), e.g. "bf16,fp32". Loading on a host where auto resolves
// otherwise (a bf16 host's run resumed on an AVX2-only one) continues with this host's dtype (the
// momenta and FOGO's memory are fp32 either way: only the Newton–Schulz rounding changes) and
// warns, naming the group and both dtypes. Informational: not in the checksum, and an archive
// without it (older checkpoints, state dicts) loads silently.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <utility>
#include <vector>

namespace fogo::detail {

/// Each group's ns_dtype option and device (its first parameter's; the CPU without one).
using GroupNSDtypes = std::vector<std::pair<c10::ScalarType, c10::Device>>;

template <class Options>
GroupNSDtypes group_ns_dtypes(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  GroupNSDtypes out;
  for (const auto& g : groups) {
    out.emplace_back(static_cast<const Options&>(g.options()).ns_dtype(),
                     g.params().empty() ? c10::Device(c10::kCPU) : g.params().front().device());
  }
  return out;
}

/// Writes under `key` every group's Newton–Schulz dtype in this process, auto resolved.
void write_ns_dtypes(torch::serialize::OutputArchive& archive, const char* key,
                     const GroupNSDtypes& groups);

/// After a load (groups: the loaded options): warns for every group on auto whose dtype where
/// the checkpoint was written (`key`, when recorded) differs from this process's.
void warn_on_changed_ns_dtypes(torch::serialize::InputArchive& archive, const char* key,
                               const char* optimizer, const GroupNSDtypes& groups);

}  // namespace fogo::detail
