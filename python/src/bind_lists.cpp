// The lists that Python iterates rather than keeping copies of (python/fogo/*.py): each is C++'s
// own, so a change to it in C++ reaches Python without a change there.
#include <fogo/fogo.h>
#include <torch/extension.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "fogo_private/fogo/state.h"
#include "traits.h"

namespace fogo_py {

namespace {

// A parameter as Python describes it to the split: (name, shape, embedding weight).
using SplitTuple = std::tuple<std::string, std::vector<int64_t>, bool>;

std::vector<fogo::SplitInput> split_inputs(const std::vector<SplitTuple>& params) {
  std::vector<fogo::SplitInput> inputs;
  for (const auto& [name, sizes, embedding] : params) inputs.push_back({name, sizes, embedding});
  return inputs;
}

// rest_patterns None: the C++ default.
fogo::ParamSplitRules split_rules(const std::optional<std::vector<std::string>>& rest_patterns,
                                  const std::vector<std::string>& matrix_patterns,
                                  bool embeddings_to_rest) {
  fogo::ParamSplitRules rules;
  if (rest_patterns) rules.rest_patterns = *rest_patterns;
  rules.matrix_patterns = matrix_patterns;
  rules.embeddings_to_rest = embeddings_to_rest;
  return rules;
}

}  // namespace

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
  // The published Newton–Schulz coefficient lists (fogo::ns_named_schedules), in their order:
  // per list a dict of its name, rows, source, and the range its tests check (steps, l, lo, hi).
  m.def("ns_named_schedules", [] {
    py::list out;
    for (const fogo::NamedNSSchedule& s : fogo::ns_named_schedules()) {
      py::dict d;
      d["name"] = s.name;
      d["rows"] = Convert<fogo::NSSchedule>::to(s.rows);
      d["source"] = s.source;
      d["steps"] = s.steps;
      d["l"] = s.l;
      d["lo"] = s.lo;
      d["hi"] = s.hi;
      out.append(d);
    }
    return out;
  });
  // The hybrid's split (fogo::matrix_side): per parameter (name, shape, embedding weight),
  // whether it goes to the matrix side; rest_patterns None: the C++ default.
  m.attr("default_rest_patterns") = fogo::ParamSplitRules{}.rest_patterns;
  // Per parameter, its side and the rule that sent it there (fogo::split_routes, which
  // fogo::matrix_side and split_parameters are), and fogo::routing_table's text.
  m.def(
      "split_routes",
      [](const std::vector<SplitTuple>& params,
         const std::optional<std::vector<std::string>>& rest_patterns,
         const std::vector<std::string>& matrix_patterns, bool embeddings_to_rest) {
        std::vector<std::pair<bool, std::string>> out;
        for (const auto& r :
             fogo::split_routes(split_inputs(params),
                                split_rules(rest_patterns, matrix_patterns, embeddings_to_rest)))
          out.emplace_back(r.matrix, r.rule);
        return out;
      },
      py::arg("params"), py::arg("rest_patterns"), py::arg("matrix_patterns"),
      py::arg("embeddings_to_rest"));
  // (name, shape, to matrix side, rule, group, update scale's text, treated as): the last three
  // empty for a route not from an optimizer.
  m.def(
      "routing_table",
      [](const std::vector<std::tuple<std::string, std::vector<int64_t>, bool, std::string,
                                      std::string, std::string, std::string>>& routes) {
        std::vector<fogo::ParamRoute> in;
        for (const auto& [name, sizes, matrix, rule, group, scale, treated] : routes) {
          fogo::UpdateScale update;
          update.text = scale;
          const fogo::ParamRoute r{name, sizes, matrix, rule, group, update, treated};
          in.push_back(r);
        }
        return fogo::routing_table(in);
      },
      py::arg("routes"));
  // fogo::update_scale and, on the matrix side, fogo::treated_as of a param group's options
  // ("muon", "fogo": their option dicts; "adamw": its lr) for a parameter of shape `sizes`:
  // {"lr", "rms_per_lr" (None: no fixed RMS), "text", "treated" ("" for AdamW)}.
  m.def(
      "update_scale",
      [](const std::string& kind, const py::dict& options, const std::vector<int64_t>& sizes) {
        std::unique_ptr<torch::optim::OptimizerOptions> o;
        if (kind == "muon") {
          o = std::make_unique<fogo::MuonOptions>(MuonTraits::from_dict(options, {}));
        } else if (kind == "fogo") {
          o = std::make_unique<fogo::FOGOOptions>(FOGOTraits::from_dict(options, {}));
        } else if (kind == "adamw") {
          o = std::make_unique<torch::optim::AdamWOptions>(options["lr"].cast<double>());
        } else {
          throw py::value_error("update_scale: kind must be 'muon', 'fogo' or 'adamw', got '" +
                                kind + "'");
        }
        const fogo::UpdateScale s = fogo::update_scale(*o, sizes);
        py::dict out;
        out["lr"] = s.lr;
        out["rms_per_lr"] = std::isnan(s.rms_per_lr) ? py::object(py::none())
                                                     : py::object(py::float_(s.rms_per_lr));
        out["text"] = s.text;
        out["treated"] = kind == "adamw" ? std::string() : fogo::treated_as(*o, sizes);
        return out;
      },
      py::arg("kind"), py::arg("options"), py::arg("sizes"));
  // NorMuon's second moment of a parameter (fogo::row_state_sizes, fogo::normuon_dtype): the
  // shape under `batch_dims`, and the dtype.
  m.def(
      "row_state_sizes",
      [](const std::vector<int64_t>& sizes, int64_t batch_dims) {
        return fogo::row_state_sizes(sizes, batch_dims);
      },
      py::arg("sizes"), py::arg("batch_dims"));
  m.def("normuon_dtype", [](const at::Tensor& p) { return fogo::normuon_dtype(p); });
  m.def("shape_key", [](const at::Tensor& p) { return fogo::shape_key("", p); });

  // Sharded steps' owners (fogo::assign_owners by fogo::newton_schulz_cost): each shape's owner
  // rank among `world`, the same on every rank.
  m.def(
      "assign_owners",
      [](const std::vector<std::vector<int64_t>>& shapes, int64_t world) {
        std::vector<double> costs;
        for (const auto& s : shapes) costs.push_back(fogo::newton_schulz_cost(s));
        return fogo::assign_owners(costs, world);
      },
      py::arg("shapes"), py::arg("world"));
}

}  // namespace fogo_py
