// The option tables of FOGO (fogo_options.h) and Muon (muon_options.h) through their one
// machinery (src/fogo_private/frame/options_table.h): every row round-trips, compares, is summed
// and validated; checkpoints written before an option existed load, and keep loading when a row is
// added to either table; a checkpoint from a newer fogo is refused naming both formats. The tests
// iterate the tables themselves, so a row added there is covered without a change here.
#include <fogo/fogo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "fogo_private/frame/integrity.h"
#include "fogo_private/frame/options_table.h"
#include "test_util.h"

namespace {

using fogo::FOGOOptions;
using fogo::MuonOptions;
using fogo::test::expect_error;
using namespace fogo::option_table;

// ---------------------------------------------------------------------------------------------
// The two optimizers, as the typed tests below take them.

struct FOGOCase {
  using Table = FOGOTable;
  using Optim = fogo::FOGO;
  static constexpr const char* format_key = "fogo/format";
  static constexpr const char* checksum_key = "fogo/checksum";
  /// A FOGO over `p` whose group has `o` (cuda_graph set after construction, which refuses it
  /// for CPU parameters).
  static std::unique_ptr<Optim> make(const at::Tensor& p, const FOGOOptions& o) {
    // ... and with the matrix view the parameter takes whatever `o` (no step checks it).
    auto opt =
        std::make_unique<Optim>(std::vector<at::Tensor>{p},
                                FOGOOptions(o).cuda_graph(false).batch_dims(0).heads(1).blocks({}));
    static_cast<FOGOOptions&>(opt->param_groups()[0].options()) = o;
    return opt;
  }
  /// Options far from `o` but with its memory layout (a checkpoint of another layout is refused).
  static FOGOOptions far_from(const FOGOOptions& o) {
    return FOGOOptions(0.5)
        .codebook_size(o.codebook_size())
        .proj_dim(o.proj_dim())
        .seed(o.seed())
        .projection_scale(o.projection_scale());
  }
  /// A value outside its `valid` column for every checked option (independent of the table).
  static std::map<std::string, std::function<void(FOGOOptions&)>> invalid() {
    return {
        {"lr", [](FOGOOptions& o) { o.lr(-1e-3); }},
        {"weight_decay", [](FOGOOptions& o) { o.weight_decay(NAN); }},
        {"sigma", [](FOGOOptions& o) { o.sigma(-0.1); }},
        {"eps", [](FOGOOptions& o) { o.eps(0.0); }},
        {"normuon_beta2", [](FOGOOptions& o) { o.normuon_beta2(1.01); }},
        {"normuon_eps", [](FOGOOptions& o) { o.normuon_eps(0.0); }},
        {"mu_s", [](FOGOOptions& o) { o.mu_s(1.5); }},
        {"mu_f", [](FOGOOptions& o) { o.mu_f(-0.1); }},
        {"ns_steps_slow", [](FOGOOptions& o) { o.ns_steps_slow(100); }},
        {"ns_steps_fast", [](FOGOOptions& o) { o.ns_steps_fast(-1); }},
        {"ns_gram_restart", [](FOGOOptions& o) { o.ns_gram_restart(100); }},
        {"ns_schedule", [](FOGOOptions& o) { o.ns_schedule(3); }},
        {"proj_dim", [](FOGOOptions& o) { o.proj_dim(0); }},
        {"xi", [](FOGOOptions& o) { o.xi(1.5); }},
        {"codebook_size", [](FOGOOptions& o) { o.codebook_size(0); }},
        {"beta_cb", [](FOGOOptions& o) { o.beta_cb(2.0); }},
        {"lambda_c", [](FOGOOptions& o) { o.lambda_c(-1.0); }},
        {"r_dec", [](FOGOOptions& o) { o.r_dec(-1); }},
        {"reseed_every", [](FOGOOptions& o) { o.reseed_every(-1); }},
        {"reseed_threshold", [](FOGOOptions& o) { o.reseed_threshold(INFINITY); }},
        {"eps_st", [](FOGOOptions& o) { o.eps_st(1.5); }},
        {"gamma_hi", [](FOGOOptions& o) { o.gamma_hi(-1.0); }},
        {"gamma_st_min", [](FOGOOptions& o) { o.gamma_st_min(-1.0); }},
        {"gamma_st_max", [](FOGOOptions& o) { o.gamma_st_max(0.05); }},  // below gamma_st_min
        {"beta_r", [](FOGOOptions& o) { o.beta_r(1.5); }},
        {"kappa", [](FOGOOptions& o) { o.kappa(0.0); }},
        {"tau_plus", [](FOGOOptions& o) { o.tau_plus(1e5); }},
        {"tau_minus", [](FOGOOptions& o) { o.tau_minus(-1.0); }},
        {"lambda_hi", [](FOGOOptions& o) { o.lambda_hi(-1.0); }},
        {"eps_lt", [](FOGOOptions& o) { o.eps_lt(1.5); }},
        {"gamma_lt", [](FOGOOptions& o) { o.gamma_lt(-1.0); }},
        {"lt_candidates", [](FOGOOptions& o) { o.lt_candidates(0); }},
        {"freeze_per_task", [](FOGOOptions& o) { o.freeze_per_task(-1); }},
        {"lambda_prox", [](FOGOOptions& o) { o.lambda_prox(0.0); }},
        {"ns_coefficients",
         [](FOGOOptions& o) {
           o.ns_coefficients({3.0, NAN, 1.0});
         }},
        {"ns_dtype", [](FOGOOptions& o) { o.ns_dtype(torch::kInt); }},
        {"ns_form", [](FOGOOptions& o) { o.ns_form(static_cast<fogo::NSForm>(7)); }},
        {"projection_scale",
         [](FOGOOptions& o) { o.projection_scale(static_cast<fogo::ProjectionScale>(2)); }},
        {"nonfinite", [](FOGOOptions& o) { o.nonfinite(static_cast<fogo::NonFinitePolicy>(9)); }},
        {"batch_dims", [](FOGOOptions& o) { o.batch_dims(65); }},
        {"heads", [](FOGOOptions& o) { o.heads(-2); }},
        {"blocks", [](FOGOOptions& o) { o.blocks({-1}); }},
        {"ns_coefficient_schedule",
         [](FOGOOptions& o) {
           o.ns_coefficient_schedule({{1, NAN, 0}});
         }},
    };
  }
};

struct MuonCase {
  using Table = MuonTable;
  using Optim = fogo::Muon;
  static constexpr const char* format_key = "muon/format";
  static constexpr const char* checksum_key = "muon/checksum";
  static std::unique_ptr<Optim> make(const at::Tensor& p, const MuonOptions& o) {
    // Made with the options the parameter takes whatever `o` (no step checks them against it).
    auto opt =
        std::make_unique<Optim>(std::vector<at::Tensor>{p},
                                MuonOptions(o).cuda_graph(false).batch_dims(0).heads(1).blocks({}));
    static_cast<MuonOptions&>(opt->param_groups()[0].options()) = o;
    return opt;
  }
  static MuonOptions far_from(const MuonOptions&) { return MuonOptions(0.5); }
  static std::map<std::string, std::function<void(MuonOptions&)>> invalid() {
    return {
        {"lr", [](MuonOptions& o) { o.lr(-1e-3); }},
        {"weight_decay", [](MuonOptions& o) { o.weight_decay(NAN); }},
        {"momentum", [](MuonOptions& o) { o.momentum(1.5); }},
        {"ns_coefficients",
         [](MuonOptions& o) {
           o.ns_coefficients({3.0, INFINITY, 1.0});
         }},
        {"eps", [](MuonOptions& o) { o.eps(0.0); }},
        {"ns_steps", [](MuonOptions& o) { o.ns_steps(100); }},
        {"adjust_lr", [](MuonOptions& o) { o.adjust_lr(static_cast<fogo::MuonAdjustLR>(3)); }},
        {"ns_dtype", [](MuonOptions& o) { o.ns_dtype(torch::kDouble); }},
        {"nonfinite", [](MuonOptions& o) { o.nonfinite(static_cast<fogo::NonFinitePolicy>(9)); }},
        {"ns_form", [](MuonOptions& o) { o.ns_form(static_cast<fogo::NSForm>(7)); }},
        {"ns_gram_restart", [](MuonOptions& o) { o.ns_gram_restart(-1); }},
        {"ns_schedule", [](MuonOptions& o) { o.ns_schedule(3); }},
        {"normuon_beta2", [](MuonOptions& o) { o.normuon_beta2(1.01); }},
        {"normuon_eps", [](MuonOptions& o) { o.normuon_eps(0.0); }},
        {"batch_dims", [](MuonOptions& o) { o.batch_dims(-1); }},
        {"heads", [](MuonOptions& o) { o.heads(0); }},
        {"blocks",
         [](MuonOptions& o) {
           o.blocks({3, 0});
         }},
        {"ns_coefficient_schedule",
         [](MuonOptions& o) {
           o.ns_coefficient_schedule({{2, -1.5, 0.5}, {INFINITY, 0, 0}});
         }},
        {"extra_scale_factor", [](MuonOptions& o) { o.extra_scale_factor(-0.2); }},
    };
  }
};

template <class Case>
class OptionTable : public ::testing::Test {};
using Cases = ::testing::Types<FOGOCase, MuonCase>;
class CaseNames {
 public:
  template <class T>
  static std::string GetName(int) {
    return T::Table::optimizer;
  }
};
TYPED_TEST_SUITE(OptionTable, Cases, CaseNames);

// ---------------------------------------------------------------------------------------------
// Rows, by their index in the table.

// A valid value other than `v` for each type of the tables (a row of a new type fails to compile
// until it has one).
double other(double v) { return v == 0 ? 0.01 : v / 2; }
int64_t other(int64_t v) { return v == 0 ? 1 : v == 1 ? 2 : v - 1; }  // Muon's heads: 1 -> 2
std::vector<int64_t> other(const std::vector<int64_t>& v) {           // Muon's blocks
  return v.empty() ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{};
}
bool other(bool v) { return !v; }
fogo::NSSchedule other(const fogo::NSSchedule& v) {  // a coefficient list
  return v.empty() ? fogo::NSSchedule{{2.0, -1.5, 0.5}} : fogo::NSSchedule{};
}
std::tuple<double, double, double> other(const std::tuple<double, double, double>& v) {
  return v == fogo::kQuintic ? fogo::kCubic : fogo::kQuintic;
}
c10::ScalarType other(c10::ScalarType v) {
  return v == torch::kBFloat16 ? torch::kFloat : torch::kBFloat16;
}
fogo::NSForm other(fogo::NSForm v) {
  return v == fogo::NSForm::Plain ? fogo::NSForm::Gram : fogo::NSForm::Plain;
}
template <class E>
E other(E v) {
  static_assert(std::is_enum_v<E>, "an option of a new type needs its other() here");
  return static_cast<E>(static_cast<int64_t>(v) + 1);
}

struct RowInfo {
  std::string name;
  bool checked;  // its `valid` column is not any()
};

template <class Table>
std::vector<RowInfo> rows() {
  std::vector<RowInfo> out;
  const typename Table::Options defaults;
  Table::each(
      [&](const auto& row, const auto&) {
        out.push_back({row.name, !std::is_same_v<std::decay_t<decltype(row.rule)>, Any>});
      },
      defaults);
  return out;
}

// Row `i` of `o` set to other(its value).
template <class Table>
void set_other(typename Table::Options& o, size_t i) {
  size_t k = 0;
  Table::each(
      [&](const auto&, auto& v) {
        if (k++ == i) v = other(v);
      },
      o);
}

// Whether row `i` is equal in `a` and `b`.
template <class Table>
bool same_row(const typename Table::Options& a, const typename Table::Options& b, size_t i) {
  size_t k = 0;
  bool same = false;
  Table::each(
      [&](const auto&, const auto& x, const auto& y) {
        if (k++ == i) same = x == y;
      },
      a, b);
  return same;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

at::Tensor param(at::IntArrayRef shape) { return torch::randn(shape).requires_grad_(true); }

std::string saved(const torch::optim::Optimizer& opt) {
  std::ostringstream out;
  torch::save(opt, out);
  return out.str();
}

torch::serialize::InputArchive open(const std::string& bytes) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  return archive;
}

int64_t stored_int(const std::string& bytes, const char* key) {
  auto archive = open(bytes);
  c10::IValue value;
  archive.read(key, value);
  return value.toInt();
}

// For every option: a non-default value is valid, survives a checkpoint, makes the options
// unequal to the defaults and changes the checkpoint's checksum (a flipped byte in it is caught).
TYPED_TEST(OptionTable, EveryOptionRoundTripsComparesAndIsSummed) {
  using Case = TypeParam;
  using Table = typename Case::Table;
  using Options = typename Table::Options;
  const Options defaults;
  const int64_t default_sum =
      stored_int(saved(*Case::make(param({4, 6}), defaults)), Case::checksum_key);
  const std::vector<RowInfo> table = rows<Table>();
  ASSERT_GE(table.size(), 15u);  // every row of today, and any added later
  for (size_t i = 0; i < table.size(); ++i) {
    SCOPED_TRACE(table[i].name);
    Options changed = defaults;
    set_other<Table>(changed, i);
    ASSERT_FALSE(same_row<Table>(changed, defaults, i)) << "other() gave the default back";
    ASSERT_NO_THROW(changed.validate()) << "other() gave an invalid value";
    EXPECT_FALSE(changed == defaults);
    EXPECT_TRUE(changed == changed);
    torch::manual_seed(8);
    const std::string bytes = saved(*Case::make(param({4, 6}), changed));
    EXPECT_NE(stored_int(bytes, Case::checksum_key), default_sum);
    auto loaded = Case::make(param({4, 6}), Case::far_from(changed));
    auto archive = open(bytes);
    loaded->load(archive);
    const auto& got = static_cast<const Options&>(loaded->param_groups()[0].options());
    EXPECT_TRUE(same_row<Table>(got, changed, i));
    EXPECT_TRUE(got == changed);
  }
}

// For every option whose `valid` column checks something: a value outside it is refused by
// validate() naming the option.
TYPED_TEST(OptionTable, EveryCheckedOptionRejectsAnInvalidValueNamingIt) {
  using Case = TypeParam;
  using Table = typename Case::Table;
  const auto invalid = Case::invalid();
  std::set<std::string> checked, listed;
  for (const RowInfo& row : rows<Table>())
    if (row.checked) checked.insert(row.name);
  for (const auto& [name, set] : invalid) listed.insert(name);
  EXPECT_EQ(listed, checked) << "each checked option needs an invalid value here, and only those";
  for (const auto& [name, set] : invalid) {
    typename Table::Options o;
    set(o);
    expect_error([&] { o.validate(); }, std::string(Table::optimizer) + ": option '" + name + "'");
  }
}

// ---------------------------------------------------------------------------------------------
// Checkpoints written before: the fixtures, and what adding a row does to them.

// tests/data/fogo_checkpoint_aa1099b.pt: a FOGO checkpoint of aa1099b (after the checksum, before
// ns_schedule and fusion_only), written by tests/reference/make_fogo_checkpoint_aa1099b.cpp after
// five steps with a task boundary after the third: group 0 a 6x10 matrix with the defaults of
// then (lr 0.02), group 1 an 8x12 one with every option of then changed.
const char* const kFOGOFixture = FOGO_TEST_DATA_DIR "/fogo_checkpoint_aa1099b.pt";

FOGOOptions fogo_fixture_group1() {
  return FOGOOptions(0.01)
      .weight_decay(0.05)
      .sigma(0.15)
      .eps(1e-7)
      .mu_s(0.9)
      .mu_f(0.3)
      .ns_steps_slow(4)
      .ns_steps_fast(3)
      .ns_gram_restart(2)
      .proj_dim(6)
      .xi(0.3)
      .codebook_size(5)
      .beta_cb(0.9)
      .lambda_c(0.2)
      .r_dec(4)
      .reseed_every(3)
      .reseed_threshold(0.05)
      .eps_st(0.2)
      .gamma_hi(0.04)
      .gamma_st_min(0.12)
      .gamma_st_max(0.35)
      .beta_r(0.9)
      .kappa(0.25)
      .tau_plus(4.0)
      .tau_minus(3.0)
      .lambda_hi(0.2)
      .eps_lt(0.15)
      .gamma_lt(0.8)
      .lt_candidates(4)
      .freeze_per_task(2)
      .lambda_prox(0.9)
      .seed(11)
      .ns_coefficients(fogo::kCubic)
      .spectral_scaling(false)
      .reinit_codebook_on_task(true)
      .cuda_graph(true)
      .ns_dtype(torch::kFloat)
      .ns_form(fogo::NSForm::Gram)
      .projection_scale(fogo::ProjectionScale::JL)
      .nonfinite(fogo::NonFinitePolicy::Skip);
}

// A FOGO with the fixture's parameter shapes and memory layout (it has not stepped).
std::unique_ptr<fogo::FOGO> fogo_for_fixture() {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{torch::zeros({6, 10}).requires_grad_(true)});
  groups.emplace_back(std::vector<at::Tensor>{torch::zeros({8, 12}).requires_grad_(true)},
                      std::make_unique<FOGOOptions>(
                          FOGOOptions().codebook_size(5).proj_dim(6).seed(11).projection_scale(
                              fogo::ProjectionScale::JL)));
  return std::make_unique<fogo::FOGO>(std::move(groups), FOGOOptions());
}

