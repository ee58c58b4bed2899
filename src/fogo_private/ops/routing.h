#pragma once
// How the dispatch (src/ops/ops.cpp) routes a multi-tensor call: each item to the implementation
// that takes it, one call per implementation with its items in their order, and the results back in
// the items' order. An odd item (a non-contiguous or fp64 parameter) goes to the ATen reference
// on its own instead of sending its whole group there.

#include <c10/util/Exception.h>

#include <cstddef>
#include <vector>

namespace fogo::detail {

/// A call's items split in two, each part in the items' order.
template <class Item>
struct Split {
  std::vector<Item> taken, rest;
  std::vector<bool> is_taken;  ///< per item of the call

  /// One result per item from the results of both parts (one per item of each, in its order).
  template <class R>
  std::vector<R> merge(const std::vector<R>& of_taken, const std::vector<R>& of_rest) const {
    TORCH_INTERNAL_ASSERT(of_taken.size() == taken.size() && of_rest.size() == rest.size(),
                          "Split::merge: ", of_taken.size(), " and ", of_rest.size(),
                          " results for ", taken.size(), " and ", rest.size(), " items");
    std::vector<R> out;
    out.reserve(is_taken.size());
    size_t t = 0, r = 0;
    for (const bool k : is_taken) out.push_back(k ? of_taken[t++] : of_rest[r++]);
    return out;
  }
};

/// The items for which `takes(item)` holds, and the others.
template <class Item, class Pred>
Split<Item> split(const std::vector<Item>& items, const Pred& takes) {
  Split<Item> out;
  for (const Item& item : items) {
    const bool k = takes(item);
    out.is_taken.push_back(k);
    (k ? out.taken : out.rest).push_back(item);
  }
  return out;
}

}  // namespace fogo::detail
