// Muon's step on row-sharded matrices (fogo::muon_step_rows, muon.h): FSDP2 owner-computes, each
// matrix gathered whole on the rank that orthogonalizes it.
#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>
#include <vector>

#include "fogo/muon.h"
#include "fogo/newton_schulz.h"
#include "fogo_private/frame/batching.h"
#include "fogo_private/frame/checks.h"
#include "fogo_private/frame/graphed_step.h"
#include "fogo_private/frame/integrity.h"
#include "fogo_private/frame/nonfinite.h"
#include "fogo_private/frame/options_table.h"
#include "fogo_private/muon/normuon.h"
#include "fogo_private/muon/orthogonalize.h"
#include "fogo_private/muon/update.h"
#include "fogo_private/newton_schulz/dtype_record.h"
#include "fogo_private/ops/ops.h"

namespace fogo {

using detail::muon::Matrix;
using detail::muon::momentum_updates;
using detail::muon::orthogonalize_matrices;

namespace {

// muon_step_rows' inputs: this rank's rows of each matrix with its gradient, buffer and (NorMuon)
// second moment, shaped alike; each parameter's matrix view (heads, blocks) checked on every
// rank alike before any collective.
std::vector<MatrixView> check_rows(const std::vector<MuonRows>& items, const MuonOptions& o) {
  std::vector<MatrixView> views;
  for (size_t k = 0; k < items.size(); ++k) {
    const MuonRows& m = items[k];
    TORCH_CHECK(m.param.dim() >= 2 && (!o.strict_2d() || m.param.dim() == 2) &&
                    m.grad.sizes() == m.param.sizes() && m.buf.sizes() == m.param.sizes() &&
                    m.rows >= m.param.size(0),
                "muon_step_rows: matrix ", k, " must be rows of a ",
                o.strict_2d() ? "2-D" : ">= 2-D", " parameter with its gradient and buffer of ",
                "the same shape, got ", m.param.sizes(), ", ", m.grad.sizes(), ", ", m.buf.sizes(),
                " (", m.rows, " rows in all)");
    TORCH_CHECK(m.first_row >= 0 && m.first_row + m.param.size(0) <= m.rows,
                "muon_step_rows: matrix ", k, "'s first_row ", m.first_row, " with its ",
                m.param.size(0), " rows here lies outside its ", m.rows, " rows");
    std::vector<int64_t> whole = m.param.sizes().vec();
    whole[0] = m.rows;
    views.push_back(
        matrix_view(whole, matrix_layout(o), "Muon",
                    c10::str("row-sharded matrix ", k, " (shape ", at::IntArrayRef(whole), ")")));
    if (!o.normuon()) continue;
    const at::Tensor& v = m.second_moment;
    TORCH_CHECK(v.defined() && v.dim() == 1 && v.size(0) == m.param.size(0) &&
                    v.scalar_type() == normuon_dtype(m.param) && v.device() == m.param.device(),
                "muon_step_rows: option 'normuon' needs matrix ", k,
                "'s second_moment: its rows of the [", m.rows, "] second moment, ",
                c10::toString(normuon_dtype(m.param)), " on ", m.param.device(), " (",
                m.param.size(0), " rows here), got ",
                v.defined() ? c10::str(v.sizes(), " ", v.scalar_type(), " on ", v.device())
                            : std::string("none"));
  }
  return views;
}

// The orthogonalized (NorMuon: normalized) update of a whole matrix `whole` [rows, ...] on the
// rank that holds it, block by block as fogo::Muon steps a parameter of that view
// (orthogonalize_matrices); `whole_v` its second moment (NorMuon). [rows, cols].
at::Tensor orthogonalize_whole(const at::Tensor& whole, const at::Tensor& whole_v,
                               const MatrixView& view, const MuonOptions& o) {
  std::vector<Matrix> blocks;
  for (int64_t b = 0; b < view.count(); ++b) blocks.push_back({0, b, view.rows_of(b), view.cols});
  std::vector<at::Tensor> Os(blocks.size());
  orthogonalize_matrices(
      blocks, {view}, {whole}, {whole_v}, o,
      [&](const Matrix& m, const at::Tensor& O) { Os[static_cast<size_t>(m.k)] = O; });
  return Os.size() == 1 ? Os[0] : at::cat(Os);
}

// This rank's rows [first, first + size(0)) of `p` (and of its orthogonalized update `mine`) in
// each block of `view` they meet, each with its block's shape for the adjusted learning rate (one
// item, the whole matrix's, by default).
void add_row_updates(std::vector<MuonUpdateItem>& updates, const at::Tensor& p,
                     const at::Tensor& mine, const MatrixView& view, int64_t first) {
  const int64_t last = first + p.size(0);
  for (int64_t b = 0; b < view.count(); ++b) {
    const int64_t start = view.offsets[static_cast<size_t>(b)];
    const int64_t lo = std::max(first, start), hi = std::min(last, start + view.rows_of(b));
    if (hi <= lo) continue;  // no row of block b here (an empty shard meets none)
    updates.push_back({p.narrow(0, lo - first, hi - lo), mine.narrow(0, lo - first, hi - lo),
                       view.rows_of(b), view.cols});
  }
}

}  // namespace

void muon_step_rows(const std::vector<MuonRows>& items, const MuonOptions& o,
                    at::ScalarType lr_dtype, const at::Tensor& ok, const RowExchange& exchange) {
  o.validate();
  TORCH_CHECK(exchange.gather && exchange.scatter, "muon_step_rows: no gather or scatter");
  TORCH_CHECK(o.batch_dims() == 0,
              "muon_step_rows: option 'batch_dims' is not supported for row-sharded matrices "
              "(FSDP2 owner-computes steps a stack's experts where they lie); use fogo::Muon or "
              "fogo::dist's sharded steps");
  const std::vector<MatrixView> views = check_rows(items, o);
  std::vector<at::Tensor> params, grads, bufs, second;
  for (const MuonRows& m : items) {
    params.push_back(m.param);
    grads.push_back(m.grad);
    bufs.push_back(m.buf);
    if (o.normuon()) second.push_back(m.second_moment);
  }
  std::vector<at::Tensor> changed;  // Mask: what the step changes (as Muon::masked_tensors)
  if (ok.defined()) {
    changed = params;
    changed.insert(changed.end(), bufs.begin(), bufs.end());
    changed.insert(changed.end(), second.begin(), second.end());
  }
  const detail::MaskScope keep(ok, std::move(changed));
  const std::vector<at::Tensor> U = momentum_updates(bufs, grads, o);
  std::vector<MuonUpdateItem> updates;
  for (size_t k = 0; k < items.size(); ++k) {
    const at::Tensor& p = params[k];
    const MatrixView& view = views[k];
    const at::Tensor whole = exchange.gather(k, U[k]);
    // NorMuon: the whole second moment with the whole update (undefined elsewhere).
    const at::Tensor whole_v = o.normuon() ? exchange.gather(k, second[k]) : at::Tensor();
    at::Tensor O;  // on the rank that orthogonalizes matrix k
    if (whole.defined()) {
      TORCH_CHECK(whole.size(0) == items[k].rows && whole.sizes().slice(1) == p.sizes().slice(1),
                  "muon_step_rows: gather returned ", whole.sizes(), " for matrix ", k, " of ",
                  items[k].rows, " rows");
      TORCH_CHECK(
          !o.normuon() || (whole_v.defined() && whole_v.sizes() == at::IntArrayRef{items[k].rows}),
          "muon_step_rows: gather returned no [", items[k].rows, "] second moment for matrix ", k);
      O = orthogonalize_whole(whole, whole_v, view, o);
    }
    // What O reaches the update in, the same on every rank: NorMuon's dtype, or Newton–Schulz's.
    const at::ScalarType dtype =
        o.normuon() ? normuon_dtype(p) : resolve_ns_config(ns_config(o), p.device()).compute_dtype;
    const at::Tensor mine = at::empty({p.size(0), view.cols}, p.options().dtype(dtype));
    exchange.scatter(k, O, mine);
    if (o.normuon()) exchange.scatter(k, whole_v, second[k]);
    add_row_updates(updates, p, mine, view, items[k].first_row);
  }
  const LearningRate lr(o.lr(), lr_dtype);
  ops::muon_update(updates, {lr, o.weight_decay(), o.adjust_lr(), {}, o.extra_scale_factor()});
  keep.restore();
}

}  // namespace fogo