TEST(FOGOOptions, CheckpointsFromBeforeNsScheduleAndFusionOnlyLoad) {
  auto archive = open(read_file(kFOGOFixture));
  c10::IValue sum;
  ASSERT_TRUE(archive.try_read("fogo/checksum", sum));  // verified below, not skipped
  auto opt = fogo_for_fixture();
  opt->load(archive);  // throws "the checkpoint is corrupted" where the options' sum moved
  const auto options = [&](size_t g) {
    return static_cast<const FOGOOptions&>(opt->param_groups()[g].options());
  };
  // The defaults of then, ns_dtype bf16 and ns_form Plain included (stored explicitly: the run
  // goes on as it was); the options it did not know at their defaults.
  EXPECT_TRUE(options(0) ==
              FOGOOptions(0.02).ns_dtype(torch::kBFloat16).ns_form(fogo::NSForm::Plain));
  EXPECT_TRUE(options(1) == fogo_fixture_group1());
  EXPECT_EQ(options(1).ns_schedule(), 0);
  EXPECT_FALSE(options(1).fusion_only());
  // The memory of five steps and one consolidation.
  EXPECT_EQ(opt->memory(0).centroids.sizes(), at::IntArrayRef({64, 128}));
  EXPECT_EQ(opt->memory(0).frozen.sizes(), at::IntArrayRef({20, 128}));
  EXPECT_EQ(opt->memory(1).centroids.sizes(), at::IntArrayRef({5, 6}));
  EXPECT_EQ(opt->memory(1).frozen.sizes(), at::IntArrayRef({2, 6}));
  for (const auto& group : opt->param_groups()) {
    const auto& p = group.params()[0];
    const auto& st =
        static_cast<const fogo::FOGOParamState&>(*opt->state().at(p.unsafeGetTensorImpl()));
    EXPECT_EQ(st.slow_momentum().sizes(), p.sizes());
    EXPECT_GT(st.slow_momentum().abs().sum().item<double>(), 0.0);
    EXPECT_GT(st.fast_momentum().abs().sum().item<double>(), 0.0);
  }
  // It steps on from there (on the CPU: without the CUDA graph it was saved with).
  static_cast<FOGOOptions&>(opt->param_groups()[1].options()).cuda_graph(false);
  for (auto& group : opt->param_groups())
    group.params()[0].mutable_grad() = torch::ones_like(group.params()[0]);
  opt->step();
  for (const auto& group : opt->param_groups())
    EXPECT_TRUE(torch::isfinite(group.params()[0]).all().item<bool>());
}

