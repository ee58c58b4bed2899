#include "common/optimizers.h"

#include <fogo/enum_names.h>
#include <fogo/fogo.h>

#include <cmath>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/metrics.h"

namespace fogo::trainer {

void add_ns_dtype_flag(Cli& cli, std::string* target) {
  cli.choice("ns-dtype", target, {"auto", "bf16", "fp32"},
             "compute dtype of the Newton-Schulz iterations of muon and fogo: auto (bf16 where "
             "the device computes it faster, else fp32; FOGO_NS_DTYPE fixes it), bf16 or fp32 "
             "(others: unused)");
}

c10::ScalarType parse_ns_dtype(const std::string& value) {
  if (value == "auto") return fogo::kNSDtypeAuto;
  if (value == "bf16") return c10::kBFloat16;
  if (value == "fp32") return c10::kFloat;
  throw Cli::error("ns-dtype", "expected one of auto,bf16,fp32, got '" + value + "'");
}

const std::vector<MuonAdjustAlias>& muon_adjust_aliases() {
  static const std::vector<MuonAdjustAlias> aliases = {
      {"match_rms", fogo::MuonAdjustLR::MatchRmsAdamW}};
  return aliases;
}

std::vector<std::string> muon_adjust_choices() {
  std::vector<std::string> names;
  for (const auto& [name, rule] : fogo::EnumNames<fogo::MuonAdjustLR>::values)
    names.push_back(name);
  for (const auto& [name, rule] : fogo::EnumAliases<fogo::MuonAdjustLR>::values)
    names.push_back(name);
  for (const auto& alias : muon_adjust_aliases()) names.push_back(alias.name);
  return names;
}

namespace {

// The factor each rule scales lr by, for --help (A x B the matrix's shape; docs/muon.md).
const char* muon_adjust_factor(fogo::MuonAdjustLR rule) {
  switch (rule) {
    case fogo::MuonAdjustLR::Original:
      return "sqrt(max(1,A/B))";
    case fogo::MuonAdjustLR::MatchRmsAdamW:
      return "0.2 sqrt(max(A,B)), AdamW's update RMS";
    case fogo::MuonAdjustLR::Spectral:
      return "sqrt(A/B)";
  }
  return "?";
}

}  // namespace

void add_muon_adjust_flag(Cli& cli, std::string* target) {
  std::string help = "Muon lr rule (fogo::MuonAdjustLR, as Python names them): ";
  const auto& names = fogo::EnumNames<fogo::MuonAdjustLR>::values;
  for (size_t k = 0; k < std::size(names); ++k) {
    if (k > 0) help += k + 1 == std::size(names) ? " or " : ", ";
    help += std::string(names[k].first) + " (" + muon_adjust_factor(names[k].second) + ")";
  }
  std::string also;
  for (const auto& [name, rule] : fogo::EnumAliases<fogo::MuonAdjustLR>::values)
    also += std::string(also.empty() ? "" : ", ") + name + " for " + fogo::enum_name(rule);
  for (const auto& alias : muon_adjust_aliases()) {
    also += (also.empty() ? "" : ", ") + alias.name + " for " + fogo::enum_name(alias.rule) +
            " (this trainer's alias)";
  }
  if (!also.empty()) help += "; also " + also;
  cli.choice("muon-adjust", target, muon_adjust_choices(), help);
}

fogo::MuonAdjustLR parse_muon_adjust(const std::string& value) {
  if (const auto rule = fogo::enum_from_name<fogo::MuonAdjustLR>(value)) return *rule;
  for (const auto& alias : muon_adjust_aliases())
    if (alias.name == value) return alias.rule;
  std::string expected;
  for (const auto& name : muon_adjust_choices()) expected += (expected.empty() ? "" : ",") + name;
  throw Cli::error("muon-adjust", "expected one of " + expected + ", got '" + value + "'");
}

std::string muon_adjust_signature(const std::string& value) {
  const fogo::MuonAdjustLR rule = parse_muon_adjust(value);
  for (const auto& alias : muon_adjust_aliases())
    if (alias.rule == rule) return alias.name;
  return fogo::enum_name(rule);
}

std::string resolved_ns_dtype(const std::string& value, const c10::Device& device) {
  return fogo::ns_dtype_name(fogo::resolve_ns_dtype(parse_ns_dtype(value), device));
}

std::string describe_ns_dtype(const std::string& value, const c10::Device& device) {
  if (parse_ns_dtype(value) != fogo::kNSDtypeAuto) return value;
  const std::string dtype = resolved_ns_dtype(value, device);
  for (const fogo::NSDtypeChoice& c : fogo::ns_dtype_choices()) {
    if (c.device != device.str() && !(device.is_cuda() && c.device.rfind("cuda", 0) == 0)) continue;
    char times[96] = "";
    if (std::isfinite(c.bf16_ms) && std::isfinite(c.fp32_ms)) {
      std::snprintf(times, sizeof times, ": bf16 GEMM %.3g ms, fp32 %.3g ms", c.bf16_ms, c.fp32_ms);
    }
    return "auto: " + dtype + " (" + c.device + ", " + c.reason + times +
           (c.isa.empty() ? "" : "; " + c.isa) + ")";
  }
  return "auto: " + dtype;
}

void add_fogo_telemetry(Record& record, const fogo::HybridOptimizer& hybrid) {
  const fogo::FOGO* fogo = hybrid.matrix<fogo::FOGO>();
  if (!fogo) return;
  const auto groups = fogo->telemetry();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& t = groups[g];
    const std::string prefix = "fogo/" + hybrid.group_name(g) + "/";
#define FOGO_RECORD_STAT(T, name, source, logged) \
  if (logged) record.set(prefix + #name, t.name);
    FOGO_TELEMETRY(FOGO_RECORD_STAT)
#undef FOGO_RECORD_STAT
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
