#pragma once
// Every fogo::FOGOOptions field from the command line, for both trainers:
//   --fogo key=value     (repeatable) sets the field `key` (its name in FOGOOptions) of every
//                        FOGO param group, after the presets and the trainer's own flags
//   --ablation NAME      a named ablation of FOGO's memory, applied before the --fogo values
// The parser is generated from the option table of fogo/fogo_options.h (FOGO_OPTIONS), so a new
// option is settable without a change here.
// Values: numbers as strtod/strtoll read them (whole text), booleans true/false/1/0/on/off,
// ns_coefficients quintic | cubic | a,b,c, ns_coefficient_schedule a name of
// fogo::ns_named_schedules (deepseek_v4, ...) | a,b,c;a,b,c;... (one row per iteration; "" none),
// ns_dtype auto | bf16 | fp32 | fp64, and the enumerations (ns_form, projection_scale, nonfinite)
// by their names in fogo/enum_names.h.

#include <fogo/fogo_options.h>

#include <string>
#include <vector>

namespace fogo::trainer {

class Cli;

/// The ablations and what each sets (docs/algorithm.md's symbols):
///   full             nothing: FOGO as configured
///   no-slerp         xi = 0 (the fast stream no longer bends the slow direction)
///   short-term-only  gamma_lt = 0 (no long-term protection; slerp and the short-term filter
///                    stay)
///   long-term-only   gamma_hi = gamma_st_min = gamma_st_max = 0 (no short-term filter)
///   memory-off       xi = 0 and every gamma 0: FOGO reduces to slow-stream Muon with RMS
///                    scaling sigma (docs/algorithm.md's first check)
const std::vector<std::string>& ablation_names();

/// Applies the ablation `name` to `options`; a CliError naming --ablation for an unknown name.
void apply_ablation(FOGOOptions& options, const std::string& name);

/// A Newton–Schulz coefficient list from its text: a name of fogo::ns_named_schedules, or rows
/// "a,b,c;a,b,c;..." ("" for none). Throws std::invalid_argument saying what it expects.
NSSchedule parse_ns_coefficient_schedule(const std::string& text);

/// The FOGOOptions field names, in table order.
std::vector<std::string> fogo_option_names();

/// Sets one field from "key=value". A CliError naming --fogo and the key for a malformed
/// assignment, an unknown key or a value the field's type or range refuses.
void apply_fogo_assignment(FOGOOptions& options, const std::string& assignment);

/// The ablation, then every assignment in order, then validate() (a CliError naming --fogo for
/// a combination FOGOOptions refuses, e.g. gamma_st_max < gamma_st_min).
void apply_fogo_flags(FOGOOptions& options, const std::string& ablation,
                      const std::vector<std::string>& assignments);

/// Registers --fogo (repeatable, into `assignments`) and --ablation (into `ablation`).
void add_fogo_flags(Cli& cli, std::vector<std::string>* assignments, std::string* ablation);

}  // namespace fogo::trainer