// tests/data/{fogo,muon}_checkpoint_4f2a4d3.pt: checkpoints of the fogo before the two tables
// shared their machinery (4f2a4d3), whose FOGO checksum summed ns_schedule and fusion_only at every
// value, written by tests/reference/make_checkpoints_4f2a4d3.cpp: FOGO group 0 a 6x10
// matrix with the defaults but lr 0.02, proj_dim 8, codebook_size 4; group 1 an 8x12 one with
// ns_schedule Polar Express, the Gram form in fp32, proj_dim 6, codebook_size 5, seed 11; group 2
// a 5x7 one fusion-only; four steps, a task boundary after the second. Muon: group 0 a 4x6 matrix
// with the defaults (lr 0.02), group 1 a 5x3 one with ns_schedule Polar Express, Nesterov off.
const char* const kFOGOFixtureBefore = FOGO_TEST_DATA_DIR "/fogo_checkpoint_4f2a4d3.pt";
const char* const kMuonFixtureBefore = FOGO_TEST_DATA_DIR "/muon_checkpoint_4f2a4d3.pt";

std::unique_ptr<fogo::FOGO> fogo_for_fixture_before() {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{torch::zeros({6, 10}).requires_grad_(true)},
                      std::make_unique<FOGOOptions>(FOGOOptions().proj_dim(8).codebook_size(4)));
  groups.emplace_back(
      std::vector<at::Tensor>{torch::zeros({8, 12}).requires_grad_(true)},
      std::make_unique<FOGOOptions>(FOGOOptions().proj_dim(6).codebook_size(5).seed(11)));
  groups.emplace_back(std::vector<at::Tensor>{torch::zeros({5, 7}).requires_grad_(true)});
  return std::make_unique<fogo::FOGO>(std::move(groups), FOGOOptions());
}

