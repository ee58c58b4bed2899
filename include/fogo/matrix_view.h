#pragma once
// A parameter's matrix view: the matrices fogo's matrix optimizers orthogonalize in it. By
// default a parameter is one matrix, [size(0), numel / size(0)] (a conv weight [out, in, kh, kw]
// is [out, in*kh*kw]). Two group options (MuonOptions; docs/muon.md) make it a list:
//   batch_dims  the leading dimensions are a batch: a stack of experts [E, out, in] is E matrices
//               [out, in] (with batch_dims 1), [E1, E2, out, in, kh, kw] is E1*E2 matrices [out,
//               in*kh*kw] (with 2)
//   heads       each matrix's rows split into `heads` equal blocks (a fused projection's heads)
//   blocks      ... or into blocks of the given row counts (GQA's fused q/k/v: [q, k, v])
// Matrix k is rows [row, row + rows) of batch entry e = k / blocks, block k % blocks: batch-major,
// the order of the rows in memory. Each is orthogonalized and scaled (adjust_lr) as a parameter
// of its own shape [rows, cols] would be; same-shape matrices share batched Newton–Schulz chains
// on a GPU as same-shape parameters do.

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fogo {

/// How a param group cuts its parameters into matrices (the options above).
struct MatrixLayout {
  int64_t batch_dims = 0;
  int64_t heads = 1;
  std::vector<int64_t> blocks;  ///< row counts; empty: `heads` equal blocks
  /// The default: every parameter one matrix.
  bool is_default() const { return batch_dims == 0 && heads == 1 && blocks.empty(); }
};

/// A parameter's matrices under a MatrixLayout.
struct MatrixView {
  int64_t batch_dims = 0;        ///< the layout's leading batch dimensions
  int64_t batch = 1;             ///< batch entries (the product of the batch dimensions)
  int64_t rows = 0, cols = 0;    ///< each entry's matrix [rows, cols] before the blocks
  std::vector<int64_t> blocks;   ///< the blocks' row counts (one: the whole matrix)
  std::vector<int64_t> offsets;  ///< the first row of each block

  /// How many matrices: batch x blocks.
  int64_t count() const { return batch * static_cast<int64_t>(blocks.size()); }
  /// Matrix k's rows (its shape is [rows_of(k), cols]).
  int64_t rows_of(int64_t k) const { return blocks[static_cast<size_t>(k % block_count())]; }
  int64_t block_count() const { return static_cast<int64_t>(blocks.size()); }
  /// One matrix, the whole parameter (the default layout's, or one that cuts nothing).
  bool single() const { return count() == 1; }
};

/// The matrix view of a parameter of shape `sizes` under `layout`. Throws naming `optimizer` and
/// `what` (the parameter, detail::describe_param) when the layout does not fit: fewer than
/// batch_dims + 2 dimensions, rows not divisible by heads, blocks not summing to the rows.
MatrixView matrix_view(at::IntArrayRef sizes, const MatrixLayout& layout, const char* optimizer,
                       const std::string& what);

/// Matrix k of `t` as a view of it: `t` a parameter (or a tensor of its shape) gives [rows_of(k),
/// rest...] (the rows of a conv weight keep their [in, kh, kw]); `t` of the parameter's leading
/// batch_dims + 1 dimensions (a per-row state, NorMuon's second moment) gives [rows_of(k)]. Every
/// element of `t` is in exactly one of the count() views.
at::Tensor matrix_of(const at::Tensor& t, const MatrixView& view, int64_t k);

/// The shape of a per-row state of a parameter of shape `sizes` (NorMuon's second moment): its
/// leading batch_dims + 1 dimensions, one entry per row of each of its matrices (at most all of
/// them: a layout that does not fit the parameter is refused elsewhere, naming it).
std::vector<int64_t> row_state_sizes(at::IntArrayRef sizes, int64_t batch_dims);

/// The matrix view as text, for routing tables and messages: "[out, in]" for one matrix,
/// "8 x [64, 256]" for a stack, "3 x [64, 256] + [32, 256]" for blocks (same shapes counted),
/// batch entries multiplying the blocks' counts.
std::string to_string(const MatrixView& view);

}  // namespace fogo
