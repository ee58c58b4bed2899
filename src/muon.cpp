#include "fogo/muon.h"

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

#include "fogo/newton_schulz.h"
#include "fogo_private/detail/batching.h"
#include "fogo_private/detail/checks.h"
#include "fogo_private/detail/integrity.h"
#include "fogo_private/detail/nonfinite.h"
#include "fogo_private/detail/ns_dtype_record.h"
#include "fogo_private/detail/options_table.h"
#include "fogo_private/muon_update.h"
#include "fogo_private/normuon.h"
#include "fogo_private/ops.h"
#include "graphed_step.h"

namespace fogo {

bool operator==(const MuonParamState& a, const MuonParamState& b) {
  const auto same = [](const at::Tensor& x, const at::Tensor& y) {
    return x.defined() == y.defined() && (!x.defined() || at::equal(x, y));
  };
  return same(a.momentum_buffer(), b.momentum_buffer()) &&
         same(a.second_moment(), b.second_moment());
}

// second_moment only where defined (NorMuon's): a checkpoint without it (normuon never on, or
// one written before the option) loads with none.
void MuonParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(second_moment);
}

void MuonParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, momentum_buffer);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, second_moment);
}

// ---------------------------------------------------------------------------------------------
// Optimizer

// MuonOptions::cuda_graph: each group's captured step.
struct Muon::Graphs {
  std::map<size_t, detail::GroupGraph<MuonOptions>> groups;
  detail::GroupGraph<MuonOptions>& of(size_t g) { return groups[g]; }
};

Muon::Muon(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, MuonOptions defaults)
    : MatrixOptimizer(param_groups, std::make_unique<MuonOptions>(defaults)),
      graphs_(std::make_unique<Graphs>()) {
  defaults.validate();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& options = static_cast<const MuonOptions&>(param_groups_[g].options());
    options.validate();
    for (size_t i = 0; i < param_groups_[g].params().size(); ++i) {
      check_param_shape(g, i, param_groups_[g].params()[i], options);
    }
  }
}

Muon::~Muon() = default;
Muon::Muon(Muon&&) noexcept = default;
Muon& Muon::operator=(Muon&&) noexcept = default;

void Muon::check_param_shape(size_t group, size_t index, const torch::Tensor& p,
                             const MuonOptions& options) const {
  if (options.cuda_graph()) detail::check_graph_device("Muon", group, index, p);
  if (options.strict_2d()) {
    // With batch_dims, the matrices of a stack are what must be 2-D.
    TORCH_CHECK(p.dim() == 2 + options.batch_dims(),
                "Muon only supports 2D parameters whereas we found a parameter with size: ",
                p.sizes(), " (", detail::describe_param(group, index, p),
                "; set strict_2d(false) to accept N-D weights as [shape0, prod(rest)])");
  } else {
    TORCH_CHECK(
        p.dim() >= 2, "Muon handles matrices and N-D weights, but ",
        detail::describe_param(group, index, p),
        " has fewer than 2 dimensions; optimize it with AdamW (see fogo::split_parameters)");
  }
  fogo::matrix_view(p.sizes(), matrix_layout(options), "Muon",
                    detail::describe_param(group, index, p));
}

NonFinitePolicy Muon::nonfinite(size_t group) const {
  TORCH_CHECK(group < param_groups_.size(), "Muon::nonfinite: group ", group, " does not exist (",
              param_groups_.size(), " groups)");
  return options(group).nonfinite();
}

NonFinitePolicy Muon::default_nonfinite() const {
  return static_cast<const MuonOptions&>(defaults()).nonfinite();
}

double Muon::weight_decay(size_t g) const { return options(g).weight_decay(); }

const MuonOptions& Muon::options(size_t g) const {
  return static_cast<const MuonOptions&>(param_groups_[g].options());
}

void Muon::check_group(size_t g) const { options(g).validate(); }

void Muon::check_param(size_t g, size_t i, const at::Tensor& p) const {
  check_param_shape(g, i, p, options(g));
  if (const auto it = state_.find(p.unsafeGetTensorImpl()); it != state_.end()) {
    detail::check_state_shape("Muon", g, i, p,
                              static_cast<const MuonParamState&>(*it->second).momentum_buffer(),
                              "momentum_buffer");
  }
}

