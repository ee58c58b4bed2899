#pragma once
// Muon's orthogonalization, shared by its step (src/muon/optimizer.cpp) and the row-sharded step
// of FSDP2 owner-computes (src/muon/rows.cpp): the momenta, then Newton-Schulz of every matrix in
// runs of one shape (one batched chain each on a GPU), NorMuon's normalization on each O.
#include <ATen/Tensor.h>
#include <fogo/matrix_view.h>
#include <fogo/muon_options.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace fogo::detail::muon {

// One matrix of a group's step: matrix k of parameter `param`'s matrix view (matrix_view.h).
struct Matrix {
  size_t param;
  int64_t k, rows, cols;
};

// The momentum EMA and the Nesterov blend as multi-tensor ops (per tensor what PyTorch's
// lerp_/lerp compute; on the CPU those calls): every parameter's update U, the buffers updated.
std::vector<at::Tensor> momentum_updates(const std::vector<at::Tensor>& bufs,
                                         const std::vector<at::Tensor>& grads,
                                         const MuonOptions& o);

using MatrixDone = std::function<void(const Matrix&, const at::Tensor&)>;

// Newton–Schulz of each of `matrices` (matrix m.k of tensor U[m.param] under views[m.param]) in
// the runs shape_runs makes, and with NorMuon each O's rows normalized by their second moments
// (`second`, as U; normuon.h): `done(m, O)` receives every matrix with its O, run by run.
void orthogonalize_matrices(std::vector<Matrix>& matrices, const std::vector<MatrixView>& views,
                            const std::vector<at::Tensor>& U, const std::vector<at::Tensor>& second,
                            const MuonOptions& o, const MatrixDone& done);

}  // namespace fogo::detail::muon
