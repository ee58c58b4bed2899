// ns_dtype auto (fogo/ns_dtype.h), the optimizers' default: how it resolves (an injected CPU
// measurement for both outcomes, the environment variable, the setter, the real measurement on
// this host), that the optimizers' default steps are bit for bit those of the dtype it resolves
// to, and what checkpoints hold of it.
#include <c10/util/Exception.h>
#include <fogo/fogo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fogo_private/frame/agreement.h"
#include "test_util.h"

namespace {

// While alive: Auto's CPU measurement answers `times` (counting calls), FOGO_NS_DTYPE is unset
// and nothing is kept or forced; on exit the default measurement, the variable as it was and no
// kept choices, whatever the test did.
struct InjectedProbe {
  fogo::NSDtypeTimes times;
  int calls = 0;
  std::optional<std::string> env;
  InjectedProbe(double bf16_ms, double fp32_ms) : times{bf16_ms, fp32_ms, "injected"} {
    if (const char* v = std::getenv(fogo::kNSDtypeEnv)) env = v;
    unsetenv(fogo::kNSDtypeEnv);
    fogo::set_ns_auto_dtype(fogo::kNSDtypeAuto);
    fogo::set_ns_dtype_probe([this] {
      ++calls;
      return times;
    });
  }
  ~InjectedProbe() {
    fogo::set_ns_dtype_probe(nullptr);
    fogo::set_ns_auto_dtype(fogo::kNSDtypeAuto);
    if (env) {
      setenv(fogo::kNSDtypeEnv, env->c_str(), 1);
    } else {
      unsetenv(fogo::kNSDtypeEnv);
    }
  }
};

const c10::Device kCpu(c10::kCPU);

// Collects c10 warnings (TORCH_WARN) while alive.
struct Warnings : c10::WarningHandler {
  std::vector<std::string> messages;
  c10::WarningUtils::WarningHandlerGuard guard{this};
  void process(const c10::Warning& w) override { messages.push_back(w.msg()); }
};

}  // namespace

TEST(NewtonSchulzDtype, CodesAndNamesAreStable) {
  // Checkpoints hold these numbers: bf16 15, fp32 6 as LibTorch numbers them (and as checkpoints
  // written before auto hold them); auto -1, never c10's Undefined, whose number moves.
  EXPECT_EQ(fogo::ns_dtype_code(torch::kBFloat16), 15);
  EXPECT_EQ(fogo::ns_dtype_code(torch::kFloat), 6);
  EXPECT_EQ(fogo::ns_dtype_code(fogo::kNSDtypeAuto), -1);
  for (const auto d : {fogo::kNSDtypeAuto, c10::kBFloat16, c10::kFloat, c10::kDouble})
    EXPECT_EQ(fogo::ns_dtype_from_code(fogo::ns_dtype_code(d)), d);
  EXPECT_EQ(fogo::ns_dtype_name(fogo::kNSDtypeAuto), "auto");
  EXPECT_EQ(fogo::ns_dtype_name(torch::kBFloat16), "bf16");
  EXPECT_EQ(fogo::ns_dtype_name(torch::kFloat), "fp32");
  EXPECT_EQ(fogo::MuonOptions().ns_dtype(), fogo::kNSDtypeAuto);
  EXPECT_EQ(fogo::FOGOOptions().ns_dtype(), fogo::kNSDtypeAuto);
}