std::vector<at::Tensor> Muon::buffers(const std::vector<at::Tensor>& params,
                                      bool second_moments) const {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params) {
    const auto& st = static_cast<const MuonParamState&>(*state_.at(p.unsafeGetTensorImpl()));
    out.push_back(second_moments ? st.second_moment() : st.momentum_buffer());
  }
  return out;
}

void Muon::step_group(const GroupStep& s) {
  const auto& o = options(s.group);
  for (size_t k = 0; k < s.params.size(); ++k) {  // state created on the host, before device work
    const at::Tensor& p = s.params[k];
    auto& slot = state_[p.unsafeGetTensorImpl()];
    if (!slot) {
      auto fresh = std::make_unique<MuonParamState>();
      fresh->momentum_buffer(torch::zeros_like(s.grads[k], at::MemoryFormat::Preserve));
      slot = std::move(fresh);
    }
    auto& st = static_cast<MuonParamState&>(*slot);
    if (o.normuon() && !st.second_moment().defined()) {
      st.second_moment(fresh_second_moment(p, o.batch_dims()));
    }
  }
  auto& graph = graphs_->of(s.group);
  const bool graphed = o.cuda_graph() && !shard_.enabled("Muon") && !graph.step.failed();
  detail::run_group(
      graph, graphed, o,
      [&] {  // what the work touches besides the static inputs
        std::vector<at::Tensor> touched = s.params;
        for (const bool second : {false, true})
          for (const at::Tensor& b : buffers(s.params, second))
            if (b.defined()) touched.push_back(b);
        return touched;
      },
      {s.grads, {s.ok}, {}}, s.params.front().device(),
      [&](const detail::GraphedStep::Inputs& in) {
        update_group(s.group, s.params, in.grads, in.tensors[0], in.lr);
      },
      [&] {  // what the update's host code may change, for a failed capture to put back
        auto states = std::make_shared<detail::SavedStates>(*this, s.params);
        return std::function<void()>([states] { states->restore(); });
      },
      "Muon", s.group);
}

void Muon::finish_step(const std::vector<GroupStep>& groups) {
  if (!shard_.enabled("Muon")) return;
  // Every matrix of every parameter with a gradient from its owner (a collective: every rank
  // calls it; the experts of a stack may have several owners), with its rows of NorMuon's second
  // moment, which only the owner updates (every rank holds one where normuon is on: the options
  // and the state's keys are the same on every rank).
  std::vector<ShardUnit> units;
  std::vector<std::vector<at::Tensor>> values;
  for (const GroupStep& s : groups) {
    const std::vector<at::Tensor> second = buffers(s.params, true);
    for (size_t i = 0; i < s.params.size(); ++i) {
      const MatrixView view = matrix_view(s.group, s.params[i]);
      for (int64_t k = 0; k < view.count(); ++k) {
        units.push_back({s.params[i], k});
        values.push_back({matrix_of(s.params[i], view, k)});
        if (options(s.group).normuon()) values.back().push_back(matrix_of(second[i], view, k));
      }
    }
  }
  shard_.exchange(units, values);
}

