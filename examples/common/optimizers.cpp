#include "common/optimizers.h"

#include <fogo/fogo.h>

#include <cmath>

#include "common/cli.h"
#include "common/metrics.h"

namespace fogo::trainer {

void add_ns_dtype_flag(Cli& cli, std::string* target) {
  cli.choice("ns-dtype", target, {"bf16", "fp32"},
             "compute dtype of the Newton-Schulz iterations of muon and fogo (others: unused)");
}

c10::ScalarType parse_ns_dtype(const std::string& value) {
  if (value == "bf16") return c10::kBFloat16;
  if (value == "fp32") return c10::kFloat;
  throw Cli::error("ns-dtype", "expected one of bf16,fp32, got '" + value + "'");
}

void add_fogo_telemetry(Record& record, const fogo::HybridOptimizer& hybrid) {
  const fogo::FOGO* fogo = hybrid.matrix<fogo::FOGO>();
  if (!fogo) return;
  const auto groups = fogo->telemetry();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& t = groups[g];
    const std::string prefix = "fogo/" + hybrid.group_name(g) + "/";
    record.set(prefix + "rbar", t.rbar)
        .set(prefix + "gamma_st", t.gamma_st)
        .set(prefix + "frac_conflicting", t.frac_conflicting)
        .set(prefix + "frac_over_aligned", t.frac_over_aligned)
        .set(prefix + "frac_lt_protected", t.frac_lt_protected)
        .set(prefix + "codebook_entropy", t.codebook_entropy)
        .set(prefix + "live_centroids", t.live_centroids)
        .set(prefix + "delta_ratio", t.delta_ratio)
        .set(prefix + "frozen", t.frozen);
  }
}

void UpdateRms::snapshot(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  torch::NoGradGuard no_grad;
  before_.clear();
  for (const auto& g : groups) {
    before_.emplace_back();
    for (const auto& p : g.params()) before_.back().push_back(p.detach().clone());
  }
}

std::vector<double> UpdateRms::measure(
    const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  torch::NoGradGuard no_grad;
  std::vector<double> out;
  if (before_.empty()) return out;
  TORCH_CHECK(before_.size() == groups.size(), "UpdateRms: ", groups.size(), " groups now, ",
              before_.size(), " at the snapshot");
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    TORCH_CHECK(params.size() == before_[g].size(), "UpdateRms: group ", g, " changed");
    if (params.empty()) {
      out.push_back(0.0);
      continue;
    }
    auto sum = torch::zeros({}, params.front().options().dtype(torch::kDouble));
    int64_t n = 0;
    for (size_t k = 0; k < params.size(); ++k) {
      sum +=
          (params[k].detach().to(torch::kDouble) - before_[g][k].to(torch::kDouble)).square().sum();
      n += params[k].numel();
    }
    out.push_back(n > 0 ? std::sqrt(sum.item<double>() / static_cast<double>(n)) : 0.0);
  }
  before_.clear();
  return out;
}

void add_update_rms(Record& record, const std::vector<std::string>& names,
                    const std::vector<double>& rms) {
  for (size_t g = 0; g < rms.size(); ++g) {
    record.set("update_rms/" + (g < names.size() ? names[g] : "group" + std::to_string(g)), rms[g]);
  }
}

}  // namespace fogo::trainer
