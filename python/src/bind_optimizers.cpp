// fogo._C.FOGO and fogo._C.Muon (bound.h), with what each has of its own, and the presets.
#include <fogo/fogo.h>
#include <torch/extension.h>

#include <string>

#include "bindings.h"
#include "bound.h"

namespace fogo_py {

namespace {

// FOGO_TELEMETRY's fields, one dict per group.
py::list telemetry(const fogo::FOGO& opt) {
  py::list out;
  for (const fogo::FOGOTelemetry& t : opt.telemetry()) {
    py::dict d;
#define FOGO_PY_STAT(T, name, ...) d[#name] = t.name;
    FOGO_TELEMETRY(FOGO_PY_STAT)
#undef FOGO_PY_STAT
    out.append(d);
  }
  return out;
}

py::dict memory(const fogo::FOGO& opt, size_t group) {
  const auto m = opt.memory(group);
  py::dict d;
  auto put = [&](const char* k, const at::Tensor& t) {
    d[k] = t.defined() ? py::cast(t) : py::none();
  };
  put("centroids", m.centroids);
  put("S", m.S);
  put("N", m.N);
  put("frozen", m.frozen);
  put("frozen_nu", m.frozen_nu);
  return d;
}

}  // namespace

void bind_optimizers(py::module_& m) {
  bind_common<FOGOTraits>(m, "FOGO")
      .def("telemetry", [](Bound<FOGOTraits>& b) { return telemetry(b.get()); })
      .def("memory", [](Bound<FOGOTraits>& b, size_t g) { return memory(b.get(), g); })
      .def("consolidate", [](Bound<FOGOTraits>& b) { b.get().consolidate(); })
      .def("begin_task", [](Bound<FOGOTraits>& b) { b.get().begin_task(); })
      .def("task_boundary", [](Bound<FOGOTraits>& b) { b.get().task_boundary(); });
  bind_common<MuonTraits>(m, "Muon").def("graph_stats", [](Bound<MuonTraits>& b, size_t g) {
    const fogo::Muon::GraphStats s = b.get().graph_stats(g);
    py::dict d;
    d["captures"] = s.captures;
    d["replays"] = s.replays;
    return d;
  });

  // The presets, from their one table (FOGO_PRESETS); python/fogo/presets.py is made from it.
  m.def("preset_table", [] {
    py::list rows;
    for (const auto& p : fogo::presets::table) rows.append(py::make_tuple(p.name, p.description));
    return rows;
  });
  m.def(
      "preset",
      [](const std::string& name) { return FOGOTraits::to_dict(fogo::presets::by_name(name)); },
      py::arg("name"));
  m.def("options_markdown", &fogo::options_markdown);
}

}  // namespace fogo_py
