#include "common/cli.h"

#include <c10/util/Exception.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

namespace fogo::trainer {
namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int64_t parse_int(const std::string& flag, const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range) {
    throw Cli::error(flag, "integer out of range: '" + text + "'");
  }
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw Cli::error(flag, "expected an integer, got '" + text + "'");
  }
  return value;
}

double parse_double(const std::string& flag, const std::string& text) {
  // strtod rather than from_chars<double>: the latter needs a newer libstdc++ than some users
  // have, and strtod's acceptance of "1e-3", ".5" and "2." is what people type.
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) {
    throw Cli::error(flag, "expected a number, got '" + text + "'");
  }
  if (!std::isfinite(value)) throw Cli::error(flag, "expected a finite number, got '" + text + "'");
  return value;
}

bool parse_bool(const std::string& flag, const std::string& text) {
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  throw Cli::error(flag, "expected true or false, got '" + text + "'");
}

template <class T, class F>
std::string join(const std::vector<T>& values, F&& fmt) {
  std::string out;
  for (size_t k = 0; k < values.size(); ++k) out += (k ? "," : "") + fmt(values[k]);
  return out;
}

}  // namespace

std::string flag_text(double value) {
  // %.17g always reads back exactly; fewer digits usually do, and read as typed. Whole numbers
  // as integers ("10", not %g's "1e+01").
  char buf[32];
  if (value == std::trunc(value) && std::fabs(value) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", value);
    return buf;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, value);
    if (std::strtod(buf, nullptr) == value) break;
  }
  return buf;
}

Cli::Cli(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

CliError Cli::error(const std::string& flag, const std::string& what) {
  return CliError("--" + flag + ": " + what);
}

void Cli::require(bool ok, const std::string& flag, const std::string& what) {
  if (!ok) throw error(flag, what);
}

void Cli::section(std::string title) { section_ = std::move(title); }

void Cli::add(const std::string& name, Target target, std::string help,
              std::vector<std::string> choices) {
  if (name.empty() || name.rfind("no-", 0) == 0 || find(name)) {
    throw CliError("Cli: flag name '" + name + "' is empty, starts with 'no-' or is taken");
  }
  Flag flag{name, std::move(help), section_, render(target), target, std::move(choices)};
  flags_.push_back(std::move(flag));
}

void Cli::flag(const std::string& n, std::string* t, std::string h) { add(n, t, std::move(h)); }
void Cli::flag(const std::string& n, int64_t* t, std::string h) { add(n, t, std::move(h)); }
void Cli::flag(const std::string& n, double* t, std::string h) { add(n, t, std::move(h)); }
void Cli::flag(const std::string& n, bool* t, std::string h) { add(n, t, std::move(h)); }
void Cli::flag(const std::string& n, std::optional<int64_t>* t, std::string h) {
  add(n, t, std::move(h));
}
void Cli::flag(const std::string& n, std::optional<double>* t, std::string h) {
  add(n, t, std::move(h));
}
void Cli::flag(const std::string& n, std::vector<std::string>* t, std::string h) {
  add(n, t, std::move(h));
}
void Cli::flag(const std::string& n, std::vector<int64_t>* t, std::string h) {
  add(n, t, std::move(h));
}
void Cli::flag(const std::string& n, std::vector<double>* t, std::string h) {
  add(n, t, std::move(h));
}
void Cli::repeated(const std::string& n, std::vector<std::string>* t, std::string h) {
  add(n, t, std::move(h) + " (repeatable)");
  flags_.back().repeat = true;
}
void Cli::choice(const std::string& name, std::string* target, std::vector<std::string> choices,
                 std::string help) {
  add(name, target, std::move(help), std::move(choices));
}

void Cli::renamed(const std::string& old_name, const std::string& new_name) {
  if (find(old_name) || !find(new_name)) {
    throw CliError("Cli: cannot rename --" + old_name + " to --" + new_name);
  }
  renamed_.emplace_back(old_name, new_name);
}

Cli::Flag* Cli::find(const std::string& name) {
  for (auto& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}
const Cli::Flag* Cli::find(const std::string& name) const {
  return const_cast<Cli*>(this)->find(name);
}

std::string Cli::render(const Target& target) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return *p;
        } else if constexpr (std::is_same_v<T, int64_t>) {
          return std::to_string(*p);
        } else if constexpr (std::is_same_v<T, double>) {
          return flag_text(*p);
        } else if constexpr (std::is_same_v<T, bool>) {
          return *p ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
          return *p ? std::to_string(**p) : "auto";
        } else if constexpr (std::is_same_v<T, std::optional<double>>) {
          return *p ? flag_text(**p) : "auto";
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          return join(*p, [](const std::string& s) { return s; });
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          return join(*p, [](int64_t v) { return std::to_string(v); });
        } else {
          return join(*p, flag_text);
        }
      },
      target);
}

