// fogo._C's part of the non-finite policy (python/fogo/_nonfinite.py uses it): the one decision
// (fogo::decide_nonfinite) and its machinery, for the steps Python assembles from several
// optimizers (fogo.Hybrid) or from the C++ step and its own work (fogo.Muon's owner-computed
// DTensor parameters). The C++ rule, its test and its error are used as they are.
#include "fogo_private/frame/nonfinite.h"

#include <fogo/enum_names.h>
#include <fogo/nonfinite.h>
#include <torch/extension.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "fogo_private/frame/checks.h"

namespace fogo_py {

namespace {

at::Tensor or_undefined(const std::optional<at::Tensor>& t) { return t ? *t : at::Tensor(); }

}  // namespace

void bind_nonfinite(py::module_& m) {
  py::class_<fogo::NonFiniteDecision>(m, "NonFiniteDecision")
      .def_property_readonly(
          "kind", [](const fogo::NonFiniteDecision& d) { return fogo::enum_name(d.kind); })
      .def_readonly("item", &fogo::NonFiniteDecision::item)
      .def_property_readonly("ok",
                             [](const fogo::NonFiniteDecision& d) -> std::optional<at::Tensor> {
                               if (!d.ok.defined()) return std::nullopt;
                               return d.ok;
                             });
  m.def(
      "decide_nonfinite",
      [](const py::sequence& policies, const std::vector<std::optional<at::Tensor>>& usable,
         bool maskable) {
        std::vector<fogo::NonFinitePolicy> p;
        for (const py::handle v : policies)
          p.push_back(Convert<fogo::NonFinitePolicy>::from(v, "decide_nonfinite", "policies"));
        std::vector<at::Tensor> flags;
        for (const auto& f : usable) flags.push_back(or_undefined(f));
        return fogo::decide_nonfinite(p, flags, maskable);
      },
      py::arg("policies"), py::arg("usable"), py::arg("maskable") = true);
  m.def("grad_usable", &fogo::detail::grad_usable, py::arg("grad"));
  m.def("grad_norm", &fogo::detail::grad_norm, py::arg("grad"));
  m.def("norm_usable", &fogo::detail::norm_usable, py::arg("norm"), py::arg("dtype"));
  m.def("describe_param", &fogo::detail::describe_param, py::arg("group"), py::arg("index"),
        py::arg("param"));
  m.def(
      "raise_unusable_grad",
      [](const std::string& optimizer, const std::string& what,
         const std::optional<at::Tensor>& grad) {
        fogo::detail::throw_unusable_grad(optimizer, what, or_undefined(grad));
      },
      py::arg("optimizer"), py::arg("what"), py::arg("grad"));
  m.def("unusable_grad_reads", &fogo::detail::unusable_grad_reads);
  py::class_<fogo::detail::MaskScope>(m, "MaskScope")
      .def(py::init([](const std::optional<at::Tensor>& ok, std::vector<at::Tensor> tensors) {
             return fogo::detail::MaskScope(or_undefined(ok), std::move(tensors));
           }),
           py::arg("ok"), py::arg("tensors"))
      .def("restore", [](const fogo::detail::MaskScope& s) { s.restore(); });
}

}  // namespace fogo_py
