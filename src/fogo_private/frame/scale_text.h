#pragma once
// The pieces of an update scale's text (fogo::UpdateScale) that Muon's, FOGO's and routing's
// share: one number format, and the distinct matrix shapes of a parameter's view.
#include <fogo/matrix_view.h>

#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace fogo::detail {

/// `x` to three significant digits.
inline std::string scale_number(double x) {
  std::ostringstream out;
  out << std::setprecision(3) << x;
  return out.str();
}

/// The distinct [rows, cols] of a view's matrices, in their order.
inline std::vector<std::pair<int64_t, int64_t>> distinct_shapes(const MatrixView& view) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t k = 0; k < view.block_count(); ++k) {
    const std::pair<int64_t, int64_t> shape{view.rows_of(k), view.cols};
    if (std::find(out.begin(), out.end(), shape) == out.end()) out.push_back(shape);
  }
  return out;
}

}  // namespace fogo::detail
