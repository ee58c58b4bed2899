#pragma once
// The machinery of fogo's option tables, for FOGOOptions and MuonOptions alike. Each options
// header holds its table, one row per option: X(type, name, default, valid values, checkpoint),
// and declares the builder fields (TORCH_ARG) from it; everything else an option needs is
// generated here from the same rows: validation, the archive both ways, ==, its part in a
// checkpoint's checksum and format, the docs table.
//
//   valid:      any(), range(lo, hi), positive(), finite(), known(), one_of(a, b, ...), counts(),
//               ns_rows(max rows, ns_schedule); a row's rule may read the other options as `o`
//               (gamma_st_max: range(o.gamma_st_min(), ..))
//   checkpoint: always()   in every checkpoint of the optimizer (a missing one: no checkpoint)
//               added()    not in the oldest checkpoints: one without it keeps the option's
//                          value; it counts in a checkpoint's checksum where the checkpoint holds
//                          it (every fogo that knew it summed it)
//               since(N)   added with checkpoint format N: as added(), but it counts in the
//                          checksum and the format only where it is not at its default, so that
//                          the fogos before it read every checkpoint that leaves it there and
//                          refuse the others by their format, not as corrupted
//
// The rows' order is the checksum's: a row never moves or goes. A new row may go anywhere in its
// table, as since(N), N one more than newest_format<Table>() of the fogo before it, with the
// default that does what fogo did before it (a checkpoint without it resumes as it ran).

#include <torch/serialize/archive.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fogo/fogo_options.h"
#include "fogo/muon_options.h"
#include "fogo_private/frame/checks.h"