void Cli::assign(Flag& flag, const std::string& text) {
  const std::string& n = flag.name;
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (!flag.choices.empty()) {
            bool ok = false;
            for (const auto& c : flag.choices) ok = ok || c == text;
            if (!ok) {
              throw error(n, "expected one of " +
                                 join(flag.choices, [](const std::string& s) { return s; }) +
                                 ", got '" + text + "'");
            }
          }
          *p = text;
        } else if constexpr (std::is_same_v<T, int64_t>) {
          *p = parse_int(n, text);
        } else if constexpr (std::is_same_v<T, double>) {
          *p = parse_double(n, text);
        } else if constexpr (std::is_same_v<T, bool>) {
          *p = parse_bool(n, text);
        } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
          *p = parse_int(n, text);
        } else if constexpr (std::is_same_v<T, std::optional<double>>) {
          *p = parse_double(n, text);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          if (flag.repeat) {
            if (!flag.given) p->clear();
            p->push_back(text);
          } else {
            *p = split_commas(text);
          }
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          p->clear();
          for (const auto& item : split_commas(text)) p->push_back(parse_int(n, item));
        } else {
          p->clear();
          for (const auto& item : split_commas(text)) p->push_back(parse_double(n, item));
        }
      },
      flag.target);
}

bool Cli::parse(int argc, const char* const* argv) { return parse(argc, argv, std::cout); }

bool Cli::parse(int argc, const char* const* argv, std::ostream& help_out) {
  for (int k = 1; k < argc; ++k) {
    const std::string arg = argv[k];
    if (arg == "--help" || arg == "-h") {
      help_out << help();
      return false;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      throw CliError("unexpected argument '" + arg + "' (flags start with --; see --help)");
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    Flag* flag = find(name);
    if (!flag && name.rfind("no-", 0) == 0) {
      Flag* negated = find(name.substr(3));
      if (negated && std::holds_alternative<bool*>(negated->target)) {
        if (value) throw error(name, "takes no value");
        *std::get<bool*>(negated->target) = false;
        negated->given = true;
        continue;
      }
    }
    if (!flag) {
      for (const auto& [old_name, new_name] : renamed_) {
        if (name == old_name) throw error(name, "now called --" + new_name);
      }
      throw CliError("unknown flag --" + name + " (see --help)");
    }
    if (!value) {
      if (std::holds_alternative<bool*>(flag->target)) {
        value = "true";
      } else if (k + 1 < argc) {
        value = argv[++k];
      } else {
        throw error(name, "missing value");
      }
    }
    assign(*flag, *value);
    flag->given = true;
  }
  return true;
}

bool Cli::given(const std::string& name) const {
  const Flag* flag = find(name);
  if (!flag) throw CliError("Cli::given: no flag --" + name);
  return flag->given;
}

std::string Cli::help() const {
  std::ostringstream out;
  out << "Usage: " << program_ << " [--flag value ...]\n\n" << summary_ << "\n";
  std::string current = "\x01";
  for (const auto& f : flags_) {
    if (f.section != current) {
      current = f.section;
      out << "\n" << (current.empty() ? "Options" : current) << ":\n";
    }
    std::string head = "  --" + f.name;
    if (!std::holds_alternative<bool*>(f.target)) head += " <value>";
    std::string text = f.help;
    if (!f.choices.empty()) {
      text += " {" + join(f.choices, [](const std::string& s) { return s; }) + "}";
    }
    text += " [default: " + (f.default_text.empty() ? std::string("\"\"") : f.default_text) + "]";
    // Help text in a column from 30 to 100, wrapped at spaces.
    constexpr size_t kIndent = 30, kWidth = 100;
    out << head;
    size_t column = head.size();
    if (column >= kIndent) {
      out << "\n";
      column = 0;
    }
    std::istringstream words(text);
    bool first = true;
    for (std::string word; words >> word; first = false) {
      if (!first && column + 1 + word.size() > kWidth) {
        out << "\n";
        column = 0;
      }
      if (column < kIndent) {
        out << std::string(kIndent - column, ' ');
        column = kIndent;
      } else {
        out << ' ';
        ++column;
      }
      out << word;
      column += word.size();
    }
    out << "\n";
  }
  out << "\n  --help, -h                  this text\n";
  return out.str();
}

std::vector<std::pair<std::string, std::string>> Cli::values() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : flags_) out.emplace_back(f.name, render(f.target));
  return out;
}

int run_main(const std::string& program, const std::function<int()>& body, std::ostream& err) {
  try {
    return body();
  } catch (const std::invalid_argument& e) {
    err << program << ": error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    err << program
        << ": error: out of memory (std::bad_alloc): the run asks for more memory than this "
           "machine has; lower --batch-size (or the model's size)\n";
  } catch (const c10::Error& e) {
    err << program << ": error: " << e.what_without_backtrace() << "\n";
  } catch (const std::exception& e) {
    err << program << ": error: " << e.what() << "\n";
  }
  return kExitFailure;
}

int run_main(const std::string& program, const std::function<int()>& body) {
  return run_main(program, body, std::cerr);
}

}  // namespace fogo::trainer