// The injected measurement decides, once per process: bf16 only when kNSBf16Margin times
// faster; the choice is listed with its times.
TEST(NewtonSchulzDtype, TheCpuTakesBf16OnlyWhenMeasuredClearlyFaster) {
  struct Case {
    double bf16_ms, fp32_ms;
    c10::ScalarType expected;
  };
  for (const Case c : {Case{2.0, 10.0, torch::kBFloat16}, Case{7.9, 10.0, torch::kBFloat16},
                       Case{8.1, 10.0, torch::kFloat}, Case{60.0, 10.0, torch::kFloat},
                       Case{NAN, NAN, torch::kFloat}}) {
    SCOPED_TRACE(std::to_string(c.bf16_ms) + " ms bf16, " + std::to_string(c.fp32_ms) + " fp32");
    InjectedProbe probe(c.bf16_ms, c.fp32_ms);
    EXPECT_EQ(fogo::ns_auto_dtype(kCpu), c.expected);
    EXPECT_EQ(fogo::ns_auto_dtype(kCpu), c.expected);
    EXPECT_EQ(fogo::resolve_ns_dtype(fogo::kNSDtypeAuto, kCpu), c.expected);
    EXPECT_EQ(fogo::resolve_ns_dtype(torch::kFloat, kCpu), torch::kFloat);  // never touched
    EXPECT_EQ(probe.calls, 1);
    const auto choices = fogo::ns_dtype_choices();
    ASSERT_EQ(choices.size(), 1u);
    EXPECT_EQ(choices[0].device, "cpu");
    EXPECT_EQ(choices[0].dtype, c.expected);
    EXPECT_EQ(choices[0].reason, "injected");
    EXPECT_FALSE(choices[0].isa.empty());
    EXPECT_TRUE(std::isnan(c.bf16_ms) ? std::isnan(choices[0].bf16_ms)
                                      : choices[0].bf16_ms == c.bf16_ms);
  }
  EXPECT_TRUE(fogo::ns_dtype_choices().empty());  // the guard's set_ns_auto_dtype forgot them
}

// FOGO_NS_DTYPE fixes the answer without measuring; set_ns_auto_dtype (the distributed layer's
// hook) is above it; bad values are refused naming the variable or the function.
TEST(NewtonSchulzDtype, TheEnvironmentAndTheSetterFixTheAnswer) {
  InjectedProbe probe(2.0, 10.0);  // the measurement would say bf16
  setenv(fogo::kNSDtypeEnv, "fp32", 1);
  EXPECT_EQ(fogo::ns_auto_dtype(kCpu), torch::kFloat);
  EXPECT_EQ(fogo::ns_dtype_choices().at(0).reason, "FOGO_NS_DTYPE=fp32");
  EXPECT_EQ(probe.calls, 0);
  fogo::set_ns_auto_dtype(torch::kBFloat16);
  EXPECT_EQ(fogo::ns_auto_dtype(kCpu), torch::kBFloat16);
  EXPECT_EQ(fogo::ns_dtype_choices().at(0).reason, "set_ns_auto_dtype");
  fogo::set_ns_auto_dtype(fogo::kNSDtypeAuto);
  setenv(fogo::kNSDtypeEnv, "auto", 1);
  EXPECT_EQ(fogo::ns_auto_dtype(kCpu), torch::kBFloat16);
  EXPECT_EQ(probe.calls, 1);
  fogo::clear_ns_dtype_choices();
  setenv(fogo::kNSDtypeEnv, "fp16", 1);
  fogo::test::expect_error([] { fogo::ns_auto_dtype(kCpu); },
                           "FOGO_NS_DTYPE (ns_dtype auto's answer) must be bf16, fp32 or auto, "
                           "got 'fp16'");
  fogo::test::expect_error([] { fogo::set_ns_auto_dtype(torch::kDouble); },
                           "set_ns_auto_dtype: the dtype must be kBFloat16, kFloat or "
                           "kNSDtypeAuto, got fp64");
}

// In a job (fogo::dist installs an agreement), the first rank's answer is every rank's: this
// rank measured bf16 faster, the job had already taken fp32; asked once per device type, with a
// key that names no device index.
TEST(NewtonSchulzDtype, AJobTakesTheAgreedDtype) {
  InjectedProbe probe(2.0, 10.0);  // this rank's own measurement says bf16
  std::vector<std::pair<std::string, int64_t>> asked;
  const auto handle = fogo::detail::install_agreement([&](const std::string& key, int64_t local) {
    asked.emplace_back(key, local);
    return fogo::ns_dtype_code(torch::kFloat);
  });
  EXPECT_EQ(fogo::ns_auto_dtype(kCpu), torch::kFloat);
  EXPECT_EQ(fogo::ns_auto_dtype(kCpu), torch::kFloat);
  fogo::detail::remove_agreement(handle);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].first, "ns_dtype/cpu");
  EXPECT_EQ(asked[0].second, fogo::ns_dtype_code(torch::kBFloat16));
  EXPECT_NE(fogo::ns_dtype_choices().at(0).reason.find("the job's answer"), std::string::npos);
  fogo::clear_ns_dtype_choices();
  EXPECT_EQ(fogo::ns_auto_dtype(kCpu), torch::kBFloat16);  // no job: its own answer again
}

