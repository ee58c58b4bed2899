// fogo._testing: harnesses for python/tests, built beside fogo._C in the build tree only (with
// FOGO_BUILD_TESTS; never installed, not in the wheel).
//
// It converts param-group options with fogo._C's own tables (python/src/traits.h): a trajectory
// here and one through fogo.FOGO / fogo.Muon then start from the same C++ options, and what
// differs is only who drives the optimizer.
#include <fogo/fogo.h>
#include <torch/extension.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../src/traits.h"

namespace py = pybind11;

namespace {

// A trajectory computed by C++ alone: a fresh optimizer of `kind` over copies of `groups`
// ((params, options) pairs), stepped with grads[t][g][i] at step t; task boundaries (FOGO)
// before the steps listed in `boundaries`, and each group's lr multiplied by lr_factors[t] at
// step t when given. Returns the parameters after every step.
std::vector<std::vector<at::Tensor>> cpp_trajectory(
    const std::string& kind,
    const std::vector<std::pair<std::vector<at::Tensor>, py::dict>>& groups,
    const std::vector<std::vector<std::vector<at::Tensor>>>& grads,
    const std::vector<int64_t>& boundaries, const std::vector<double>& lr_factors) {
  if (kind != "FOGO" && kind != "Muon")
    throw py::value_error("cpp_trajectory: kind must be 'FOGO' or 'Muon'");
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  std::vector<at::Tensor> all;
  std::vector<double> base_lr;
  for (const auto& [params, options] : groups) {
    std::vector<at::Tensor> copies;
    for (const auto& p : params) copies.push_back(p.detach().clone().requires_grad_(true));
    all.insert(all.end(), copies.begin(), copies.end());
    if (kind == "FOGO") {
      auto o = fogo_py::FOGOTraits::from_dict(options, {});
      base_lr.push_back(o.lr());
      param_groups.emplace_back(copies, std::make_unique<fogo::FOGOOptions>(o));
    } else {
      auto o = fogo_py::MuonTraits::from_dict(options, {});
      base_lr.push_back(o.lr());
      param_groups.emplace_back(copies, std::make_unique<fogo::MuonOptions>(o));
    }
  }
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (kind == "FOGO")
    opt = std::make_unique<fogo::FOGO>(param_groups);
  else
    opt = std::make_unique<fogo::Muon>(param_groups);
  py::gil_scoped_release no_gil;
  std::vector<std::vector<at::Tensor>> out;
  for (size_t t = 0; t < grads.size(); ++t) {
    if (std::find(boundaries.begin(), boundaries.end(), static_cast<int64_t>(t)) !=
        boundaries.end())
      static_cast<fogo::FOGO&>(*opt).task_boundary();
    for (size_t g = 0; g < param_groups.size(); ++g) {
      if (t < lr_factors.size())
        opt->param_groups()[g].options().set_lr(base_lr[g] * lr_factors[t]);
      const auto& params = opt->param_groups()[g].params();
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[t][g][i].clone();
    }
    opt->step();
    std::vector<at::Tensor> now;
    for (const auto& p : all) now.push_back(p.detach().clone());
    out.push_back(std::move(now));
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_testing, m) {
  m.doc() = "fogo's test harnesses (python/tests); not part of the installed package";
  m.def("cpp_trajectory", &cpp_trajectory, py::arg("kind"), py::arg("groups"), py::arg("grads"),
        py::arg("boundaries") = std::vector<int64_t>{},
        py::arg("lr_factors") = std::vector<double>{});
}