namespace {

// One matrix of a group's step: matrix k of parameter `param`'s matrix view (matrix_view.h).
struct Matrix {
  size_t param;
  int64_t k, rows, cols;
};

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
template <class Done>
void orthogonalize_matrices(std::vector<Matrix>& matrices, const std::vector<MatrixView>& views,
                            const std::vector<at::Tensor>& U, const std::vector<at::Tensor>& second,
                            const MuonOptions& o, Done&& done) {
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

}  // namespace

MatrixView Muon::matrix_view(size_t group, const at::Tensor& param) const {
  std::ostringstream what;
  what << "a parameter of group " << group << " (shape " << param.sizes() << ")";
  return fogo::matrix_view(param.sizes(), matrix_layout(options(group)), "Muon", what.str());
}

void Muon::update_group(size_t g, const std::vector<at::Tensor>& params,
                        const std::vector<at::Tensor>& grads, const at::Tensor& ok,
                        const at::Tensor& device_lr) {
  const auto& o = options(g);
  const std::vector<at::Tensor> bufs = buffers(params);
  const std::vector<at::Tensor> second = buffers(params, true);  // NorMuon's, or undefined
  // Mask: what the step changes before the update (nothing to copy without it). The parameters
  // are not copied: the update takes the flag and leaves them as they are (issue 44).
  std::vector<at::Tensor> changed;
  if (ok.defined()) {
    changed = bufs;
    if (o.normuon()) changed.insert(changed.end(), second.begin(), second.end());
  }
  const detail::MaskScope keep(ok, std::move(changed));
  // The momenta of every parameter, elementwise (the same bits however they are grouped).
  const std::vector<at::Tensor> U = momentum_updates(bufs, grads, o);
  // Every matrix of every parameter (sharded: the owned ones only go through Newton–Schulz and
  // the update).
  std::vector<MatrixView> views;
  std::vector<Matrix> matrices;
  for (size_t i = 0; i < params.size(); ++i) {
    views.push_back(matrix_view(g, params[i]));
    for (int64_t k = 0; k < views[i].count(); ++k) {
      if (!shard_.owns || shard_.owns(params[i], k))
        matrices.push_back({i, k, views[i].rows_of(k), views[i].cols});
    }
  }
  std::vector<MuonUpdateItem> updates;  // each (owned) matrix with its orthogonalized momentum
  orthogonalize_matrices(matrices, views, U, second, o, [&](const Matrix& m, const at::Tensor& O) {
    updates.push_back({matrix_of(params[m.param], views[m.param], m.k), O});
  });
  // Every run's update in one call: on CUDA one multi-tensor kernel per dtype pair (the learning
  // rate read on the device in a graph), elsewhere torch.optim.Muon's ops. Each matrix takes the
  // adjusted learning rate of its own shape.
  const at::ScalarType lr_dtype = g < lr_dtypes_.size() ? lr_dtypes_[g] : at::kDouble;
  ops::muon_update(updates, {o.lr(), o.weight_decay(), o.adjust_lr(), device_lr, lr_dtype, ok,
                             o.extra_scale_factor()});
  keep.restore();
}

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
  std::vector<at::Tensor> changed;  // Mask: what the step changes (as update_group)
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
    // This rank's rows [first_row, first_row + size(0)) of each block they meet, each with its
    // block's shape for the adjusted learning rate (one item, the whole matrix's, by default).
    const int64_t first = items[k].first_row, last = first + p.size(0);
    for (int64_t b = 0; b < view.count(); ++b) {
      const int64_t start = view.offsets[static_cast<size_t>(b)];
      const int64_t lo = std::max(first, start), hi = std::min(last, start + view.rows_of(b));
      if (hi <= lo) continue;  // no row of block b here (an empty shard meets none)
      updates.push_back({p.narrow(0, lo - first, hi - lo), mine.narrow(0, lo - first, hi - lo),
                         view.rows_of(b), view.cols});
    }
  }
  ops::muon_update(
      updates, {o.lr(), o.weight_decay(), o.adjust_lr(), {}, lr_dtype, {}, o.extra_scale_factor()});
  keep.restore();
}

Muon::GraphStats Muon::graph_stats(size_t group) const {
  TORCH_CHECK(group < param_groups_.size(), "Muon::graph_stats: group ", group, " does not exist (",
              param_groups_.size(), " groups)");
  const auto it = graphs_->groups.find(group);
  if (it == graphs_->groups.end()) return {};
  return {it->second.step.captures(), it->second.step.replays()};
}

void Muon::set_lr_dtype(size_t group, at::ScalarType dtype) {
  TORCH_CHECK(group < param_groups_.size(), "Muon::set_lr_dtype: group ", group,
              " does not exist (", param_groups_.size(), " groups)");
  if (lr_dtypes_.size() <= group) lr_dtypes_.resize(group + 1, at::kDouble);
  lr_dtypes_[group] = dtype;
}

void Muon::set_step_shard(StepShard shard) {
  shard.enabled("Muon::set_step_shard");
  shard_ = std::move(shard);
}

namespace {

using option_table::MuonTable;

constexpr const char* kMuonFormat = "muon/format";  // detail::read_format; absent: format 1
constexpr const char* kMuonChecksum = "muon/checksum";
constexpr const char* kMuonNSDtypes = "muon/ns_dtype_resolved";  // detail/ns_dtype_record.h

// Every group's options and every parameter's momentum buffer, in group order: what a checkpoint
// stores and load() recomputes from what it read; `held`: which options the checkpoint holds.
uint64_t state_checksum(const Muon& muon, option_table::HeldOptions& held) {
  detail::Checksum sum;
  for (size_t g = 0; g < muon.param_groups().size(); ++g) {
    const auto& group = muon.param_groups()[g];
    option_table::add_to_checksum<MuonTable>(static_cast<const MuonOptions&>(group.options()), sum,
                                             held.in_group(g));
    for (const auto& p : group.params()) {
      const auto it = muon.state().find(p.unsafeGetTensorImpl());
      if (it == muon.state().end()) {
        sum.add(int64_t{0});
      } else {
        const auto& st = static_cast<const MuonParamState&>(*it->second);
        sum.add(int64_t{1}).add(st.momentum_buffer());
        // NorMuon's second moment where there is one: a checkpoint without (every one from
        // before the option) sums as it did.
        if (st.second_moment().defined()) sum.add(int64_t{2}).add(st.second_moment());
      }
    }
  }
  return sum.value();
}

}  // namespace