// The default measurement on this host: bf16 or fp32 by the margin rule applied to the times it
// lists (or fp32 unmeasured where cpuinfo shows no bf16 units), and the global generator is
// untouched (a seeded run draws the same numbers whether or not auto measured on the way).
TEST(NewtonSchulzDtype, TheDefaultMeasurementFollowsItsTimesAndLeavesTheGeneratorAlone) {
  if (std::getenv(fogo::kNSDtypeEnv)) GTEST_SKIP() << "FOGO_NS_DTYPE fixes the answer here";
  fogo::clear_ns_dtype_choices();
  torch::manual_seed(5);
  const auto expected = torch::randn({8});
  torch::manual_seed(5);
  const c10::ScalarType dtype = fogo::ns_auto_dtype(kCpu);
  EXPECT_TRUE(torch::equal(torch::randn({8}), expected));
  const auto c = fogo::ns_dtype_choices().at(0);
  std::cout << "[ NOTE     ] ns_dtype auto on this CPU (" << c.isa
            << "): " << fogo::ns_dtype_name(dtype) << ", " << c.reason << " (bf16 GEMM "
            << c.bf16_ms << " ms, fp32 " << c.fp32_ms << " ms)\n";
  if (c.reason == "measured") {
    EXPECT_GT(c.bf16_ms, 0.0);
    EXPECT_GT(c.fp32_ms, 0.0);
    EXPECT_EQ(dtype == torch::kBFloat16, c.bf16_ms * fogo::kNSBf16Margin < c.fp32_ms);
  } else {
    EXPECT_NE(c.reason.find("not measured"), std::string::npos) << c.reason;
    EXPECT_EQ(dtype, torch::kFloat);
  }
}

// newton_schulz with compute_dtype auto is the resolved dtype's chain, bit for bit, in both
// forms and the projected route.
TEST(NewtonSchulzDtype, AnAutoConfigRunsTheResolvedDtypesChain) {
  torch::manual_seed(41);
  const auto B = torch::randn({3, 8, 40}), Pi = torch::randn({40, 6});
  for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
    InjectedProbe probe(dtype == torch::kBFloat16 ? 1.0 : 10.0, 5.0);
    for (const auto form : {fogo::NSForm::Plain, fogo::NSForm::Gram}) {
      fogo::NSConfig automatic, fixed;
      automatic.compute_dtype = fogo::kNSDtypeAuto;
      fixed.compute_dtype = dtype;
      automatic.form = fixed.form = form;
      const auto got = fogo::newton_schulz(B, automatic);
      EXPECT_EQ(got.scalar_type(), dtype);
      EXPECT_TRUE(torch::equal(got, fogo::newton_schulz(B, fixed)));
      EXPECT_TRUE(torch::equal(fogo::newton_schulz_projected(B, Pi, automatic),
                               fogo::newton_schulz_projected(B, Pi, fixed)));
    }
  }
}

namespace {

// Four steps of a Muon or FOGO over a wide, a tall and a conv-shaped parameter from fixed data;
// the parameters after them.
template <class Optim, class Options>
std::vector<torch::Tensor> trajectory(const Options& options) {
  torch::manual_seed(42);
  std::vector<torch::Tensor> params = {torch::randn({8, 40}).requires_grad_(true),
                                       torch::randn({24, 6}).requires_grad_(true),
                                       torch::randn({6, 4, 3, 3}).requires_grad_(true)};
  Optim opt(params, options);
  for (int step = 0; step < 4; ++step) {
    for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes());
    opt.step();
  }
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

const auto kMuonDefault = fogo::MuonOptions(0.02);
const auto kFogoDefault = fogo::FOGOOptions(0.02).proj_dim(8).codebook_size(4);

}  // namespace

