#pragma once
// fogo._C's bound optimizer, Bound<Traits>: a C++ optimizer (fogo::FOGO, fogo::Muon) stepping
// the tensors of a Python torch.optim.Optimizer (python/fogo/optim.py).
//
// The Python classes are torch.optim.Optimizers whose param_groups are the truth for options and
// parameters, and whose opt.state holds each parameter's state tensors; the C++ optimizer here
// steps them. Before every call the Python side hands the groups over (sync): the same tensors
// (checked by identity, never copied) and every option, converted by traits.h; and the state
// (adopt_states): the C++ optimizer's state tensors are Python's, taken without a copy (checked
// when they change), so both sides share storage and each step updates opt.state in place.
//
// Checkpoints: what the C++ archive holds besides LibTorch's part (FOGO's per-group memory) goes
// to Python as nested dicts of tensors and numbers (extra_state, archive.h); loading rebuilds a
// LibTorch archive from the state, options and those entries and goes through the C++ load(), so
// its checks and its all-or-nothing behaviour apply unchanged.
#include <fogo/fogo.h>
#include <torch/extension.h>
#include <torch/serialize/archive.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "archive.h"
#include "fogo_private/frame/checks.h"
#include "fogo_private/frame/integrity.h"
#include "traits.h"

namespace fogo_py {

template <class Traits>
class Bound {
 public:
  using Options = typename Traits::Options;
  using State = typename Traits::State;

  explicit Bound(const py::dict& defaults)
      : opt_(std::vector<torch::optim::OptimizerParamGroup>{},
             Traits::from_dict(defaults, Options())) {}

  static py::dict default_options() { return Traits::to_dict(Options()); }
  static Options options_from(const py::dict& d) { return Traits::from_dict(d, Options()); }

  /// Adds a group after the checks the C++ constructor makes (options valid, parameter shapes),
  /// with this group's index in the messages.
  /// Options are checked first (their errors as the C++ raises them); what the constructor then
  /// rejects is a parameter (fewer than 2 dimensions, a CPU tensor with cuda_graph): ValueError,
  /// as torch.optim.Muon raises for a parameter it cannot take. `shapes`, when given (one per
  /// parameter), are what the checks see instead of `params`: an owner-computed parameter's
  /// stand-in is its local rows, but its shape checks (a fused weight's blocks) are the whole
  /// parameter's (fogo/_cpp_optimizer.py, _shape_probes).
  void add_param_group(const std::vector<at::Tensor>& params, const py::dict& options,
                       const std::optional<std::vector<at::Tensor>>& shapes) {
    const Options o = options_from(options);
    o.validate();
    if (shapes && shapes->size() != params.size())
      throw py::value_error("add_param_group: " + std::to_string(shapes->size()) + " shapes for " +
                            std::to_string(params.size()) + " parameters");
    try {
      std::vector<torch::optim::OptimizerParamGroup> probe;
      for (size_t g = 0; g < opt_.param_groups().size(); ++g)
        probe.emplace_back(std::vector<at::Tensor>{}, std::make_unique<Options>());
      probe.emplace_back(shapes ? *shapes : params, std::make_unique<Options>(o));
      typename Traits::Optim check(probe, o);
    } catch (const c10::Error& e) {
      throw py::value_error(e.what_without_backtrace());
    }
    opt_.add_param_group(torch::optim::OptimizerParamGroup(params, std::make_unique<Options>(o)));
  }

  /// The Python groups' parameters and options into the C++ groups.
  void sync(const py::list& groups) {
    auto& mine = opt_.param_groups();
    if (py::len(groups) != mine.size())
      throw std::runtime_error(std::string("fogo.") + Traits::name + ": " +
                               std::to_string(py::len(groups)) + " param groups, but " +
                               std::to_string(mine.size()) +
                               " were added through add_param_group; add groups with "
                               "add_param_group, never by appending to param_groups");
    std::vector<Options> options;
    for (size_t g = 0; g < mine.size(); ++g) {
      const auto group = groups[g].cast<py::dict>();
      const auto params = group["params"].cast<py::list>();
      const auto& cpp = mine[g].params();
      bool same = py::len(params) == cpp.size();
      for (size_t i = 0; same && i < cpp.size(); ++i) {
        same = THPVariable_Check(params[i].ptr()) &&
               THPVariable_Unpack(params[i].ptr()).unsafeGetTensorImpl() ==
                   cpp[i].unsafeGetTensorImpl();
      }
      if (!same)
        throw std::runtime_error(std::string("fogo.") + Traits::name + ": param_groups[" +
                                 std::to_string(g) +
                                 "]['params'] changed since the group was added; parameters "
                                 "can only be added, in a new group (add_param_group)");
      options.push_back(Traits::from_dict(group, static_cast<const Options&>(mine[g].options())));
    }
    for (size_t g = 0; g < mine.size(); ++g) {
      static_cast<Options&>(mine[g].options()) = std::move(options[g]);
      Traits::sync_group(opt_, g, groups[g].cast<py::dict>());
    }
  }

