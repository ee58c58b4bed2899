// fogo::dist: process groups over c10d, gradient averaging, sharded steps, lockstep checks
// (distributed.h).
#include <fogo/distributed.h>
#include <fogo/fogo_optimizer.h>
#include <fogo/hybrid.h>
#include <fogo/muon.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef FOGO_DISTRIBUTED_NCCL
#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace fogo::dist {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr const char* kEnvHint =
    "torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT";

/// c10::Error's message without its C++ backtrace: the errors here quote c10d's.
std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

std::string format(milliseconds t) {
  std::ostringstream out;
  if (t.count() % 1000 == 0) {
    out << t.count() / 1000 << " s";
  } else {
    out << t.count() << " ms";
  }
  return out.str();
}

std::string join(const std::vector<int64_t>& values) {
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i) {
    out << (i ? ", " : "") << values[i];
  }
  return out.str();
}

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::optional<std::string>(value) : std::nullopt;
}

int64_t parse_int(const char* name, const std::string& text) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  TORCH_CHECK(error == std::errc() && end == text.data() + text.size() && !text.empty(),
              "fogo::dist: ", name, "='", text, "' is not an integer");
  return value;
}

int64_t env_int(const char* name) {
  const auto text = env(name);
  TORCH_CHECK(text, "fogo::dist: environment variable ", name, " is not set (", kEnvHint, ")");
  return parse_int(name, *text);
}

void check_launch(const Launch& l) {
  TORCH_CHECK(l.world_size >= 1 && l.world_size <= std::numeric_limits<int>::max(),
              "fogo::dist: WORLD_SIZE=", l.world_size, " is not a positive int");
  TORCH_CHECK(l.rank >= 0 && l.rank < l.world_size, "fogo::dist: RANK=", l.rank,
              " is not in [0, WORLD_SIZE=", l.world_size, ")");
  TORCH_CHECK(l.local_rank >= 0 && l.local_rank < l.world_size,
              "fogo::dist: LOCAL_RANK=", l.local_rank, " is not in [0, WORLD_SIZE=", l.world_size,
              ")");
  TORCH_CHECK(l.local_world_size == 0 ||
                  (l.local_world_size > l.local_rank && l.local_world_size <= l.world_size),
              "fogo::dist: LOCAL_WORLD_SIZE=", l.local_world_size,
              " is not in (LOCAL_RANK=", l.local_rank, ", WORLD_SIZE=", l.world_size, "]");
  TORCH_CHECK(!l.master_addr.empty(), "fogo::dist: MASTER_ADDR is empty");
  TORCH_CHECK(l.master_port >= 1 && l.master_port <= 65535,
              "fogo::dist: MASTER_PORT=", l.master_port, " is not a TCP port in [1, 65535]");
}

/// All ranks on this machine: Gloo can then stay on the loopback interface.
bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

std::string this_process() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + ":" + std::to_string(getpid());
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

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
// ProcessGroup

struct ProcessGroup::Impl {
  Launch launch;
  ProcessGroupOptions options;
  bool hosts_store = false;
  c10::intrusive_ptr<c10d::Store> store;  // this group's prefix of the TCPStore
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  torch::Device control_device = torch::kCPU;
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
  void create_backends();
  void shutdown() noexcept;

  /// Waits for `work`; a failure marks the group failed and becomes an error naming `what`.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) {
    try {
      work->wait();
    } catch (const std::exception& e) {
      failed = true;
      TORCH_CHECK(false, "fogo::dist: ", what, " failed on ", where(),
                  ": another rank exited, crashed or stalled past the timeout (",
                  format(options.timeout()), "). c10d: ", message_of(e));
    }
  }
};

ProcessGroup::Impl& impl(const ProcessGroup& group) { return *group.impl_; }

Launch Launch::from_env(const ProcessGroupOptions& options) {
  Launch l;
  l.world_size = env_int("WORLD_SIZE");
  l.rank = env_int("RANK");
  l.local_rank = env_int("LOCAL_RANK");
  l.local_world_size = env("LOCAL_WORLD_SIZE") ? env_int("LOCAL_WORLD_SIZE") : 0;
  if (options.master_addr()) {
    l.master_addr = *options.master_addr();
  } else {
    const auto addr = env("MASTER_ADDR");
    TORCH_CHECK(addr, "fogo::dist: environment variable MASTER_ADDR is not set (", kEnvHint, ")");
    l.master_addr = *addr;
  }
  l.master_port = options.master_port() ? *options.master_port() : env_int("MASTER_PORT");
  l.agent_store = env("TORCHELASTIC_USE_AGENT_STORE") == "True";
  check_launch(l);
  return l;
}