// ns_form Default: Auto (timed) where ns_dtype auto resolved to fp32, Plain where it resolved to
// bf16 and for every dtype set explicitly; the other forms as they are.
TEST(NewtonSchulzDtype, TheDefaultFormIsTimedOnlyWhereAutoResolvedToFp32) {
  using fogo::NSForm;
  for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
    InjectedProbe probe(dtype == torch::kBFloat16 ? 1.0 : 10.0, 5.0);
    EXPECT_EQ(fogo::resolve_ns_form(NSForm::Default, fogo::kNSDtypeAuto, kCpu),
              dtype == torch::kFloat ? NSForm::Auto : NSForm::Plain);
    for (const auto explicit_dtype : {torch::kBFloat16, torch::kFloat, torch::kDouble})
      EXPECT_EQ(fogo::resolve_ns_form(NSForm::Default, explicit_dtype, kCpu), NSForm::Plain);
    for (const auto form : {NSForm::Plain, NSForm::Gram, NSForm::Auto})
      EXPECT_EQ(fogo::resolve_ns_form(form, fogo::kNSDtypeAuto, kCpu), form);
    fogo::NSConfig config;
    config.compute_dtype = fogo::kNSDtypeAuto;
    config.form = NSForm::Default;
    const auto resolved = fogo::resolve_ns_config(config, kCpu);
    EXPECT_EQ(resolved.compute_dtype, dtype);
    EXPECT_EQ(resolved.form, dtype == torch::kFloat ? NSForm::Auto : NSForm::Plain);
  }
  EXPECT_EQ(fogo::MuonOptions().ns_form(), NSForm::Default);
  EXPECT_EQ(fogo::FOGOOptions().ns_form(), NSForm::Default);
}

namespace {

// The explicit options the defaults must equal on a host where auto resolves to `dtype`.
fogo::NSForm form_for(c10::ScalarType dtype) {
  return dtype == torch::kFloat ? fogo::NSForm::Auto : fogo::NSForm::Plain;
}

}  // namespace

// The optimizers' defaults (ns_dtype auto, ns_form Default) step exactly as what they resolve to
// (bf16 plain, or fp32 with the forms timed; one process keeps one set of form decisions), for
// both outcomes of the measurement, and differ from the other dtype.
TEST(NewtonSchulzDtype, DefaultStepsAreTheResolvedDtypesBitForBit) {
  for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
    SCOPED_TRACE(fogo::ns_dtype_name(dtype));
    const auto other = dtype == torch::kBFloat16 ? torch::kFloat : torch::kBFloat16;
    InjectedProbe probe(dtype == torch::kBFloat16 ? 1.0 : 10.0, 5.0);
    const auto muon = trajectory<fogo::Muon>(kMuonDefault);
    EXPECT_TRUE(fogo::test::bit_identical(
        muon, trajectory<fogo::Muon>(
                  fogo::MuonOptions(kMuonDefault).ns_dtype(dtype).ns_form(form_for(dtype)))));
    EXPECT_FALSE(fogo::test::bit_identical(
        muon, trajectory<fogo::Muon>(fogo::MuonOptions(kMuonDefault).ns_dtype(other))));
    const auto fogo_steps = trajectory<fogo::FOGO>(kFogoDefault);
    EXPECT_TRUE(fogo::test::bit_identical(
        fogo_steps, trajectory<fogo::FOGO>(
                        fogo::FOGOOptions(kFogoDefault).ns_dtype(dtype).ns_form(form_for(dtype)))));
    EXPECT_FALSE(fogo::test::bit_identical(
        fogo_steps, trajectory<fogo::FOGO>(fogo::FOGOOptions(kFogoDefault).ns_dtype(other))));
    EXPECT_EQ(probe.calls, 1);  // once for the process, not per optimizer or step
  }
  fogo::clear_ns_form_choices();
}

// On this host, measured for real: where auto picks bf16 (a CPU with bf16 units), the defaults'
// bits are those of explicit bf16 with the plain chain, i.e. unchanged from before auto (and
// torch.optim.Muon's for Muon); elsewhere those of fp32 with timed forms.
TEST(NewtonSchulzDtype, OnThisHostTheDefaultsAreTheMeasuredDtypesBits) {
  fogo::clear_ns_dtype_choices();
  const c10::ScalarType dtype = fogo::ns_auto_dtype(kCpu);
  std::cout << "[ NOTE     ] auto resolves to " << fogo::ns_dtype_name(dtype) << " here\n";
  const auto form = form_for(dtype);
  EXPECT_TRUE(fogo::test::bit_identical(
      trajectory<fogo::Muon>(kMuonDefault),
      trajectory<fogo::Muon>(fogo::MuonOptions(kMuonDefault).ns_dtype(dtype).ns_form(form))));
  EXPECT_TRUE(fogo::test::bit_identical(
      trajectory<fogo::FOGO>(kFogoDefault),
      trajectory<fogo::FOGO>(fogo::FOGOOptions(kFogoDefault).ns_dtype(dtype).ns_form(form))));
  fogo::clear_ns_form_choices();
}

