#include "fogo_flags.h"

#include <fogo/enum_names.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <type_traits>

#include "cli.h"
#include "runtime.h"

namespace fogo::trainer {
namespace {

using coefficients_t = FOGOOptions::coefficients_t;
using sizes_t = FOGOOptions::sizes_t;
using schedule_t = FOGOOptions::schedule_t;

// One value of each option type from its text; throws std::invalid_argument with what was
// expected (the caller adds the flag and the key).
double parse(const std::string& text, double*) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(begin, &end);
  if (text.empty() || end != begin + text.size() || errno == ERANGE || std::isnan(v)) {
    throw std::invalid_argument("expected a number, got '" + text + "'");
  }
  return v;
}

int64_t parse(const std::string& text, int64_t*) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(begin, &end, 10);
  if (text.empty() || end != begin + text.size() || errno == ERANGE) {
    throw std::invalid_argument("expected an integer, got '" + text + "'");
  }
  return v;
}

bool parse(const std::string& text, bool*) {
  if (text == "true" || text == "1" || text == "on") return true;
  if (text == "false" || text == "0" || text == "off") return false;
  throw std::invalid_argument("expected true or false, got '" + text + "'");
}

coefficients_t parse(const std::string& text, coefficients_t*) {
  if (text == "quintic") return kQuintic;
  if (text == "cubic") return kCubic;
  double abc[3];
  size_t start = 0;
  for (int k = 0; k < 3; ++k) {
    const size_t comma = k < 2 ? text.find(',', start) : text.size();
    if (comma == std::string::npos || (k == 2 && text.find(',', start) != std::string::npos)) {
      throw std::invalid_argument("expected quintic, cubic or a,b,c, got '" + text + "'");
    }
    abc[k] = parse(text.substr(start, comma - start), static_cast<double*>(nullptr));
    start = comma + 1;
  }
  return {abc[0], abc[1], abc[2]};
}