ProcessGroup::Impl::Impl(const Launch& l, ProcessGroupOptions o)
    : launch(l), options(std::move(o)) {
  check_launch(launch);
  TORCH_CHECK(options.timeout().count() > 0, "fogo::dist: timeout must be positive, got ",
              options.timeout().count(), " ms");
  hosts_store = launch.rank == 0 && !launch.agent_store;
  connect_store();
  check_members();
  create_backends();
}

void ProcessGroup::Impl::connect_store() {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(launch.master_port);
  o.isServer = hosts_store;
  if (hosts_store) {
    o.numWorkers = static_cast<size_t>(launch.world_size);
  }
  // The members are checked by check_members(), which names what is wrong; the server's own
  // wait for workers would only report a count.
  o.waitWorkers = false;
  o.timeout = options.timeout();
  o.multiTenant = true;  // several groups of one process may share the server
  c10::intrusive_ptr<c10d::Store> tcp;
  // c10d's client, once connected, waits for the server's answer with no timeout: a host that
  // accepts the connection but never answers (a stalled process on the port, another program)
  // would hold this rank forever. So the store is made on a helper thread and waited for at most
  // the timeout, plus a margin that lets c10d's own errors (refused, unreachable) come first; a
  // helper still blocked then is left behind, detached, and ends with the process.
  auto made = std::make_shared<std::promise<c10::intrusive_ptr<c10d::Store>>>();
  auto future = made->get_future();
  std::thread([made, addr = launch.master_addr, o] {
    try {
      made->set_value(c10::make_intrusive<c10d::TCPStore>(addr, o));
    } catch (...) {
      made->set_exception(std::current_exception());
    }
  }).detach();
  const auto margin = std::min(options.timeout(), std::chrono::milliseconds(5000));
  TORCH_CHECK(future.wait_for(options.timeout() + margin) == std::future_status::ready,
              "fogo::dist: ", where(), " cannot ", hosts_store ? "host" : "reach",
              " the rendezvous store at MASTER_ADDR:MASTER_PORT = ", store_address(),
              ": a process there accepted the connection but did not answer within the timeout (",
              format(options.timeout()),
              "); is MASTER_PORT another program's, or is rank 0 stalled?");
  try {
    tcp = future.get();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "fogo::dist: ", where(), " cannot ", hosts_store ? "host" : "reach",
                " the rendezvous store at MASTER_ADDR:MASTER_PORT = ", store_address(),
                " within the timeout (", format(options.timeout()), "): ", message_of(e));
  }
  // Each group of a process gets its own key space; ranks create their groups in the same order.
  static std::atomic<int64_t> groups_created{0};
  store = c10::make_intrusive<c10d::PrefixStore>("fogo/group" + std::to_string(groups_created++),
                                                 std::move(tcp));
}

