#pragma once
// Optimizer archives <-> plain Python, for fogo._C's state_dict: what the C++ archive holds
// besides LibTorch's part (FOGO's per-group memory) goes to Python as nested dicts of tensors and
// numbers, and comes back from them into an archive that the C++ load() reads.
#include <torch/extension.h>
#include <torch/serialize/archive.h>

#include <string>
#include <vector>

namespace fogo_py {

namespace py = pybind11;

/// A parameter's key in a LibTorch optimizer archive (its TensorImpl's address).
std::string param_key(const at::Tensor& p);

/// An archive written, as one to read.
torch::serialize::InputArchive reopen(const torch::serialize::OutputArchive& out);

/// Entry `key` of `a` as Python: a tensor, a number, a string, or a dict for a sub-archive.
py::object archive_value_to_py(torch::serialize::InputArchive& a, const std::string& key);

/// `value` (archive_value_to_py's kinds) into `a` under `key`; a TypeError for anything else.
void py_to_archive(torch::serialize::OutputArchive& a, const std::string& key,
                   const py::handle& value);

/// The LibTorch part of an optimizer archive: handled by hand (it is keyed by tensor addresses).
bool is_libtorch_key(const std::string& key);

/// A file's checksum (fogo/checksum, muon/checksum) describes an archive on a disk; a state dict
/// is live Python objects (its tensors are the optimizer's own), so it carries none, and its
/// archive is marked as built in memory when it is loaded (detail::kInMemoryArchive).
bool is_file_only_key(const std::string& key);

/// The keys `o` writes into an archive.
std::vector<std::string> archive_option_keys(const torch::optim::OptimizerOptions& o);

}  // namespace fogo_py
