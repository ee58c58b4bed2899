#pragma once
// How fogo::Muon and fogo::FOGO batch parameters: sorted (stably) by a shape key, every run of
// equal keys goes through one batched Newton–Schulz chain (and, in FOGO, one projection and one
// lift GEMM). One way for both optimizers.

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace fogo::detail {

/// [begin, end) of a run of items with equal keys.
using Runs = std::vector<std::pair<size_t, size_t>>;

/// Sorts `items` stably by `key(item)` (any type with < and ==) and returns the runs of equal
/// keys, in key order; items with equal keys keep their order.
template <class T, class Key>
Runs sort_into_runs(std::vector<T>& items, const Key& key) {
  std::stable_sort(items.begin(), items.end(),
                   [&](const T& a, const T& b) { return key(a) < key(b); });
  Runs runs;
  for (size_t i = 0; i < items.size(); ++i) {
    if (runs.empty() || !(key(items[i]) == key(items[i - 1]))) runs.emplace_back(i, i);
    runs.back().second = i + 1;
  }
  return runs;
}

}  // namespace fogo::detail