// Through the store: one process per rank, and every rank present with rank 0's WORLD_SIZE.
// Rank 0 checks the others and publishes a verdict; the others check rank 0's WORLD_SIZE
// themselves (so they fail at once when they disagree) and then wait for the verdict.
void ProcessGroup::Impl::check_members() {
  const auto deadline = Clock::now() + options.timeout();
  const auto remaining = [&] {
    return std::max(milliseconds(1),
                    std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  };
  const auto world = launch.world_size;
  const auto rank_key = [](int64_t r) { return "rank/" + std::to_string(r); };
  const auto world_of = [](const std::string& token) {
    return parse_int("WORLD_SIZE", token.substr(0, token.find('|')));
  };
  const auto process_of = [](const std::string& token) {
    return token.substr(token.find('|') + 1);
  };

  const std::string token = std::to_string(world) + "|" + this_process();
  const auto holder = text(store->compareSet(rank_key(launch.rank), {}, bytes(token)));
  TORCH_CHECK(holder == token, "fogo::dist: RANK=", launch.rank,
              " is claimed by two processes: ", process_of(holder), " and this one (",
              this_process(), "); every process needs its own RANK");

  if (launch.rank != 0) {
    // Rank 0 waits for this acknowledgement before it exits with an error, so that its store
    // outlives the ranks still reading from it.
    const auto acknowledge = [&] {
      try {
        store->add("acks", 1);
      } catch (const std::exception&) {
      }
    };
    try {
      store->wait({rank_key(0)}, remaining());
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "fogo::dist: ", where(), ": rank 0 did not join at ", store_address(),
                  " within the timeout (", format(options.timeout()), "): ", message_of(e));
    }
    const auto world0 = world_of(store->get_to_str(rank_key(0)));
    if (world0 != world) {
      acknowledge();
      TORCH_CHECK(false, "fogo::dist: WORLD_SIZE mismatch: RANK=", launch.rank,
                  " has WORLD_SIZE=", world, " but rank 0 has WORLD_SIZE=", world0);
    }
    std::string verdict;
    try {
      // Rank 0 may take its whole timeout to find a missing rank, and its clock started about
      // when this one's did: a few seconds' grace let its verdict arrive.
      store->wait({"verdict"}, remaining() + milliseconds(5000));
      verdict = store->get_to_str("verdict");
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "fogo::dist: ", where(), ": rank 0 did not confirm the members within ",
                  "the timeout (", format(options.timeout()), "): ", message_of(e));
    }
    acknowledge();
    TORCH_CHECK(verdict == "ok", verdict, " (reported by rank 0)");
    return;
  }

  std::string problem;
  for (int64_t r = 1; r < world && problem.empty(); ++r) {
    try {
      store->wait({rank_key(r)}, remaining());
    } catch (const std::exception&) {
      std::vector<int64_t> missing;
      for (int64_t q = r; q < world; ++q) {
        if (!store->check({rank_key(q)})) {
          missing.push_back(q);
        }
      }
      problem = "rank(s) " + join(missing) + " of WORLD_SIZE=" + std::to_string(world) +
                " did not join at " + store_address() + " within the timeout (" +
                format(options.timeout()) + ")";
      break;
    }
    const auto world_r = world_of(store->get_to_str(rank_key(r)));
    if (world_r != world) {
      problem = "WORLD_SIZE mismatch: rank 0 has WORLD_SIZE=" + std::to_string(world) +
                " but RANK=" + std::to_string(r) + " has WORLD_SIZE=" + std::to_string(world_r);
    }
  }
  store->set("verdict", problem.empty() ? std::string("ok") : "fogo::dist: " + problem);
  if (problem.empty()) {
    return;
  }
  if (hosts_store) {
    int64_t joined = 0;
    for (int64_t r = 1; r < world; ++r) {
      joined += store->check({rank_key(r)});
    }
    const auto ack_deadline = Clock::now() + std::min(options.timeout(), milliseconds(5000));
    while (store->add("acks", 0) < joined && Clock::now() < ack_deadline) {
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  TORCH_CHECK(false, "fogo::dist: ", problem);
}

Backends choose_backends(const ProcessGroupOptions& options, const Launch& launch,
                         int64_t cuda_devices, bool nccl_built) {
  const auto backend = options.backend();
  const auto& device = options.device();
  TORCH_CHECK(!device || device->is_cpu() || device->is_cuda(),
              "fogo::dist: ProcessGroupOptions::device must be a CPU or CUDA device, got ",
              *device);
  // NCCL runs on cuda:LOCAL_RANK: a rank without a GPU of its own cannot take part in it, and
  // a NCCL group is only whole when every rank has one. A launcher that does not say how many
  // ranks share the node (LOCAL_WORLD_SIZE) may have put them all on it.
  const bool own_gpu = launch.local_rank < cuda_devices;
  const int64_t local_world =
      launch.local_world_size > 0 ? launch.local_world_size : launch.world_size;
  const auto no_gpu_for_this_rank = [&](const char* why) {
    TORCH_CHECK(
        false, "fogo::dist: ", why, " needs one GPU per rank on each node (it runs on ",
        "cuda:LOCAL_RANK), but LOCAL_RANK=", launch.local_rank, " of ", local_world,
        " local rank(s) finds ", cuda_devices, " CUDA device(s) visible. Launch at most ",
        cuda_devices, " rank(s) per node (torchrun --nproc-per-node ",
        std::max<int64_t>(cuda_devices, 1),
        "), or keep the job's tensors on the CPU (ProcessGroupOptions::device(torch::kCPU); "
        "the trainers' --device cpu), which communicates through Gloo");
  };
  switch (backend) {
    case Backend::Gloo:
      return {true, false};
    case Backend::Nccl:
      TORCH_CHECK(nccl_built, "fogo::dist: backend Nccl requested but fogo was built without NCCL");
      TORCH_CHECK(!device || device->is_cuda(), "fogo::dist: backend Nccl communicates CUDA ",
                  "tensors, but ProcessGroupOptions::device is ", *device,
                  " (use Backend::Gloo or Auto for a CPU job)");
      if (!own_gpu) no_gpu_for_this_rank("backend Nccl");
      return {false, true};
    case Backend::Auto:
      break;
  }
  if (!nccl_built) return {true, false};  // Gloo moves CUDA tensors too, through the host
  if (device) {
    if (device->is_cpu()) return {true, false};
    if (!own_gpu) no_gpu_for_this_rank("a CUDA job (ProcessGroupOptions::device cuda)");
    return {true, true};
  }
  // No device named: NCCL only where every local rank has a GPU. The decision is the same on
  // every rank of a node (it reads the node's figures, not this rank's), so no rank ends up
  // waiting for a NCCL peer that never created its backend.
  return {true, local_world <= cuda_devices};
}

void ProcessGroup::Impl::create_backends() {
#ifdef FOGO_DISTRIBUTED_NCCL
  const bool nccl_built = true;
  const int64_t cuda_devices = torch::cuda::is_available() ? c10::cuda::device_count() : 0;
#else
  const bool nccl_built = false;
  const int64_t cuda_devices = 0;
#endif
  const auto [use_gloo, use_nccl] = choose_backends(options, launch, cuda_devices, nccl_built);
  const int rank = static_cast<int>(launch.rank);
  const int world = static_cast<int>(launch.world_size);
  pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);

  if (use_gloo) {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout());
    // Torch's convention: GLOO_SOCKET_IFNAME names the interfaces; a loopback MASTER_ADDR means
    // a single machine, where loopback is enough; otherwise the address this host's name
    // resolves to.
    if (const auto interfaces = env("GLOO_SOCKET_IFNAME")) {
      std::stringstream list(*interfaces);
      for (std::string name; std::getline(list, name, ',');) {
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
      }
    } else if (is_loopback(launch.master_addr)) {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    c10::intrusive_ptr<c10d::Backend> gloo;
    try {
      gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>("gloo", store), rank, world, gloo_options);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "fogo::dist: ", where(), ": connecting Gloo to the other ranks failed ",
                  "within the timeout (", format(options.timeout()), "): ", message_of(e));
    }
    pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  }
