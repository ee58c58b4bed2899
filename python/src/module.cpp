// fogo._C: the C++ optimizers behind fogo.FOGO and fogo.Muon (python/fogo/optim.py).
//
// The Python classes are torch.optim.Optimizers whose param_groups are the truth for options and
// parameters, and whose opt.state holds each parameter's state tensors; the C++ optimizer here
// steps them. Before every call the Python side hands the groups over (sync): the same tensors
// (checked by identity, never copied) and every option, converted by the tables below; and the
// state (adopt_states): the C++ optimizer's state tensors are Python's, taken without a copy
// (checked when they change), so both sides share storage and each step updates opt.state in
// place. FOGO's options come from the X-macro tables of fogo_options.h, so a new option reaches
// Python with its C++ default without touching this file.
//
// Checkpoints: what the C++ archive holds besides LibTorch's part (FOGO's per-group memory) goes
// to Python as nested dicts of tensors and numbers (extra_state); loading rebuilds a LibTorch
// archive from the state, options and those entries and goes through the C++ load(), so its
// checks and its all-or-nothing behaviour apply unchanged.
#include <fogo/detail/checks.h>
#include <fogo/detail/integrity.h>
#include <fogo/fogo.h>
#include <torch/csrc/Dtype.h>
#include <torch/extension.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <array>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// ---------------------------------------------------------------------------------------------
// Option values between Python and C++

[[noreturn]] void bad_type(const char* optimizer, const char* option, const char* expected,
                           const py::handle& value) {
  throw py::type_error(std::string(optimizer) + ": option '" + option + "' must be " + expected +
                       ", got " + py::repr(value).cast<std::string>());
}

template <class E>
struct EnumNames;
template <>
struct EnumNames<fogo::ProjectionScale> {
  static constexpr std::pair<const char*, fogo::ProjectionScale> values[] = {
      {"unit", fogo::ProjectionScale::Unit}, {"jl", fogo::ProjectionScale::JL}};
};
template <>
struct EnumNames<fogo::NonFinitePolicy> {
  static constexpr std::pair<const char*, fogo::NonFinitePolicy> values[] = {
      {"raise", fogo::NonFinitePolicy::Raise},
      {"skip", fogo::NonFinitePolicy::Skip},
      {"unchecked", fogo::NonFinitePolicy::Unchecked},
      {"mask", fogo::NonFinitePolicy::Mask}};
};
template <>
struct EnumNames<fogo::NSForm> {
  static constexpr std::pair<const char*, fogo::NSForm> values[] = {
      {"plain", fogo::NSForm::Plain},
      {"gram", fogo::NSForm::Gram},
      {"auto", fogo::NSForm::Auto},
      {"default", fogo::NSForm::Default}};
};
template <>
struct EnumNames<fogo::MuonAdjustLR> {
  static constexpr std::pair<const char*, fogo::MuonAdjustLR> values[] = {
      {"original", fogo::MuonAdjustLR::Original},
      {"match_rms_adamw", fogo::MuonAdjustLR::MatchRmsAdamW},
      {"spectral", fogo::MuonAdjustLR::Spectral}};
};

template <class T>
struct Convert;

template <>
struct Convert<double> {
  static py::object to(double v) { return py::float_(v); }
  static double from(const py::handle& v, const char* opt, const char* name) {
    // Numbers and anything with __float__ (a 0-d tensor from a scheduler, numpy scalars).
    if (PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr())) bad_type(opt, name, "a number", v);
    double out = PyFloat_AsDouble(v.ptr());
    if (out == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      bad_type(opt, name, "a number", v);
    }
    return out;
  }
};

template <>
struct Convert<int64_t> {
  static py::object to(int64_t v) { return py::int_(v); }
  static int64_t from(const py::handle& v, const char* opt, const char* name) {
    if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr())) bad_type(opt, name, "an integer", v);
    const py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
    int overflow = 0;
    const long long out = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (overflow != 0) bad_type(opt, name, "an integer that fits in 64 bits", v);
    return out;
  }
};

template <>
struct Convert<bool> {
  static py::object to(bool v) { return py::bool_(v); }
  static bool from(const py::handle& v, const char* opt, const char* name) {
    if (!PyBool_Check(v.ptr())) bad_type(opt, name, "True or False", v);
    return v.ptr() == Py_True;
  }
};

