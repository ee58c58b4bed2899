#pragma once
// FOGO's internal state (private to src/), shared by the step (src/fogo/optimizer.cpp) and
// checkpointing (src/fogo/checkpoint.cpp): a group's memory, the projections, and the telemetry
// layout.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "fogo/fogo_optimizer.h"
#include "fogo_private/fogo/codebook.h"
#include "fogo_private/fogo/projection.h"
#include "fogo_private/frame/graphed_step.h"

namespace fogo {

// Telemetry is kept on the device as one vector and read back only when asked for, so a step
// never waits on the host for it: the Device statistics of FOGO_TELEMETRY (fogo_optimizer.h), in
// its order, stat::<name> the index of each. FOGO_TELEMETRY_IF_<source>(...) is its arguments for
// a Device field and nothing for a Host one.
#define FOGO_TELEMETRY_IF_Device(...) __VA_ARGS__
#define FOGO_TELEMETRY_IF_Host(...)
namespace stat {
#define FOGO_STAT_INDEX(T, name, source, ...) FOGO_TELEMETRY_IF_##source(name, )
enum : int64_t { FOGO_TELEMETRY(FOGO_STAT_INDEX) count };
#undef FOGO_STAT_INDEX
}  // namespace stat
inline constexpr int64_t kNumStats = stat::count;

inline at::Generator make_cpu_generator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

// The codebook group's memory: everything of docs/algorithm.md that is not per parameter.
struct GroupMemory {
  bool initialized = false;
  int64_t step = 0;
  Codebook book;
  at::Tensor start;      ///< task-start snapshot of the centroids
  at::Tensor frozen;     ///< frozen bank [F, d]
  at::Tensor frozen_nu;  ///< importance weights [F]
  at::Tensor rbar;       ///< conflict EMA, 0-d
  at::Tensor stats;      ///< [kNumStats], last step's telemetry
  at::Tensor skipped;    ///< NonFinitePolicy::Mask: masked steps, 0-d int64 (undefined: none)
  /// Mask: whether a step since the last consolidate() was taken rather than masked, 0-d bool on
  /// the device; undefined when that is known on the host (consolidated says it).
  at::Tensor stepped_since_consolidate;
  at::Generator gen;  ///< CPU generator: initialisation, re-seeding, candidate sampling
  /// consolidate() ran since the last step: freezing again would add the same centroids.
  bool consolidated = false;

  /// What uses each tensor of the memory: a checkpoint (kSaved, by its name; the order is the
  /// archive's and its checksum's), a step (kStep: the CUDA graph's layout holds every tensor a
  /// step reads or writes), Mask's restore (kMasked: what a step changes).
  enum Use : unsigned { kSaved = 1, kStep = 2, kMasked = 4 };
  /// f(name, tensor, uses) for every tensor field, in one order: the one list of the memory's
  /// tensors (a field added here reaches the checkpoint, the graph, Mask and Python's
  /// state_dict).
  template <class F>
  void visit(F&& f) {
    visit_fields(*this,
                 [&f](const char* name, auto& t, unsigned use, const char*) { f(name, t, use); });
  }
  template <class F>
  void visit(F&& f) const {
    visit_fields(*this,
                 [&f](const char* name, auto& t, unsigned use, const char*) { f(name, t, use); });
  }

  /// A tensor field as the list has it: its name, uses and shape once defined, a dimension per
  /// character: 'C' codebook_size, 'd' proj_dim, 'F' the frozen bank's size (grows by a block
  /// per task), 'K' kNumStats; "" a 0-d tensor. Python's state_dict lays the memory out by it
  /// (python/fogo/_memory.py).
  struct Field {
    const char* name;
    unsigned use;
    const char* shape;
  };
  static std::vector<Field> fields() {
    std::vector<Field> out;
    const GroupMemory m;
    visit_fields(m, [&out](const char* name, const at::Tensor&, unsigned use, const char* shape) {
      out.push_back({name, use, shape});
    });
    return out;
  }

 private:
  template <class Self, class F>
  static void visit_fields(Self& m, F&& f) {
    f("centroids", m.book.centroids, kSaved | kStep | kMasked, "Cd");
    f("S", m.book.S, kSaved | kStep | kMasked, "Cd");
    f("N", m.book.N, kSaved | kStep | kMasked, "C");
    f("start", m.start, kSaved, "Cd");
    f("frozen", m.frozen, kSaved | kStep, "Fd");
    f("frozen_nu", m.frozen_nu, kSaved | kStep, "F");
    f("rbar", m.rbar, kSaved | kStep | kMasked, "");
    f("stats", m.stats, kSaved | kStep | kMasked, "K");
    f("skipped", m.skipped, kStep, "");
    f("stepped_since_consolidate", m.stepped_since_consolidate, kStep, "");
  }
};

// Pi [n, d] and the lift matrix K (projection.h), and their bf16 forms for a bf16 step's
// tensor-core products: Pi_bf16 only when that is exact (unit scale), K_bf16 always.
struct Projection {
  at::Tensor Pi, K, Pi_bf16, K_bf16;
};

/// Pi [n, d] of a group's options and its lift matrix (a pure function of the seed, n, d, the
/// scale and lambda_prox).
inline Projection make_projection(const FOGOOptions& o, int64_t n, const at::Device& device) {
  at::Tensor Pi = rademacher(o.seed(), n, o.proj_dim(), o.projection_scale(), device);
  at::Tensor K = lift_operator(Pi, o.lambda_prox());
  at::Tensor Pi_bf16 =
      o.projection_scale() == ProjectionScale::Unit ? Pi.to(at::kBFloat16) : at::Tensor();
  return {Pi, K, Pi_bf16, K.to(at::kBFloat16)};
}

struct FOGO::Impl {
  std::vector<GroupMemory> groups;
  // One Pi per (n, d) shared by every parameter with that n (and its lift operator per lambda);
  // regenerated from the seed, never stored.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, std::string, double>, Projection>
      projections;

  const Projection& projection(const FOGOOptions& o, int64_t n, const at::Device& device) {
    auto key =
        std::make_tuple(o.seed(), n, o.proj_dim(), static_cast<int64_t>(o.projection_scale()),
                        device.str(), o.lambda_prox());
    auto it = projections.find(key);
    if (it == projections.end()) it = projections.emplace(key, make_projection(o, n, device)).first;
    return it->second;
  }

  GroupMemory& group(size_t g, const FOGOOptions& o) {
    while (groups.size() <= g) {
      GroupMemory fresh;
      // Unsigned arithmetic: any int64 seed is valid, and the product wraps as defined.
      fresh.gen = make_cpu_generator(static_cast<uint64_t>(o.seed()) * 1000003u + groups.size());
      groups.push_back(std::move(fresh));
    }
    return groups[g];
  }
};

}  // namespace fogo