namespace fogo::option_table {

// ---------------------------------------------------------------------------------------------
// The `valid` column.

struct Any {};  ///< every value
struct Range {  ///< finite and in [lo, hi]
  double lo, hi;
};
struct Positive {};  ///< finite and > 0
struct Finite {};    ///< every element finite (a tuple of numbers)
struct Known {};     ///< is_known(value) (nonfinite.h)
struct Counts {};    ///< a list of integers, each >= 1 (sizes_t: block row counts)
struct NSRows {      ///< a coefficient list (NSSchedule): finite, at most `max_rows` rows, and
  int64_t max_rows;  ///< only with the named schedule `schedule` at kNSConstant (it replaces it)
  int64_t schedule;
};
template <class T, size_t N>
struct OneOf {  ///< one of `values`
  std::array<T, N> values;
};
constexpr Any any() { return {}; }
constexpr Range range(double lo, double hi) { return {lo, hi}; }
constexpr Positive positive() { return {}; }
constexpr Finite finite() { return {}; }
constexpr Known known() { return {}; }
constexpr Counts counts() { return {}; }
constexpr NSRows ns_rows(int64_t max_rows, int64_t schedule) { return {max_rows, schedule}; }
template <class T, class... U>
constexpr OneOf<T, 1 + sizeof...(U)> one_of(T first, U... rest) {
  return {{first, rest...}};
}

// ---------------------------------------------------------------------------------------------
// The `checkpoint` column.

struct Archived {
  enum Kind { Always, Added, Since } kind;
  int64_t format;  ///< Since: the checkpoint format it came with
};
constexpr Archived always() { return {Archived::Always, 0}; }
constexpr Archived added() { return {Archived::Added, 0}; }
constexpr Archived since(int64_t format) { return {Archived::Since, format}; }

/// One row of a table, as the visitor of a table's each() receives it.
template <class T, class Rule>
struct Row {
  const char* name;
  T def;
  Rule rule;
  Archived archived;
  const char *def_text, *rule_text, *archived_text;
};

/// each(f, o, others...) calls f(row, o.name(), others.name()...) for every row in table order.
/// `TABLE` is a table's X-macro; a table type is a struct holding Options (the options type),
/// optimizer (its name in messages), layout (its archive's own format: the archive's layout
/// without the options) and this.
#define FOGO_OPTION_TABLE_EACH(TABLE)                                \
  template <class F, class O, class... Os>                           \
  static void each(F&& f, O& o, Os&... others) {                     \
    using namespace ::fogo;                                          \
    using namespace ::fogo::option_table;                            \
    using coefficients_t = typename std::decay_t<O>::coefficients_t; \
    using sizes_t = std::vector<int64_t>;                            \
    using schedule_t = NSSchedule;                                   \
    TABLE(FOGO_OPTION_TABLE_ROW)                                     \
  }
#define FOGO_OPTION_TABLE_ROW(T, name, def, valid, stored)                                    \
  f(::fogo::option_table::Row<T, decltype(valid)>{#name, T(def), valid, stored, #def, #valid, \
                                                  #stored},                                   \
    o.name(), others.name()...);

struct FOGOTable {
  using Options = FOGOOptions;
  static constexpr const char* optimizer = "FOGO";
  static constexpr int64_t layout = 1;  ///< fogo/format (src/fogo/checkpoint.cpp)
  FOGO_OPTION_TABLE_EACH(FOGO_OPTIONS)
};

struct MuonTable {
  using Options = MuonOptions;
  static constexpr const char* optimizer = "Muon";
  static constexpr int64_t layout = 1;  ///< muon/format (src/muon/); archives without it: 1
  FOGO_OPTION_TABLE_EACH(FOGO_MUON_OPTIONS)
};

// ---------------------------------------------------------------------------------------------
// Values as archives and checksums hold them.

/// A dtype as its ns_dtype_code (auto -1: c10's number for it moves between LibTorch versions),
/// any other enumeration as its number, a coefficient list as its numbers in a row (a, b, c, a,
/// ...), the rest as themselves.
template <class T>
auto archived(const T& v) {
  if constexpr (std::is_same_v<T, NSSchedule>) {
    std::vector<double> flat;
    for (const auto& row : v) flat.insert(flat.end(), row.begin(), row.end());
    return flat;
  } else if constexpr (std::is_same_v<T, c10::ScalarType>) {
    return ns_dtype_code(v);
  } else if constexpr (std::is_enum_v<T>) {
    return static_cast<int64_t>(v);
  } else {
    return v;
  }
}

/// `name`: the option's, for the message refusing a coefficient list that is not one.
template <class T>
T from_archive(const c10::IValue& v, const char* optimizer, const char* name) {
  if constexpr (std::is_same_v<T, NSSchedule>) {
    TORCH_CHECK(v.isDoubleList() && v.toDoubleVector().size() % 3 == 0, optimizer,
                " options: the archive's '", name,
                "' is not a list of (a, b, c) rows (a flat list of 3 numbers per row)");
    const std::vector<double> flat = v.toDoubleVector();
    NSSchedule out;
    for (size_t i = 0; i < flat.size(); i += 3) out.push_back({flat[i], flat[i + 1], flat[i + 2]});
    return out;
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    return v.toIntVector();
  } else if constexpr (std::is_same_v<T, c10::ScalarType>) {
    return ns_dtype_from_code(v.toInt());
  } else if constexpr (std::is_enum_v<T>) {
    return static_cast<T>(v.toInt());
  } else {
    return v.to<T>();
  }
}

// ---------------------------------------------------------------------------------------------
// Validation: one overload per rule; each error names "<optimizer>: option '<name>'".

namespace rules {
template <class T>
auto printable(const T& v) {
  if constexpr (std::is_same_v<T, c10::ScalarType>) {
    return ns_dtype_name(v);
  } else if constexpr (std::is_enum_v<T>) {
    return static_cast<int64_t>(v);
  } else {
    return v;
  }
}

template <class T>
void check(const char*, const char*, const T&, Any) {}

template <class T>
void check(const char* optimizer, const char* name, const T& v, Range r) {
  detail::check_range(optimizer, name, static_cast<double>(v), r.lo, r.hi);
}

inline void check(const char* optimizer, const char* name, double v, Positive) {
  TORCH_CHECK(std::isfinite(v) && v > 0, optimizer, ": option '", name,
              "' must be finite and > 0, got ", v);
}

inline void check(const char* optimizer, const char* name,
                  const std::tuple<double, double, double>& v, Finite) {
  const auto [a, b, c] = v;
  TORCH_CHECK(std::isfinite(a) && std::isfinite(b) && std::isfinite(c), optimizer, ": option '",
              name, "' must be finite, got (", a, ", ", b, ", ", c, ")");
}

template <class T>
void check(const char* optimizer, const char* name, const T& v, Known) {
  TORCH_CHECK(is_known(v), optimizer, ": option '", name, "' is not a known value (", printable(v),
              ")");
}

inline void check(const char* optimizer, const char* name, const std::vector<int64_t>& v, Counts) {
  for (const int64_t x : v) {
    TORCH_CHECK(x >= 1, optimizer, ": option '", name, "' must list counts >= 1, got ",
                at::IntArrayRef(v));
  }
}

inline void check(const char* optimizer, const char* name, const NSSchedule& v, NSRows r) {
  for (size_t k = 0; k < v.size(); ++k) {
    const auto [a, b, c] = v[k];
    TORCH_CHECK(std::isfinite(a) && std::isfinite(b) && std::isfinite(c), optimizer, ": option '",
                name, "' must hold finite numbers, got (", a, ", ", b, ", ", c, ") in row ", k);
  }
  TORCH_CHECK(static_cast<int64_t>(v.size()) <= r.max_rows, optimizer, ": option '", name,
              "' lists ", v.size(), " iterations, more than the ", r.max_rows,
              " Newton–Schulz steps run (the rows beyond would be dropped): set the step count to ",
              v.size(), " or give fewer rows");
  TORCH_CHECK(v.empty() || r.schedule == kNSConstant, optimizer, ": option '", name,
              "' replaces ns_schedule, which must then be 0 (kNSConstant), got ", r.schedule);
}

template <class T, size_t N>
void check(const char* optimizer, const char* name, const T& v, const OneOf<T, N>& rule) {
  if (std::find(rule.values.begin(), rule.values.end(), v) != rule.values.end()) return;
  std::ostringstream valid;
  for (const T& x : rule.values) valid << ' ' << printable(x);
  TORCH_CHECK(false, optimizer, ": option '", name, "' must be one of", valid.str(), ", got ",
              printable(v));
}
}  // namespace rules

// ---------------------------------------------------------------------------------------------
// What the tables generate.

/// Throws naming the first option outside its `valid` column.
template <class Table>
void validate(const typename Table::Options& o) {
  Table::each(
      [](const auto& row, const auto& v) { rules::check(Table::optimizer, row.name, v, row.rule); },
      o);
}

/// Every option, under its name.
template <class Table>
void write(const typename Table::Options& o, torch::serialize::OutputArchive& archive) {
  Table::each(
      [&](const auto& row, const auto& v) { archive.write(row.name, c10::IValue(archived(v))); },
      o);
}

/// Every option the archive holds; one added later that it lacks keeps its value, one always()
/// that it lacks is an error (the archive is no checkpoint of this optimizer).
template <class Table>
void read(typename Table::Options& o, torch::serialize::InputArchive& archive) {
  c10::IValue value;
  Table::each(
      [&](const auto& row, auto& v) {
        using T = std::decay_t<decltype(v)>;
        if (archive.try_read(row.name, value)) {
          v = from_archive<T>(value, Table::optimizer, row.name);
        } else {
          TORCH_CHECK(row.archived.kind != Archived::Always, Table::optimizer,
                      " options: the archive has no '", row.name, "', which every ",
                      Table::optimizer, " checkpoint holds");
        }
      },
      o);
}

template <class Table>
bool equal(const typename Table::Options& a, const typename Table::Options& b) {
  bool same = true;
  Table::each([&](const auto&, const auto& x, const auto& y) { same = same && x == y; }, a, b);
  return same;
}

/// Adds every option to `sum` (a detail::Checksum) in table order: an added() one where
/// `held(name)` says the checkpoint holds it, a since() one where it is not at its default. Save
/// sums a checkpoint it writes (which holds every option); load, the one it read (HeldOptions).
template <class Table, class Sum, class Held>
void add_to_checksum(const typename Table::Options& o, Sum& sum, Held&& held) {
  Table::each(
      [&](const auto& row, const auto& v) {
        const bool counts = row.archived.kind == Archived::Always ||
                            (row.archived.kind == Archived::Added && held(row.name)) ||
                            (row.archived.kind == Archived::Since && !(v == row.def));
        if (counts) sum.option(archived(v));
      },
      o);
}

/// Which options each param group of a checkpoint holds: add_to_checksum's `held`. Made from an
/// optimizer's archive at load (LibTorch's layout: param_groups/param_groups/<g>/options/<name>);
/// default-made at save, where the checkpoint written holds every option.
class HeldOptions {
 public:
  HeldOptions() = default;
  explicit HeldOptions(torch::serialize::InputArchive& optimizer_archive) : all_(false) {
    torch::serialize::InputArchive groups;
    optimizer_archive.read("param_groups", groups);
    at::Tensor size;
    groups.read("param_groups/size", size);
    for (int64_t g = 0; g < size.item<int64_t>(); ++g) {
      torch::serialize::InputArchive group;
      groups.read("param_groups/" + std::to_string(g), group);
      group.read("options", options_.emplace_back());
    }
  }
  /// add_to_checksum's `held` for group g.
  auto in_group(size_t g) {
    return [this, g](const char* name) {
      c10::IValue value;
      return all_ || (g < options_.size() && options_[g].try_read(name, value));
    };
  }

 private:
  bool all_ = true;
  std::vector<torch::serialize::InputArchive> options_;
};

/// The checkpoint format an archive holding `o` needs: the table's layout, or the newest since()
/// of an option not at its default.
template <class Table>
int64_t format_needed(const typename Table::Options& o) {
  int64_t format = Table::layout;
  Table::each(
      [&](const auto& row, const auto& v) {
        if (row.archived.kind == Archived::Since && !(v == row.def))
          format = std::max(format, row.archived.format);
      },
      o);
  return format;
}

/// The newest format this build reads: the layout's or the newest since() of the table.
template <class Table>
int64_t newest_format() {
  const typename Table::Options defaults;
  int64_t format = Table::layout;
  Table::each(
      [&](const auto& row, const auto&) {
        if (row.archived.kind == Archived::Since) format = std::max(format, row.archived.format);
      },
      defaults);
  return format;
}

/// The format of a checkpoint of these param groups: the oldest that holds all their options.
template <class Table>
int64_t checkpoint_format(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  int64_t format = Table::layout;
  for (const auto& group : groups) {
    format = std::max(
        format, format_needed<Table>(static_cast<const typename Table::Options&>(group.options())));
  }
  return format;
}

/// The table as Markdown (option | default | valid | checkpoint), in table order: the docs hold
/// this text, and a test keeps the two equal.
template <class Table>
std::string markdown() {
  const typename Table::Options defaults;
  std::string out = "| option | default | valid | checkpoint |\n|---|---|---|---|\n";
  Table::each(
      [&](const auto& row, const auto&) {
        out += std::string("| `") + row.name + "` | `" + row.def_text + "` | `" + row.rule_text +
               "` | `" + row.archived_text + "` |\n";
      },
      defaults);
  return out;
}

}  // namespace fogo::option_table
