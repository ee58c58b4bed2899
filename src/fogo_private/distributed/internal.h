#pragma once
// What the parts of fogo::dist share (src/distributed/*.cpp): the process group's state and the
// collectives the others build on. Private to the library.
#include <fogo/distributed.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace fogo::dist {
namespace detail {

/// c10::Error's message without its C++ backtrace: the errors here quote c10d's.
std::string message_of(const std::exception& e);
/// "10 s" or "1500 ms".
std::string format(std::chrono::milliseconds t);
/// "0, 2, 3".
std::string join(const std::vector<int64_t>& values);

/// One rank's part in the job's backend choice, carried by the members check to rank 0.
struct Offer {
  Backends backends;  ///< choose_backends' answer on that rank
  std::string gpu;    ///< its GPU's identity (gpu_identity), "" for none or unknown
  std::string error;  ///< choose_backends' error on that rank (then the rest is empty)
};
std::string encode(const Offer& offer);
Offer decode(const std::string& text);

/// The job's choice from every rank's offer (rank order): NCCL or not, or the problem that
/// stops the job (its message, the same on every rank).
struct JobBackends {
  bool nccl = false;
  std::string problem;
};
JobBackends settle_backends(const std::vector<Offer>& offers);

/// CUDA device `index`'s UUID as nvidia-smi prints it ("GPU-8f3a...", "MIG-..."), the same in
/// every process whatever CUDA_VISIBLE_DEVICES numbers it; "" without NCCL in the build.
std::string gpu_identity(int64_t index);

}  // namespace detail

struct ProcessGroup::Impl {
  Launch launch;
  ProcessGroupOptions options;
  bool hosts_store = false;
  c10::intrusive_ptr<c10d::Store> store;  // this group's prefix of the TCPStore
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  torch::Device control_device = torch::kCPU;
  Backends backends;       ///< this rank's choose_backends, with `nccl` as the job settled it
  std::string offer;       ///< detail::encode'd: what the members check carries to rank 0
  int64_t agreement = -1;  ///< fogo::detail::install_agreement's handle, -1 for none
  /// A collective failed: other ranks are gone or stuck, so shutdown() does not wait for them.
  std::atomic<bool> failed{false};
  std::mutex shutdown_mutex;
  bool shut_down = false;

  Impl(const Launch& l, ProcessGroupOptions o);
  ~Impl() { shutdown(); }

  std::string where() const {
    return "rank " + std::to_string(launch.rank) + " of " + std::to_string(launch.world_size);
  }
  std::string store_address() const {
    return launch.master_addr + ":" + std::to_string(launch.master_port);
  }

  void connect_store();
  void check_members();
  /// check_members on a rank other than 0: rank 0's WORLD_SIZE, then its verdict.
  void await_verdict(std::chrono::steady_clock::time_point deadline);
  /// check_members on rank 0: every other rank and its WORLD_SIZE; the verdict published.
  void judge_members(std::chrono::steady_clock::time_point deadline);
  /// choose_backends on this machine into `backends` and `offer` (an error goes in the offer,
  /// so that every rank reports it).
  void offer_backends();
  void create_backends();
  /// Makes ns_form Auto's decisions the job's (fogo_private/frame/agreement.h) through the store.
  void install_agreement();
  void shutdown() noexcept;

  /// Waits for `work`; a failure marks the group failed and becomes an error naming `what`.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) {
    try {
      work->wait();
    } catch (const std::exception& e) {
      failed = true;
      TORCH_CHECK(false, "fogo::dist: ", what, " failed on ", where(),
                  ": another rank exited, crashed or stalled past the timeout (",
                  detail::format(options.timeout()), "). c10d: ", detail::message_of(e));
    }
  }
};

ProcessGroup::Impl& impl(const ProcessGroup& group);

namespace detail {

/// Every rank's `local` (same shape and dtype everywhere) stacked as [world, ...] on the CPU.
at::Tensor all_gather(ProcessGroup::Impl& s, const at::Tensor& local, const std::string& what);
/// Every rank's `table` [T, C] (int64) as [world, T, C] on the CPU. Ranks with another T are an
/// error naming each rank's count.
at::Tensor gather_table(ProcessGroup::Impl& s, const at::Tensor& table, const std::string& what);
/// Every rank's byte string, in rank order.
std::vector<std::string> all_gather_bytes(ProcessGroup::Impl& s, const std::string& local,
                                          const std::string& what);
/// Ranks whose row `t` of the gathered table differs from rank 0's in columns [begin, end).
std::vector<int64_t> disagreeing(const at::Tensor& gathered, int64_t t, int64_t begin, int64_t end);
/// Requires the same names, dtypes and shapes on every rank (before a collective on them).
void check_same_layout(ProcessGroup::Impl& s, const NamedTensors& tensors, const std::string& what);
/// "kind 0", "kind 1", ... for tensors without names.
NamedTensors numbered(const std::string& kind, const std::vector<at::Tensor>& tensors);

}  // namespace detail
}  // namespace fogo::dist
