// The named Newton–Schulz coefficient schedules (fogo/newton_schulz.h): ns_schedule's ids, and the
// published lists by name (ns_named_schedules), each with its source and the range it promises.
#include <c10/util/Exception.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "fogo/newton_schulz.h"

namespace fogo {

std::vector<std::array<double, 3>> ns_schedule(int64_t id, int64_t steps) {
  switch (id) {
    case kNSConstant:
      return {};
    case kPolarExpress: {
      // arXiv 2505.16932, Algorithm 1 (degree 5, l = 1e-3), as published; the safety factor
      // applied here as the paper's code applies it.
      constexpr std::array<std::array<double, 3>, 8> published = {{
          {8.28721201814563, -23.595886519098837, 17.300387312530933},
          {4.107059111542203, -2.9478499167379106, 0.5448431082926601},
          {3.9486908534822946, -2.908902115962949, 0.5518191394370137},
          {3.3184196573706015, -2.488488024314874, 0.51004894012372},
          {2.300652019954817, -1.6689039845747493, 0.4188073119525673},
          {1.891301407787398, -1.2679958271945868, 0.37680408948524835},
          {1.8750014808534479, -1.2500016453999487, 0.3750001645474248},
          {1.875, -1.25, 0.375},
      }};
      constexpr double safety = 1.01;
      std::vector<std::array<double, 3>> out;
      for (size_t k = 0; k < published.size(); ++k) {
        const auto [a, b, c] = published[k];
        const bool last = k + 1 == published.size();
        out.push_back(last ? published[k]
                           : std::array<double, 3>{a / safety, b / std::pow(safety, 3),
                                                   c / std::pow(safety, 5)});
      }
      return out;
    }
    case kTuned5:
      TORCH_CHECK(steps == 5,
                  "ns_schedule 2 (kTuned5) is a 5-iteration set: the Newton–Schulz "
                  "step count (ns_steps) must be 5, got ",
                  steps);
      return {{4.0848, -6.8946, 2.9270},
              {3.9505, -6.3029, 2.6377},
              {3.7418, -5.5913, 2.3037},
              {2.8769, -3.1427, 1.2046},
              {2.8366, -3.0525, 1.2012}};
  }
  TORCH_CHECK(false, "ns_schedule must be 0 (kNSConstant), 1 (kPolarExpress) or 2 (kTuned5), got ",
              id);
}

const std::vector<NamedNSSchedule>& ns_named_schedules() {
  // Each as published (docs/muon.md cites them), with the range fogo's tests check: the scalar
  // map of `steps` iterations takes [l, 1] into [lo, hi], and so do the SVD's singular values.
  static const std::vector<NamedNSSchedule> named = [] {
    const std::array<double, 3> quintic = coefficient_array(kQuintic);
    NSSchedule deepseek(8, quintic);
    deepseek.insert(deepseek.end(), 2, {2.0, -1.5, 0.5});
    return std::vector<NamedNSSchedule>{
        {"keller_jordan",
         {quintic},
         "Keller Jordan, Muon (kellerjordan.github.io/posts/muon)",
         5,
         1e-2,
         0.68,
         1.14},
        {"polar_express", ns_schedule(kPolarExpress, 8), "arXiv 2505.16932, Algorithm 1", 8, 1e-3,
         1 - 1e-6, 1 + 1e-6},
        {"tuned5", ns_schedule(kTuned5, 5), "You Jiacheng; modded-nanogpt, Dion", 5, 1e-2, 0.977,
         1.032},
        {"deepseek_v4", deepseek, "DeepSeek-V4 report (DeepSeek_V4.pdf)", 10, 1e-3, 1.0 - 1e-3,
         1.0 + 1e-3},
        {"cans",
         {{8.4703, -25.1081, 18.6293},
          {4.1828, -3.1087, 0.5806},
          {3.9619, -2.9541, 0.5630},
          {3.2866, -2.4647, 0.5074},
          {2.2737, -1.6447, 0.4162}},
         "arXiv 2506.10935 (CANS), as NVIDIA Emerging-Optimizers lists it",
         5,
         1e-3,
         0.88,
         1.12},
        {"cubic5",
         {{3.3656576, -3.3420992, 0.0},
          {2.5744352, -1.4957376, 0.0},
          {2.5368962, -1.4312570, 0.0},
          {2.4418906, -1.2764040, 0.0},
          {2.2230472, -0.9630650, 0.0}},
         "arXiv 2606.00371 (relaxed cubic), as NVIDIA Emerging-Optimizers lists it",
         5,
         7e-3,
         0.77,
         1.30},
    };
  }();
  return named;
}

NSSchedule ns_named_schedule(const std::string& name) {
  std::string known;
  for (const NamedNSSchedule& s : ns_named_schedules()) {
    if (name == s.name) return s.rows;
    known += std::string(known.empty() ? "" : ", ") + s.name;
  }
  TORCH_CHECK(false, "no Newton–Schulz coefficient list named '", name,
              "'; the named ones: ", known);
}

}  // namespace fogo