#ifdef FOGO_DISTRIBUTED_NCCL
  if (use_nccl) {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(launch.local_rank));
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options.timeout();
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        c10::make_intrusive<c10d::PrefixStore>("nccl", store), rank, world, nccl_options);
    pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
    if (!use_gloo) {
      pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
      control_device =
          torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(launch.local_rank));
    }
  }
#endif
}

void ProcessGroup::Impl::shutdown() noexcept {
  std::lock_guard<std::mutex> lock(shutdown_mutex);
  if (shut_down) {
    return;
  }
  shut_down = true;
  try {
    if (pg && !failed) {
      // The last rank to arrive marks the exit; the rank hosting the store waits for that mark.
      if (store->add("exit", 1) == launch.world_size) {
        store->set("exit/done", "1");
      }
      if (hosts_store) {
        store->wait({"exit/done"}, options.timeout());
      }
    }
  } catch (const std::exception& e) {
    TORCH_WARN("fogo::dist: shutdown on ", where(), ": not every rank reached shutdown within ",
               format(options.timeout()), ": ", message_of(e));
  }
  try {
    if (pg) {
      failed ? pg->abort() : pg->shutdown();
    }
  } catch (const std::exception& e) {
    TORCH_WARN("fogo::dist: shutdown on ", where(), ": ", message_of(e));
  }
  pg.reset();
  store.reset();
}

ProcessGroup::ProcessGroup(const Launch& launch, ProcessGroupOptions options)
    : impl_(std::make_shared<Impl>(launch, std::move(options))) {}

int64_t ProcessGroup::rank() const { return impl_->launch.rank; }
int64_t ProcessGroup::world_size() const { return impl_->launch.world_size; }
int64_t ProcessGroup::local_rank() const { return impl_->launch.local_rank; }
const ProcessGroupOptions& ProcessGroup::options() const { return impl_->options; }
torch::Device ProcessGroup::control_device() const { return impl_->control_device; }

c10d::ProcessGroup& ProcessGroup::c10d() const {
  TORCH_CHECK(impl_->pg, "fogo::dist: the process group was shut down");
  return *impl_->pg;
}

void ProcessGroup::barrier() const {
  c10d::BarrierOptions o;
  o.device = impl_->control_device;
  impl_->wait(c10d().barrier(o), "barrier");
}

void ProcessGroup::shutdown() const { impl_->shutdown(); }

ProcessGroup init_from_env(ProcessGroupOptions options) {
  const auto launch = Launch::from_env(options);
  return ProcessGroup(launch, std::move(options));
}

// ---------------------------------------------------------------------------------------------
// Comparing tensors across ranks

namespace {

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

}  // namespace

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

