#include "fogo_private/fogo/codebook.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

namespace fogo {

at::Tensor normalize_rows(const at::Tensor& x, double eps) {
  return x / (at::linalg_vector_norm(x, 2, {1}, /*keepdim=*/true) + eps);
}
namespace {

// Indices (on q's device) of up to k distinct valid rows, in an order drawn by `gen`.
at::Tensor draw_valid_rows(const at::Tensor& valid, int64_t k, at::Generator& gen) {
  const at::Tensor rows = valid.nonzero().squeeze(1).cpu();  // host sync: init and re-seed only
  const at::Tensor order = at::randperm(rows.size(0), gen, at::TensorOptions().dtype(at::kLong));
  return rows.index_select(0, order.slice(0, 0, std::min(k, rows.size(0)))).to(valid.device());
}

}  // namespace

Codebook init_codebook(const at::Tensor& q, const at::Tensor& valid, int64_t C,
                       at::Generator& gen) {
  const int64_t d = q.size(1);
  const at::Tensor picked = q.index_select(0, draw_valid_rows(valid, C, gen));
  at::Tensor centroids = picked;
  if (picked.size(0) < C) {
    const at::Tensor random =
        at::randn({C - picked.size(0), d}, gen, at::TensorOptions().dtype(at::kFloat));
    centroids = at::cat({picked, normalize_rows(random, 0.0).to(q.device())});
  }
  return {centroids.contiguous(), at::zeros({C, d}, q.options()), at::zeros({C}, q.options())};
}

Assignments assign(const at::Tensor& q, const at::Tensor& sim, const at::Tensor& valid) {
  const int64_t C = sim.size(1);
  const at::Tensor a = sim.argmax(1);
  const at::Tensor w = valid.to(q.scalar_type());
  return {at::zeros({C}, q.options()).index_add_(0, a, w),
          at::zeros({C, q.size(1)}, q.options()).index_add_(0, a, q * w.unsqueeze(1))};
}

void ref::codebook_flush(Codebook& book, const Assignments& acc, const FlushParams& p) {
  book.S.mul_(p.beta_cb).add_(acc.s, 1.0 - p.beta_cb);
  book.N.mul_(p.beta_cb).add_(acc.m, 1.0 - p.beta_cb);
  const at::Tensor ctilde = book.S / (book.N.unsqueeze(1) + p.eps);
  const at::Tensor chat = normalize_rows(ctilde, p.eps);
  const at::Tensor& prev = book.centroids;
  const int64_t C = prev.size(0);
  const int64_t r = std::min<int64_t>(p.r_dec, C - 1);
  at::Tensor h = at::zeros_like(ctilde);
  if (r > 0 && p.lambda_c != 0.0) {
    at::Tensor corr = chat.mm(prev.t());  // <chat_j, cbar_l>
    const at::Tensor self = at::eye(C, corr.options()).to(at::kBool);
    const at::Tensor top = std::get<1>(at::where(self, -1.0, corr.abs()).topk(r, 1));  // R_j
    const at::Tensor weights = at::zeros_like(corr).scatter_(1, top, corr.gather(1, top));
    h = weights.mm(prev);
  }
  const at::Tensor raw = ctilde - p.lambda_c * h;
  const at::Tensor raw_norm = at::linalg_vector_norm(raw, 2, {1}, /*keepdim=*/true);
  const at::Tensor keep = (book.N.unsqueeze(1) <= p.eps) | (raw_norm <= p.eps);
  book.centroids.copy_(at::where(keep, prev, raw / (raw_norm + p.eps)));  // in place
}

void reseed(Codebook& book, const at::Tensor& q, const at::Tensor& valid, double threshold,
            at::Generator& gen) {
  const at::Tensor dead = (book.N < threshold).nonzero().squeeze(1);  // host sync, periodic
  if (dead.size(0) == 0) return;
  const at::Tensor rows = draw_valid_rows(valid, dead.size(0), gen);
  const at::Tensor slots = dead.slice(0, 0, rows.size(0));
  const at::Tensor fresh = q.index_select(0, rows);
  book.centroids.index_copy_(0, slots, fresh);
  book.S.index_copy_(0, slots, fresh * threshold);
  book.N.index_fill_(0, slots, threshold);
}

FrozenPicks select_important(const Codebook& book, const at::Tensor& start, int64_t K) {
  const at::Tensor& c = book.centroids;
  const int64_t C = c.size(0);
  K = std::min(K, C);
  const at::Tensor usage = book.N / book.N.sum().clamp_min(1e-30);
  const at::Tensor cos = c.mm(c.t()).abs();
  const at::Tensor others = at::where(at::eye(C, cos.options()).to(at::kBool), 0.0, cos);
  const at::Tensor uniqueness = 1.0 - std::get<0>(others.max(1));
  const at::Tensor drift = 1.0 - (c * start).sum(1);
  // Greedy selection on the host: K and C are small (tens), and this runs once per task.
  const at::Tensor score_host =
      (usage * uniqueness.clamp_min(0) * (1.0 + drift)).to(at::kDouble).cpu().contiguous();
  const at::Tensor cos_host = cos.to(at::kDouble).cpu().contiguous();
  const auto cos_at = cos_host.accessor<double, 2>();
  std::vector<double> score(score_host.data_ptr<double>(), score_host.data_ptr<double>() + C);
  std::vector<int64_t> picks;
  std::vector<double> weights;
  std::vector<bool> taken(C, false);
  for (int64_t k = 0; k < K; ++k) {
    int64_t best = -1;
    for (int64_t j = 0; j < C; ++j) {
      if (!taken[j] && (best < 0 || score[j] > score[best])) best = j;
    }
    taken[best] = true;
    picks.push_back(best);
    weights.push_back(score[best]);
    for (int64_t j = 0; j < C; ++j) score[j] *= 1.0 - cos_at[best][j];
  }
  at::Tensor nu = at::tensor(weights, at::TensorOptions().dtype(at::kDouble));
  const double total = nu.sum().item<double>();
  nu = total > 0 ? nu / total : at::full({K}, 1.0 / K, nu.options());
  const at::Tensor index = at::tensor(picks, at::TensorOptions().dtype(at::kLong)).to(c.device());
  return {c.index_select(0, index).clone(), nu.to(c.options())};
}

at::Tensor sample_candidates(const at::Tensor& nu, int64_t k, const at::Tensor& log_u) {
  const int64_t F = nu.size(0);
  TORCH_CHECK(k >= 1 && k <= F, "sample_candidates: k must be in [1, ", F, "], got ", k);
  TORCH_CHECK(log_u.dim() == 1 && log_u.size(0) == F && log_u.scalar_type() == at::kDouble,
              "sample_candidates: log_u must be [", F, "] float64, got ", log_u.sizes(), " ",
              log_u.scalar_type());
  // log(u) / w is a monotone transform of u^(1/w): the k largest are a weighted sample without
  // replacement.
  const at::Tensor keys = log_u / nu.to(at::kDouble).clamp_min(1e-12);
  return std::get<1>(keys.topk(k));
}

at::Tensor candidate_keys(int64_t F, at::Generator& gen, const c10::Device& device) {
  at::Tensor log_u = at::rand({F}, gen, at::TensorOptions().dtype(at::kDouble)).log_();
  if (device.is_cuda()) log_u = log_u.pin_memory();
  return log_u.to(device, /*non_blocking=*/true);
}

}  // namespace fogo
