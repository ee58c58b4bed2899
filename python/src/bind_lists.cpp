// The lists that Python iterates rather than keeping copies of (python/fogo/*.py): each is C++'s
// own, so a change to it in C++ reaches Python without a change there.
#include <fogo/fogo.h>
#include <torch/extension.h>

#include "bindings.h"
#include "fogo_state.h"

namespace fogo_py {

void bind_lists(py::module_& m) {
  // FOGO's group memory, the tensors of GroupMemory::visit: (name, uses, shape) each, in its
  // order (python/fogo/_memory.py lays the state_dict's "memory" out by it).
  m.def("memory_fields", [] {
    py::list out;
    for (const fogo::GroupMemory::Field& f : fogo::GroupMemory::fields()) {
      py::list uses;
      if (f.use & fogo::GroupMemory::kSaved) uses.append("saved");
      if (f.use & fogo::GroupMemory::kStep) uses.append("step");
      if (f.use & fogo::GroupMemory::kMasked) uses.append("masked");
      out.append(py::make_tuple(f.name, py::tuple(uses), f.shape));
    }
    return out;
  });
  m.attr("default_rest_patterns") = fogo::ParamSplitRules{}.rest_patterns;
  m.def("shape_key", [](const at::Tensor& p) { return fogo::shape_key("", p); });
}

}  // namespace fogo_py