// Row counts, "8,4,4" (blocks); "" for none.
sizes_t parse(const std::string& text, sizes_t*) {
  sizes_t out;
  for (size_t start = 0; !text.empty();) {
    const size_t comma = text.find(',', start);
    out.push_back(parse(text.substr(start, comma - start), static_cast<int64_t*>(nullptr)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

NSSchedule parse(const std::string& text, NSSchedule*) {
  return parse_ns_coefficient_schedule(text);
}

c10::ScalarType parse(const std::string& text, c10::ScalarType*) {
  if (text == "auto") return kNSDtypeAuto;
  if (text == "bf16" || text == "bfloat16") return c10::kBFloat16;
  if (text == "fp32" || text == "float32") return c10::kFloat;
  if (text == "fp64" || text == "float64") return c10::kDouble;
  throw std::invalid_argument("expected auto, bf16, fp32 or fp64, got '" + text + "'");
}

// An enumeration by its name (fogo/enum_names.h).
template <class E, class = std::enable_if_t<std::is_enum_v<E>>>
E parse(const std::string& text, E*) {
  if (const auto e = enum_from_name<E>(text)) return *e;
  throw std::invalid_argument("expected " + enum_names_text<E>("", ", ", " or ") + ", got '" +
                              text + "'");
}

}  // namespace

NSSchedule parse_ns_coefficient_schedule(const std::string& text) {
  for (const NamedNSSchedule& s : ns_named_schedules())
    if (text == s.name) return s.rows;
  NSSchedule out;
  for (size_t start = 0; !text.empty();) {
    const size_t semicolon = text.find(';', start);
    const std::string row = text.substr(start, semicolon - start);
    try {
      const auto [a, b, c] = parse(row, static_cast<coefficients_t*>(nullptr));
      out.push_back({a, b, c});
    } catch (const std::invalid_argument&) {
      std::string names;
      for (const NamedNSSchedule& s : ns_named_schedules()) names += std::string(s.name) + ", ";
      throw std::invalid_argument("expected one of " + names + "or rows a,b,c;a,b,c;..., got '" +
                                  text + "'");
    }
    if (semicolon == std::string::npos) break;
    start = semicolon + 1;
  }
  return out;
}

const std::vector<std::string>& ablation_names() {
  static const std::vector<std::string> names{"full", "no-slerp", "short-term-only",
                                              "long-term-only", "memory-off"};
  return names;
}

void apply_ablation(FOGOOptions& o, const std::string& name) {
  const bool no_slerp = name == "no-slerp" || name == "memory-off";
  const bool no_short = name == "long-term-only" || name == "memory-off";
  const bool no_long = name == "short-term-only" || name == "memory-off";
  if (name != "full" && !no_slerp && !no_short && !no_long) {
    std::string list;
    for (const auto& n : ablation_names()) list += (list.empty() ? "" : ", ") + n;
    throw Cli::error("ablation", "unknown ablation '" + name + "' (" + list + ")");
  }
  if (no_slerp) o.xi(0.0);
  if (no_short) o.gamma_hi(0.0).gamma_st_min(0.0).gamma_st_max(0.0);
  if (no_long) o.gamma_lt(0.0);
}

std::vector<std::string> fogo_option_names() {
  std::vector<std::string> names;
#define FOGO_NAME(T, name, ...) names.push_back(#name);
  FOGO_OPTIONS(FOGO_NAME)
#undef FOGO_NAME
  return names;
}

void apply_fogo_assignment(FOGOOptions& o, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw Cli::error("fogo", "expected key=value (a FOGOOptions field), got '" + assignment + "'");
  }
  const std::string key = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  try {
#define FOGO_SET(T, name, ...)                      \
  if (key == #name) {                               \
    o.name(parse(value, static_cast<T*>(nullptr))); \
    return;                                         \
  }
    FOGO_OPTIONS(FOGO_SET)
#undef FOGO_SET
  } catch (const CliError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    throw Cli::error("fogo", key + ": " + e.what());
  }
  std::string list;
  for (const auto& n : fogo_option_names()) list += (list.empty() ? "" : ", ") + n;
  throw Cli::error("fogo", "unknown option '" + key + "' (FOGOOptions has " + list + ")");
}

void apply_fogo_flags(FOGOOptions& o, const std::string& ablation,
                      const std::vector<std::string>& assignments) {
  apply_ablation(o, ablation);
  for (const auto& a : assignments) apply_fogo_assignment(o, a);
  try {
    o.validate();
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (const size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    throw Cli::error("fogo", what);
  }
  // FOGO's proximal lift solves a d x d system in float64 (d = proj_dim), three such matrices
  // at once: a d the machine cannot hold ended in an allocator's message.
  const double d = static_cast<double>(o.proj_dim()), lift = 3.0 * 8.0 * d * d;
  const double ram = physical_memory_bytes();
  char text[200];
  std::snprintf(text, sizeof text,
                "proj_dim=%lld: FOGO's proximal lift solves a d x d system in float64 (3 x 8 "
                "d^2 bytes = %.1f GB), more than this machine's %.1f GB of memory",
                static_cast<long long>(o.proj_dim()), lift / 1e9, ram / 1e9);
  Cli::require(ram <= 0 || lift <= ram, "fogo", text);
}

void add_fogo_flags(Cli& cli, std::vector<std::string>* assignments, std::string* ablation) {
  cli.repeated("fogo", assignments,
               "key=value: set the FOGOOptions field `key` of every FOGO group (after the "
               "presets; names and values as in fogo/fogo_options.h)");
  std::string list;
  for (const auto& n : ablation_names()) list += (list.empty() ? "" : ", ") + n;
  cli.choice("ablation", ablation, ablation_names(),
             "FOGO ablation: " + list +
                 " (no-slerp: xi 0; short-term-only: gamma_lt 0; long-term-only: gamma_hi, "
                 "gamma_st 0; memory-off: all of them, slow-stream Muon with RMS scaling)");
}

}  // namespace fogo::trainer
