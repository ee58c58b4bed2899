#include "common/data_parallel.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#ifdef FOGO_WITH_DISTRIBUTED
#include <fogo/distributed.h>
#include <fogo/fogo_optimizer.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include "common/cli.h"
#include "common/runtime.h"
#include "common/signature.h"

namespace fogo::trainer {

void add_data_parallel_flags(Cli& cli, DataParallelFlags& flags) {
  cli.section("Data-parallel (under torchrun)");
  cli.flag("shard-step", &flags.shard_step,
           "muon, fogo: each rank runs the Newton-Schulz chains (fogo: also the projection, lift "
           "and update) of its share of the matrices, and the results are broadcast; the same "
           "results as every rank stepping everything (adam and adamw runs: no effect)");
  cli.flag("dist-timeout", &flags.dist_timeout,
           "seconds a collective waits for the other ranks before the run stops with an error");
}

void validate_data_parallel_flags(const DataParallelFlags& flags) {
  // Gloo waits with int milliseconds (24.8 days at most); beyond that the timeout wraps negative.
  constexpr int64_t kMaxTimeout = 1000000;
  Cli::require(flags.dist_timeout >= 1 && flags.dist_timeout <= kMaxTimeout, "dist-timeout",
               "must be in [1, " + std::to_string(kMaxTimeout) + "] seconds (11.5 days), got " +
                   std::to_string(flags.dist_timeout));
}

namespace {

// WORLD_SIZE as torchrun sets it; 1 when unset. A malformed value is fogo::dist's to report.
int64_t env_world_size() {
  const char* v = std::getenv("WORLD_SIZE");
  if (!v || std::string(v) == "1") return 1;
  return 2;  // any other value: a job of several processes (fogo::dist checks it)
}

DataParallel* g_process = nullptr;

}  // namespace

#ifdef FOGO_WITH_DISTRIBUTED

struct DataParallel::Impl {
  explicit Impl(fogo::dist::ProcessGroup g) : group(std::move(g)) {}
  fogo::dist::ProcessGroup group;
  std::unique_ptr<fogo::dist::GradientAverager> averager;

  torch::Tensor all_reduce_sum(torch::Tensor values) const {
    std::vector<torch::Tensor> tensors{values};
    auto work = group.c10d().allreduce(tensors);
    try {
      work->wait();
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "data-parallel: summing a value over the ranks failed on rank ",
                  group.rank(), " of ", group.world_size(),
                  " (another rank exited, crashed or stalled?): ", e.what());
    }
    return values;
  }

  // Rank 0's 1-D `values` on every rank (the others pass nullopt; rank 0 may too: then every
  // rank gets nullopt): its length (-1: none), then its contents.
  std::optional<torch::Tensor> from_main(const std::optional<torch::Tensor>& values,
                                         at::ScalarType dtype) const {
    auto size = torch::tensor({values ? values->numel() : int64_t{-1}});
    fogo::dist::broadcast_tensors(group, {size});
    const int64_t n = size.item<int64_t>();
    if (n < 0) return std::nullopt;
    auto data = values ? values->contiguous() : torch::empty({n}, dtype);
    fogo::dist::broadcast_tensors(group, {data});
    return data;
  }
};

DataParallel& DataParallel::process(std::chrono::seconds timeout,
                                    std::optional<torch::Device> device) {
  if (!g_process) {
    auto* dp = new DataParallel();
    exit_with_torchrun_agent();
    if (env_world_size() > 1) {
      auto group = fogo::dist::init_from_env(
          fogo::dist::ProcessGroupOptions()
              .timeout(std::chrono::duration_cast<std::chrono::milliseconds>(timeout))
              .device(device));
      dp->rank_ = group.rank();
      dp->world_size_ = group.world_size();
      dp->local_rank_ = group.local_rank();
      dp->cuda_device_ = group.cuda_device();
      dp->impl_ = std::make_shared<Impl>(std::move(group));
    }
    g_process = dp;  // kept to the end of the process: shutdown_process() releases the group
  }
  return *g_process;
}

void DataParallel::shutdown_process() {
  if (g_process && g_process->impl_) {
    g_process->impl_->averager.reset();
    g_process->impl_->group.shutdown();
  }
}

void DataParallel::barrier() const {
  if (impl_) impl_->group.barrier();
}

void DataParallel::broadcast_module(const torch::nn::Module& module) const {
  if (impl_) fogo::dist::broadcast_parameters(impl_->group, module);
}

void DataParallel::broadcast_buffers(const torch::nn::Module& module) const {
  if (!impl_) return;
  const auto buffers = module.buffers();
  if (!buffers.empty()) fogo::dist::broadcast_tensors(impl_->group, buffers);
}

