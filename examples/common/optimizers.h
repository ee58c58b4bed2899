#pragma once
// What the trainers share about their optimizers: the --ns-dtype flag and FOGO's telemetry as
// fields of a metrics record, under one set of names.

#include <c10/core/ScalarType.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

namespace fogo::trainer {

class Cli;
class Record;

/// Registers --ns-dtype (bf16 | fp32), the compute dtype of the Newton–Schulz iterations of
/// Muon and FOGO; its current value, the library's default bf16, is the flag's default.
void add_ns_dtype_flag(Cli& cli, std::string* target);

/// The dtype an --ns-dtype value names; a CliError naming the flag for anything else (a config
/// built in code bypasses the parser's check).
c10::ScalarType parse_ns_dtype(const std::string& value);

/// Sets FOGO's statistics of its last step on `record`, one field per param group and statistic:
/// "fogo/<group>/<stat>" with <group> from `group_names` (in param-group order) and <stat> one of
/// rbar, gamma_st, frac_conflicting, frac_over_aligned, frac_lt_protected, codebook_entropy,
/// live_centroids, delta_ratio, frozen. Sets nothing when `optimizer` is not a fogo::FOGO.
void add_fogo_telemetry(Record& record, const torch::optim::Optimizer* optimizer,
                        const std::vector<std::string>& group_names);

}  // namespace fogo::trainer
