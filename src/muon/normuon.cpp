#include "fogo_private/muon/normuon.h"

#include <ATen/ATen.h>

#include "fogo/matrix_view.h"

namespace fogo {

at::ScalarType normuon_dtype(const at::Tensor& param) {
  return param.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

at::Tensor fresh_second_moment(const at::Tensor& param, int64_t batch_dims) {
  return at::zeros(row_state_sizes(param.sizes(), batch_dims),
                   param.options().dtype(normuon_dtype(param)));
}

std::vector<at::Tensor> normuon_normalize(const at::Tensor& O,
                                          const std::vector<at::Tensor>& second_moments,
                                          double beta2, double eps) {
  TORCH_CHECK(O.dim() == 3 && static_cast<size_t>(O.size(0)) == second_moments.size(),
              "normuon_normalize: O [count, rows, cols] with one second moment per matrix");
  if (second_moments.empty()) return {};
  const at::ScalarType dtype = second_moments.front().scalar_type();
  bool uniform = true;
  for (const at::Tensor& v : second_moments) uniform = uniform && v.scalar_type() == dtype;
  if (!uniform || O.size(-1) == 0) {  // rare: same-shape parameters of fp32 and fp64 (a GPU run)
    std::vector<at::Tensor> out;
    for (size_t k = 0; k < second_moments.size(); ++k) {
      const at::Tensor o = O[static_cast<int64_t>(k)];
      out.push_back(
          O.size(-1) == 0
              ? o.to(second_moments[k].scalar_type())
              : normuon_normalize(o.unsqueeze(0), {second_moments[k]}, beta2, eps).front());
    }
    return out;
  }
  // One run, batched: a handful of kernels whatever the count.
  const at::Tensor o = O.to(dtype);
  at::_foreach_lerp_(second_moments, o.square().mean(-1).unbind(0), 1.0 - beta2);
  const at::Tensor v =
      second_moments.size() == 1 ? second_moments.front().unsqueeze(0) : at::stack(second_moments);
  at::Tensor normalized = o / (v.sqrt() + eps).unsqueeze(-1);
  const at::Tensor norm = at::linalg_vector_norm(o, 2, at::IntArrayRef{-2, -1}, true);
  const at::Tensor normalized_norm =
      at::linalg_vector_norm(normalized, 2, at::IntArrayRef{-2, -1}, true);
  return normalized.mul_(norm / (normalized_norm + eps)).unbind(0);
}

at::Tensor normuon_row_factors(const at::Tensor& Ohat, const at::Tensor& v, double beta2,
                               double eps) {
  TORCH_CHECK(Ohat.dim() == 2 && v.dim() == 1 && v.size(0) == Ohat.size(0) &&
                  Ohat.scalar_type() == v.scalar_type(),
              "normuon_row_factors: Ohat [rows, cols] and v [rows] of one dtype");
  v.lerp_(Ohat.square().mean(-1), 1.0 - beta2);
  const at::Tensor inverse_root = (v.sqrt() + eps).reciprocal();
  const at::Tensor norm = at::linalg_vector_norm(Ohat, 2);
  const at::Tensor normalized_norm = at::linalg_vector_norm(Ohat * inverse_root.unsqueeze(-1), 2);
  return inverse_root * (norm / (normalized_norm + eps));
}

}  // namespace fogo
