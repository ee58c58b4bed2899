#pragma once
// fogo::MatrixOptions: what code outside an optimizer asks of a matrix optimizer's options
// (MuonOptions, FOGOOptions), whichever optimizer they belong to: how they cut a parameter into
// matrices and how they scale its update. The routing table (routing.h) reads them through it
// with one cross-cast from torch::optim::OptimizerOptions, and a new matrix optimizer's options
// join the table by implementing it.

#include <fogo/matrix_view.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace fogo {

/// How an optimizer's options scale one parameter's update (update_scale): the group's `lr`, and
/// `rms_per_lr`, the update's RMS per entry divided by lr (Muon: its adjust_lr factor over
/// sqrt(max(rows, cols)), an orthogonal update's RMS; FOGO: sigma, its target RMS; NaN for AdamW,
/// whose step per entry is bounded by lr but has no fixed RMS), and `text` saying both.
struct UpdateScale {
  double lr = std::nan("");
  double rms_per_lr = std::nan("");
  std::string text;
};

/// A matrix optimizer's options, as routing sees them. It holds no data, so copying or assigning
/// the options (the frame assigns them whole) copies nothing of it.
class MatrixOptions {
 public:
  virtual ~MatrixOptions() = default;
  /// How the options cut their group's parameters into matrices (batch_dims, heads, blocks).
  virtual MatrixLayout layout() const = 0;
  /// The update scale the options give a parameter of shape `sizes`, on its matrix view under
  /// layout(): Muon's per matrix shape (the text listing each shape's where the blocks differ,
  /// `rms_per_lr` the first matrix's), FOGO's sigma.
  virtual UpdateScale update_scale(const std::vector<int64_t>& sizes) const = 0;

 protected:
  MatrixOptions() = default;
  MatrixOptions(const MatrixOptions&) = default;
  MatrixOptions& operator=(const MatrixOptions&) = default;
};

}  // namespace fogo
