// fogo::dist's process group (dist/process_group.h): the launch environment, the rendezvous
// store, the members check, the backends.
#include <fogo/newton_schulz.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef FOGO_DISTRIBUTED_NCCL
#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <future>
#include <map>
#include <sstream>
#include <thread>

#include "fogo_private/distributed/internal.h"
#include "fogo_private/frame/agreement.h"

namespace fogo::dist {
namespace detail {

/// c10::Error's message without its C++ backtrace: the errors here quote c10d's.
std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

std::string format(std::chrono::milliseconds t) {
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
}  // namespace detail

namespace {

using namespace detail;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr const char* kEnvHint =
    "torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT";

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

}  // namespace

// ---------------------------------------------------------------------------------------------
// ProcessGroup

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
  // torchrun's agent hosts its store at its own MASTER_ADDR:MASTER_PORT only: an endpoint the
  // options move elsewhere has no store unless rank 0 hosts one (else every rank waits for a store
  // nobody serves until the timeout; torch 2.15's rendezvous reads the variable the same way).
  const auto env_addr = env("MASTER_ADDR");
  const auto env_port = env("MASTER_PORT");
  l.agent_store = env("TORCHELASTIC_USE_AGENT_STORE") == "True" && env_addr &&
                  *env_addr == l.master_addr && env_port && env_int("MASTER_PORT") == l.master_port;
  check_launch(l);
  return l;
}

ProcessGroup::Impl::Impl(const Launch& l, ProcessGroupOptions o)
    : launch(l), options(std::move(o)) {
  check_launch(launch);
  TORCH_CHECK(options.timeout().count() > 0, "fogo::dist: timeout must be positive, got ",
              options.timeout().count(), " ms");
  hosts_store = launch.rank == 0 && !launch.agent_store;
  offer_backends();
  connect_store();
  check_members();
  create_backends();
  install_agreement();
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

namespace {
std::string rank_key(int64_t r) { return "rank/" + std::to_string(r); }
// A rank's claim in the store: "WORLD_SIZE|process|backend offer" (the offer may hold '|').
int64_t world_of(const std::string& token) {
  return parse_int("WORLD_SIZE", token.substr(0, token.find('|')));
}
std::string process_of(const std::string& token) {
  const auto begin = token.find('|') + 1;
  return token.substr(begin, token.find('|', begin) - begin);
}
std::string offer_of(const std::string& token) {
  return token.substr(token.find('|', token.find('|') + 1) + 1);
}
}  // namespace

// Through the store: one process per rank, and every rank present with rank 0's WORLD_SIZE.
// Rank 0 checks the others, settles the job's backends from their offers and publishes a verdict
// ("ok", "ok+nccl" or the problem; judge_members); the others check rank 0's WORLD_SIZE
// themselves (so they fail at once when they disagree) and then wait for the verdict
// (await_verdict).
void ProcessGroup::Impl::check_members() {
  const auto deadline = Clock::now() + options.timeout();
  const std::string token = std::to_string(launch.world_size) + "|" + this_process() + "|" + offer;
  const auto holder = text(store->compareSet(rank_key(launch.rank), {}, bytes(token)));
  TORCH_CHECK(holder == token, "fogo::dist: RANK=", launch.rank,
              " is claimed by two processes: ", process_of(holder), " and this one (",
              this_process(), "); every process needs its own RANK");
  if (launch.rank != 0) {
    await_verdict(deadline);
  } else {
    judge_members(deadline);
  }
}

void ProcessGroup::Impl::await_verdict(Clock::time_point deadline) {
  const auto remaining = [&] {
    return std::max(milliseconds(1),
                    std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  };
  // Rank 0 waits for this acknowledgement before it exits with an error, so that its store
  // outlives the ranks still reading from it.
  const auto acknowledge = [&] {
    try {
      store->add("acks", 1);
    } catch (const std::exception&) {
    }
  };
  const auto world = launch.world_size;
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
  TORCH_CHECK(verdict.rfind("ok", 0) == 0, verdict, " (reported by rank 0)");
  backends.nccl = verdict == "ok+nccl";
}

void ProcessGroup::Impl::judge_members(Clock::time_point deadline) {
  const auto remaining = [&] {
    return std::max(milliseconds(1),
                    std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  };
  const auto world = launch.world_size;
  std::string problem;
  std::vector<Offer> offers{decode(offer)};
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
      problem = "fogo::dist: rank(s) " + join(missing) + " of WORLD_SIZE=" + std::to_string(world) +
                " did not join at " + store_address() + " within the timeout (" +
                format(options.timeout()) + ")";
      break;
    }
    const auto token = store->get_to_str(rank_key(r));
    const auto world_r = world_of(token);
    if (world_r != world) {
      problem = "fogo::dist: WORLD_SIZE mismatch: rank 0 has WORLD_SIZE=" + std::to_string(world) +
                " but RANK=" + std::to_string(r) + " has WORLD_SIZE=" + std::to_string(world_r);
    }
    offers.push_back(decode(offer_of(token)));
  }
  if (problem.empty()) {
    const auto job = settle_backends(offers);
    problem = job.problem;
    backends.nccl = job.nccl;
  }
  store->set("verdict", problem.empty() ? std::string(backends.nccl ? "ok+nccl" : "ok") : problem);
  if (problem.empty()) {
    return;
  }
  if (hosts_store) {  // the others' acknowledgements first: they may still read from this store
    int64_t joined = 0;
    for (int64_t r = 1; r < world; ++r) {
      joined += store->check({rank_key(r)});
    }
    const auto ack_deadline = Clock::now() + std::min(options.timeout(), milliseconds(5000));
    while (store->add("acks", 0) < joined && Clock::now() < ack_deadline) {
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  TORCH_CHECK(false, problem);
}

void ProcessGroup::Impl::create_backends() {
  const bool use_gloo = backends.gloo, use_nccl = backends.nccl;  // nccl as the job settled it
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
    if (!use_nccl) {
      // ProcessGroupGloo takes CUDA tensors too (broadcast, all-reduce, all-gather: copies to
      // pinned host memory on side streams ordered after the current one, and back), so a CUDA
      // job without NCCL (fogo built without it, Backend::Gloo, more ranks than GPUs) works,
      // slower. c10d dispatches by device type: without this, its first CUDA collective fails.
      pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, gloo);
      if (options.device() && options.device()->is_cuda()) {
        TORCH_WARN_ONCE("fogo::dist: this CUDA job communicates through Gloo, by host memory (",
                        built_with_nccl() ? "Backend::Gloo" : "fogo was built without NCCL",
                        "): slower than NCCL");
      }
    }
  }
#ifdef FOGO_DISTRIBUTED_NCCL
  if (use_nccl) {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(backends.cuda_device));
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options.timeout();
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        c10::make_intrusive<c10d::PrefixStore>("nccl", store), rank, world, nccl_options);
    pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
    if (!use_gloo) {
      pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
      control_device =
          torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(backends.cuda_device));
    }
  }
