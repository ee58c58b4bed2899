// fogo::dist's comparisons and broadcasts across ranks (dist/lockstep.h), and the gathers the
// other parts build on (dist/internal.h).
#include <fogo/fogo_optimizer.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "fogo_private/distributed/internal.h"

namespace fogo::dist {
namespace {

using namespace detail;

/// 64-bit FNV-1a, for signatures of names, dtypes and shapes.
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h = (h ^ p[i]) * 1099511628211ull;
    }
  }
  void add(const std::string& s) { add(s.data(), s.size() + 1); }
  void add(int64_t v) { add(&v, sizeof(v)); }
};

int64_t signature(const std::string& name, const at::Tensor& t) {
  Fnv f;
  f.add(name);
  f.add(int64_t{t.defined()});
  if (t.defined()) {
    f.add(static_cast<int64_t>(t.scalar_type()));
    for (const auto s : t.sizes()) {
      f.add(s);
    }
  }
  return static_cast<int64_t>(f.h);
}

/// Three exact integer sums over a tensor's bytes b_i: sum b_i, sum b_i w_i, sum b_i v_i with
/// position weights w_i, v_i < 2^16. Products stay below 2^24, so the int64 sums are exact (up
/// to 2^39 bytes per tensor) and equal on every device and in any reduction order: ranks holding
/// the same bytes compute the same values. A changed byte changes the first sum.
at::Tensor content_sums(const at::Tensor& t) {
  const auto options = torch::dtype(torch::kInt64).device(t.device());
  auto sums = torch::zeros({3}, options);
  const auto all_bytes = t.detach().contiguous().reshape({-1}).view(torch::kUInt8);
  const int64_t n = all_bytes.numel();
  constexpr int64_t kChunk = int64_t{1} << 22;  // bounds the int64 temporaries to 32 MB
  for (int64_t offset = 0; offset < n; offset += kChunk) {
    const auto len = std::min(kChunk, n - offset);
    const auto b = all_bytes.narrow(0, offset, len).to(torch::kInt64);
    const auto i = torch::arange(offset, offset + len, options);
    sums +=
        torch::stack({b.sum(), (b * (i % 65521 + 1)).sum(), (b * ((i * 40503) % 65519 + 1)).sum()});
  }
  return sums.cpu();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Comparing tensors across ranks

namespace detail {

/// Every rank's `local` (same shape and dtype everywhere) stacked as [world, ...] on the CPU.
at::Tensor all_gather(ProcessGroup::Impl& s, const at::Tensor& local, const std::string& what) {
  std::vector<at::Tensor> input{local.to(s.control_device)};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int64_t r = 0; r < s.launch.world_size; ++r) {
    output[0].push_back(torch::empty_like(input[0]));
  }
  TORCH_CHECK(s.pg, "fogo::dist: the process group was shut down");
  s.wait(s.pg->allgather(output, input), what);
  return torch::stack(output[0]).cpu();
}

/// Every rank's `table` [T, C] (int64) as [world, T, C] on the CPU. Ranks with another T are an
/// error naming each rank's count.
at::Tensor gather_table(ProcessGroup::Impl& s, const at::Tensor& table, const std::string& what) {
  const auto world = s.launch.world_size;
  const auto counts =
      all_gather(s, torch::tensor({table.size(0)}, torch::kInt64), what + " (counts)");
  const auto count = counts.accessor<int64_t, 2>();
  std::vector<int64_t> per_rank(static_cast<size_t>(world));
  bool same = true;
  for (int64_t r = 0; r < world; ++r) {
    per_rank[r] = count[r][0];
    same = same && per_rank[r] == per_rank[0];
  }
  TORCH_CHECK(same, "fogo::dist::", what, ": the ranks passed different numbers of tensors (",
              "rank 0, 1, ...: ", join(per_rank), ")");
  return all_gather(s, table, what + " (values)");
}

/// Every rank's byte string, in rank order (padded to the longest for one all-gather).
std::vector<std::string> all_gather_bytes(ProcessGroup::Impl& s, const std::string& local,
                                          const std::string& what) {
  const auto sizes = all_gather(
      s, torch::tensor({static_cast<int64_t>(local.size())}, torch::kInt64), what + " (sizes)");
  const int64_t longest = sizes.max().item<int64_t>();
  auto padded = torch::zeros({std::max<int64_t>(longest, 1)}, torch::kUInt8);
  std::copy(local.begin(), local.end(), padded.data_ptr<uint8_t>());
  const auto all = all_gather(s, padded, what).contiguous();
  std::vector<std::string> out;
  for (int64_t r = 0; r < s.launch.world_size; ++r) {
    const auto* begin = all[r].data_ptr<uint8_t>();
    out.emplace_back(begin, begin + sizes[r][0].item<int64_t>());
  }
  return out;
}

/// Ranks whose row `t` of the gathered table differs from rank 0's in columns [begin, end).
std::vector<int64_t> disagreeing(const at::Tensor& gathered, int64_t t, int64_t begin,
                                 int64_t end) {
  std::vector<int64_t> ranks;
  const auto g = gathered.accessor<int64_t, 3>();
  for (int64_t r = 1; r < gathered.size(0); ++r) {
    for (int64_t c = begin; c < end; ++c) {
      if (g[r][t][c] != g[0][t][c]) {
        ranks.push_back(r);
        break;
      }
    }
  }
  return ranks;
}

/// Requires the same names, dtypes and shapes on every rank (before a collective on them).
void check_same_layout(ProcessGroup::Impl& s, const NamedTensors& tensors,
                       const std::string& what) {
  auto table = torch::empty({static_cast<int64_t>(tensors.size()), 1}, torch::kInt64);
  for (size_t i = 0; i < tensors.size(); ++i) {
    table[i][0] = signature(tensors[i].first, tensors[i].second);
  }
  const auto gathered = gather_table(s, table, what);
  for (int64_t t = 0; t < table.size(0); ++t) {
    const auto ranks = disagreeing(gathered, t, 0, 1);
    TORCH_CHECK(ranks.empty(), "fogo::dist::", what, ": ", tensors[t].first,
                " has another dtype or shape on rank(s) ", join(ranks), " than on rank 0");
  }
}

NamedTensors numbered(const std::string& kind, const std::vector<at::Tensor>& tensors) {
  NamedTensors named;
  for (size_t i = 0; i < tensors.size(); ++i) {
    named.emplace_back(kind + " " + std::to_string(i), tensors[i]);
  }
  return named;
}

}  // namespace detail