std::unique_ptr<fogo::Muon> muon_two_groups() {
  return std::make_unique<fogo::Muon>(std::vector<torch::optim::OptimizerParamGroup>{
      torch::optim::OptimizerParamGroup({torch::zeros({4, 6}).requires_grad_(true)}),
      torch::optim::OptimizerParamGroup({torch::zeros({5, 3}).requires_grad_(true)})});
}

// The fogo before this machinery summed FOGO's ns_schedule and fusion_only at every value: its
// checkpoints verify (each holds both), with the values it stored.
TEST(FOGOOptions, CheckpointsOfTheFogoBeforeLoad) {
  auto fogo_archive = open(read_file(kFOGOFixtureBefore));
  auto opt = fogo_for_fixture_before();
  opt->load(fogo_archive);
  const auto options = [&](size_t g) {
    return static_cast<const FOGOOptions&>(opt->param_groups()[g].options());
  };
  EXPECT_TRUE(options(0) == FOGOOptions(0.02).proj_dim(8).codebook_size(4));
  EXPECT_TRUE(options(1) == FOGOOptions(0.01)
                                .proj_dim(6)
                                .codebook_size(5)
                                .seed(11)
                                .ns_schedule(fogo::kPolarExpress)
                                .ns_form(fogo::NSForm::Gram)
                                .ns_dtype(torch::kFloat));
  EXPECT_TRUE(options(2) == FOGOOptions(0.02).fusion_only(true));
  EXPECT_EQ(opt->memory(0).frozen.sizes(), at::IntArrayRef({4, 8}));  // 20 asked, 4 centroids
  EXPECT_EQ(opt->memory(1).centroids.sizes(), at::IntArrayRef({5, 6}));
  EXPECT_FALSE(opt->memory(2).centroids.defined());  // fusion-only: no memory
  auto muon_archive = open(read_file(kMuonFixtureBefore));
  auto muon = muon_two_groups();
  muon->load(muon_archive);
  EXPECT_TRUE(static_cast<const MuonOptions&>(muon->param_groups()[1].options()) ==
              MuonOptions(0.01).ns_schedule(fogo::kPolarExpress).nesterov(false));
}

