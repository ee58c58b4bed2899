#pragma once
// Option values between Python and C++ (fogo._C): Convert<T>::to (C++ -> Python) and
// Convert<T>::from (Python -> C++, a TypeError or ValueError naming the optimizer and the option)
// for every type an option table holds (fogo_options.h, muon_options.h).
#include <fogo/enum_names.h>
#include <fogo/fogo.h>
#include <torch/csrc/Dtype.h>
#include <torch/extension.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace fogo_py {

namespace py = pybind11;

[[noreturn]] inline void bad_type(const char* optimizer, const char* option, const char* expected,
                                  const py::handle& value) {
  throw py::type_error(std::string(optimizer) + ": option '" + option + "' must be " + expected +
                       ", got " + py::repr(value).cast<std::string>());
}

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

// Muon's blocks: a list (or tuple) of integers, each row count of a block.
template <>
struct Convert<std::vector<int64_t>> {
  static py::object to(const std::vector<int64_t>& v) {
    py::list out;
    for (const int64_t x : v) out.append(x);
    return out;  // moved: a local converted to the return type (C++20 implicit move)
  }
  static std::vector<int64_t> from(const py::handle& v, const char* opt, const char* name) {
    if (!(PyList_Check(v.ptr()) || PyTuple_Check(v.ptr())))
      bad_type(opt, name, "a list of integers (row counts)", v);
    std::vector<int64_t> out;
    for (const py::handle x : py::reinterpret_borrow<py::sequence>(v))
      out.push_back(Convert<int64_t>::from(x, opt, name));
    return out;
  }
};

// ns_coefficient_schedule: a list (or tuple) of (a, b, c) rows, one per Newton–Schulz iteration;
// as a list of tuples. A row that is not three numbers is refused here, naming the option; the
// numbers' finiteness and the row count by the option's rule (options_table.h).
template <>
struct Convert<fogo::NSSchedule> {
  static py::object to(const fogo::NSSchedule& v) {
    py::list out;
    for (const auto& [a, b, c] : v) out.append(py::make_tuple(a, b, c));
    return out;  // moved: a local converted to the return type (C++20 implicit move)
  }
  static fogo::NSSchedule from(const py::handle& v, const char* opt, const char* name) {
    const char* expected = "a list of (a, b, c) rows, one per Newton–Schulz iteration";
    if (!(PyList_Check(v.ptr()) || PyTuple_Check(v.ptr()))) bad_type(opt, name, expected, v);
    fogo::NSSchedule out;
    for (const py::handle row : py::reinterpret_borrow<py::sequence>(v)) {
      if (!py::isinstance<py::sequence>(row) || PyUnicode_Check(row.ptr()) || py::len(row) != 3)
        bad_type(opt, name, expected, v);
      const auto abc = Convert<std::tuple<double, double, double>>::from(row, opt, name);
      out.push_back({std::get<0>(abc), std::get<1>(abc), std::get<2>(abc)});
    }
    return out;
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

// An enumeration by its name (fogo/enum_names.h).
template <class E>
struct ConvertEnum {
  static py::object to(E v) {
    if (const char* name = fogo::enum_name(v)) return py::str(name);
    return py::int_(static_cast<int64_t>(v));
  }
  static E from(const py::handle& v, const char* opt, const char* name) {
    const std::string expected = "one of " + fogo::enum_names_text<E>("'", " ", " ");
    if (!PyUnicode_Check(v.ptr())) bad_type(opt, name, expected.c_str(), v);
    const std::string s = v.cast<std::string>();
    if (const auto e = fogo::enum_from_name<E>(s)) return *e;
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

}  // namespace fogo_py
