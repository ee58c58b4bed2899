// Orchestration of fogo's CUDA kernels (fogo_private/cuda/kernels.h): allocations, the GEMMs
// (cuBLAS through ATen) and the launches, all on the current stream with no host synchronisation.
//
// Projected step, per group (R rows, C centroids, K frozen candidates):
//   fuse_rows          slerp, q, |z|, valid                       (step 4, query of step 5)
//   sim = q cbar^T     GEMM [R, C]
//   memory_read        argmax, m/s accumulation, set weights, [z_hi; z_conf] [2R, d] from the
//                      sets' centroids only, r_i per block           (steps 5-6)
//   short_term_reduce  r_t, rbar, gamma_st, set statistics (one block)
//   short_term_apply   z~ = z - gamma_hi z_hi - gamma_st z_conf, dz = z~ - Ps
//   F = z~ frozen^T    GEMM [R, K]                                  (step 7, if K > 0)
//   long_term_weights  B_i, gamma_lt_i, Wlt
//   dz -= Wlt frozen   GEMM
// The similarities and the long-term contraction are GEMMs because cuBLAS runs them faster than a
// hand-fused loop over centroids would (every row meets every centroid); the short-term
// components are not: a row's sets hold a small part of the codebook (|sim| > eps_st), and a
// dense [2R, C] weight matrix times cbar would mostly multiply zeros. The row-wise kernels fuse
// everything between the GEMMs.
#include "fogo_private/ops/ops_cuda.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fogo/muon.h>

#include <algorithm>
#include <optional>

#include "fogo_private/cuda/kernels.h"

namespace fogo::cuda {
namespace {

float* f32(const at::Tensor& t) { return t.data_ptr<float>(); }

// Raw pointers are taken from these tensors: fp32, on the one device the kernels run on.
void check_f32_cuda(const at::Tensor& t, const char* what, const c10::Device& device) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kFloat, "fogo CUDA kernels: ", what,
              " must be a CUDA fp32 tensor, got ", t.scalar_type(), " on ", t.device());
  TORCH_CHECK(t.device() == device, "fogo CUDA kernels: ", what, " is on ", t.device(),
              ", the other inputs on ", device);
}

FloatType float_type(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return FloatType::Float;
    case at::kBFloat16:
      return FloatType::BFloat16;
    case at::kHalf:
      return FloatType::Half;
    default:
      TORCH_CHECK(false, "fogo CUDA kernels: ", what, " must be fp32, bf16 or fp16, got ",
                  t.scalar_type());
  }
}

// Calls launch(begin, end) for each run of consecutive items of one (parameter, input) dtype pair,
// at most `most` long: the items one multi-tensor launch takes.
template <typename F>
void for_each_launch(const std::vector<std::pair<FloatType, FloatType>>& types, size_t most,
                     F&& launch) {
  for (size_t begin = 0; begin < types.size();) {
    size_t end = begin;
    while (end < types.size() && end - begin < most && types[end] == types[begin]) ++end;
    launch(begin, end);
    begin = end;
  }
}

}  // namespace

bool runs_on(const c10::Device& device) {
  return at::cuda::getDeviceProperties(device.index())->major >= 8;
}

