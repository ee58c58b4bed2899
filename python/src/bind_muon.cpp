// fogo._C's Muon functions beyond the optimizer: the owner-computed step of row-sharded
// (DTensor) matrices (python/fogo/optim.py) and ns_dtype auto (fogo/ns_dtype.h).
#include <fogo/fogo.h>
#include <fogo/qk_clip.h>
#include <torch/extension.h>

#include <optional>
#include <vector>

#include "bindings.h"
#include "bound.h"

namespace fogo_py {

void bind_muon(py::module_& m) {
  // Owner-computes for row-sharded (DTensor) matrices (fogo/optim.py): the C++ step
  // (fogo::muon_step_rows) of group `group`'s matrices, given this rank's rows of each (and, with
  // normuon, of each second moment; an empty list without) and where those rows start in each
  // matrix (first_rows: a fused weight's blocks need it); Python supplies where the rows live:
  // gather(k, rows) -> the whole tensor on the matrix's owner rank (None elsewhere), scatter(k,
  // whole or None, out) -> this rank's rows of it written into `out` (fogo/muon.h, RowExchange).
  m.def(
      "muon_step_rows",
      [](const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
         const std::vector<at::Tensor>& bufs, const std::vector<at::Tensor>& second_moments,
         const std::vector<int64_t>& rows, const std::vector<int64_t>& first_rows,
         const py::dict& group, const std::optional<at::Tensor>& ok, const py::function& gather,
         const py::function& scatter) {
        TORCH_CHECK(grads.size() == params.size() && bufs.size() == params.size() &&
                        rows.size() == params.size() && first_rows.size() == params.size() &&
                        (second_moments.empty() || second_moments.size() == params.size()),
                    "fogo._C.muon_step_rows: params, grads, bufs, second_moments (when given), "
                    "rows and first_rows differ in length");
        std::vector<fogo::MuonRows> items;
        for (size_t k = 0; k < params.size(); ++k)
          items.push_back({params[k], grads[k], bufs[k], rows[k],
                           second_moments.empty() ? at::Tensor() : second_moments[k],
                           first_rows[k]});
        const fogo::RowExchange exchange{
            [&](size_t k, const at::Tensor& rows) {
              const py::object whole = gather(k, rows);
              return whole.is_none() ? at::Tensor() : whole.cast<at::Tensor>();
            },
            [&](size_t k, const at::Tensor& whole, const at::Tensor& out) {
              scatter(k, whole.defined() ? py::cast(whole) : py::none(), out);
            }};
        fogo::muon_step_rows(items, Bound<MuonTraits>::options_from(group),
                             MuonTraits::lr_dtype(group), ok ? *ok : at::Tensor(), exchange);
      },
      py::arg("params"), py::arg("grads"), py::arg("bufs"), py::arg("second_moments"),
      py::arg("rows"), py::arg("first_rows"), py::arg("group"), py::arg("ok"), py::arg("gather"),
      py::arg("scatter"));
  // QK-Clip (fogo/qk_clip.h), in place; python/fogo/qk_clip.py passes a DTensor's local rows
  // and their first row. Returns gamma per key head (float64).
  m.def(
      "qk_clip",
      [](at::Tensor weight, std::optional<at::Tensor> bias, const at::Tensor& max_logits,
         int64_t q_heads, int64_t kv_heads, int64_t head_dim, double threshold, double alpha,
         int64_t first_row, std::optional<at::Tensor> k_weight, std::optional<at::Tensor> k_bias) {
        const fogo::QKHeads heads{q_heads, kv_heads, head_dim};
        at::NoGradGuard no_grad;  // parameters (leaves that require grad) are scaled in place
        if (k_weight)
          return fogo::qk_clip_separate(weight, bias.value_or(at::Tensor()), *k_weight,
                                        k_bias.value_or(at::Tensor()), max_logits, heads, threshold,
                                        alpha);
        return fogo::qk_clip(weight, bias.value_or(at::Tensor()), max_logits, heads, threshold,
                             alpha, first_row);
      },
      py::arg("weight"), py::arg("bias"), py::arg("max_logits"), py::arg("q_heads"),
      py::arg("kv_heads"), py::arg("head_dim"), py::arg("threshold"), py::arg("alpha"),
      py::arg("first_row"), py::arg("k_weight"), py::arg("k_bias"));
  // ns_dtype auto (fogo/ns_dtype.h): what it computes in on a device, and the kept choices.
  m.def("ns_dtype_choices", [] {
    py::list out;
    for (const fogo::NSDtypeChoice& c : fogo::ns_dtype_choices()) {
      py::dict d;
      d["device"] = c.device;
      d["dtype"] = py::cast(c.dtype);
      d["reason"] = c.reason;
      d["isa"] = c.isa;
      d["bf16_ms"] = c.bf16_ms;
      d["fp32_ms"] = c.fp32_ms;
      out.append(d);
    }
    return out;
  });
  m.def(
      "set_ns_auto_dtype",
      [](const py::handle& dtype) {
        fogo::set_ns_auto_dtype(
            Convert<c10::ScalarType>::from(dtype, "set_ns_auto_dtype", "dtype"));
      },
      py::arg("dtype"));
}

}  // namespace fogo_py