// Each optimizer's fixtures: checkpoints of older fogos (tests/data) and one of today's with every
// option that is not always() away from its default, each with an optimizer to load it into.
struct Fixture {
  std::string name, bytes;
  std::function<std::unique_ptr<torch::optim::Optimizer>()> optimizer;
};

template <class Case>
std::vector<Fixture> fixtures();

template <>
std::vector<Fixture> fixtures<FOGOCase>() {
  torch::manual_seed(35);
  const auto o = FOGOOptions(0.02)
                     .proj_dim(4)
                     .codebook_size(3)
                     .ns_gram_restart(2)
                     .ns_schedule(fogo::kPolarExpress)
                     .fusion_only(true)
                     .ns_form(fogo::NSForm::Gram)
                     .ns_dtype(torch::kFloat);
  auto p = param({6, 10});
  auto today = FOGOCase::make(p, o);
  for (int step = 0; step < 2; ++step) {
    p.mutable_grad() = torch::randn({6, 10});
    today->step();
  }
  static_cast<FOGOOptions&>(today->param_groups()[0].options()).cuda_graph(true);
  const auto today_layout = [o] { return FOGOCase::make(param({6, 10}), FOGOCase::far_from(o)); };
  return {{"fogo_checkpoint_aa1099b.pt", read_file(kFOGOFixture), fogo_for_fixture},
          {"fogo_checkpoint_4f2a4d3.pt", read_file(kFOGOFixtureBefore), fogo_for_fixture_before},
          {"today's", saved(*today), today_layout}};
}