using namespace detail;

void check_lockstep(const ProcessGroup& group, const NamedTensors& tensors) {
  auto& s = impl(group);
  const auto n = static_cast<int64_t>(tensors.size());
  auto table = torch::zeros({n, 4}, torch::kInt64);
  for (int64_t t = 0; t < n; ++t) {
    const auto& [name, tensor] = tensors[t];
    table[t][0] = signature(name, tensor);
    if (tensor.defined()) {
      table[t].narrow(0, 1, 3).copy_(content_sums(tensor));
    }
  }
  const auto gathered = gather_table(s, table, "check_lockstep");
  for (int64_t t = 0; t < n; ++t) {
    const auto& name = tensors[t].first;
    auto ranks = disagreeing(gathered, t, 0, 1);
    TORCH_CHECK(ranks.empty(), "fogo::dist::check_lockstep: tensor ", t, " ('", name,
                "' on this rank) has another name, dtype or shape on rank(s) ", join(ranks),
                " than on rank 0: the ranks passed different tensor lists");
    ranks = disagreeing(gathered, t, 1, 4);
    TORCH_CHECK(ranks.empty(), "fogo::dist::check_lockstep: ranks out of lockstep: '", name,
                "' (tensor ", t + 1, " of ", n, ") differs on rank(s) ", join(ranks),
                " from rank 0");
  }
}

NamedTensors module_state(const torch::nn::Module& module) {
  NamedTensors named;
  for (const auto& item : module.named_parameters()) {
    named.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers()) {
    named.emplace_back(item.key(), item.value());
  }
  return named;
}

NamedTensors fogo_memory(const fogo::FOGO& optimizer) {
  NamedTensors named;
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto m = optimizer.memory(g);
    const auto prefix = "fogo.group" + std::to_string(g) + ".";
    for (const auto& [name, tensor] : {std::pair{"centroids", m.centroids},
                                       {"S", m.S},
                                       {"N", m.N},
                                       {"frozen", m.frozen},
                                       {"frozen_nu", m.frozen_nu}}) {
      if (tensor.defined()) {
        named.emplace_back(prefix + name, tensor);
      }
    }
  }
  return named;
}

// ---------------------------------------------------------------------------------------------
// Broadcast

void broadcast_tensors(const ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                       int64_t root) {
  auto& s = impl(group);
  TORCH_CHECK(root >= 0 && root < s.launch.world_size, "fogo::dist::broadcast_tensors: root ", root,
              " is not a rank of WORLD_SIZE=", s.launch.world_size);
  for (const auto& t : tensors) {
    TORCH_CHECK(t.defined(), "fogo::dist::broadcast_tensors: undefined tensor");
  }
  check_same_layout(s, numbered("tensor", tensors), "broadcast_tensors");
  // One flat broadcast per device and dtype.
  std::map<std::pair<std::string, c10::ScalarType>, std::vector<at::Tensor>> groups;
  for (const auto& t : tensors) {
    groups[{t.device().str(), t.scalar_type()}].push_back(t);
  }
  torch::NoGradGuard no_grad;
  for (auto& [key, members] : groups) {
    std::vector<at::Tensor> flat_views;
    for (const auto& t : members) {
      flat_views.push_back(t.reshape({-1}));
    }
    std::vector<at::Tensor> flat{torch::cat(flat_views)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    TORCH_CHECK(s.pg, "fogo::dist: the process group was shut down");
    s.wait(s.pg->broadcast(flat, o), "broadcast_tensors");
    int64_t offset = 0;
    for (auto& t : members) {
      t.copy_(flat[0].narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

void broadcast_parameters(const ProcessGroup& group, const torch::nn::Module& module,
                          int64_t root) {
  std::vector<torch::Tensor> tensors;
  for (const auto& [name, t] : module_state(module)) {
    tensors.push_back(t);
  }
  broadcast_tensors(group, tensors, root);
}

}  // namespace fogo::dist
