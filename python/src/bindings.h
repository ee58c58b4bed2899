#pragma once
// The parts of fogo._C's module definition (module.cpp calls each once).
#include <torch/extension.h>

namespace fogo_py {

namespace py = pybind11;

/// fogo._C.FOGO and fogo._C.Muon, the bound optimizers, and the presets (bind_optimizers.cpp).
void bind_optimizers(py::module_& m);
/// Muon's owner-computed step for row-sharded matrices and ns_dtype auto (bind_muon.cpp).
void bind_muon(py::module_& m);
/// The lists Python iterates instead of keeping copies: FOGO's memory fields, the hybrid's split
/// rule, sharded steps' owner assignment (bind_lists.cpp).
void bind_lists(py::module_& m);
/// The non-finite policy's decision and its machinery (nonfinite.cpp).
void bind_nonfinite(py::module_& m);

}  // namespace fogo_py