template <>
std::vector<Fixture> fixtures<MuonCase>() {
  torch::manual_seed(36);
  auto p = param({4, 6});
  const auto o = MuonOptions(0.02)
                     .nonfinite(fogo::NonFinitePolicy::Skip)
                     .ns_form(fogo::NSForm::Gram)
                     .ns_gram_restart(2)
                     .ns_schedule(fogo::kPolarExpress);
  auto today = MuonCase::make(p, o);
  p.mutable_grad() = torch::randn({4, 6});
  today->step();
  static_cast<MuonOptions&>(today->param_groups()[0].options()).cuda_graph(true);
  const auto one_group = [] { return MuonCase::make(param({4, 6}), MuonOptions()); };
  // muon_checkpoint_b6a7e9f.pt: test_muon.cpp, MuonOptions.CheckpointsFromBeforeTheTableLoad.
  return {{"muon_checkpoint_b6a7e9f.pt",
           read_file(FOGO_TEST_DATA_DIR "/muon_checkpoint_b6a7e9f.pt"), muon_two_groups},
          {"muon_checkpoint_4f2a4d3.pt", read_file(kMuonFixtureBefore), muon_two_groups},
          {"today's", saved(*today), one_group}};
}

// Each table with one more row, as the next option would be added: an int64 `added_later`,
// default 7, as since(kNextFormat), first or last in its table; and, to show what the tests
// catch, the same row last as added() (counted in the checksum of every checkpoint that holds it)
// or always() (required).
template <class Base>
struct PlusOne : Base {
  PlusOne() : Base(0) {}  // as LibTorch's reader starts a group's options
  TORCH_ARG(int64_t, added_later) = 7;
};
constexpr int64_t kNextFormat = 1000;  // newer than any format so far

