// A parameter's matrix view (fogo/matrix_view.h).
#include "fogo/matrix_view.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <numeric>
#include <sstream>

namespace fogo {

MatrixView matrix_view(at::IntArrayRef sizes, const MatrixLayout& layout, const char* optimizer,
                       const std::string& what) {
  const auto dims = static_cast<int64_t>(sizes.size());
  const int64_t b = layout.batch_dims;
  TORCH_CHECK(dims >= b + 2, optimizer, ": ", what, " has ", dims,
              " dimensions; option 'batch_dims' ", b, " needs at least ", b + 2,
              " (the batch dimensions, then a matrix's rows and columns)");
  MatrixView v;
  v.batch_dims = b;
  v.batch = c10::multiply_integers(sizes.slice(0, static_cast<size_t>(b)));
  v.rows = sizes[static_cast<size_t>(b)];
  v.cols = c10::multiply_integers(sizes.slice(static_cast<size_t>(b + 1)));
  if (!layout.blocks.empty()) {
    const int64_t sum = std::accumulate(layout.blocks.begin(), layout.blocks.end(), int64_t{0});
    TORCH_CHECK(layout.heads == 1, optimizer, ": options 'heads' (", layout.heads,
                ") and 'blocks' both cut the rows; set one of them");
    TORCH_CHECK(sum == v.rows, optimizer, ": option 'blocks' ", at::IntArrayRef(layout.blocks),
                " sums to ", sum, " rows, but the matrices of ", what, " have ", v.rows,
                " (dimension ", b, ")");
    v.blocks = layout.blocks;
  } else {
    TORCH_CHECK(layout.heads >= 1 && v.rows % layout.heads == 0, optimizer, ": option 'heads' ",
                layout.heads, " does not divide the ", v.rows, " rows of the matrices of ", what,
                " (dimension ", b, ")");
    v.blocks.assign(static_cast<size_t>(layout.heads), v.rows / layout.heads);
  }
  int64_t row = 0;
  for (const int64_t r : v.blocks) {
    v.offsets.push_back(row);
    row += r;
  }
  return v;
}

at::Tensor matrix_of(const at::Tensor& t, const MatrixView& view, int64_t k) {
  const int64_t j = k % view.block_count();
  int64_t e = k / view.block_count();
  // Batch entry e, row-major over the batch dimensions: select from the last one up.
  std::vector<int64_t> index(static_cast<size_t>(view.batch_dims));
  for (int64_t d = view.batch_dims - 1; d >= 0; --d) {
    index[static_cast<size_t>(d)] = e % t.size(d);
    e /= t.size(d);
  }
  at::Tensor m = t;
  for (const int64_t i : index) m = m.select(0, i);
  if (view.block_count() == 1) return m;
  return m.narrow(0, view.offsets[static_cast<size_t>(j)], view.blocks[static_cast<size_t>(j)]);
}

std::vector<int64_t> row_state_sizes(at::IntArrayRef sizes, int64_t batch_dims) {
  return sizes.slice(0, std::min(static_cast<size_t>(batch_dims) + 1, sizes.size())).vec();
}

std::string to_string(const MatrixView& view) {
  // Counts per block shape, in the order the shapes first appear.
  std::vector<std::pair<int64_t, int64_t>> counts;  // (rows, count)
  for (const int64_t r : view.blocks) {
    auto it =
        std::find_if(counts.begin(), counts.end(), [r](const auto& c) { return c.first == r; });
    if (it == counts.end()) it = counts.insert(counts.end(), {r, 0});
    it->second += view.batch;
  }
  std::ostringstream out;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (i > 0) out << " + ";
    if (counts[i].second != 1) out << counts[i].second << " x ";
    out << "[" << counts[i].first << ", " << view.cols << "]";
  }
  return out.str();
}

}  // namespace fogo
