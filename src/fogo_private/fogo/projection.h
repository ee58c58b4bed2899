#pragma once
// The random projection Pi and the proximal lift back to parameter space
// (paper: Method "Memory of Gradients" and "Projection Back to Original Space"; docs/algorithm.md
// steps 3 and 8).

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <fogo/fogo_options.h>

#include <cstdint>

namespace fogo {

/// Pi in R^{n x d}, entries +-1 (or +-1/sqrt(d) with ProjectionScale::JL), i.i.d. Rademacher.
/// A pure function of (seed, n, d): every rank, device and resumed run gets the same matrix, so
/// it is never stored in checkpoints. Generated on the CPU, returned fp32 on `device`.
at::Tensor rademacher(int64_t seed, int64_t n, int64_t d, ProjectionScale scale,
                      c10::Device device);

/// The lift matrix K = 2 lambda Pi (I + 2 lambda M)^-1 [n, d] with M = Pi^T Pi (the d x d
/// system is symmetric positive definite for lambda > 0; solved once per (Pi, lambda) in
/// float64, returned in Pi's dtype): delta_i = K dz_i is the minimiser of
/// 1/2 |delta|^2 + lambda |Pi^T delta - dz_i|^2. Folding the d x d solve into K leaves the lift
/// one GEMM per batch of rows.
at::Tensor lift_operator(const at::Tensor& Pi, double lambda);

/// Rows dz [R, d] -> delta [R, n] = dz K^T, fp32; the rows of all parameters that share Pi go
/// through one call. With K in bf16 (a bf16 step) dz is rounded to bf16 too and the products are
/// summed in fp32 (mm_bf16_f32): relative errors of 2^-8 of a row's scale, the precision of the
/// bf16 O_s the lift is added to. With K in fp32, fp32 throughout.
at::Tensor proximal_lift(const at::Tensor& dz, const at::Tensor& K);

/// a [r, k] times b [k, c], both bf16, as fp32: the exact products summed in fp32. On CUDA one
/// tensor-core GEMM (cuBLAS, bf16 in, fp32 out); elsewhere, where ATen has no such kernel, an
/// fp32 GEMM of the upcast factors, the same sum up to its order.
at::Tensor mm_bf16_f32(const at::Tensor& a, const at::Tensor& b);
/// mm_bf16_f32 written into `out` ([r, c] fp32, e.g. rows of a larger buffer); returns out.
at::Tensor& mm_bf16_f32_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b);

}  // namespace fogo