template <>
struct Convert<std::tuple<double, double, double>> {
  using T = std::tuple<double, double, double>;
  static py::object to(const T& v) {
    return py::make_tuple(std::get<0>(v), std::get<1>(v), std::get<2>(v));
  }
  static T from(const py::handle& v, const char* opt, const char* name) {
    if (!py::isinstance<py::sequence>(v) || PyUnicode_Check(v.ptr()) || py::len(v) != 3)
      bad_type(opt, name, "a sequence of three numbers (a, b, c)", v);
    const auto s = py::reinterpret_borrow<py::sequence>(v);
    return {Convert<double>::from(s[0], opt, name), Convert<double>::from(s[1], opt, name),
            Convert<double>::from(s[2], opt, name)};
  }
};

// ns_dtype: a torch.dtype, or "auto" (fogo::kNSDtypeAuto, the default).
template <>
struct Convert<c10::ScalarType> {
  static py::object to(c10::ScalarType v) {
    if (v == fogo::kNSDtypeAuto) return py::str("auto");
    return py::cast(v);  // a torch.dtype
  }
  static c10::ScalarType from(const py::handle& v, const char* opt, const char* name) {
    if (THPDtype_Check(v.ptr())) return reinterpret_cast<THPDtype*>(v.ptr())->scalar_type;
    if (PyUnicode_Check(v.ptr()) && v.cast<std::string>() == "auto") return fogo::kNSDtypeAuto;
    bad_type(opt, name,
             "a torch.dtype (torch.bfloat16, torch.float32 or torch.float64) or \"auto\"", v);
  }
};

template <class E>
struct ConvertEnum {
  static py::object to(E v) {
    for (const auto& [n, e] : EnumNames<E>::values)
      if (e == v) return py::str(n);
    return py::int_(static_cast<int64_t>(v));
  }
  static E from(const py::handle& v, const char* opt, const char* name) {
    std::string expected = "one of";
    for (const auto& [n, e] : EnumNames<E>::values) expected += std::string(" '") + n + "'";
    if (!PyUnicode_Check(v.ptr())) bad_type(opt, name, expected.c_str(), v);
    const std::string s = v.cast<std::string>();
    for (const auto& [n, e] : EnumNames<E>::values)
      if (s == n) return e;
    throw py::value_error(std::string(opt) + ": option '" + name + "' must be " + expected +
                          ", got '" + s + "'");
  }
};
template <>
struct Convert<fogo::ProjectionScale> : ConvertEnum<fogo::ProjectionScale> {};
template <>
struct Convert<fogo::NonFinitePolicy> : ConvertEnum<fogo::NonFinitePolicy> {};
template <>
struct Convert<fogo::NSForm> : ConvertEnum<fogo::NSForm> {};
template <>
struct Convert<fogo::MuonAdjustLR> : ConvertEnum<fogo::MuonAdjustLR> {
  static fogo::MuonAdjustLR from(const py::handle& v, const char* opt, const char* name) {
    if (v.is_none()) return fogo::MuonAdjustLR::Original;  // torch.optim.Muon's None
    return ConvertEnum<fogo::MuonAdjustLR>::from(v, opt, name);
  }
};

template <class T>
using Plain = std::decay_t<T>;

// ---------------------------------------------------------------------------------------------
// The options tables, per optimizer: names, defaults, dict <-> options.

// A parameter's state tensor `key` from a Python dict, with a message naming what is missing.
at::Tensor tensor_item(const char* optimizer, const py::dict& d, const char* key) {
  if (!d.contains(key))
    throw py::key_error(std::string("fogo.") + optimizer + ": a parameter's state has no '" + key +
                        "'");
  const py::object v = d[key];
  if (!THPVariable_Check(v.ptr()))
    throw py::type_error(std::string("fogo.") + optimizer + ": a parameter's state '" + key +
                         "' must be a tensor, got " + py::repr(v).cast<std::string>());
  return THPVariable_Unpack(v.ptr());
}

struct FOGOTraits {
  using Optim = fogo::FOGO;
  using Options = fogo::FOGOOptions;
  using State = fogo::FOGOParamState;
  static constexpr const char* name = "FOGO";

