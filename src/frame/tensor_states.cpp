// The frame's generic checkpoint of named per-parameter tensors (fogo/tensor_states.h).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fogo/tensor_states.h>

#include "fogo_private/frame/checks.h"
#include "fogo_private/frame/integrity.h"

namespace fogo {

namespace {

constexpr int64_t kFormat = 1;

std::string key(const std::string& prefix, size_t g, size_t i, const std::string& name) {
  return prefix + "/state/" + std::to_string(g) + "/" + std::to_string(i) + "/" + name;
}

// The layout, every lr and every state tensor, in group order: what a checkpoint stores and
// load recomputes from what it read.
uint64_t checksum(const torch::optim::Optimizer& optimizer, const TensorStates& states) {
  detail::Checksum sum;
  sum.add(static_cast<int64_t>(optimizer.param_groups().size()));
  for (const auto& group : optimizer.param_groups()) {
    sum.add(static_cast<int64_t>(group.params().size())).add(group.options().get_lr());
    for (const at::Tensor& p : group.params()) {
      const auto it = optimizer.state().find(p.unsafeGetTensorImpl());
      sum.add(int64_t{it != optimizer.state().end()});
      if (it == optimizer.state().end()) continue;
      for (const auto& [name, t] : states.get(*it->second)) sum.add(t);
    }
  }
  return sum.value();
}

}  // namespace

void save_tensor_states(const torch::optim::Optimizer& optimizer,
                        torch::serialize::OutputArchive& archive, const std::string& prefix,
                        const TensorStates& states) {
  archive.write(prefix + "/format", c10::IValue(kFormat));
  const auto& groups = optimizer.param_groups();
  archive.write(prefix + "/groups", c10::IValue(static_cast<int64_t>(groups.size())));
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string group = prefix + "/group/" + std::to_string(g);
    archive.write(group + "/params", c10::IValue(static_cast<int64_t>(groups[g].params().size())));
    archive.write(group + "/lr", c10::IValue(groups[g].options().get_lr()));
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const auto it = optimizer.state().find(groups[g].params()[i].unsafeGetTensorImpl());
      if (it == optimizer.state().end()) continue;
      for (const auto& [name, t] : states.get(*it->second))
        archive.write(key(prefix, g, i, name), t);
    }
  }
  detail::write_checksum(archive, (prefix + "/checksum").c_str(), checksum(optimizer, states));
}

namespace {

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key, const char* who) {
  c10::IValue v;
  TORCH_CHECK(archive.try_read(key, v) && v.isInt(), who, "::load: the checkpoint has no ", key,
              " (not a checkpoint of ", who, ", or a damaged one)");
  return v.toInt();
}

// Parameter i of group g's state from the archive, checked (nullptr: it had none).
std::unique_ptr<torch::optim::OptimizerParamState> read_state(
    torch::serialize::InputArchive& archive, const std::string& prefix, size_t g, size_t i,
    const at::Tensor& p, const TensorStates& states,
    const std::function<bool(const std::string&)>& same_shape, const char* who) {
  TensorStates::Named named;
  for (const std::string& name : states.names) {
    at::Tensor t;
    if (!archive.try_read(key(prefix, g, i, name), t)) {
      TORCH_CHECK(named.empty(), who, "::load: the checkpoint's state of ",
                  detail::describe_param(g, i, p), " lacks ", name, " (a damaged checkpoint)");
      return nullptr;
    }
    TORCH_CHECK(!same_shape(name) || t.sizes() == p.sizes(), who, "::load: the checkpoint's ", name,
                " for ", detail::describe_param(g, i, p), " has shape ", t.sizes(),
                "; the checkpoint was made for a different model");
    detail::check_finite_state(who, name + " for " + detail::describe_param(g, i, p), t);
    named.emplace_back(name, t.to(p.device()));  // archives load onto the CPU
  }
  return states.make(named);
}

}  // namespace

void load_tensor_states(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive,
                        const std::string& prefix, const TensorStates& states,
                        const std::function<bool(const std::string&)>& same_shape,
                        const char* who) {
  const auto load = [&] {
    const int64_t format = read_int(archive, prefix + "/format", who);
    TORCH_CHECK(format == kFormat, who, "::load: checkpoint format ", format, ", this fogo reads ",
                kFormat);
    auto& groups = optimizer.param_groups();
    const int64_t n = read_int(archive, prefix + "/groups", who);
    TORCH_CHECK(n == static_cast<int64_t>(groups.size()), who, "::load: the checkpoint has ", n,
                " param groups, this optimizer ", groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      const std::string group = prefix + "/group/" + std::to_string(g);
      const int64_t params = read_int(archive, group + "/params", who);
      TORCH_CHECK(params == static_cast<int64_t>(groups[g].params().size()), who,
                  "::load: the checkpoint's param group ", g, " has ", params,
                  " parameters, this optimizer's ", groups[g].params().size());
      c10::IValue lr;
      TORCH_CHECK(archive.try_read(group + "/lr", lr) && lr.isDouble(), who,
                  "::load: the checkpoint has no ", group, "/lr");
      groups[g].options().set_lr(lr.toDouble());
      for (size_t i = 0; i < groups[g].params().size(); ++i) {
        const at::Tensor& p = groups[g].params()[i];
        auto state = read_state(archive, prefix, g, i, p, states, same_shape, who);
        if (state) optimizer.state()[p.unsafeGetTensorImpl()] = std::move(state);
      }
    }
    detail::verify_checksum(archive, who, (prefix + "/checksum").c_str(),
                            checksum(optimizer, states));
  };
  detail::load_transactional(optimizer, load, [](size_t, size_t, const at::Tensor&) {});
}

}  // namespace fogo