#endif
}

void ProcessGroup::Impl::install_agreement() {
  if (launch.world_size == 1) return;
  // The first value any rank offers for a key is the job's: a compare-and-set in this group's
  // store, not a collective, so it holds wherever decisions happen (a rank alone in a sharded
  // step, ranks in any order) and cannot deadlock.
  auto agreed = c10::make_intrusive<c10d::PrefixStore>("agree", store);
  agreement = fogo::detail::install_agreement(
      [agreed, here = where()](const std::string& key, int64_t local) {
        std::string value;
        try {
          value = text(agreed->compareSet(key, {}, bytes(std::to_string(local))));
        } catch (const std::exception& e) {
          TORCH_CHECK(false, "fogo::dist: ", here, ": agreeing with the other ranks on ", key,
                      " through the store failed: ", message_of(e));
        }
        return parse_int(key.c_str(), value);
      });
  // Decisions made before the group existed were each process's own.
  fogo::clear_ns_form_choices();
  fogo::clear_ns_dtype_choices();
}

void ProcessGroup::Impl::shutdown() noexcept {
  std::lock_guard<std::mutex> lock(shutdown_mutex);
  if (shut_down) {
    return;
  }
  shut_down = true;
  if (agreement >= 0) {
    fogo::detail::remove_agreement(agreement);
    agreement = -1;
  }
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
std::optional<torch::Device> ProcessGroup::cuda_device() const {
  const auto index = impl_->backends.cuda_device;
  if (index < 0) return std::nullopt;
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}
bool ProcessGroup::has_nccl() const { return impl_->backends.nccl; }

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

}  // namespace fogo::dist
