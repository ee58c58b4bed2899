#include "common/signature.h"

#include <sstream>
#include <stdexcept>

#include "common/cli.h"

namespace fogo::trainer {
namespace {

constexpr const char* kKey = "signature";
constexpr const char* kProgramKey = "signature_program";

const std::string* find(const std::vector<std::pair<std::string, std::string>>& entries,
                        const std::string& flag) {
  for (const auto& [f, v] : entries) {
    if (f == flag) return &v;
  }
  return nullptr;
}

}  // namespace

RunSignature& RunSignature::add(const std::string& flag, const std::string& value) {
  if (flag.empty() || flag.find('=') != std::string::npos || find(entries_, flag)) {
    throw std::logic_error("RunSignature: flag '" + flag + "' is empty, holds '=' or is listed");
  }
  if (value.find('\n') != std::string::npos) {
    throw std::logic_error("RunSignature: the value of --" + flag + " holds a newline");
  }
  entries_.emplace_back(flag, value);
  return *this;
}

RunSignature& RunSignature::add(const std::string& flag, const char* value) {
  return add(flag, std::string(value));
}
RunSignature& RunSignature::add(const std::string& flag, int64_t value) {
  return add(flag, std::to_string(value));
}
RunSignature& RunSignature::add(const std::string& flag, double value) {
  return add(flag, flag_text(value));
}
RunSignature& RunSignature::add(const std::string& flag, bool value) {
  return add(flag, std::string(value ? "true" : "false"));
}
RunSignature& RunSignature::add(const std::string& flag, const std::vector<int64_t>& values) {
  std::string text;
  for (size_t k = 0; k < values.size(); ++k) text += (k ? "," : "") + std::to_string(values[k]);
  return add(flag, text);
}

std::string RunSignature::to_text() const {
  std::string out;
  for (const auto& [flag, value] : entries_) out += flag + "=" + value + "\n";
  return out;
}

RunSignature RunSignature::from_text(std::string program, const std::string& text) {
  RunSignature out(std::move(program));
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) {
      throw std::runtime_error("run signature: malformed line '" + line + "'");
    }
    out.add(line.substr(0, eq), line.substr(eq + 1));
  }
  return out;
}

std::vector<std::string> RunSignature::differences(const RunSignature& stored) const {
  std::vector<std::string> out;
  auto differ = [&](const std::string& flag, const std::string* was, const std::string* now) {
    if (was && now && *was == *now) return;
    out.push_back("--" + flag + " was " + (was ? *was : "(absent)") + ", now " +
                  (now ? *now : "(absent)"));
  };
  for (const auto& [flag, value] : entries_) differ(flag, find(stored.entries_, flag), &value);
  for (const auto& [flag, value] : stored.entries_) {
    if (!find(entries_, flag)) differ(flag, &value, nullptr);
  }
  return out;
}

void RunSignature::write(CheckpointWriter& out) const {
  out.put(kProgramKey, program_);
  out.put(kKey, to_text());
}

void RunSignature::check(CheckpointReader& in) const {
  const std::string where = "--resume: checkpoint '" + in.path() + "'";
  if (!in.has(kProgramKey) || !in.has(kKey)) {
    throw std::invalid_argument(where +
                                " has no run signature (another program, or an older version of " +
                                program_ + ", wrote it); use another --out or drop --resume");
  }
  const std::string writer = in.get_string(kProgramKey);
  if (writer != program_) {
    throw std::invalid_argument(where + " was written by " + writer + ", not " + program_ +
                                "; use another --out or drop --resume");
  }
  const auto diff = differences(from_text(writer, in.get_string(kKey)));
  if (diff.empty()) return;
  std::string list;
  for (const auto& d : diff) list += (list.empty() ? "" : "; ") + d;
  throw std::invalid_argument(where + " belongs to a run with other settings (" + list +
                              "); use another --out or drop --resume to start afresh");
}

std::optional<CheckpointReader> open_for_resume(const std::string& path,
                                                const RunSignature& signature,
                                                c10::optional<c10::Device> device) {
  if (!checkpoint_exists(path)) return std::nullopt;
  std::optional<CheckpointReader> in(std::in_place, path, device);
  signature.check(*in);
  return in;
}

}  // namespace fogo::trainer
