// fogo::Muon's checkpoints: LibTorch's optimizer archive (options, momentum buffers, NorMuon's
// second moments) with fogo's format, checksum and ns_dtype record, loaded all-or-nothing.
#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>
#include <vector>

#include "fogo/muon.h"
#include "fogo/newton_schulz.h"
#include "fogo_private/frame/batching.h"
#include "fogo_private/frame/checks.h"
#include "fogo_private/frame/graphed_step.h"
#include "fogo_private/frame/integrity.h"
#include "fogo_private/frame/nonfinite.h"
#include "fogo_private/frame/options_table.h"
#include "fogo_private/muon/normuon.h"
#include "fogo_private/muon/update.h"
#include "fogo_private/newton_schulz/dtype_record.h"
#include "fogo_private/ops/ops.h"

namespace fogo {

bool operator==(const MuonParamState& a, const MuonParamState& b) {
  const auto same = [](const at::Tensor& x, const at::Tensor& y) {
    return x.defined() == y.defined() && (!x.defined() || at::equal(x, y));
  };
  return same(a.momentum_buffer(), b.momentum_buffer()) &&
         same(a.second_moment(), b.second_moment());
}

// second_moment only where defined (NorMuon's): a checkpoint without it (normuon never on, or
// one written before the option) loads with none.
void MuonParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(second_moment);
}

void MuonParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, momentum_buffer);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, second_moment);
}
namespace {

using option_table::MuonTable;

constexpr const char* kMuonFormat = "muon/format";  // detail::read_format; absent: format 1
constexpr const char* kMuonChecksum = "muon/checksum";
constexpr const char* kMuonNSDtypes =
    "muon/ns_dtype_resolved";  // fogo_private/newton_schulz/dtype_record.h

// Every group's options and every parameter's momentum buffer, in group order: what a checkpoint
// stores and load() recomputes from what it read; `held`: which options the checkpoint holds.
uint64_t state_checksum(const Muon& muon, option_table::HeldOptions& held) {
  detail::Checksum sum;
  for (size_t g = 0; g < muon.param_groups().size(); ++g) {
    const auto& group = muon.param_groups()[g];
    option_table::add_to_checksum<MuonTable>(static_cast<const MuonOptions&>(group.options()), sum,
                                             held.in_group(g));
    for (const auto& p : group.params()) {
      const auto it = muon.state().find(p.unsafeGetTensorImpl());
      if (it == muon.state().end()) {
        sum.add(int64_t{0});
      } else {
        const auto& st = static_cast<const MuonParamState&>(*it->second);
        sum.add(int64_t{1}).add(st.momentum_buffer());
        // NorMuon's second moment where there is one: a checkpoint without (every one from
        // before the option) sums as it did.
        if (st.second_moment().defined()) sum.add(int64_t{2}).add(st.second_moment());
      }
    }
  }
  return sum.value();
}

}  // namespace

void Muon::save(torch::serialize::OutputArchive& archive) const {
  serialize(*this, archive);
  // The oldest format that holds these options (as FOGO::save).
  archive.write(kMuonFormat,
                c10::IValue(option_table::checkpoint_format<MuonTable>(param_groups_)));
  option_table::HeldOptions all;
  detail::write_checksum(archive, kMuonChecksum, state_checksum(*this, all));
  detail::write_ns_dtypes(archive, kMuonNSDtypes,
                          detail::group_ns_dtypes<MuonOptions>(param_groups_));
}

void Muon::load(torch::serialize::InputArchive& archive) {
  detail::load_transactional(
      *this,
      [&] {
        c10::IValue value;
        TORCH_CHECK(!archive.try_read("fogo/format", value),
                    "Muon::load: not a Muon checkpoint (FOGO wrote it; load it with FOGO::load)");
        detail::read_format(archive, "Muon", "Muon", kMuonFormat,
                            option_table::newest_format<MuonTable>(), /*absent=*/1);
        // LibTorch's reader throws torch::jit errors or internal asserts, naming no optimizer,
        // for an archive that is not a Muon checkpoint (a module's, AdamW's) or a damaged one.
        try {
          serialize(*this, archive);
        } catch (const std::exception& e) {
          const std::string what = e.what();
          TORCH_CHECK(false, "Muon::load: not a Muon checkpoint (or a damaged one): ",
                      what.substr(0, what.find('\n')));
        }
        option_table::HeldOptions held(archive);
        detail::verify_checksum(archive, "Muon", kMuonChecksum, state_checksum(*this, held));
      },
      [&](size_t g, size_t i, const torch::Tensor& p) {
        auto it = state_.find(p.unsafeGetTensorImpl());
        if (it == state_.end()) return;
        auto& st = static_cast<MuonParamState&>(*it->second);
        const auto& buf = st.momentum_buffer();
        TORCH_CHECK(buf.defined() && buf.sizes() == p.sizes(),
                    "Muon::load: the checkpoint's momentum_buffer for ",
                    detail::describe_param(g, i, p), " has shape ",
                    buf.defined() ? buf.sizes() : at::IntArrayRef{},
                    "; the checkpoint was made for a different model");
        detail::check_finite_state("Muon", "momentum_buffer for " + detail::describe_param(g, i, p),
                                   buf);
        const auto& options = static_cast<const MuonOptions&>(param_groups_[g].options());
        options.validate();
        st.momentum_buffer(buf.to(p.device()));  // archives load onto the CPU
        const at::Tensor& v = st.second_moment();
        if (!v.defined()) return;  // NorMuon off when saved: a step with it on starts at zeros
        // One per row of each matrix (batch_dims: of each matrix of the stack).
        const std::vector<int64_t> rows = row_state_sizes(p.sizes(), options.batch_dims());
        TORCH_CHECK(v.sizes() == at::IntArrayRef(rows) && v.is_floating_point(),
                    "Muon::load: the checkpoint's second_moment for ",
                    detail::describe_param(g, i, p), " has shape ", v.sizes(), " (",
                    v.scalar_type(), "), expected ", at::IntArrayRef(rows),
                    " floating point (one per row of each matrix); the checkpoint was made for a "
                    "different model or another batch_dims");
        detail::check_finite_state("Muon", "second_moment for " + detail::describe_param(g, i, p),
                                   v);
        st.second_moment(v.to(p.device(), normuon_dtype(p)));
      });
  detail::warn_on_changed_ns_dtypes(archive, kMuonNSDtypes, "Muon",
                                    detail::group_ns_dtypes<MuonOptions>(param_groups_));
}
}  // namespace fogo