  /// One step; `decided`: the decision Python took for it (python/fogo/_nonfinite.py), when
  /// the step is part of a larger one.
  void step(const std::optional<fogo::NonFiniteDecision>& decided) {
    fogo::StepContext context;
    context.decided = decided;
    py::gil_scoped_release no_gil;
    opt_.step_with(context);
  }

  /// The archive's entries other than LibTorch's (FOGO's per-group memory), as plain Python
  /// (copies); the per-parameter state is Python's opt.state, shared with the step.
  py::dict extra_state() const {
    py::dict extra;
    torch::serialize::OutputArchive out;
    opt_.save(out);
    torch::serialize::InputArchive in = reopen(out);
    for (const std::string& key : in.keys())
      if (!is_libtorch_key(key) && !is_file_only_key(key))
        extra[py::str(key)] = archive_value_to_py(in, key);
    return extra;
  }

  /// Every parameter's state tensors, the optimizer's own (no copies): per group a list with a
  /// {name: tensor} dict per parameter, None where it has none.
  py::list param_states() const {
    py::list out;
    for (const auto& group : opt_.param_groups()) {
      py::list row;
      for (const auto& p : group.params()) {
        const auto it = opt_.state().find(p.unsafeGetTensorImpl());
        if (it == opt_.state().end()) {
          row.append(py::none());
          continue;
        }
        py::dict d;
        const auto tensors = Traits::state_tensors(static_cast<const State&>(*it->second));
        for (size_t k = 0; k < tensors.size(); ++k)
          if (tensors[k].defined()) d[Traits::state_keys[k]] = tensors[k];
        row.append(d);
      }
      out.append(row);
    }
    return out;
  }