void DataParallel::average_gradients_of(const torch::nn::Module& module) {
  if (!impl_) return;
  impl_->averager.reset();
  impl_->averager = std::make_unique<fogo::dist::GradientAverager>(impl_->group, module);
}

void DataParallel::accumulate_locally(const std::function<void()>& backward) {
  if (!impl_ || !impl_->averager) {
    backward();
    return;
  }
  auto no_sync = impl_->averager->no_sync();
  backward();
}

void DataParallel::finish_gradients() {
  if (impl_ && impl_->averager) impl_->averager->finish();
}

torch::Tensor DataParallel::sum(const torch::Tensor& values) const {
  if (!impl_) return values;
  return impl_->all_reduce_sum(values.to(torch::kCPU).clone().contiguous());
}

double DataParallel::sum(double value) const {
  if (!impl_) return value;
  return sum(torch::tensor({value}, torch::kDouble)).item<double>();
}

void DataParallel::sum_in_place(torch::Tensor& values) const {
  if (impl_) impl_->all_reduce_sum(values);
}

std::vector<double> DataParallel::from_main(const std::vector<double>& values) const {
  if (!impl_) return values;
  std::optional<torch::Tensor> mine;
  if (main()) mine = torch::tensor(values, torch::kDouble);
  const torch::Tensor data = *impl_->from_main(mine, torch::kDouble);
  return {data.data_ptr<double>(), data.data_ptr<double>() + data.numel()};
}

torch::Tensor DataParallel::gather_rows(const torch::Tensor& local, int64_t n) const {
  if (!impl_) return local;
  const auto [begin, end] = rows(n);
  TORCH_CHECK(local.dim() >= 1 && local.size(0) == end - begin, "gather_rows: rank ", rank_,
              " holds rows [", begin, ", ", end, ") of ", n, ", got a tensor of shape ",
              local.sizes());
  // Each rank's rows in place in negative zeros, summed over the ranks: x + (-0) is x for every
  // x (+0 and NaN included, unlike x + (+0) for x = -0), so the result is every rank's rows bit
  // for bit.
  auto shape = local.sizes().vec();
  shape[0] = n;
  auto whole = torch::full(shape, -0.0, local.options().device(torch::kCPU));
  whole.slice(0, begin, end).copy_(local);
  return impl_->all_reduce_sum(whole).to(local.device());
}

std::optional<std::string> DataParallel::read_on_main(const std::string& path) const {
  const auto read = [&]() -> std::optional<std::string> {
    if (!std::filesystem::is_regular_file(path)) return std::nullopt;
    std::ifstream in(path, std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    TORCH_CHECK(in.good() || in.eof(), "cannot read ", path);
    return bytes.str();
  };
  if (!impl_) return read();
  // Rank 0 reads; the bytes (or that there is no file) go to every rank.
  std::optional<torch::Tensor> mine;
  if (main()) {
    if (const auto contents = read()) {
      mine = torch::empty({static_cast<int64_t>(contents->size())}, torch::kUInt8);
      std::memcpy(mine->data_ptr<uint8_t>(), contents->data(), contents->size());
    }
  }
  const auto bytes = impl_->from_main(mine, torch::kUInt8);
  if (!bytes) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(bytes->data_ptr<uint8_t>()),
                     static_cast<size_t>(bytes->numel()));
}