// ---------------------------------------------------------------------------------------------
// Sharded optimizer mode

double newton_schulz_cost(const torch::Tensor& param) {
  if (param.dim() < 2) {
    return static_cast<double>(param.numel());
  }
  const auto m = static_cast<double>(param.size(0));
  const auto n = static_cast<double>(param.numel()) / std::max(m, 1.0);
  return m * n * std::min(m, n);
}

namespace {

/// Greedy balance: costliest first (ties: the earlier parameter), to the least-loaded rank
/// (ties: the lower rank). Only shapes enter, so every rank computes the same owners.
std::vector<int64_t> assign_owners(const std::vector<at::Tensor>& params, int64_t world,
                                   const ShardedOptimizer::Cost& cost) {
  std::vector<size_t> order(params.size());
  std::vector<double> costs(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    order[i] = i;
    costs[i] = cost(params[i]);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return costs[a] > costs[b]; });
  std::vector<double> load(static_cast<size_t>(world), 0.0);
  std::vector<int64_t> owners(params.size(), 0);
  for (const auto i : order) {
    const auto r = std::min_element(load.begin(), load.end()) - load.begin();
    owners[i] = r;
    load[r] += costs[i];
  }
  return owners;
}

/// Overwrites every rank's tensors[i] with owners[i]'s: per owner, one flat broadcast per device
/// and dtype.
void broadcast_from_owners(ProcessGroup::Impl& s, const std::vector<at::Tensor>& tensors,
                           const std::vector<int64_t>& owners, const std::string& what) {
  torch::NoGradGuard no_grad;
  for (int64_t owner = 0; owner < s.launch.world_size; ++owner) {
    std::map<std::pair<std::string, c10::ScalarType>, std::vector<at::Tensor>> groups;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (owners[i] == owner) {
        groups[{tensors[i].device().str(), tensors[i].scalar_type()}].push_back(tensors[i]);
      }
    }
    for (auto& [key, members] : groups) {
      std::vector<at::Tensor> flat_views;
      for (const auto& t : members) {
        flat_views.push_back(t.detach().reshape({-1}));
      }
      std::vector<at::Tensor> flat{torch::cat(flat_views)};
      c10d::BroadcastOptions o;
      o.rootRank = owner;
      TORCH_CHECK(s.pg, "fogo::dist: the process group was shut down");
      s.wait(s.pg->broadcast(flat, o), what + ": broadcast from rank " + std::to_string(owner));
      if (owner == s.launch.rank) {
        continue;
      }
      int64_t offset = 0;
      for (const auto& t : members) {
        t.detach().copy_(flat[0].narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    }
  }
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(ProcessGroup group, std::vector<torch::Tensor> params,
                                   Factory make, const Cost& cost)
    : group_(std::move(group)), params_(std::move(params)), make_(std::move(make)) {
  for (size_t i = 0; i < params_.size(); ++i) {
    TORCH_CHECK(params_[i].defined(), "fogo::dist::ShardedOptimizer: parameter ", i,
                " is undefined");
  }
  TORCH_CHECK(make_, "fogo::dist::ShardedOptimizer: no factory");
  check_same_layout(impl(group_), numbered("parameter", params_), "ShardedOptimizer");
  owners_ = assign_owners(params_, group_.world_size(), cost);
  const auto owned = owned_by(group_.rank());
  if (!owned.empty()) {
    local_ = make_(owned);
    TORCH_CHECK(local_, "fogo::dist::ShardedOptimizer: the factory returned no optimizer");
  }
}

std::vector<torch::Tensor> ShardedOptimizer::owned_by(int64_t rank) const {
  std::vector<torch::Tensor> owned;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owners_[i] == rank) {
      owned.push_back(params_[i]);
    }
  }
  return owned;
}

void ShardedOptimizer::step() {
  if (local_) {
    local_->step();
  }
  broadcast_from_owners(impl(group_), params_, owners_, "ShardedOptimizer::step");
}

namespace {

/// Moves the state of `params` from `from` to `to` and copies `from`'s param-group options into
/// `to` (group by group: the factory makes one layout).
void move_state(torch::optim::Optimizer& from, torch::optim::Optimizer& to,
                const std::vector<torch::Tensor>& params, const std::string& what) {
  TORCH_CHECK(from.param_groups().size() == to.param_groups().size(), "fogo::dist::", what,
              ": the factory made ", from.param_groups().size(), " and ", to.param_groups().size(),
              " param groups for two sets of parameters; it must make one layout");
  for (size_t g = 0; g < to.param_groups().size(); ++g) {
    to.param_groups()[g].set_options(from.param_groups()[g].options().clone());
  }
  for (const auto& p : params) {
    auto it = from.state().find(p.unsafeGetTensorImpl());
    if (it != from.state().end()) {
      to.state()[p.unsafeGetTensorImpl()] = std::move(it->second);
      from.state().erase(it);
    }
  }
}

}  // namespace

void ShardedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  std::string blob;
  if (local_) {
    torch::serialize::OutputArchive mine;
    local_->save(mine);
    std::ostringstream out;
    mine.save_to(out);
    blob = out.str();
  }
  const auto blobs = all_gather_bytes(impl(group_), blob, "ShardedOptimizer::save");
  auto whole = make_(params_);
  TORCH_CHECK(whole, "fogo::dist::ShardedOptimizer: the factory returned no optimizer");
  // From the highest rank down, so that the options that stay are the lowest owner's (every
  // rank's are the same when the training loop sets them alike).
  for (int64_t r = group_.world_size() - 1; r >= 0; --r) {
    const auto owned = owned_by(r);
    if (owned.empty()) {
      continue;
    }
    auto shard = make_(owned);
    torch::serialize::InputArchive in;
    std::istringstream bytes(blobs[r]);
    in.load_from(bytes);
    shard->load(in);
    move_state(*shard, *whole, owned, "ShardedOptimizer::save");
  }
  whole->save(archive);
}

void ShardedOptimizer::load(torch::serialize::InputArchive& archive) {
  auto whole = make_(params_);
  TORCH_CHECK(whole, "fogo::dist::ShardedOptimizer: the factory returned no optimizer");
  whole->load(archive);  // throws before anything here changes
  const auto owned = owned_by(group_.rank());
  std::unique_ptr<torch::optim::Optimizer> local;
  if (!owned.empty()) {
    local = make_(owned);
    move_state(*whole, *local, owned, "ShardedOptimizer::load");
  }
  local_ = std::move(local);
}

std::vector<int64_t> shard_step(const ProcessGroup& group, torch::optim::Optimizer& optimizer,
                                const ShardedOptimizer::Cost& cost) {
  if (auto* hybrid = dynamic_cast<fogo::HybridOptimizer*>(&optimizer)) {
    TORCH_CHECK(hybrid->matrix(), "fogo::dist::shard_step: the hybrid has no matrix side");
    return shard_step(group, *hybrid->matrix(), cost);
  }
  auto* fogo_opt = dynamic_cast<fogo::FOGO*>(&optimizer);
  auto* muon = dynamic_cast<fogo::Muon*>(&optimizer);
  TORCH_CHECK(fogo_opt || muon, "fogo::dist::shard_step shards fogo::FOGO, fogo::Muon or a ",
              "HybridOptimizer's matrix side, not a ", c10::demangle(typeid(optimizer).name()),
              "; other optimizers shard with ShardedOptimizer");
  std::vector<at::Tensor> params;
  for (const auto& g : optimizer.param_groups()) {
    for (const auto& p : g.params()) {
      params.push_back(p);
    }
  }
  check_same_layout(impl(group), numbered("parameter", params), "shard_step");
  const auto owners = assign_owners(params, group.world_size(), cost);
  auto owner_of = std::make_shared<std::map<const c10::TensorImpl*, int64_t>>();
  for (size_t i = 0; i < params.size(); ++i) {
    (*owner_of)[params[i].unsafeGetTensorImpl()] = owners[i];
  }
  const auto find = [owner_of](const at::Tensor& p) {
    const auto it = owner_of->find(p.unsafeGetTensorImpl());
    TORCH_CHECK(it != owner_of->end(), "fogo::dist::shard_step: a parameter of the step ",
                "was not in the optimizer when it was sharded; call shard_step again after ",
                "add_param_group");
    return it->second;
  };
  fogo::StepShard shard;
  const auto rank = group.rank();
  shard.owns = [find, rank](const torch::Tensor& p) { return find(p) == rank; };
  shard.exchange = [find, group](const std::vector<torch::Tensor>& ps,
                                 const std::vector<std::vector<torch::Tensor>>& values) {
    std::vector<at::Tensor> tensors;
    std::vector<int64_t> owners;
    for (size_t i = 0; i < ps.size(); ++i) {
      const auto owner = find(ps[i]);
      for (const auto& t : values[i]) {
        tensors.push_back(t);
        owners.push_back(owner);
      }
    }
    broadcast_from_owners(impl(group), tensors, owners, "shard_step exchange");
  };
  if (fogo_opt) {
    fogo_opt->set_step_shard(std::move(shard));
  } else {
    muon->set_step_shard(std::move(shard));
  }
  return owners;
}

