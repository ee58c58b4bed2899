#pragma once
// The random projection Pi and the proximal lift back to parameter space
// (paper: Method "Memory of Gradients" and "Projection Back to Original Space"; ALGORITHM.md
// steps 3 and 8).

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <fogo/fogo_optimizer.h>

#include <cstdint>

namespace fogo {

/// Pi in R^{n x d}, entries +-1 (or +-1/sqrt(d) with ProjectionScale::JL), i.i.d. Rademacher.
/// A pure function of (seed, n, d): every rank, device and resumed run gets the same matrix, so
/// it is never stored in checkpoints. Generated on the CPU, returned fp32 on `device`.
at::Tensor rademacher(int64_t seed, int64_t n, int64_t d, ProjectionScale scale,
                      c10::Device device);

/// The lift operator L = 2 lambda (I + 2 lambda M)^-1 with M = Pi^T Pi (d x d, symmetric
/// positive definite for lambda > 0), factored once per (Pi, lambda): then
///   u_i = L dz_i  and  delta_i = Pi u_i,
/// the minimiser of 1/2 |delta|^2 + lambda |Pi^T delta - dz_i|^2.
at::Tensor lift_operator(const at::Tensor& Pi, double lambda);

/// Rows dz [R, d] -> delta [R, n] = (dz L) Pi^T (L is symmetric), fp32. The rows of all
/// parameters that share Pi go through one call. With `Pi_bf16` (Pi in bf16, given only when
/// that is exact: unit scale) the product with Pi^T takes bf16 factors, dz L rounded to bf16 and
/// the exact +-1, summed in fp32 (mm_bf16_f32): the precision of a bf16 Newton–Schulz, whose
/// O_s the lift is added to; without it, fp32 throughout.
at::Tensor proximal_lift(const at::Tensor& dz, const at::Tensor& Pi, const at::Tensor& L,
                         const at::Tensor& Pi_bf16 = {});

/// a [r, k] times b [k, c], both bf16, as fp32: the exact products summed in fp32. On CUDA one
/// tensor-core GEMM (cuBLAS, bf16 in, fp32 out); elsewhere, where ATen has no such kernel, an
/// fp32 GEMM of the upcast factors, the same sum up to its order.
at::Tensor mm_bf16_f32(const at::Tensor& a, const at::Tensor& b);

}  // namespace fogo
