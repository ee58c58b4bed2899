// The sharding hook (fogo/step_shard.h) and the owner assignment every sharded step uses.
#include "fogo/step_shard.h"

#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <numeric>

namespace fogo {

bool StepShard::enabled(const char* optimizer) const {
  TORCH_CHECK(static_cast<bool>(owns) == static_cast<bool>(exchange), optimizer,
              ": a StepShard needs both owns and exchange, or neither");
  return static_cast<bool>(owns);
}

double newton_schulz_cost(at::IntArrayRef sizes) {
  const auto numel = static_cast<double>(c10::multiply_integers(sizes));
  if (sizes.size() < 2) return numel;
  const auto m = static_cast<double>(sizes[0]);
  const auto n = numel / std::max(m, 1.0);
  return m * n * std::min(m, n);
}

std::vector<int64_t> assign_owners(const std::vector<double>& costs, int64_t world) {
  TORCH_CHECK(world >= 1, "assign_owners: world must be >= 1, got ", world);
  std::vector<size_t> order(costs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return costs[a] > costs[b]; });
  std::vector<double> load(static_cast<size_t>(world), 0.0);
  std::vector<int64_t> owners(costs.size(), 0);
  for (const size_t i : order) {
    const auto r = std::min_element(load.begin(), load.end()) - load.begin();
    owners[i] = r;
    load[static_cast<size_t>(r)] += costs[i];
  }
  return owners;
}

}  // namespace fogo