// Long on purpose (~95 lines): every precondition of the three kernels of steps 4-7, their
// buffers and launches in order, in one place, so that what the launch sequence assumes is read
// beside it.
ProjectedStepResult projected_step(const at::Tensor& Ps_in, const at::Tensor& Pf_in,
                                   const at::Tensor& cbar_in, const at::Tensor& frozen_in,
                                   const at::Tensor& nu_in, const at::Tensor& rbar,
                                   const ProjectedStepParams& p) {
  check_f32_cuda(Ps_in, "Ps", Ps_in.device());
  check_f32_cuda(Pf_in, "Pf", Ps_in.device());
  check_f32_cuda(cbar_in, "cbar", Ps_in.device());
  check_f32_cuda(rbar, "rbar", Ps_in.device());
  TORCH_CHECK(Ps_in.dim() == 2 && Ps_in.sizes() == Pf_in.sizes() && Ps_in.size(0) > 0 &&
                  cbar_in.dim() == 2 && cbar_in.size(0) > 0 && cbar_in.size(1) == Ps_in.size(1) &&
                  rbar.numel() == 1,
              "fogo CUDA projected_step: Ps, Pf [R >= 1, d], cbar [C >= 1, d] and a one-element "
              "rbar expected, got ",
              Ps_in.sizes(), ", ", Pf_in.sizes(), ", ", cbar_in.sizes(), ", ", rbar.sizes());
  TORCH_CHECK(p.short_term.eps_st >= 0, "fogo CUDA projected_step: eps_st must be >= 0, got ",
              p.short_term.eps_st);
  const c10::cuda::CUDAGuard guard(Ps_in.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor Ps = Ps_in.contiguous(), Pf = Pf_in.contiguous(), cbar = cbar_in.contiguous();
  const int64_t R = Ps.size(0), d = Ps.size(1), C = cbar.size(0);
  const auto options = Ps.options();
  const float eps = static_cast<float>(p.eps);

  // Step 4 and the query. On a group's first step nothing is filtered and z - Ps is the answer,
  // written straight into the z buffer.
  at::Tensor z = at::empty({R, d}, options), q = at::empty({R, d}, options);
  at::Tensor znorm = at::empty({R}, options), valid = at::empty({R}, options.dtype(at::kBool));
  launch_fuse_rows(f32(Ps), f32(Pf), R, d, static_cast<float>(p.xi), eps,
                   static_cast<float>(-1.0 + p.eps), static_cast<float>(1.0 - p.eps), !p.filter,
                   f32(z), f32(q), f32(znorm), valid.data_ptr<bool>(), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  // Step 5: memory read against the pre-update codebook.
  const at::Tensor sim = at::mm(q, cbar.t());
  at::Tensor m = at::zeros({C}, options), s = at::zeros({C, d}, options);
  at::Tensor stats = at::zeros({4}, options);
  const ShortTermArgs st{
      static_cast<float>(p.short_term.eps_st), static_cast<float>(p.short_term.tau_plus),
      static_cast<float>(p.short_term.tau_minus), eps, static_cast<float>(p.lambda_hi)};
  if (!p.filter) {
    launch_memory_read(f32(sim), f32(q), f32(znorm), valid.data_ptr<bool>(), R, C, d, st, f32(m),
                       f32(s), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {z, q, valid, m, s, rbar, stats};
  }

  // Step 6: the components and r_i with the read, then r_t -> rbar -> gamma_st on the device,
  // then the correction.
  const int64_t blocks = row_blocks(R);
  at::Tensor partials = at::empty({5, blocks}, options);  // conflict, over, r, protected, valid
  at::Tensor zhc = at::empty({2 * R, d}, options);        // [z_hi; z_conf]
  launch_memory_read(f32(sim), f32(q), f32(znorm), valid.data_ptr<bool>(), R, C, d, st, f32(m),
                     f32(s), f32(cbar), f32(zhc), f32(partials[0]), f32(partials[1]),
                     f32(partials[2]), f32(partials[4]), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  at::Tensor rbar_new = at::empty({}, options);
  launch_short_term_reduce(f32(partials[2]), f32(partials[0]), f32(partials[1]), f32(partials[4]),
                           blocks, f32(rbar.contiguous()),
                           {static_cast<float>(p.beta_r), static_cast<float>(1.0 - p.beta_r),
                            static_cast<float>(p.gamma_st_min), static_cast<float>(p.gamma_st_max),
                            static_cast<float>(p.kappa)},
                           f32(rbar_new), f32(stats), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  at::Tensor dz = at::empty({R, d}, options);
  const bool protect = frozen_in.defined() && frozen_in.size(0) > 0;
  if (!protect) {
    launch_short_term_apply(f32(z), f32(zhc), f32(Ps), f32(stats), R, d,
                            static_cast<float>(p.gamma_hi), f32(dz), nullptr, nullptr, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {dz, q, valid, m, s, rbar_new, stats};
  }

  // Step 7: z~ overwrites z, then zbar - Ps = (z~ - Ps) - Wlt frozen.
  check_f32_cuda(frozen_in, "frozen", Ps.device());
  check_f32_cuda(nu_in, "nu", Ps.device());
  const at::Tensor frozen = frozen_in.contiguous(), nu = nu_in.contiguous();
  const int64_t K = frozen.size(0);
  TORCH_CHECK(frozen.dim() == 2 && frozen.size(1) == d && nu.numel() == K,
              "fogo CUDA projected_step: frozen [K, d] and nu [K] expected, got ", frozen.sizes(),
              " and ", nu.sizes());
  at::Tensor ztnorm = at::empty({R}, options);
  launch_short_term_apply(f32(z), f32(zhc), f32(Ps), f32(stats), R, d,
                          static_cast<float>(p.gamma_hi), f32(dz), f32(z), f32(ztnorm), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const at::Tensor F = at::mm(z, frozen.t());
  at::Tensor Wlt = at::empty({R, K}, options);
  const LongTermArgs lt{static_cast<float>(p.long_term.eps_lt),
                        static_cast<float>(p.long_term.gamma_lt),
                        static_cast<float>(p.long_term.eps), p.long_term.spectral_scaling};
  launch_long_term_weights(f32(F), f32(ztnorm), f32(nu), R, K, lt, f32(Wlt), f32(partials[3]),
                           stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  dz.addmm_(Wlt, frozen, /*beta=*/1.0, /*alpha=*/-1.0);
  launch_protected_reduce(f32(partials[3]), f32(partials[4]), blocks, f32(stats), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {dz, q, valid, m, s, rbar_new, stats};
}

void codebook_flush(Codebook& book, const Assignments& acc, const FlushParams& p) {
  const c10::Device device = book.centroids.device();
  check_f32_cuda(book.centroids, "centroids", device);
  check_f32_cuda(book.S, "S", device);
  check_f32_cuda(book.N, "N", device);
  check_f32_cuda(acc.m, "m", device);
  check_f32_cuda(acc.s, "s", device);
  TORCH_CHECK(book.S.is_contiguous() && book.N.is_contiguous(),
              "fogo CUDA codebook_flush: S and N are updated in place and must be contiguous");
  const auto& c = book.centroids;
  TORCH_CHECK(c.dim() == 2 && book.S.sizes() == c.sizes() && acc.s.sizes() == c.sizes() &&
                  book.N.dim() == 1 && book.N.size(0) == c.size(0) && acc.m.dim() == 1 &&
                  acc.m.size(0) == c.size(0),
              "fogo CUDA codebook_flush: centroids, S, s [C, d] and N, m [C] expected, got ",
              c.sizes(), ", ", book.S.sizes(), ", ", acc.s.sizes(), ", ", book.N.sizes(), ", ",
              acc.m.sizes());
  const c10::cuda::CUDAGuard guard(book.centroids.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor prev = book.centroids.contiguous();
  const int64_t C = prev.size(0), d = prev.size(1);
  const float eps = static_cast<float>(p.eps);
  at::Tensor chat = at::empty({C, d}, prev.options());
  launch_flush_ema(f32(book.S), f32(book.N), f32(acc.s.contiguous()), f32(acc.m.contiguous()), C, d,
                   p.beta_cb, eps, f32(chat), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // As fogo::flush: no decorrelation term without a weight or a neighbour.
  const int64_t r = p.lambda_c == 0.0 ? 0 : std::min<int64_t>(p.r_dec, C - 1);
  const at::Tensor corr = r > 0 ? at::mm(chat, prev.t()) : at::Tensor();
  at::Tensor out = at::empty({C, d}, prev.options());
  launch_flush_decorrelate(f32(book.S), f32(book.N), r > 0 ? f32(corr) : nullptr, f32(prev), C, d,
                           r, static_cast<float>(p.lambda_c), eps, f32(out), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  book.centroids.copy_(out);
}

void momenta_step(const std::vector<MomentaItem>& items, double mu_s, double mu_f,
                  const at::Tensor& ok) {
  if (items.empty()) return;
  const c10::Device device = items.front().Bs.device();
  if (ok.defined()) {
    TORCH_CHECK(
        ok.is_cuda() && ok.device() == device && ok.scalar_type() == at::kBool && ok.numel() == 1,
        "fogo CUDA momenta_step: ok must be one bool on ", device);
  }
  // Every item checked before the first launch: a rejected call changes nothing.
  std::optional<at::ScalarType> x_dtype;  // one Newton–Schulz input dtype for the whole call
  FloatType x_type = FloatType::Float;
  for (const MomentaItem& item : items) {
    for (const auto& [t, what] : {std::pair{&item.Bs, "B_s"}, {&item.Bf, "B_f"}, {&item.G, "G"}}) {
      check_f32_cuda(*t, what, device);
      TORCH_CHECK(t->is_contiguous() && t->sizes() == item.Bs.sizes(),
                  "fogo CUDA momenta_step: B_s, B_f and G must be contiguous and of one shape");
    }
    for (const at::Tensor* x : {&item.Xs, &item.Xf}) {
      if (!x->defined()) continue;
      x_type = float_type(*x, "the Newton–Schulz input");
      if (!x_dtype) x_dtype = x->scalar_type();
      TORCH_CHECK(x->device() == device && x->is_contiguous() && x->scalar_type() == *x_dtype &&
                      x->numel() == item.Bs.numel(),
                  "fogo CUDA momenta_step: the Newton–Schulz inputs must be contiguous, of one "
                  "dtype and of the momenta's size, on ",
                  device);
    }
  }
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool* flag = ok.defined() ? ok.data_ptr<bool>() : nullptr;
  MomentaChunk chunk{};
  const auto launch = [&] {
    launch_momenta(chunk, static_cast<float>(mu_s), static_cast<float>(mu_f), flag, x_type, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    chunk.count = 0;
  };
  for (const MomentaItem& item : items) {
    if (item.Bs.numel() == 0) continue;  // nothing to update (and no matrix view to divide by)
    const int64_t rows = item.Bs.size(0), cols = item.Bs.numel() / rows;
    chunk.t[chunk.count++] = {f32(item.Bs),
                              f32(item.Bf),
                              f32(item.G),
                              item.Xs.defined() ? item.Xs.data_ptr() : nullptr,
                              item.Xf.defined() ? item.Xf.data_ptr() : nullptr,
                              rows,
                              cols,
                              item.transposed};
    if (chunk.count == kMomentaChunk) launch();
  }
  if (chunk.count > 0) launch();
}

void muon_update(const std::vector<MuonUpdateItem>& items, const MuonUpdateParams& p) {
  if (items.empty()) return;
  const c10::Device device = items.front().param.device();
  std::vector<std::pair<FloatType, FloatType>> types;  // (parameter, O): all checked first
  for (const MuonUpdateItem& item : items) {
    types.emplace_back(float_type(item.param, "the parameter"), float_type(item.O, "O"));
    TORCH_CHECK(
        item.param.is_cuda() && item.param.device() == device && item.O.device() == device &&
            item.param.is_contiguous() && item.param.dim() >= 1 && item.O.dim() == 2 &&
            item.O.size(0) == item.param.size(0) && item.O.numel() == item.param.numel(),
        "fogo CUDA muon_update: a contiguous parameter and O [rows, numel / rows], all on ", device,
        ", expected, got ", item.param.sizes(), " and ", item.O.sizes(), " on ", item.O.device());
  }
  p.lr.check_device(device, "fogo CUDA muon_update");
  if (p.ok.defined()) {
    TORCH_CHECK(p.ok.is_cuda() && p.ok.device() == device && p.ok.scalar_type() == at::kBool &&
                    p.ok.numel() == 1,
                "fogo CUDA muon_update: ok must be one bool on ", device);
  }
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const MuonArgs args{p.lr.value, p.weight_decay, p.lr.device_ptr(),
                      p.ok.defined() ? p.ok.data_ptr<bool>() : nullptr};
  std::vector<at::Tensor> inputs;  // O made contiguous, alive until the launches are queued
  for_each_launch(types, kMuonChunk, [&](size_t begin, size_t end) {
    MuonChunk chunk{};
    for (size_t k = begin; k < end; ++k) {
      const MuonUpdateItem& item = items[k];
      const int64_t rows = item.O.size(0), cols = item.O.size(1);
      // Tall matrices come out of Newton–Schulz as the transpose of a contiguous wide result:
      // read that one as is (the kernel transposes through a shared tile).
      const bool transposed = !item.O.is_contiguous() && item.O.t().is_contiguous();
      const at::Tensor O = transposed ? item.O : item.O.contiguous();
      inputs.push_back(O);
      const auto [A, B] = adjusted_lr_shape(item);  // a row shard's: its whole matrix's
      const auto [f1, f2] = muon_adjusted_lr_factors(p.adjust_lr, A, B, p.extra_scale);
      if (rows * cols > 0)
        chunk.t[chunk.count++] = {
            item.param.data_ptr(), O.data_ptr(), rows, cols, f1, f2, transposed};
    }
    launch_muon_update(chunk, types[begin].first, types[begin].second, args, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  for (const MuonUpdateItem& item : items) {
    item.param.unsafeGetTensorImpl()->bump_version();  // as an in-place ATen op would
  }
}

std::vector<at::Tensor> apply_rms_update(const std::vector<RmsUpdateItem>& items,
                                         const UpdateParams& p, const at::Tensor& ok) {
  if (items.empty()) return {};
  const c10::Device device = items.front().param.device();
  std::vector<std::pair<FloatType, FloatType>> types;  // (parameter, O_s): all checked first
  for (const RmsUpdateItem& item : items) {
    types.emplace_back(float_type(item.param, "the parameter"), float_type(item.Os, "O_s"));
    check_f32_cuda(item.delta, "delta", device);
    TORCH_CHECK(item.Os.device() == device && item.Os.dim() == 2 &&
                    item.Os.sizes() == item.delta.sizes() &&
                    item.param.numel() == item.Os.numel() && item.param.is_contiguous() &&
                    item.param.device() == device,
                "fogo CUDA apply_rms_update: O_s, delta [m, n] and a contiguous parameter of m n "
                "elements, all on ",
                device, ", expected, got ", item.Os.sizes(), ", ", item.delta.sizes(), ", ",
                item.param.sizes(), " on ", item.param.device());
    p.lr.check_device(item.param.device(), "fogo CUDA apply_rms_update");
  }
  if (ok.defined()) {
    TORCH_CHECK(
        ok.is_cuda() && ok.device() == device && ok.scalar_type() == at::kBool && ok.numel() == 1,
        "fogo CUDA apply_rms_update: ok must be one bool on ", device);
  }
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const UpdateArgs args{p.lr.value,        p.weight_decay,
                        p.sigma,           p.eps,
                        p.lr.device_ptr(), ok.defined() ? ok.data_ptr<bool>() : nullptr};
  const at::Tensor ratios =
      at::empty({static_cast<int64_t>(items.size())}, items.front().delta.options());
  std::vector<at::Tensor> inputs;  // contiguous O_s and delta, alive until the launches are queued
  for_each_launch(types, kRmsChunk, [&](size_t begin, size_t end) {
    RmsChunk chunk{};
    for (size_t k = begin; k < end; ++k) {
      const RmsUpdateItem& item = items[k];
      const at::Tensor Os = item.Os.contiguous(), delta = item.delta.contiguous();
      inputs.push_back(Os);
      inputs.push_back(delta);
      chunk.t[chunk.count++] = {
          item.param.data_ptr(), Os.data_ptr(), f32(delta), Os.size(0), Os.size(1),
          item.transposed};
    }
    at::Tensor scratch =
        at::empty({rms_scratch_doubles(chunk)}, ratios.options().dtype(at::kDouble));
    launch_rms_update(chunk, types[begin].first, types[begin].second, args,
                      scratch.data_ptr<double>(), f32(ratios) + begin, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < items.size(); ++k) {
    // As an in-place ATen op would, for autograd.
    items[k].param.unsafeGetTensorImpl()->bump_version();
    out.push_back(ratios[static_cast<int64_t>(k)]);
  }
  return out;
}

}  // namespace fogo::cuda