  static py::dict to_dict(const Options& o) {
    py::dict d;
#define FOGO_PY_TO(T, field, ...) d[#field] = Convert<Plain<decltype(o.field())>>::to(o.field());
    FOGO_RANGED_OPTIONS(FOGO_PY_TO)
    FOGO_PLAIN_OPTIONS(FOGO_PY_TO)
    FOGO_ENUM_OPTIONS(FOGO_PY_TO)
#undef FOGO_PY_TO
    return d;
  }
  static Options from_dict(const py::dict& d, Options o) {
#define FOGO_PY_FROM(T, field, ...) \
  if (d.contains(#field))           \
    o.field(Convert<Plain<decltype(o.field())>>::from(d[#field], name, #field));
    FOGO_RANGED_OPTIONS(FOGO_PY_FROM)
    FOGO_PLAIN_OPTIONS(FOGO_PY_FROM)
    FOGO_ENUM_OPTIONS(FOGO_PY_FROM)
#undef FOGO_PY_FROM
    return o;
  }
  static constexpr std::array<const char*, 2> state_keys = {"slow_momentum", "fast_momentum"};
  static std::vector<at::Tensor> state_tensors(const State& s) {
    return {s.slow_momentum(), s.fast_momentum()};
  }
  static State state_from_dict(const py::dict& d) {
    State s;
    s.slow_momentum(tensor_item(name, d, "slow_momentum"));
    s.fast_momentum(tensor_item(name, d, "fast_momentum"));
    return s;
  }
  /// The momenta are fp32 whatever the parameter's dtype (FOGOParamState).
  static c10::ScalarType state_dtype(const at::Tensor&) { return at::kFloat; }
  /// FOGO takes a Tensor lr's value (its step's arithmetic is in double; no torch reference).
  static void sync_group(Optim&, size_t, const py::dict&) {}
};

// The param-group key of a MuonOptions field: torch.optim.Muon's name where it has one
// (adjust_lr_fn), so that param groups and checkpoints cross with torch.optim.Muon.
constexpr const char* muon_key(std::string_view field) {
  return field == "adjust_lr" ? "adjust_lr_fn" : field.data();
}

struct MuonTraits {
  using Optim = fogo::Muon;
  using Options = fogo::MuonOptions;
  using State = fogo::MuonParamState;
  static constexpr const char* name = "Muon";

  static py::dict to_dict(const Options& o) {
    py::dict d;
#define FOGO_PY_TO(T, field, ...) \
  d[muon_key(#field)] = Convert<Plain<decltype(o.field())>>::to(o.field());
    FOGO_MUON_OPTIONS(FOGO_PY_TO)
#undef FOGO_PY_TO
    return d;
  }
  static Options from_dict(const py::dict& d, Options o) {
#define FOGO_PY_FROM(T, field, ...) \
  if (d.contains(muon_key(#field))) \
    o.field(Convert<Plain<decltype(o.field())>>::from(d[muon_key(#field)], name, muon_key(#field)));
    FOGO_MUON_OPTIONS(FOGO_PY_FROM)
#undef FOGO_PY_FROM
    return o;
  }
  static constexpr std::array<const char*, 1> state_keys = {"momentum_buffer"};
  static std::vector<at::Tensor> state_tensors(const State& s) { return {s.momentum_buffer()}; }
  static State state_from_dict(const py::dict& d) {
    State s;
    s.momentum_buffer(tensor_item(name, d, "momentum_buffer"));
    return s;
  }
  /// The buffer has the parameter's dtype (torch.optim.Muon's zeros_like(grad)).
  static c10::ScalarType state_dtype(const at::Tensor& p) { return p.scalar_type(); }
  /// A Tensor lr: torch.optim.Muon computes with it in its dtype, and so does the step.
  static void sync_group(Optim& opt, size_t g, const py::dict& group) {
    opt.set_lr_dtype(g, lr_dtype(group));
  }
  static at::ScalarType lr_dtype(const py::dict& group) {
    if (!group.contains("lr")) return at::kDouble;
    const py::object lr = group["lr"];
    return THPVariable_Check(lr.ptr()) ? THPVariable_Unpack(lr.ptr()).scalar_type() : at::kDouble;
  }
};

// ---------------------------------------------------------------------------------------------
// Archives <-> plain Python

std::string param_key(const at::Tensor& p) {
  return std::to_string(reinterpret_cast<size_t>(p.unsafeGetTensorImpl()));
}

torch::serialize::InputArchive reopen(const torch::serialize::OutputArchive& out) {
  std::stringstream buffer;
  const_cast<torch::serialize::OutputArchive&>(out).save_to(buffer);
  torch::serialize::InputArchive in;
  in.load_from(buffer);
  return in;
}

py::object archive_value_to_py(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  a.read(key, v);
  if (v.isTensor()) return py::cast(v.toTensor());
  if (v.isBool()) return py::bool_(v.toBool());
  if (v.isInt()) return py::int_(v.toInt());
  if (v.isDouble()) return py::float_(v.toDouble());
  if (v.isString()) return py::str(v.toStringRef());
  if (v.isObject()) {
    torch::serialize::InputArchive sub;
    a.read(key, sub);
    py::dict d;
    for (const std::string& k : sub.keys()) {
      if (k == "training") continue;  // the archive's module flag, not data
      d[py::str(k)] = archive_value_to_py(sub, k);
    }
    return d;
  }
  throw std::runtime_error("fogo: checkpoint entry '" + key + "' has an unsupported type " +
                           v.tagKind());
}

void py_to_archive(torch::serialize::OutputArchive& a, const std::string& key,
                   const py::handle& value) {
  if (THPVariable_Check(value.ptr())) {
    a.write(key, value.cast<at::Tensor>(), /*is_buffer=*/true);
  } else if (PyBool_Check(value.ptr())) {
    a.write(key, c10::IValue(value.ptr() == Py_True));
  } else if (PyLong_Check(value.ptr())) {
    a.write(key, c10::IValue(value.cast<int64_t>()));
  } else if (PyFloat_Check(value.ptr())) {
    a.write(key, c10::IValue(value.cast<double>()));
  } else if (PyUnicode_Check(value.ptr())) {
    a.write(key, c10::IValue(value.cast<std::string>()));
  } else if (PyDict_Check(value.ptr())) {
    torch::serialize::OutputArchive sub(a.compilation_unit());
    for (const auto& [k, v] : py::reinterpret_borrow<py::dict>(value))
      py_to_archive(sub, k.cast<std::string>(), v);
    a.write(key, sub);
  } else {
    throw py::type_error("fogo: state_dict entry '" + key +
                         "' must be a tensor, number, string or dict, got " +
                         py::repr(value).cast<std::string>());
  }
}

// The LibTorch part of an optimizer archive: handled by hand (it is keyed by tensor addresses).
bool is_libtorch_key(const std::string& key) {
  return key == "pytorch_version" || key == "state" || key == "param_groups" || key == "training";
}

// A file's checksum (fogo/checksum, muon/checksum) describes an archive on a disk; a state dict
// is live Python objects (its tensors are the optimizer's own), so it carries none, and its
// archive is marked as built in memory when it is loaded (detail::kInMemoryArchive).
bool is_file_only_key(const std::string& key) {
  const std::string suffix = "/checksum";
  return key == fogo::detail::kInMemoryArchive ||
         (key.size() >= suffix.size() &&
          key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0);
}

// ---------------------------------------------------------------------------------------------
// The bound optimizer

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
  /// as torch.optim.Muon raises for a parameter it cannot take.
  void add_param_group(const std::vector<at::Tensor>& params, const py::dict& options) {
    const Options o = options_from(options);
    o.validate();
    try {
      std::vector<torch::optim::OptimizerParamGroup> probe;
      for (size_t g = 0; g < opt_.param_groups().size(); ++g)
        probe.emplace_back(std::vector<at::Tensor>{}, std::make_unique<Options>());
      probe.emplace_back(params, std::make_unique<Options>(o));
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
        for (size_t k = 0; k < tensors.size(); ++k) d[Traits::state_keys[k]] = tensors[k];
        row.append(d);
      }
      out.append(row);
    }
    return out;
  }

  /// Makes `states` (param_states' layout, a dict per parameter) the optimizer's state, tensor
  /// by tensor without copying, so that Python's opt.state and the C++ step share storage. A
  /// tensor the optimizer already holds is taken as it is; another is checked first (the
  /// parameter's shape and device, the state's dtype, contiguous where the parameter is), all
  /// before anything changes.
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
        for (size_t k = 0; k < theirs.size(); ++k)
          check_state(g, i, p, Traits::state_keys[k], theirs[k]);
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
  static void check_state(size_t g, size_t i, const at::Tensor& p, const char* key,
                          const at::Tensor& t) {
    const auto fail = [&](const std::string& what) {
      throw py::value_error(std::string("fogo.") + Traits::name + ": opt.state[p]['" + key +
                            "'] of " + fogo::detail::describe_param(g, i, p) + " " + what +
                            " (load_state_dict converts a checkpoint's state; tensors put into "
                            "opt.state by hand must match the parameter)");
    };
    if (!t.defined()) fail("is undefined");
    if (t.sizes() != p.sizes())
      fail("has shape " + c10::str(t.sizes()) + ", the parameter " + c10::str(p.sizes()));
    if (t.device() != p.device())
      fail("is on " + t.device().str() + ", the parameter on " + p.device().str());
    if (t.scalar_type() != Traits::state_dtype(p))
      fail("has dtype " + std::string(c10::toString(t.scalar_type())) + ", expected " +
           c10::toString(Traits::state_dtype(p)));
    if (p.is_contiguous() && !t.is_contiguous()) fail("is not contiguous");
  }

  typename Traits::Optim opt_;
};

py::list telemetry(const fogo::FOGO& opt) {
  py::list out;
  for (const fogo::FOGOTelemetry& t : opt.telemetry()) {
    py::dict d;
    d["step"] = t.step;
    d["rbar"] = t.rbar;
    d["gamma_st"] = t.gamma_st;
    d["frac_conflicting"] = t.frac_conflicting;
    d["frac_over_aligned"] = t.frac_over_aligned;
    d["frac_lt_protected"] = t.frac_lt_protected;
    d["codebook_entropy"] = t.codebook_entropy;
    d["live_centroids"] = t.live_centroids;
    d["delta_ratio"] = t.delta_ratio;
    d["frozen"] = t.frozen;
    d["skipped_steps"] = t.skipped_steps;
    d["graph_captures"] = t.graph_captures;
    d["graph_replays"] = t.graph_replays;
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

std::vector<std::string> archive_option_keys(const torch::optim::OptimizerOptions& o) {
  torch::serialize::OutputArchive out;
  o.serialize(out);
  torch::serialize::InputArchive in = reopen(out);
  std::vector<std::string> keys;
  for (const auto& k : in.keys())
    if (k != "training") keys.push_back(k);
  return keys;
}

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
      .def("add_param_group", &B::add_param_group)
      .def("sync", &B::sync)
      .def("step", &B::step, py::arg("decided") = py::none())
      .def("maskable", [](const B& b, size_t g) { return b.get().maskable(g); })
      .def("extra_state", &B::extra_state)
      .def("param_states", &B::param_states)
      .def("adopt_states", &B::adopt_states)
      .def("load_state_dict", &B::load_state_dict);
}

}  // namespace

// fogo._testing (python/tests/testing_module.cpp) compiles this file for the conversions above,
// without this module.
#ifndef FOGO_PY_CONVERSIONS_ONLY

// python/src/nonfinite.cpp.
void bind_nonfinite(py::module_& m,
                    const std::function<fogo::NonFinitePolicy(const py::handle&)>& policy_from);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fogo's C++ optimizers (use fogo.FOGO and fogo.Muon)";

  // C++ errors as Python exceptions with the C++ message (without LibTorch's backtrace).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });

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

  bind_nonfinite(m, [](const py::handle& v) {
    return Convert<fogo::NonFinitePolicy>::from(v, "decide_nonfinite", "policies");
  });
  m.attr("default_rest_patterns") = fogo::ParamSplitRules{}.rest_patterns;
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
  m.def("shape_key", [](const at::Tensor& p) { return fogo::shape_key("", p); });
  m.def("options_markdown", &fogo::options_markdown);
  m.def("cuda_kernels", [] {
#ifdef FOGO_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
}

#endif  // FOGO_PY_CONVERSIONS_ONLY