void ShardedOptimizer::zero_grad() {
  for (auto& p : params_) {
    p.mutable_grad() = torch::Tensor();
  }
}

// ---------------------------------------------------------------------------------------------
// GradientAverager

struct GradientAverager::State {
  struct Bucket {
    std::vector<size_t> members;   // indices into params
    std::vector<int64_t> offsets;  // of each member in flat
    at::Tensor flat;
    size_t waiting = 0;  // members whose gradient this backward has not produced yet
    c10::intrusive_ptr<c10d::Work> work;
  };

  ProcessGroup group;
  std::vector<at::Tensor> params;
  std::vector<std::string> names;  // in errors
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;
  std::vector<uint8_t> ready;
  size_t next_launch = 0;  // buckets go out in order: every rank issues the same collectives
  bool sync = true;
  std::mutex mutex;
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks;

  State(ProcessGroup g, const NamedTensors& all, int64_t bucket_bytes);
  ~State() {
    for (auto& [node, key] : hooks) {
      node->del_post_hook(key);
    }
  }

  /// From the hook on parameter i's gradient accumulator, once backward has accumulated it.
  void mark_ready(size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!sync) {
      return;
    }
    TORCH_CHECK(!ready[i], "fogo::dist::GradientAverager: the gradient of ", names[i],
                " was accumulated twice since the last finish(): accumulate inside no_sync(), ",
                "or call finish() after each backward");
    ready[i] = 1;
    if (--buckets[bucket_of[i]].waiting == 0) {
      while (next_launch < buckets.size() && buckets[next_launch].waiting == 0) {
        launch(next_launch++);
      }
    }
  }

  /// Copies bucket k's gradients (zeros where a parameter has none) into its buffer and starts
  /// the all-reduce.
  void launch(size_t k) {
    auto& b = buckets[k];
    {
      torch::NoGradGuard no_grad;
      for (size_t j = 0; j < b.members.size(); ++j) {
        const auto& p = params[b.members[j]];
        auto slice = b.flat.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
        const auto& grad = p.grad();
        if (grad.defined()) {
          TORCH_CHECK(!grad.is_sparse(), "fogo::dist::GradientAverager: ", names[b.members[j]],
                      " has a sparse gradient, which is not supported");
          slice.copy_(grad);
        } else {
          slice.zero_();
        }
      }
    }
    std::vector<at::Tensor> tensors{b.flat};
    b.work = group.c10d().allreduce(tensors);
  }

  void reset() {
    std::fill(ready.begin(), ready.end(), 0);
    for (auto& b : buckets) {
      b.waiting = b.members.size();
      b.work.reset();
    }
    next_launch = 0;
  }

  void finish();
};

namespace {

struct ReadyHook : torch::autograd::FunctionPostHook {
  ReadyHook(GradientAverager::State* s, size_t i) : state(s), index(i) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    state->mark_ready(index);
    return outputs;
  }
  GradientAverager::State* state;
  size_t index;
};

}  // namespace

GradientAverager::State::State(ProcessGroup g, const NamedTensors& all, int64_t bucket_bytes)
    : group(std::move(g)) {
  TORCH_CHECK(bucket_bytes > 0, "fogo::dist::GradientAverager: bucket_bytes must be positive");
  NamedTensors named;
  for (const auto& [name, p] : all) {
    TORCH_CHECK(p.defined(), "fogo::dist::GradientAverager: ", name, " is undefined");
    if (!p.requires_grad()) {
      continue;
    }
    TORCH_CHECK(p.is_leaf(), "fogo::dist::GradientAverager: ", name, " is not a leaf tensor");
    for (size_t j = 0; j < params.size(); ++j) {
      TORCH_CHECK(!params[j].is_same(p), "fogo::dist::GradientAverager: ", name, " and ", names[j],
                  " are the same tensor");
    }
    params.push_back(p);
    names.push_back(name);
    named.emplace_back(name, p);
  }
  check_same_layout(impl(group), named, "GradientAverager");

  // Reverse order, one open bucket per (device, dtype): backward tends to produce gradients from
  // the last parameters to the first, so buckets fill (and go out) early.
  std::map<std::pair<std::string, c10::ScalarType>, size_t> open;
  std::vector<int64_t> filled;
  bucket_of.resize(params.size());
  for (size_t i = params.size(); i-- > 0;) {
    const auto& p = params[i];
    const std::pair key{p.device().str(), p.scalar_type()};
    auto it = open.find(key);
    if (it == open.end()) {
      it = open.emplace(key, buckets.size()).first;
      buckets.emplace_back();
      filled.push_back(0);
    }
    const auto k = it->second;
    buckets[k].members.push_back(i);
    buckets[k].offsets.push_back(filled[k] / static_cast<int64_t>(p.element_size()));
    filled[k] += p.numel() * static_cast<int64_t>(p.element_size());
    bucket_of[i] = k;
    if (filled[k] >= bucket_bytes) {
      open.erase(it);
    }
  }
  for (size_t k = 0; k < buckets.size(); ++k) {
    const auto& first = params[buckets[k].members[0]];
    buckets[k].flat = torch::empty({filled[k] / static_cast<int64_t>(first.element_size())},
                                   first.options().requires_grad(false));
  }
  ready.assign(params.size(), 0);
  reset();
  for (size_t i = 0; i < params.size(); ++i) {
    auto node = torch::autograd::impl::grad_accumulator(params[i]);
    const auto key = node->add_post_hook(std::make_unique<ReadyHook>(this, i));
    hooks.emplace_back(std::move(node), key);
  }
}

