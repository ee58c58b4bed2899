// The lists that Python iterates rather than keeping copies of (python/fogo/*.py): each is C++'s
// own, so a change to it in C++ reaches Python without a change there.
#include <fogo/fogo.h>
#include <torch/extension.h>

#include "bindings.h"

namespace fogo_py {

void bind_lists(py::module_& m) {
  m.attr("default_rest_patterns") = fogo::ParamSplitRules{}.rest_patterns;
  m.def("shape_key", [](const at::Tensor& p) { return fogo::shape_key("", p); });
}

}  // namespace fogo_py