#define FOGO_TEST_EXTRA(X, stored) X(int64_t, added_later, 7, range(0, 9), stored)
#define FOGO_TEST_FOGO_FIRST(X) FOGO_TEST_EXTRA(X, since(kNextFormat)) FOGO_OPTIONS(X)
#define FOGO_TEST_FOGO_LAST(X) FOGO_OPTIONS(X) FOGO_TEST_EXTRA(X, since(kNextFormat))
#define FOGO_TEST_FOGO_ADDED(X) FOGO_OPTIONS(X) FOGO_TEST_EXTRA(X, added())
#define FOGO_TEST_FOGO_ALWAYS(X) FOGO_OPTIONS(X) FOGO_TEST_EXTRA(X, always())
#define FOGO_TEST_MUON_FIRST(X) FOGO_TEST_EXTRA(X, since(kNextFormat)) FOGO_MUON_OPTIONS(X)
#define FOGO_TEST_MUON_LAST(X) FOGO_MUON_OPTIONS(X) FOGO_TEST_EXTRA(X, since(kNextFormat))
#define FOGO_TEST_MUON_ADDED(X) FOGO_MUON_OPTIONS(X) FOGO_TEST_EXTRA(X, added())
#define FOGO_TEST_MUON_ALWAYS(X) FOGO_MUON_OPTIONS(X) FOGO_TEST_EXTRA(X, always())
#define FOGO_TEST_TABLE(Name, Base, ROWS)                     \
  struct Name {                                               \
    using Options = PlusOne<Base::Options>;                   \
    static constexpr const char* optimizer = Base::optimizer; \
    static constexpr int64_t layout = Base::layout;           \
    FOGO_OPTION_TABLE_EACH(ROWS)                              \
  };
FOGO_TEST_TABLE(FOGOFirst, FOGOTable, FOGO_TEST_FOGO_FIRST)
FOGO_TEST_TABLE(FOGOLast, FOGOTable, FOGO_TEST_FOGO_LAST)
FOGO_TEST_TABLE(FOGOAdded, FOGOTable, FOGO_TEST_FOGO_ADDED)
FOGO_TEST_TABLE(FOGOAlways, FOGOTable, FOGO_TEST_FOGO_ALWAYS)
FOGO_TEST_TABLE(MuonFirst, MuonTable, FOGO_TEST_MUON_FIRST)
FOGO_TEST_TABLE(MuonLast, MuonTable, FOGO_TEST_MUON_LAST)
FOGO_TEST_TABLE(MuonAdded, MuonTable, FOGO_TEST_MUON_ADDED)
FOGO_TEST_TABLE(MuonAlways, MuonTable, FOGO_TEST_MUON_ALWAYS)

template <class Case>
struct Extended;
template <>
struct Extended<FOGOCase> {
  using First = FOGOFirst;
  using Last = FOGOLast;
  using Added = FOGOAdded;
  using Always = FOGOAlways;
};
template <>
struct Extended<MuonCase> {
  using First = MuonFirst;
  using Last = MuonLast;
  using Added = MuonAdded;
  using Always = MuonAlways;
};

// What add_to_checksum adds, one fingerprint per option: two tables whose lists are equal add the
// same bytes to a checkpoint's checksum.
struct Fingerprints {
  std::vector<uint64_t> values;
  template <class T>
  Fingerprints& option(const T& v) {
    fogo::detail::Checksum one;
    one.option(v);
    values.push_back(one.value());
    return *this;
  }
};

// What `Table` sums of group g's options `o` in a checkpoint that holds what `held` says.
template <class Table>
std::vector<uint64_t> summed(const typename Table::Options& o, HeldOptions& held, size_t g) {
  Fingerprints f;
  add_to_checksum<Table>(o, f, held.in_group(g));
  return f.values;
}

// The options archive of group g in an optimizer's archive (LibTorch's layout).
torch::serialize::InputArchive group_options(const std::string& bytes, size_t g) {
  auto archive = open(bytes);
  torch::serialize::InputArchive groups, group, options;
  archive.read("param_groups", groups);
  groups.read("param_groups/" + std::to_string(g), group);
  group.read("options", options);
  return options;
}

// Group g of a checkpoint read through `Plus` (the table with one more row) and through `Table`
// (as the optimizer loaded it): the same options, the new one at its default, and the same
// checksum and format.
template <class Plus, class Table>
void expect_loaded_as_before(const std::string& bytes, HeldOptions& held, size_t g,
                             const typename Table::Options& loaded) {
  typename Plus::Options plus;
  auto archive = group_options(bytes, g);
  ASSERT_NO_THROW(read<Plus>(plus, archive));
  EXPECT_EQ(plus.added_later(), 7);  // absent: its default
  EXPECT_TRUE(static_cast<const typename Table::Options&>(plus) == loaded);
  EXPECT_EQ(summed<Plus>(plus, held, g), summed<Table>(loaded, held, g));
  EXPECT_EQ(format_needed<Plus>(plus), format_needed<Table>(loaded));
}

