#include "fogo_private/fogo/projection.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

namespace fogo {

at::Tensor rademacher(int64_t seed, int64_t n, int64_t d, ProjectionScale scale,
                      c10::Device device) {
  TORCH_CHECK(n > 0 && d > 0, "rademacher: n and d must be positive, got n=", n, " d=", d);
  // Mix (seed, n, d) into one 64-bit seed (splitmix64 finaliser): distinct shapes get
  // independent matrices, the same shape always the same one.
  uint64_t x = static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull ^
               (static_cast<uint64_t>(n) << 32) ^ static_cast<uint64_t>(d);
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(x);
  at::Tensor bits = at::randint(0, 2, {n, d}, gen, at::TensorOptions().dtype(at::kFloat));
  at::Tensor Pi = bits.mul_(2).sub_(1);
  if (scale == ProjectionScale::JL) Pi.div_(std::sqrt(static_cast<double>(d)));
  return Pi.to(device);
}

at::Tensor lift_operator(const at::Tensor& Pi, double lambda) {
  TORCH_CHECK(lambda > 0 && std::isfinite(lambda),
              "lift_operator: lambda_prox must be finite and > 0, got ", lambda);
  // In float64: M's entries are up to n (unit scale), and I + 2 lambda M can be ill-conditioned
  // when d > n (M is then singular and only the identity keeps it invertible).
  const at::Tensor P = Pi.to(at::kDouble);
  const int64_t d = P.size(1);
  const at::Tensor A = at::eye(d, P.options()) + (2.0 * lambda) * P.t().mm(P);
  const at::Tensor L = (2.0 * lambda) * at::cholesky_inverse(at::linalg_cholesky(A));
  return P.mm(L).to(Pi.scalar_type());  // K = Pi L (L symmetric)
}

at::Tensor proximal_lift(const at::Tensor& dz, const at::Tensor& K) {
  return K.scalar_type() == at::kBFloat16 ? mm_bf16_f32(dz.to(at::kBFloat16), K.t()) : dz.mm(K.t());
}

at::Tensor mm_bf16_f32(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options().dtype(at::kFloat));
  return mm_bf16_f32_out(out, a, b);
}

at::Tensor& mm_bf16_f32_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16,
              "mm_bf16_f32: bf16 factors expected, got ", a.scalar_type(), " and ",
              b.scalar_type());
  TORCH_CHECK(out.scalar_type() == at::kFloat, "mm_bf16_f32: out must be fp32, got ",
              out.scalar_type());
  return a.is_cuda() ? at::mm_out(out, a, b, at::kFloat)
                     : at::mm_out(out, a.to(at::kFloat), b.to(at::kFloat));
}

}  // namespace fogo
