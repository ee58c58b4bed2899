// Optimizer archives <-> plain Python (archive.h).
#include "archive.h"

#include <sstream>
#include <stdexcept>

#include "fogo_private/frame/integrity.h"

namespace fogo_py {

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

bool is_libtorch_key(const std::string& key) {
  return key == "pytorch_version" || key == "state" || key == "param_groups" || key == "training";
}

bool is_file_only_key(const std::string& key) {
  const std::string suffix = "/checksum";
  return key == fogo::detail::kInMemoryArchive ||
         (key.size() >= suffix.size() &&
          key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0);
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

}  // namespace fogo_py
