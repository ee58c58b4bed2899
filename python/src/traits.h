#pragma once
// fogo._C's view of each C++ optimizer (FOGOTraits, MuonTraits): its options as a param-group
// dict (from the X-macro tables of fogo_options.h and muon_options.h, so a new option reaches
// Python with its C++ default without a change here) and its per-parameter state as a dict of
// tensors: state_keys names them, state_sizes and state_dtype say what each must be, and an
// optional one (required false: Muon's NorMuon second moment) may be absent (undefined in C++).
#include <fogo/fogo.h>
#include <fogo/matrix_view.h>
#include <torch/extension.h>

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "convert.h"
#include "fogo_private/muon/normuon.h"

namespace fogo_py {

// A parameter's state tensor `key` from a Python dict, with a message naming what is missing;
// an undefined tensor where an optional one (`required` false) is absent or None.
inline at::Tensor tensor_item(const char* optimizer, const py::dict& d, const char* key,
                              bool required = true) {
  if (!required && (!d.contains(key) || d[key].is_none())) return at::Tensor();
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
    FOGO_OPTIONS(FOGO_PY_TO)
#undef FOGO_PY_TO
    return d;
  }
  static Options from_dict(const py::dict& d, Options o) {
#define FOGO_PY_FROM(T, field, ...) \
  if (d.contains(#field))           \
    o.field(Convert<Plain<decltype(o.field())>>::from(d[#field], name, #field));
    FOGO_OPTIONS(FOGO_PY_FROM)
#undef FOGO_PY_FROM
    return o;
  }
  /// NorMuon's second moment only where the C++ state has one, as Muon's.
  static constexpr std::array<const char*, 3> state_keys = {"slow_momentum", "fast_momentum",
                                                            "second_moment"};
  static std::vector<at::Tensor> state_tensors(const State& s) {
    return {s.slow_momentum(), s.fast_momentum(), s.second_moment()};
  }
  static State state_from_dict(const py::dict& d) {
    State s;
    s.slow_momentum(tensor_item(name, d, "slow_momentum"));
    s.fast_momentum(tensor_item(name, d, "fast_momentum"));
    s.second_moment(tensor_item(name, d, "second_moment", required(2)));
    return s;
  }
  static bool required(size_t k) { return k < 2; }
  /// The momenta are the parameter's shape, fp32 whatever its dtype (FOGOParamState); the second
  /// moment one per row of each matrix (row_state_sizes), in normuon_dtype.
  static std::vector<int64_t> state_sizes(const at::Tensor& p, size_t k, int64_t batch_dims) {
    return k < 2 ? p.sizes().vec() : fogo::row_state_sizes(p.sizes(), batch_dims);
  }
  static c10::ScalarType state_dtype(const at::Tensor& p, size_t k) {
    return k < 2 ? at::kFloat : fogo::normuon_dtype(p);
  }
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
  /// NorMuon's second moment only where the C++ state has one (normuon on at some step; the
  /// Python side makes it from construction where normuon is on).
  static constexpr std::array<const char*, 2> state_keys = {"momentum_buffer", "second_moment"};
  static std::vector<at::Tensor> state_tensors(const State& s) {
    return {s.momentum_buffer(), s.second_moment()};
  }
  static State state_from_dict(const py::dict& d) {
    State s;
    s.momentum_buffer(tensor_item(name, d, "momentum_buffer"));
    s.second_moment(tensor_item(name, d, "second_moment", required(1)));
    return s;
  }
  static bool required(size_t k) { return k == 0; }
  /// The buffer is the parameter's shape and dtype (torch.optim.Muon's zeros_like(grad)); the
  /// second moment one per row of each matrix (row_state_sizes), in normuon_dtype (fp32; fp64 for
  /// an fp64 parameter).
  static std::vector<int64_t> state_sizes(const at::Tensor& p, size_t k, int64_t batch_dims) {
    return k == 0 ? p.sizes().vec() : fogo::row_state_sizes(p.sizes(), batch_dims);
  }
  static c10::ScalarType state_dtype(const at::Tensor& p, size_t k) {
    return k == 0 ? p.scalar_type() : fogo::normuon_dtype(p);
  }
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

}  // namespace fogo_py
