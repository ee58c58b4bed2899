// Muon's orthogonalization (fogo_private/muon/orthogonalize.h): the momenta, the runs of matrices
// that share one Newton-Schulz chain, and NorMuon's normalization of each O.
#include "fogo_private/muon/orthogonalize.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "fogo/muon.h"
#include "fogo/newton_schulz.h"
#include "fogo_private/frame/batching.h"
#include "fogo_private/muon/normuon.h"

namespace fogo::detail::muon {

namespace {

// The runs of same-shape matrices that go through one Newton–Schulz chain, as [begin, end) of
// `matrices` (sorted here). On a GPU, one chain per wide shape (min, max) of [rows, cols] and
// device, as FOGO batches: a dozen small matrices in one bmm fill the GPU where one small GEMM per
// matrix cannot, and a tall matrix joins the wide ones of its shape transposed (GPT-2's c_fc
// [3072, 768] and c_proj [768, 3072]: one run of 24, not two of 12; issue 44); within a run the
// wide matrices come first (orthogonalize_run). The matrices of a stack or the blocks of a fused
// weight join the other parameters' of their shape. On the CPU every matrix is a run of its own, as
// torch.optim.Muon steps its parameters: batching gains nothing there (the GEMMs are
// compute-bound), and ATen's CPU bmm can round differently from mm on small matrices, which would
// break the bit-identity with PyTorch (and a stack's with its experts as separate parameters).
detail::Runs shape_runs(const std::vector<at::Tensor>& params, std::vector<Matrix>& matrices) {
  std::vector<size_t> seq(matrices.size());
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = i;
  std::stable_sort(seq.begin(), seq.end(), [&](size_t a, size_t b) {  // wide before tall
    return (matrices[a].rows > matrices[a].cols) < (matrices[b].rows > matrices[b].cols);
  });
  const detail::Runs runs = detail::sort_into_runs(seq, [&](size_t i) {
    const Matrix& m = matrices[i];
    const at::Tensor& p = params[m.param];
    return std::make_tuple(p.is_cuda() ? 0 : i, static_cast<int>(p.device().type()),
                           p.device().index(), std::min(m.rows, m.cols), std::max(m.rows, m.cols));
  });
  std::vector<Matrix> sorted;
  for (const size_t i : seq) sorted.push_back(matrices[i]);
  matrices = std::move(sorted);
  return runs;
}

// Newton–Schulz of one run's momenta `inputs` (one matrix shape [rows, cols] each, given as any
// shape of rows x cols elements; `shapes`), batched in the compute dtype (the cast done by the
// copy; ns_dtype auto as it resolves on their device). One orientation: [count, rows, cols], as
// newton_schulz orients it (a tall run transposed inside, as torch.optim.Muon does). Both (a
// shape_runs run on a GPU, the wide ones first): the tall ones copied in transposed, so the chain
// sees [count, m, n] wide, and each tall O returned as the transpose of its wide result (the
// update kernel reads it so): `wide` receives the wide part [w, m, n], `tall` the tall part
// [count - w, n, m] (a view), either undefined when empty.
void orthogonalize_run(const std::vector<at::Tensor>& inputs,
                       const std::vector<std::pair<int64_t, int64_t>>& shapes, NSConfig ns,
                       at::Tensor& wide, at::Tensor& tall) {
  ns = resolve_ns_config(ns, inputs.front().device());
  int64_t w = 0;
  for (const auto& [rows, cols] : shapes) w += rows <= cols ? 1 : 0;
  const auto count = static_cast<int64_t>(inputs.size());
  const auto [rows, cols] = shapes.front();
  const bool mixed = w > 0 && w < count;
  const int64_t m = mixed ? std::min(rows, cols) : rows, n = mixed ? std::max(rows, cols) : cols;
  at::Tensor X = at::empty({count, m, n}, inputs.front().options().dtype(ns.compute_dtype));
  for (int64_t k = 0; k < count; ++k) {
    const auto [r, c] = shapes[static_cast<size_t>(k)];
    if (r == m) {
      X[k].view(inputs[static_cast<size_t>(k)].sizes()).copy_(inputs[static_cast<size_t>(k)]);
    } else {
      X[k].copy_(inputs[static_cast<size_t>(k)].reshape({r, c}).mT());
    }
  }
  const at::Tensor O = count == 1 ? newton_schulz(X[0], ns).unsqueeze(0) : newton_schulz(X, ns);
  wide = tall = at::Tensor();
  if (!mixed) {
    (rows <= cols ? wide : tall) = O;
    return;
  }
  wide = O.narrow(0, 0, w);
  tall = O.narrow(0, w, count - w).mT();
}

}  // namespace

// The momentum EMA and the Nesterov blend as multi-tensor ops (per tensor what PyTorch's
// lerp_/lerp compute; on the CPU those calls): every parameter's update U, the buffers updated.
std::vector<at::Tensor> momentum_updates(const std::vector<at::Tensor>& bufs,
                                         const std::vector<at::Tensor>& grads,
                                         const MuonOptions& o) {
  at::_foreach_lerp_(bufs, grads, 1.0 - o.momentum());
  return o.nesterov() ? at::_foreach_lerp(grads, bufs, o.momentum()) : bufs;
}

// Newton–Schulz of each of `matrices` (matrix m.k of tensor U[m.param] under views[m.param]) in
// the runs shape_runs makes, and with NorMuon each O's rows normalized by their second moments
// (`second`, as U; normuon.h): `done(m, O)` receives every matrix with its O, run by run.
void orthogonalize_matrices(std::vector<Matrix>& matrices, const std::vector<MatrixView>& views,
                            const std::vector<at::Tensor>& U, const std::vector<at::Tensor>& second,
                            const MuonOptions& o, const MatrixDone& done) {
  const auto of = [&](const std::vector<at::Tensor>& t, const Matrix& m) {
    return matrix_of(t[m.param], views[m.param], m.k);
  };
  for (const auto& [begin, end] : shape_runs(U, matrices)) {
    std::vector<at::Tensor> inputs, run_second;
    std::vector<std::pair<int64_t, int64_t>> shapes;
    for (size_t i = begin; i < end; ++i) {
      inputs.push_back(of(U, matrices[i]));
      shapes.emplace_back(matrices[i].rows, matrices[i].cols);
      if (o.normuon()) run_second.push_back(of(second, matrices[i]));
    }
    at::Tensor wide, tall;
    orthogonalize_run(inputs, shapes, ns_config(o), wide, tall);
    // Each orientation's O batched (NorMuon: its rows are the matrix's rows, so per orientation).
    std::vector<at::Tensor> Os;
    size_t first = 0;
    for (const at::Tensor& part : {wide, tall}) {
      if (!part.defined()) continue;
      const auto n = static_cast<size_t>(part.size(0));
      const std::vector<at::Tensor> mine =
          o.normuon() ? normuon_normalize(part,
                                          std::vector<at::Tensor>(run_second.begin() + first,
                                                                  run_second.begin() + first + n),
                                          o.normuon_beta2(), o.normuon_eps())
                      : part.unbind(0);
      Os.insert(Os.end(), mine.begin(), mine.end());
      first += n;
    }
    for (size_t i = begin; i < end; ++i) done(matrices[i], Os[i - begin]);
  }
}
}  // namespace fogo::detail::muon