void GradientAverager::State::finish() {
  std::lock_guard<std::mutex> lock(mutex);
  TORCH_CHECK(sync, "fogo::dist::GradientAverager::finish() inside a no_sync() scope");
  auto& s = impl(group);
  const auto world = s.launch.world_size;
  at::Tensor counts;
  try {
    // Buckets backward did not complete hold parameters without a gradient on this rank.
    while (next_launch < buckets.size()) {
      launch(next_launch++);
    }
    auto used = torch::empty({static_cast<int64_t>(params.size())}, torch::kInt32);
    for (size_t i = 0; i < params.size(); ++i) {
      used[static_cast<int64_t>(i)] = static_cast<int32_t>(params[i].grad().defined());
    }
    std::vector<at::Tensor> used_tensors{used.to(s.control_device)};
    const auto used_work = group.c10d().allreduce(used_tensors);
    for (size_t k = 0; k < buckets.size(); ++k) {
      s.wait(buckets[k].work, "all-reduce of gradient bucket " + std::to_string(k) + " (of " +
                                  std::to_string(buckets.size()) + ")");
    }
    s.wait(used_work, "all-reduce of the gradient counts");
    counts = used_tensors[0].cpu();
  } catch (...) {
    reset();
    throw;
  }
  const auto count = counts.accessor<int32_t, 1>();
  torch::NoGradGuard no_grad;
  for (auto& b : buckets) {
    b.flat.div_(world);
    for (size_t j = 0; j < b.members.size(); ++j) {
      const auto i = b.members[j];
      if (count[static_cast<int64_t>(i)] == 0) {
        continue;  // no rank has a gradient: it stays undefined
      }
      auto& p = params[i];
      const auto average = b.flat.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
      auto& grad = p.mutable_grad();
      if (grad.defined()) {
        grad.copy_(average);
      } else {
        grad = torch::empty_like(p, at::MemoryFormat::Preserve).copy_(average);
      }
    }
  }
  reset();
}

GradientAverager::GradientAverager(ProcessGroup group, const std::vector<torch::Tensor>& params,
                                   GradientAveragerOptions options)
    : state_(std::make_unique<State>(std::move(group), numbered("parameter", params),
                                     options.bucket_bytes())) {}
GradientAverager::GradientAverager(ProcessGroup group, const torch::nn::Module& module,
                                   GradientAveragerOptions options) {
  NamedTensors named;
  for (const auto& item : module.named_parameters()) {
    named.emplace_back(item.key(), item.value());
  }
  state_ = std::make_unique<State>(std::move(group), named, options.bucket_bytes());
}
GradientAverager::~GradientAverager() = default;
GradientAverager::GradientAverager(GradientAverager&&) noexcept = default;
GradientAverager& GradientAverager::operator=(GradientAverager&&) noexcept = default;

void GradientAverager::finish() { state_->finish(); }

GradientAverager::NoSync GradientAverager::no_sync() { return NoSync(*this); }

GradientAverager::NoSync::NoSync(GradientAverager& averager) : averager_(averager) {
  auto& s = *averager_.state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  previous_ = s.sync;
  s.sync = false;
}

GradientAverager::NoSync::~NoSync() {
  auto& s = *averager_.state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  s.sync = previous_;
}

size_t GradientAverager::buckets_started() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->next_launch;
}

std::vector<std::vector<size_t>> GradientAverager::buckets() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : state_->buckets) {
    out.push_back(b.members);
  }
  return out;
}

}  // namespace fogo::dist
