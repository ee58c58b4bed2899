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

/// A fresh (zero) second moment of `param` under `batch_dims`: one per row of each of its
/// matrices (row_state_sizes), in normuon_dtype, on param's device.
at::Tensor fresh_second_moment(const at::Tensor& param, int64_t batch_dims);

/// Normalizes `O` [count, rows, cols] (a Newton–Schulz run, any float dtype): returns each Oh[k]
/// [rows, cols] in second_moments[k]'s dtype and updates second_moments[k] ([rows]) in place with
/// O[k]'s rows. A matrix without columns is returned as it is, its second moment unchanged (a
/// mean over no columns is no number).
std::vector<at::Tensor> normuon_normalize(const at::Tensor& O,
                                          const std::vector<at::Tensor>& second_moments,
                                          double beta2, double eps);

/// NorMuon on FOGO's final update (FOGOOptions::normuon): the per-row factors D [rows] of `Ohat`
/// [rows, cols] (the parameter's matrix view, in `v`'s dtype) that make D Ohat what
/// normuon_normalize makes of it, D = (|Ohat|_F / (|Ohat / (sqrt(v) + eps)|_F + eps)) /
/// (sqrt(v) + eps), after updating the second moment `v` [rows] in place with Ohat's rows. FOGO
/// scales O_s and delta by D apart, so that its update and its telemetry ratio read the
/// normalized Ohat.
at::Tensor normuon_row_factors(const at::Tensor& Ohat, const at::Tensor& v, double beta2,
                               double eps);

}  // namespace fogo
