#pragma once
// NorMuon's row normalization of an orthogonalized update (Li, Liu, Liang, Chen, Zhao, "NorMuon:
// Making Muon more efficient and scalable", 2025), fogo::Muon's `normuon` option. For each
// update O [rows, cols] with its per-row second moment v [rows] (state, zeros at the start):
//   v  = beta2 v + (1 - beta2) mean_cols(O * O)        (v.lerp_(mean, 1 - beta2))
//   Oh = O / (sqrt(v) + eps)                           (each row by its own root second moment)
//   Oh = Oh |O|_F / (|Oh|_F + eps)                      (back to the update's Frobenius norm)
// as the authors' reference code computes it (its comment: the scaling keeps the update's norm as
// before the normalization); the learning-rate rule (adjust_lr) applies to Oh as to O.

#include <ATen/Tensor.h>

#include <vector>

namespace fogo {

/// The dtype of a parameter's NorMuon second moment, and of the normalization's arithmetic: fp32,
/// fp64 for an fp64 parameter.
at::ScalarType normuon_dtype(const at::Tensor& param);

/// Normalizes `O` [count, rows, cols] (a Newton–Schulz run, any float dtype): returns each Oh[k]
/// [rows, cols] in second_moments[k]'s dtype and updates second_moments[k] ([rows]) in place with
/// O[k]'s rows. A matrix without columns is returned as it is, its second moment unchanged (a
/// mean over no columns is no number).
std::vector<at::Tensor> normuon_normalize(const at::Tensor& O,
                                          const std::vector<at::Tensor>& second_moments,
                                          double beta2, double eps);

}  // namespace fogo