namespace {
torch::Tensor text_tensor(const std::string& text) {
  auto t = torch::empty({static_cast<int64_t>(text.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr<uint8_t>(), text.data(), text.size());
  return t;
}
std::string tensor_text(const torch::Tensor& t) {
  return std::string(reinterpret_cast<const char*>(t.data_ptr<uint8_t>()),
                     static_cast<size_t>(t.numel()));
}
}  // namespace

void DataParallel::check_same_settings(const RunSignature& settings) const {
  if (!impl_) return;
  std::optional<torch::Tensor> mine;  // rank 0's text goes to every rank (another length too)
  if (main()) mine = text_tensor(settings.to_text());
  const auto main_text = tensor_text(*impl_->from_main(mine, torch::kUInt8));
  const RunSignature main_settings = RunSignature::from_text(settings.program(), main_text);
  std::string list;
  for (const auto& [flag, value] : settings.entries()) {
    std::string theirs = "(absent)";
    for (const auto& [f, v] : main_settings.entries()) {
      if (f == flag) theirs = v;
    }
    if (theirs != value) {
      list +=
          (list.empty() ? "" : "; ") + ("--" + flag + " " + value + " (rank 0: " + theirs + ")");
    }
  }
  // Every rank learns whether any rank differs, so that all of them stop here together.
  if (sum(list.empty() ? 0.0 : 1.0) == 0) return;
  if (list.empty()) {
    throw CliError("rank " + std::to_string(rank_) +
                   ": another rank was launched with other flags than rank 0 (its error names "
                   "them); every rank of a job needs the same flags");
  }
  throw CliError("rank " + std::to_string(rank_) + " was launched with other flags than rank 0: " +
                 list + "; every rank of a job needs the same flags");
}

void DataParallel::on_main(const std::function<void()>& body) const {
  if (!impl_) return body();
  std::exception_ptr error;
  std::string message;
  bool usage = false;
  if (main()) {
    try {
      body();
    } catch (const std::invalid_argument& e) {
      error = std::current_exception(), message = e.what(), usage = true;
    } catch (const std::exception& e) {
      error = std::current_exception(), message = e.what();
    }
  }
  std::optional<torch::Tensor> mine;
  if (main() && error) mine = text_tensor((usage ? "U" : "R") + message);
  const auto verdict = impl_->from_main(mine, torch::kUInt8);
  if (!verdict) return;
  if (error) std::rethrow_exception(error);
  const std::string text = tensor_text(*verdict);
  const std::string quoted = "rank 0 stopped the run: " + text.substr(1);
  if (text[0] == 'U') throw CliError(quoted);
  throw std::runtime_error(quoted);
}

std::vector<int64_t> DataParallel::shard_step(torch::optim::Optimizer& optimizer) const {
  if (!impl_) return {};
  return fogo::dist::shard_step(impl_->group, optimizer);
}

void DataParallel::check_lockstep(
    const torch::nn::Module& module, const fogo::FOGO* fogo,
    const std::vector<std::pair<std::string, torch::Tensor>>& extra) const {
  if (!impl_) return;
  auto state = fogo::dist::module_state(module);
  if (fogo) {
    auto memory = fogo::dist::fogo_memory(*fogo);
    state.insert(state.end(), memory.begin(), memory.end());
  }
  state.insert(state.end(), extra.begin(), extra.end());
  fogo::dist::check_lockstep(impl_->group, state);
}

#else  // !FOGO_WITH_DISTRIBUTED

struct DataParallel::Impl {};

DataParallel& DataParallel::process(std::chrono::seconds, std::optional<torch::Device>) {
  if (!g_process) {
    if (env_world_size() > 1) {
      throw std::runtime_error(
          "WORLD_SIZE=" + std::string(std::getenv("WORLD_SIZE")) +
          ": this program was launched as one of several processes (torchrun), but fogo was built "
          "without distributed support (FOGO_WITH_DISTRIBUTED=OFF or gloo's headers missing); "
          "rebuild with libgloo-dev installed, or run it as a single process");
    }
    g_process = new DataParallel();
  }
  return *g_process;
}

void DataParallel::shutdown_process() {}
void DataParallel::barrier() const {}
void DataParallel::broadcast_module(const torch::nn::Module&) const {}
void DataParallel::average_gradients_of(const torch::nn::Module&) {}
void DataParallel::broadcast_buffers(const torch::nn::Module&) const {}
void DataParallel::accumulate_locally(const std::function<void()>& backward) { backward(); }
void DataParallel::finish_gradients() {}
torch::Tensor DataParallel::sum(const torch::Tensor& values) const { return values; }
double DataParallel::sum(double value) const { return value; }
void DataParallel::sum_in_place(torch::Tensor&) const {}
std::vector<double> DataParallel::from_main(const std::vector<double>& values) const {
  return values;
}
torch::Tensor DataParallel::gather_rows(const torch::Tensor& local, int64_t) const { return local; }
std::optional<std::string> DataParallel::read_on_main(const std::string& path) const {
  if (!std::filesystem::is_regular_file(path)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}
std::vector<int64_t> DataParallel::shard_step(torch::optim::Optimizer&) const { return {}; }
void DataParallel::check_same_settings(const RunSignature&) const {}
void DataParallel::on_main(const std::function<void()>& body) const { body(); }
void DataParallel::check_lockstep(const torch::nn::Module&, const fogo::FOGO*,
                                  const std::vector<std::pair<std::string, torch::Tensor>>&) const {
}

#endif

DataParallel::DataParallel() = default;

std::pair<int64_t, int64_t> DataParallel::rows(int64_t n) const {
  return {rank_ * n / world_size_, (rank_ + 1) * n / world_size_};
}

std::ostream& DataParallel::main_only(std::ostream& out) const {
  static std::ostream discard(nullptr);
  return main() ? out : discard;
}

}  // namespace fogo::trainer