  /// Makes `states` (param_states' layout, a dict per parameter) the optimizer's state, tensor
  /// by tensor without copying, so that Python's opt.state and the C++ step share storage. A
  /// tensor the optimizer already holds is taken as it is; another is checked first (the state's
  /// shape, dtype and device, traits.h; contiguous where the parameter is), all before anything
  /// changes. An optional tensor absent from a dict is absent from the state.
  void adopt_states(const py::list& states) {
    auto& groups = opt_.param_groups();
    auto& map = opt_.state();
    std::vector<std::pair<void*, State>> adopted;
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto row = states[g].template cast<py::list>();
      const auto& params = groups[g].params();
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& p = params[i];
        State s = Traits::state_from_dict(row[i].template cast<py::dict>());
        const auto mine = map.find(p.unsafeGetTensorImpl());
        const auto theirs = Traits::state_tensors(s);
        if (mine != map.end()) {
          const auto held = Traits::state_tensors(static_cast<const State&>(*mine->second));
          bool same = true;
          for (size_t k = 0; k < held.size(); ++k)
            same = same && held[k].unsafeGetTensorImpl() == theirs[k].unsafeGetTensorImpl();
          if (same) continue;
        }
        const int64_t batch_dims =
            static_cast<const typename Traits::Options&>(groups[g].options()).batch_dims();
        for (size_t k = 0; k < theirs.size(); ++k)
          if (Traits::required(k) || theirs[k].defined())
            check_state(g, i, p, k, theirs[k], batch_dims);
        adopted.emplace_back(p.unsafeGetTensorImpl(), std::move(s));
      }
    }
    for (auto& [key, s] : adopted) map[key] = std::make_unique<State>(std::move(s));
  }

  /// `groups`: the checkpoint's option dicts, one per group (same layout as this optimizer's,
  /// checked by the caller); `state`: {(group, index): {name: tensor}}; `extra`: state_dict's.
  void load_state_dict(const py::list& groups, const py::dict& state, const py::dict& extra) {
    const auto& mine = opt_.param_groups();
    torch::serialize::OutputArchive out;
    out.write("pytorch_version", c10::IValue("1.5.0"));
    torch::serialize::OutputArchive state_archive(out.compilation_unit());
    for (const auto item : state) {
      const py::handle key = item.first, value = item.second;
      const auto [g, i] = key.cast<std::pair<size_t, size_t>>();
      torch::serialize::OutputArchive a(out.compilation_unit());
      Traits::state_from_dict(value.cast<py::dict>()).serialize(a);
      state_archive.write(param_key(mine.at(g).params().at(i)), a);
    }
    out.write("state", state_archive);
    torch::serialize::OutputArchive groups_archive(out.compilation_unit());
    groups_archive.write("param_groups/size", torch::tensor(static_cast<int64_t>(mine.size())));
    for (size_t g = 0; g < mine.size(); ++g) {
      torch::serialize::OutputArchive a(out.compilation_unit());
      const auto& params = mine[g].params();
      a.write("params/size", torch::tensor(static_cast<int64_t>(params.size())));
      for (size_t i = 0; i < params.size(); ++i)
        a.write("params/" + std::to_string(i), c10::IValue(param_key(params[i])));
      torch::serialize::OutputArchive options(out.compilation_unit());
      options_from(groups[g].cast<py::dict>()).serialize(options);
      a.write("options", options);
      groups_archive.write("param_groups/" + std::to_string(g), a);
    }
    out.write("param_groups", groups_archive);
    for (const auto item : extra) {
      const auto key = item.first.cast<std::string>();
      if (!is_file_only_key(key)) py_to_archive(out, key, item.second);
    }
    out.write(fogo::detail::kInMemoryArchive, c10::IValue(true));
    torch::serialize::InputArchive in = reopen(out);
    opt_.load(in);
  }

  typename Traits::Optim& get() { return opt_; }
  const typename Traits::Optim& get() const { return opt_; }

 private:
  /// `batch_dims`: the group's (a per-row state has the parameter's leading batch_dims + 1
  /// dimensions).
  static void check_state(size_t g, size_t i, const at::Tensor& p, size_t k, const at::Tensor& t,
                          int64_t batch_dims) {
    const char* key = Traits::state_keys[k];
    const auto fail = [&](const std::string& what) {
      throw py::value_error(std::string("fogo.") + Traits::name + ": opt.state[p]['" + key +
                            "'] of " + fogo::detail::describe_param(g, i, p) + " " + what +
                            " (load_state_dict converts a checkpoint's state; tensors put into "
                            "opt.state by hand must match the parameter)");
    };
    if (!t.defined()) fail("is undefined");
    const std::vector<int64_t> sizes = Traits::state_sizes(p, k, batch_dims);
    if (t.sizes() != at::IntArrayRef(sizes))
      fail("has shape " + c10::str(t.sizes()) + ", expected " + c10::str(at::IntArrayRef(sizes)) +
           " for the parameter's " + c10::str(p.sizes()));
    if (t.device() != p.device())
      fail("is on " + t.device().str() + ", the parameter on " + p.device().str());
    if (t.scalar_type() != Traits::state_dtype(p, k))
      fail("has dtype " + std::string(c10::toString(t.scalar_type())) + ", expected " +
           c10::toString(Traits::state_dtype(p, k)));
    if (p.is_contiguous() && !t.is_contiguous()) fail("is not contiguous");
  }

  typename Traits::Optim opt_;
};

/// The methods both optimizers' classes have.
template <class Traits>
py::class_<Bound<Traits>> bind_common(py::module_& m, const char* name) {
  using B = Bound<Traits>;
  return py::class_<B>(m, name)
      .def(py::init<const py::dict&>())
      .def_static("default_options", &B::default_options)
      .def_static("normalize_options",
                  [](const py::dict& d) {
                    auto o = B::options_from(d);
                    o.validate();
                    return Traits::to_dict(o);
                  })
      .def_static("archive_option_keys",
                  [] { return archive_option_keys(typename Traits::Options()); })
      .def("add_param_group", &B::add_param_group, py::arg("params"), py::arg("options"),
           py::arg("shapes") = py::none())
      .def("sync", &B::sync)
      .def("step", &B::step, py::arg("decided") = py::none())
      .def("maskable", [](const B& b, size_t g) { return b.get().maskable(g); })
      .def("extra_state", &B::extra_state)
      .def("param_states", &B::param_states)
      .def("adopt_states", &B::adopt_states)
      .def("load_state_dict", &B::load_state_dict);
}

}  // namespace fogo_py
