#pragma once
// What the trainers share about their optimizers: the --ns-dtype and --muon-adjust flags, and
// FOGO's telemetry as fields of a metrics record, under one set of names.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <fogo/muon_options.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

namespace fogo {
class HybridOptimizer;
}

namespace fogo::trainer {

class Cli;
class Record;

/// Registers --ns-dtype (auto | bf16 | fp32), the compute dtype of the Newton–Schulz iterations
/// of Muon and FOGO; its current value, the library's default auto, is the flag's default.
void add_ns_dtype_flag(Cli& cli, std::string* target);

/// The dtype an --ns-dtype value names (auto: fogo::kNSDtypeAuto); a CliError naming the flag
/// for anything else (a config built in code bypasses the parser's check).
c10::ScalarType parse_ns_dtype(const std::string& value);

/// --ns-dtype as a run's signature records it: bf16 or fp32, auto resolved for `device`
/// (fogo/ns_dtype.h), so that a checkpoint resumes only where the Newton–Schulz arithmetic is the
/// same (elsewhere --ns-dtype with the recorded value continues it).
std::string resolved_ns_dtype(const std::string& value, const c10::Device& device);

/// --ns-dtype for a run's start-up header: "bf16", or for auto what it resolved to and why, e.g.
/// "auto: bf16 (cpu, measured: bf16 GEMM 0.2 ms, fp32 0.9 ms; AVX512 +AVX512-BF16 +AMX-BF16)".
std::string describe_ns_dtype(const std::string& value, const c10::Device& device);

/// The trainers' own spelling of a Muon lr rule, accepted beside the library's names.
struct MuonAdjustAlias {
  std::string name;
  fogo::MuonAdjustLR rule;
};

/// The trainers' aliases: match_rms for match_rms_adamw, what both trainers' --muon-adjust took
/// before it read the library's names (and what their run signatures record).
const std::vector<MuonAdjustAlias>& muon_adjust_aliases();

/// Every spelling --muon-adjust accepts: the names of fogo::MuonAdjustLR and the library's
/// aliases of them (fogo/enum_names.h, the list Python reads), then muon_adjust_aliases().
std::vector<std::string> muon_adjust_choices();

/// Registers --muon-adjust, Muon's lr rule, restricted to muon_adjust_choices(); its help lists
/// the library's names with each rule's factor, then the aliases and what each stands for.
void add_muon_adjust_flag(Cli& cli, std::string* target);

/// The rule a --muon-adjust value names (a library name, a library alias or a trainers' alias); a
/// CliError naming the flag and every accepted spelling for anything else (a config built in code
/// bypasses the parser's check).
fogo::MuonAdjustLR parse_muon_adjust(const std::string& value);

/// --muon-adjust as a run's signature records it, whichever spelling chose the rule: the
/// trainers' alias where the rule has one (match_rms: what checkpoints recorded before the
/// library's names were accepted, so that they stay resumable), else the library's name.
std::string muon_adjust_signature(const std::string& value);

/// Sets the statistics of the last step of `hybrid`'s FOGO side on `record`, one field per
/// codebook group and statistic: "fogo/<group>/<stat>", <group> the param group's name
/// (hybrid.group_name(g)) and <stat> each field of fogo::FOGOTelemetry marked logged in
/// FOGO_TELEMETRY (rbar, gamma_st, frac_conflicting, frac_over_aligned, frac_lt_protected,
/// codebook_entropy, live_centroids, delta_ratio, frozen). Sets nothing when
/// the hybrid has no matrix side; throws (HybridOptimizer::matrix<fogo::FOGO>()) when its
/// matrix side is not a fogo::FOGO, so call it for FOGO runs only.
void add_fogo_telemetry(Record& record, const fogo::HybridOptimizer& hybrid);

/// The update a step actually applies, per param group, whatever the rule (lr, schedule, RMS
/// scaling, weight decay and clipping included): snapshot() the parameters before the step,
/// measure() after it. update RMS of a group = sqrt(sum over its parameters of
/// |p_after - p_before|_F^2 / (their total element count)).
class UpdateRms {
 public:
  void snapshot(const std::vector<torch::optim::OptimizerParamGroup>& groups);
  /// One value per group of the snapshot; empty when there was none. Clears the snapshot.
  std::vector<double> measure(const std::vector<torch::optim::OptimizerParamGroup>& groups);

 private:
  std::vector<std::vector<torch::Tensor>> before_;
};

/// Sets "update_rms/<names[g]>" = rms[g] on `record` (nothing when rms is empty).
void add_update_rms(Record& record, const std::vector<std::string>& names,
                    const std::vector<double>& rms);

}  // namespace fogo::trainer
