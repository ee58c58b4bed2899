// FOGO's checkpoints: LibTorch's optimizer archive (options, momenta) plus each group's memory
// (codebook, EMA statistics, frozen bank, generator, step counter).
#include <torch/serialize/archive.h>

#include "fogo/fogo_optimizer.h"
#include "fogo/matrix_view.h"
#include "fogo_private/fogo/state.h"
#include "fogo_private/frame/checks.h"
#include "fogo_private/frame/integrity.h"
#include "fogo_private/frame/options_table.h"
#include "fogo_private/muon/normuon.h"
#include "fogo_private/newton_schulz/dtype_record.h"

namespace fogo {

namespace {

at::Tensor or_empty(const at::Tensor& t) { return t.defined() ? t : at::empty({0}); }

// The options that lay out a group's memory: a checkpoint that differs in one of them holds a
// codebook of another size or in another projected space, which this optimizer cannot continue.
void check_same_layout(size_t group, const FOGOOptions& mine, const FOGOOptions& theirs) {
  const auto check = [&](const char* option, int64_t a, int64_t b) {
    TORCH_CHECK(a == b, "FOGO::load: group ", group, " of the checkpoint has ", option, " ", b,
                ", this optimizer ", a, "; a codebook cannot move to another ", option);
  };
  check("codebook_size", mine.codebook_size(), theirs.codebook_size());
  check("proj_dim", mine.proj_dim(), theirs.proj_dim());
  check("seed", mine.seed(), theirs.seed());
  check("projection_scale", static_cast<int64_t>(mine.projection_scale()),
        static_cast<int64_t>(theirs.projection_scale()));
}

using option_table::FOGOTable;

constexpr const char* kFormat = "fogo/format";  // detail::read_format
constexpr const char* kChecksum = "fogo/checksum";
constexpr const char* kNSDtypes =
    "fogo/ns_dtype_resolved";  // fogo_private/newton_schulz/dtype_record.h

// Every group's options and every parameter's momenta, in group order (the memory follows, added
// by save and load as they write and read it); `held`: which options the checkpoint holds.
detail::Checksum options_and_momenta(const FOGO& fogo, option_table::HeldOptions& held) {
  detail::Checksum sum;
  for (size_t g = 0; g < fogo.param_groups().size(); ++g) {
    const auto& group = fogo.param_groups()[g];
    option_table::add_to_checksum<FOGOTable>(static_cast<const FOGOOptions&>(group.options()), sum,
                                             held.in_group(g));
    for (const auto& p : group.params()) {
      const auto it = fogo.state().find(p.unsafeGetTensorImpl());
      if (it == fogo.state().end()) {
        sum.add(int64_t{0});
        continue;
      }
      const auto& st = static_cast<const FOGOParamState&>(*it->second);
      sum.add(int64_t{1}).add(st.slow_momentum()).add(st.fast_momentum());
      // NorMuon's second moment where there is one (a checkpoint without: the sum of before).
      if (st.second_moment().defined()) sum.add(int64_t{2}).add(st.second_moment());
    }
  }
  return sum;
}

}  // namespace

void FOGO::save(torch::serialize::OutputArchive& archive) const {
  serialize(*this, archive);
  option_table::HeldOptions all;
  detail::Checksum sum = options_and_momenta(*this, all);
  // The oldest format that holds these options: a since() option at its default leaves the
  // checkpoint readable by the fogos before it.
  archive.write(kFormat, c10::IValue(option_table::checkpoint_format<FOGOTable>(param_groups_)));
  archive.write("fogo/groups", c10::IValue(static_cast<int64_t>(impl_->groups.size())));
  for (size_t g = 0; g < impl_->groups.size(); ++g) {
    const GroupMemory& mem = impl_->groups[g];
    torch::serialize::OutputArchive a(archive.compilation_unit());
    a.write("initialized", c10::IValue(mem.initialized));
    a.write("step", c10::IValue(mem.step));
    sum.add(static_cast<int64_t>(mem.initialized)).add(mem.step);
    const auto tensor = [&](const char* name, const at::Tensor& t) {
      a.write(name, or_empty(t), /*is_buffer=*/true);
      sum.add(or_empty(t));
    };
    mem.visit([&](const char* name, const at::Tensor& t, unsigned use) {
      if (use & GroupMemory::kSaved) tensor(name, t);
    });
    tensor("generator", mem.gen.get_state());
    a.write("consolidated", c10::IValue(mem.consolidated));
    sum.add(static_cast<int64_t>(mem.consolidated));
    archive.write("fogo/group/" + std::to_string(g), a);
  }
  detail::write_checksum(archive, kChecksum, sum.value());
  detail::write_ns_dtypes(archive, kNSDtypes, detail::group_ns_dtypes<FOGOOptions>(param_groups_));
}

namespace {

// The checked shapes of a loaded group's memory (codebook_size C, proj_dim d of its options).
void check_memory_shapes(const GroupMemory& mem, size_t g, const FOGOOptions& o) {
  const int64_t C = o.codebook_size(), d = o.proj_dim();
  if (mem.initialized) {
    auto expect = [&](const at::Tensor& t, std::vector<int64_t> shape, const char* what) {
      TORCH_CHECK(t.defined() && t.sizes() == at::IntArrayRef(shape), "FOGO::load: group ", g,
                  "'s ", what, " has shape ", t.defined() ? t.sizes() : at::IntArrayRef{},
                  ", expected ", at::IntArrayRef(shape),
                  " (codebook_size C and proj_dim d must match the checkpoint's)");
    };
    expect(mem.book.centroids, {C, d}, "codebook");
    expect(mem.book.S, {C, d}, "codebook statistics S");
    expect(mem.book.N, {C}, "codebook counts N");
    expect(mem.start, {C, d}, "task-start snapshot");
    expect(mem.rbar, {}, "conflict EMA");
  }
  if (mem.frozen.defined()) {
    TORCH_CHECK(mem.frozen.dim() == 2 && mem.frozen.size(1) == d && mem.frozen_nu.defined() &&
                    mem.frozen_nu.size(0) == mem.frozen.size(0),
                "FOGO::load: group ", g, "'s frozen bank has shape ", mem.frozen.sizes(),
                ", expected [F, ", d, "] with F importance weights");
  }
}

// Group g's memory from its archive `a` (as save wrote it), on `device`, each value added to
// `sum` in the order save added them.
GroupMemory read_memory(torch::serialize::InputArchive& a, size_t g, const FOGOOptions& o,
                        const at::Device& device, detail::Checksum& sum) {
  c10::IValue value;
  GroupMemory mem;
  a.read("initialized", value);
  mem.initialized = value.toBool();
  a.read("step", value);
  mem.step = value.toInt();
  sum.add(static_cast<int64_t>(mem.initialized)).add(mem.step);
  mem.visit([&](const char* name, at::Tensor& t, unsigned use) {
    if (!(use & GroupMemory::kSaved)) return;
    a.read(name, t, /*is_buffer=*/true);
    sum.add(t);
    detail::check_finite_state("FOGO", "group " + std::to_string(g) + "'s " + name, t);
    t = t.numel() == 0 && t.dim() == 1 ? at::Tensor() : t.to(device);
  });
  at::Tensor gen_state;
  a.read("generator", gen_state, true);
  sum.add(gen_state);
  mem.consolidated = a.try_read("consolidated", value) && value.toBool();
  sum.add(static_cast<int64_t>(mem.consolidated));
  mem.gen = make_cpu_generator(0);
  mem.gen.set_state(gen_state);
  check_memory_shapes(mem, g, o);
  return mem;
}

// A loaded parameter state (parameter i of group g, options `o`): checked and moved to the
// parameter's device.
void check_loaded_state(FOGOParamState& st, size_t g, size_t i, const at::Tensor& p,
                        const FOGOOptions& o) {
  for (const at::Tensor& t : {st.slow_momentum(), st.fast_momentum()}) {
    TORCH_CHECK(t.defined() && t.sizes() == p.sizes(), "FOGO::load: the checkpoint's momentum for ",
                detail::describe_param(g, i, p), " has shape ",
                t.defined() ? t.sizes() : at::IntArrayRef{},
                "; the checkpoint was made for a different model");
  }
  detail::check_finite_state("FOGO", "slow momentum for " + detail::describe_param(g, i, p),
                             st.slow_momentum());
  detail::check_finite_state("FOGO", "fast momentum for " + detail::describe_param(g, i, p),
                             st.fast_momentum());
  st.slow_momentum(st.slow_momentum().to(p.device()));
  st.fast_momentum(st.fast_momentum().to(p.device()));
  const at::Tensor& v = st.second_moment();
  if (!v.defined()) return;
  // One per row of each matrix (batch_dims: of each matrix of the stack).
  const std::vector<int64_t> rows = row_state_sizes(p.sizes(), o.batch_dims());
  TORCH_CHECK(v.sizes() == at::IntArrayRef(rows), "FOGO::load: the checkpoint's second_moment for ",
              detail::describe_param(g, i, p), " has shape ", v.sizes(), ", expected ",
              at::IntArrayRef(rows),
              " (one per row of each matrix); the checkpoint was made for a different "
              "model or another batch_dims");
  detail::check_finite_state("FOGO", "second moment for " + detail::describe_param(g, i, p), v);
  st.second_moment(v.to(p.device(), normuon_dtype(p)));
}

}  // namespace

void FOGO::load(torch::serialize::InputArchive& archive) {
  std::vector<GroupMemory> loaded;
  detail::load_transactional(
      *this,
      [&] {
        c10::IValue value;
        detail::read_format(archive, "FOGO", "FOGO", kFormat,
                            option_table::newest_format<FOGOTable>());
        std::vector<FOGOOptions> before;
        for (const auto& group : param_groups_)
          before.push_back(static_cast<const FOGOOptions&>(group.options()));
        serialize(*this, archive);
        for (size_t g = 0; g < before.size() && g < param_groups_.size(); ++g) {
          check_same_layout(g, before[g],
                            static_cast<const FOGOOptions&>(param_groups_[g].options()));
        }
        option_table::HeldOptions held(archive);
        detail::Checksum sum = options_and_momenta(*this, held);
        archive.read("fogo/groups", value);
        const int64_t count = value.toInt();
        TORCH_CHECK(count <= static_cast<int64_t>(param_groups_.size()),
                    "FOGO::load: the checkpoint has memory for ", count, " groups, this optimizer ",
                    param_groups_.size(), " groups");
        for (int64_t g = 0; g < count; ++g) {
          const auto& o = static_cast<const FOGOOptions&>(param_groups_[g].options());
          const at::Device device = param_groups_[g].params().empty()
                                        ? at::Device(at::kCPU)
                                        : param_groups_[g].params()[0].device();
          torch::serialize::InputArchive a;
          archive.read("fogo/group/" + std::to_string(g), a);
          loaded.push_back(read_memory(a, g, o, device, sum));
        }
        detail::verify_checksum(archive, "FOGO", kChecksum, sum.value());
      },
      [&](size_t g, size_t i, const torch::Tensor& p) {
        const auto it = state_.find(p.unsafeGetTensorImpl());
        if (it == state_.end()) return;
        check_loaded_state(static_cast<FOGOParamState&>(*it->second), g, i, p,
                           static_cast<const FOGOOptions&>(param_groups_[g].options()));
      });
  impl_->groups = std::move(loaded);
  detail::warn_on_changed_ns_dtypes(archive, kNSDtypes, "FOGO",
                                    detail::group_ns_dtypes<FOGOOptions>(param_groups_));
}

}  // namespace fogo
