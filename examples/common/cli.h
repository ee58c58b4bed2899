#pragma once
// A small command-line flag parser for the example trainers.
//
//   fogo::trainer::Cli cli("resnet_train", "Trains ResNet-18 ...");
//   int64_t epochs = 10;                         // the variable's value is the default
//   std::optional<double> lr;                    // optional: "auto" unless given
//   cli.section("Training");
//   cli.flag("epochs", &epochs, "passes over the training set");
//   cli.flag("lr", &lr, "learning rate (default: the optimizer's paper value)");
//   cli.choice("optimizer", &opt, {"adam", "adamw", "muon", "fogo"}, "update rule");
//   if (!cli.parse(argc, argv)) return 0;        // --help was printed
//
// Accepted spellings: `--name value`, `--name=value`; booleans also `--name` (true) and
// `--no-name` (false). Lists are comma-separated (`--seeds 0,1,2`). A flag given twice keeps
// the last value. Every error is a CliError whose message names the flag and the problem, e.g.
// "--epochs: expected an integer, got 'ten'".
//
// A trainer's main() is `return run_main("resnet_train", [&] { ...; return 0; });`, which gives
// both trainers one error line ("resnet_train: error: <message>") and one exit status per kind
// of error: 2 when the command line is refused, 1 when the run fails.

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace fogo::trainer {

/// A refused command line: an unknown, renamed or malformed flag, or a value the trainer rejects
/// once parsed. An std::invalid_argument, like the trainers' other checks of their settings.
class CliError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class Cli {
 public:
  Cli(std::string program, std::string summary);

  /// Starts a titled group of flags in --help.
  void section(std::string title);

  /// Binds --name to *target (which must outlive parse()); its current value is the default.
  void flag(const std::string& name, std::string* target, std::string help);
  void flag(const std::string& name, int64_t* target, std::string help);
  void flag(const std::string& name, double* target, std::string help);
  void flag(const std::string& name, bool* target, std::string help);
  void flag(const std::string& name, std::optional<int64_t>* target, std::string help);
  void flag(const std::string& name, std::optional<double>* target, std::string help);
  void flag(const std::string& name, std::vector<std::string>* target, std::string help);
  void flag(const std::string& name, std::vector<int64_t>* target, std::string help);
  void flag(const std::string& name, std::vector<double>* target, std::string help);
  /// A flag that may be given many times: each occurrence appends its whole value (commas
  /// included) to *target; the first one replaces the default.
  void repeated(const std::string& name, std::vector<std::string>* target, std::string help);
  /// A string flag restricted to `choices`.
  void choice(const std::string& name, std::string* target, std::vector<std::string> choices,
              std::string help);
  /// --old_name, a flag's former name, is refused with an error naming its new one:
  /// "--clip: now called --grad-clip". Not shown in --help.
  void renamed(const std::string& old_name, const std::string& new_name);

  /// Parses argv[1..argc). Returns false when --help (or -h) was given: the help text has been
  /// written to `help_out` and the caller should exit successfully. Throws CliError on an unknown
  /// flag, a missing or malformed value, or a stray positional argument.
  bool parse(int argc, const char* const* argv, std::ostream& help_out);
  bool parse(int argc, const char* const* argv);

  /// Whether --name appeared on the command line.
  bool given(const std::string& name) const;
  std::string help() const;
  /// (name, current value as it would be typed) for every flag, in registration order: what a
  /// trainer stores with a run to record, or later compare, its configuration.
  std::vector<std::pair<std::string, std::string>> values() const;

  /// CliError("--flag: what"), for checks a trainer makes after parse().
  static CliError error(const std::string& flag, const std::string& what);
  /// Throws error(flag, what) unless `ok`.
  static void require(bool ok, const std::string& flag, const std::string& what);

 private:
  using Target = std::variant<std::string*, int64_t*, double*, bool*, std::optional<int64_t>*,
                              std::optional<double>*, std::vector<std::string>*,
                              std::vector<int64_t>*, std::vector<double>*>;
  struct Flag {
    std::string name, help, section, default_text;
    Target target;
    std::vector<std::string> choices;
    bool given = false;
    bool repeat = false;  ///< repeated(): append each occurrence
  };
  void add(const std::string& name, Target target, std::string help,
           std::vector<std::string> choices = {});
  Flag* find(const std::string& name);
  const Flag* find(const std::string& name) const;
  static void assign(Flag& flag, const std::string& text);
  static std::string render(const Target& target);

  std::string program_, summary_, section_;
  std::vector<Flag> flags_;
  std::vector<std::pair<std::string, std::string>> renamed_;  ///< (old name, new name)
};

/// Exit statuses of the trainers.
inline constexpr int kExitFailure = 1;  ///< the run failed: data, I/O, divergence, ...
inline constexpr int kExitUsage = 2;    ///< the command line was refused

/// Runs a trainer's main `body` and turns what it throws into an exit status and one line on
/// `err`, "<program>: error: <message>" (a c10::Error without its C++ backtrace): kExitUsage for
/// an std::invalid_argument (CliError, the trainers' checks of flag values, a --resume of other
/// settings), kExitFailure for any other exception. Returns body's status when it returns.
int run_main(const std::string& program, const std::function<int()>& body, std::ostream& err);
int run_main(const std::string& program, const std::function<int()>& body);  ///< err: std::cerr

/// The shortest text that reads back as exactly `value` ("0.1", "6e-05", "2"): how the trainers
/// show a floating-point flag's value, in --help and in run signatures.
std::string flag_text(double value);

}  // namespace fogo::trainer