void Muon::save(torch::serialize::OutputArchive& archive) const {
  serialize(*this, archive);
  // The oldest format that holds these options (as FOGO::save).
  archive.write(kMuonFormat,
                c10::IValue(option_table::checkpoint_format<MuonTable>(param_groups_)));
  option_table::HeldOptions all;
  detail::write_checksum(archive, kMuonChecksum, state_checksum(*this, all));
  detail::write_ns_dtypes(archive, kMuonNSDtypes,
                          detail::group_ns_dtypes<MuonOptions>(param_groups_));
}

void Muon::load(torch::serialize::InputArchive& archive) {
  detail::load_transactional(
      *this,
      [&] {
        c10::IValue value;
        TORCH_CHECK(!archive.try_read("fogo/format", value),
                    "Muon::load: not a Muon checkpoint (FOGO wrote it; load it with FOGO::load)");
        detail::read_format(archive, "Muon", "Muon", kMuonFormat,
                            option_table::newest_format<MuonTable>(), /*absent=*/1);
        // LibTorch's reader throws torch::jit errors or internal asserts, naming no optimizer,
        // for an archive that is not a Muon checkpoint (a module's, AdamW's) or a damaged one.
        try {
          serialize(*this, archive);
        } catch (const std::exception& e) {
          const std::string what = e.what();
          TORCH_CHECK(false, "Muon::load: not a Muon checkpoint (or a damaged one): ",
                      what.substr(0, what.find('\n')));
        }
        option_table::HeldOptions held(archive);
        detail::verify_checksum(archive, "Muon", kMuonChecksum, state_checksum(*this, held));
      },
      [&](size_t g, size_t i, const torch::Tensor& p) {
        auto it = state_.find(p.unsafeGetTensorImpl());
        if (it == state_.end()) return;
        auto& st = static_cast<MuonParamState&>(*it->second);
        const auto& buf = st.momentum_buffer();
        TORCH_CHECK(buf.defined() && buf.sizes() == p.sizes(),
                    "Muon::load: the checkpoint's momentum_buffer for ",
                    detail::describe_param(g, i, p), " has shape ",
                    buf.defined() ? buf.sizes() : at::IntArrayRef{},
                    "; the checkpoint was made for a different model");
        detail::check_finite_state("Muon", "momentum_buffer for " + detail::describe_param(g, i, p),
                                   buf);
        const auto& options = static_cast<const MuonOptions&>(param_groups_[g].options());
        options.validate();
        st.momentum_buffer(buf.to(p.device()));  // archives load onto the CPU
        const at::Tensor& v = st.second_moment();
        if (!v.defined()) return;  // NorMuon off when saved: a step with it on starts at zeros
        // One per row of each matrix (batch_dims: of each matrix of the stack).
        const std::vector<int64_t> rows = row_state_sizes(p.sizes(), options.batch_dims());
        TORCH_CHECK(v.sizes() == at::IntArrayRef(rows) && v.is_floating_point(),
                    "Muon::load: the checkpoint's second_moment for ",
                    detail::describe_param(g, i, p), " has shape ", v.sizes(), " (",
                    v.scalar_type(), "), expected ", at::IntArrayRef(rows),
                    " floating point (one per row of each matrix); the checkpoint was made for a "
                    "different model or another batch_dims");
        detail::check_finite_state("Muon", "second_moment for " + detail::describe_param(g, i, p),
                                   v);
        st.second_moment(v.to(p.device(), normuon_dtype(p)));
      });
  detail::warn_on_changed_ns_dtypes(archive, kMuonNSDtypes, "Muon",
                                    detail::group_ns_dtypes<MuonOptions>(param_groups_));
}

}  // namespace fogo