// Adding a row to either table keeps every fixture loading: each group's options read through the
// table with the new row (since(N), first or last; or added()) are the options the optimizer
// loads today, the new one at its default, with the same checksum and format. FOGO::load and
// Muon::load reach the table only through read, add_to_checksum and checkpoint_format, so with
// the row in its table they verify and load these checkpoints as now. And the other way: today's
// fogo reads what a fogo with the new row writes while the option is at its default (the same
// sum and format), which only since() gives: added() would make it "corrupted" here. A row
// added as always() fails the fixtures.
TYPED_TEST(OptionTable, AddingARowKeepsEveryFixtureLoading) {
  using Case = TypeParam;
  using Table = typename Case::Table;
  using Options = typename Table::Options;
  using Plus = Extended<Case>;
  for (const Fixture& fixture : fixtures<Case>()) {
    SCOPED_TRACE(fixture.name);
    auto opt = fixture.optimizer();
    auto archive = open(fixture.bytes);
    c10::IValue sum;
    ASSERT_TRUE(archive.try_read(Case::checksum_key, sum));
    ASSERT_NO_THROW(opt->load(archive));  // verifies the checksum
    HeldOptions held(archive), all;
    for (size_t g = 0; g < opt->param_groups().size(); ++g) {
      SCOPED_TRACE("group " + std::to_string(g));
      const auto& loaded = static_cast<const Options&>(opt->param_groups()[g].options());
      expect_loaded_as_before<typename Plus::First, Table>(fixture.bytes, held, g, loaded);
      expect_loaded_as_before<typename Plus::Last, Table>(fixture.bytes, held, g, loaded);
      expect_loaded_as_before<typename Plus::Added, Table>(fixture.bytes, held, g, loaded);
      // What a fogo with the new row, at its default, sums writing these options.
      typename Plus::Last::Options newer;
      static_cast<Options&>(newer) = loaded;
      EXPECT_EQ(summed<typename Plus::Last>(newer, all, g), summed<Table>(loaded, all, g));
      EXPECT_EQ(format_needed<typename Plus::Last>(newer), format_needed<Table>(loaded));
      typename Plus::Added::Options added;
      static_cast<Options&>(added) = loaded;
      EXPECT_NE(summed<typename Plus::Added>(added, all, g), summed<Table>(loaded, all, g));
      // always(): required, absent from every checkpoint written before it.
      typename Plus::Always::Options always;
      auto b = group_options(fixture.bytes, g);
      expect_error([&] { read<typename Plus::Always>(always, b); }, "has no 'added_later'");
    }
  }
}

// A checkpoint whose options need a format this fogo does not read (written by a fogo with one
// more option, set) is refused naming both formats, not as corrupted, and changes nothing.
TYPED_TEST(OptionTable, ACheckpointOfANewerFormatIsRefusedNamingBoth) {
  using Case = TypeParam;
  using Table = typename Case::Table;
  using Options = typename Table::Options;
  using Last = typename Extended<Case>::Last;
  const int64_t newest = newest_format<Table>();
  typename Last::Options newer;
  EXPECT_EQ(format_needed<Last>(newer), Table::layout);  // at its default: the format of today
  newer.added_later(8);
  const int64_t format = format_needed<Last>(newer);
  ASSERT_EQ(format, kNextFormat);
  ASSERT_GT(format, newest);
  // Today's checkpoints state the format of their options.
  torch::manual_seed(5);
  auto p = torch::randn({4, 6}).requires_grad_(true);
  auto writer = Case::make(p, Options(0.02));
  EXPECT_EQ(stored_int(saved(*writer), Case::format_key), format_needed<Table>(Options(0.02)));
  // The newer fogo's checkpoint: this one's, with its format.
  torch::serialize::OutputArchive out;
  writer->save(out);
  out.write(Case::format_key, c10::IValue(format));
  std::ostringstream stream;
  out.save_to(stream);
  const std::string bytes = stream.str();
  ASSERT_EQ(stored_int(bytes, Case::format_key), format);
  // Loaded into an optimizer that has stepped: refused, and it keeps its state and options.
  auto q = torch::randn({4, 6}).requires_grad_(true);
  auto reader = Case::make(q, Options(0.03));
  q.mutable_grad() = torch::randn({4, 6});
  reader->step();
  const std::string before = saved(*reader);
  auto archive = open(bytes);
  const std::string want = "has format " + std::to_string(format) +
                           ", written by a newer fogo; this fogo reads formats 1 to " +
                           std::to_string(newest);
  expect_error([&] { reader->load(archive); }, want);
  EXPECT_EQ(saved(*reader), before);
}

}  // namespace
