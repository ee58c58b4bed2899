#include "common/optimizers.h"

#include <fogo/fogo.h>

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

}  // namespace fogo::trainer