namespace {

// A checkpoint of `Optim` with default (auto) options after a step, as bytes.
template <class Optim, class Options>
std::string stepped_checkpoint(const Options& options) {
  torch::manual_seed(43);
  auto p = torch::randn({8, 40}).requires_grad_(true);
  Optim opt({p}, options);
  p.mutable_grad() = torch::randn({8, 40});
  opt.step();
  std::ostringstream out;
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  archive.save_to(out);
  return out.str();
}

torch::serialize::InputArchive reopen(const std::string& bytes) {
  torch::serialize::InputArchive in;
  in.load_from(bytes.data(), bytes.size());
  return in;
}

// The archived ns_dtype option of group 0 (LibTorch's param_groups/param_groups/0/options).
int64_t archived_ns_dtype(torch::serialize::InputArchive& in) {
  torch::serialize::InputArchive groups, group, options;
  in.read("param_groups", groups);
  groups.read("param_groups/0", group);
  group.read("options", options);
  c10::IValue v;
  options.read("ns_dtype", v);
  return v.toInt();
}

// Saved where auto is bf16, loaded where it is fp32: the options keep auto (-1 in the archive),
// the record says bf16, the load warns naming both and the run continues in fp32.
template <class Optim, class Options>
void check_checkpoint(const Options& options, const char* name, const char* key) {
  std::string bytes;
  {
    InjectedProbe bf16(1.0, 10.0);
    bytes = stepped_checkpoint<Optim>(options);
  }
  auto in = reopen(bytes);
  EXPECT_EQ(archived_ns_dtype(in), -1);
  c10::IValue record;
  ASSERT_TRUE(in.try_read(key, record));
  EXPECT_EQ(record.toStringRef(), "bf16");

  InjectedProbe fp32(10.0, 1.0);
  auto q = torch::zeros({8, 40}).requires_grad_(true);
  Optim loaded({q}, options);
  Warnings warnings;
  auto again = reopen(bytes);
  loaded.load(again);
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find(std::string(name) +
                                      "::load: group 0's Newton–Schulz computed in bf16 where the "
                                      "checkpoint was written (ns_dtype auto); auto resolves to "
                                      "fp32 here"),
            std::string::npos)
      << warnings.messages[0];
  EXPECT_EQ(static_cast<const Options&>(loaded.param_groups()[0].options()).ns_dtype(),
            fogo::kNSDtypeAuto);
  // Loaded where auto resolves as where it was saved: silent.
  warnings.messages.clear();
  {
    InjectedProbe bf16(1.0, 10.0);
    auto same = reopen(bytes);
    Optim twin({q}, options);
    twin.load(same);
  }
  EXPECT_TRUE(warnings.messages.empty());
}

}  // namespace

TEST(NewtonSchulzDtype, CheckpointsKeepAutoAndRecordWhatItResolvedTo) {
  check_checkpoint<fogo::Muon>(fogo::MuonOptions(0.02), "Muon", "muon/ns_dtype_resolved");
  check_checkpoint<fogo::FOGO>(fogo::FOGOOptions(0.02).proj_dim(8).codebook_size(4), "FOGO",
                               "fogo/ns_dtype_resolved");
  // An explicit dtype is recorded as itself and never warns.
  InjectedProbe fp32(10.0, 1.0);
  auto in =
      reopen(stepped_checkpoint<fogo::Muon>(fogo::MuonOptions(0.02).ns_dtype(torch::kBFloat16)));
  EXPECT_EQ(archived_ns_dtype(in), 15);
  c10::IValue record;
  ASSERT_TRUE(in.try_read("muon/ns_dtype_resolved", record));
  EXPECT_EQ(record.toStringRef(), "bf16");
}
