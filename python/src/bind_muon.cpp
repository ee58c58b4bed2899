// fogo._C's Muon functions beyond the optimizer: the owner-computed step of row-sharded
// (DTensor) matrices (python/fogo/optim.py) and ns_dtype auto (fogo/ns_dtype.h).
#include <fogo/fogo.h>
#include <torch/extension.h>

#include <algorithm>
#include <string>

#include "bindings.h"
#include "bound.h"

namespace fogo_py {

void bind_muon(py::module_& m) {
  // Owner-computes for sharded (DTensor) parameters (fogo/optim.py): the owner rank of a matrix
  // orthogonalizes the whole momentum-updated matrix as Muon::step does (the same NSConfig, the
  // same matrix view [rows, numel / rows], the same cast into the compute dtype); every rank
  // takes the adjusted learning rate for the shape; the elementwise parts run on the shards.
  m.def(
      "muon_orthogonalize",
      [](const at::Tensor& update, const py::dict& group) {
        const fogo::MuonOptions o = Bound<MuonTraits>::options_from(group);
        o.validate();
        TORCH_CHECK(update.dim() >= 2,
                    "fogo._C.muon_orthogonalize: 'update' must have >= 2 dimensions, got ",
                    update.sizes());
        // The step's own, never a copy; auto as it resolves here (resolve_ns_config).
        const fogo::NSConfig ns = fogo::resolve_ns_config(fogo::ns_config(o), update.device());
        const int64_t rows = update.size(0), cols = update.numel() / std::max<int64_t>(rows, 1);
        at::Tensor x = at::empty({rows, cols}, update.options().dtype(ns.compute_dtype));
        x.view(update.sizes()).copy_(update);
        const at::Tensor ortho = fogo::newton_schulz(x, ns);
        // The other ranks receive it into tensors of ns_dtype (auto: ns_compute_dtype's).
        TORCH_CHECK(ortho.scalar_type() == ns.compute_dtype,
                    "fogo._C.muon_orthogonalize: the result's dtype is not ns_dtype");
        return ortho;
      },
      py::arg("update"), py::arg("group"));
  m.def(
      "muon_adjusted_lr",
      [](const py::dict& group, int64_t rows, int64_t cols) {
        const fogo::MuonOptions o = Bound<MuonTraits>::options_from(group);
        return fogo::muon_adjusted_lr(o.lr(), o.adjust_lr(), rows, cols,
                                      MuonTraits::lr_dtype(group));
      },
      py::arg("group"), py::arg("rows"), py::arg("cols"));
  // ns_dtype auto (fogo/ns_dtype.h): what it computes in on a device, and the kept choices.
  m.def(
      "ns_compute_dtype",
      [](const py::handle& dtype, const std::string& device) {
        const c10::ScalarType d =
            Convert<c10::ScalarType>::from(dtype, "ns_compute_dtype", "dtype");
        return py::cast(fogo::resolve_ns_dtype(d, c10::Device(device)));
      },
      py::arg("dtype"), py::arg("device"));
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
