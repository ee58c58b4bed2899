#include "common/metrics.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "common/checkpoint.h"

namespace fogo::trainer {
namespace {

std::string number(double v) {
  if (!std::isfinite(v)) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_value(const Record::Value& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, int64_t>) return std::to_string(x);
        if constexpr (std::is_same_v<T, double>) return std::isfinite(x) ? number(x) : "null";
        if constexpr (std::is_same_v<T, std::string>) return json_string(x);
        if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
      },
      v);
}

std::string csv_cell(const Record::Value& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, int64_t>) return std::to_string(x);
        if constexpr (std::is_same_v<T, double>) return std::isfinite(x) ? number(x) : "nan";
        if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
        if constexpr (std::is_same_v<T, std::string>) {
          if (x.find_first_of(",\"\n") == std::string::npos) return x;
          std::string out = "\"";
          for (const char c : x) out += c == '"' ? std::string("\"\"") : std::string(1, c);
          return out + "\"";
        }
      },
      v);
}

// Splits one CSV line produced by csv_cell (quoted cells may hold commas and doubled quotes).
std::vector<std::string> csv_split(const std::string& line) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (size_t k = 0; k < line.size(); ++k) {
    const char c = line[k];
    if (quoted) {
      if (c == '"' && k + 1 < line.size() && line[k + 1] == '"') {
        cells.back() += '"';
        ++k;
      } else if (c == '"') {
        quoted = false;
      } else {
        cells.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      cells.emplace_back();
    } else {
      cells.back() += c;
    }
  }
  return cells;
}

}  // namespace

const Record::Value* Record::get(const std::string& key) const {
  for (const auto& [k, v] : fields_) {
    if (k == key) return &v;
  }
  return nullptr;
}

Record& Record::put(const std::string& key, Value value) {
  for (auto& [k, v] : fields_) {
    if (k == key) {
      v = std::move(value);
      return *this;
    }
  }
  fields_.emplace_back(key, std::move(value));
  return *this;
}
Record& Record::set(const std::string& key, int64_t value) { return put(key, value); }
Record& Record::set(const std::string& key, double value) { return put(key, value); }
Record& Record::set(const std::string& key, const std::string& value) { return put(key, value); }
Record& Record::set(const std::string& key, bool value) { return put(key, value); }

MetricsFormat metrics_format(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".jsonl" || ext == ".json") return MetricsFormat::Jsonl;
  if (ext == ".csv") return MetricsFormat::Csv;
  throw std::invalid_argument("metrics file '" + path + "': unknown extension; use .jsonl or .csv");
}

MetricsWriter::MetricsWriter(std::string path, MetricsFormat format,
                             std::vector<std::string> columns, bool append)
    : path_(std::move(path)), format_(format), columns_(std::move(columns)) {
  const auto parent = std::filesystem::path(path_).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  out_.open(path_, append ? std::ios::app : std::ios::trunc);
  if (!out_) throw std::runtime_error("metrics file '" + path_ + "': cannot open for writing");
}

MetricsWriter MetricsWriter::create(const std::string& path) {
  return MetricsWriter(path, metrics_format(path), {}, /*append=*/false);
}

MetricsWriter MetricsWriter::resume(const std::string& path, int64_t upto, const std::string& key) {
  const MetricsFormat format = metrics_format(path);
  std::ifstream in(path);
  if (!in) return create(path);
  std::vector<std::string> kept, columns;
  std::string line;
  if (format == MetricsFormat::Jsonl) {
    const std::regex field("\"" + key + "\":(-?[0-9]+)[,}]");
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      std::smatch m;
      if (std::regex_search(line, m, field) && std::stoll(m[1]) > upto) continue;
      kept.push_back(line);
    }
  } else {
    int64_t column = -1;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      if (columns.empty()) {
        columns = csv_split(line);
        for (size_t c = 0; c < columns.size(); ++c) {
          if (columns[c] == key) column = static_cast<int64_t>(c);
        }
        kept.push_back(line);
        continue;
      }
      const auto cells = csv_split(line);
      if (column >= 0 && static_cast<size_t>(column) < cells.size() && !cells[column].empty() &&
          std::stoll(cells[column]) > upto) {
        continue;
      }
      kept.push_back(line);
    }
  }
  in.close();
  // Rewritten through a temporary file, checked once on disk before it replaces the original: a
  // crash or a full disk here cannot lose the kept records.
  std::string contents;
  for (const auto& l : kept) contents += l + '\n';
  try {
    replace_file(path, contents);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("metrics file ") + e.what());
  }
  return MetricsWriter(path, format, columns, /*append=*/true);
}

void MetricsWriter::write(const Record& record) {
  std::string line;
  if (format_ == MetricsFormat::Jsonl) {
    line = "{";
    bool first = true;
    for (const auto& [k, v] : record.fields()) {
      line += (first ? "" : ",") + json_string(k) + ":" + json_value(v);
      first = false;
    }
    line += "}";
  } else {
    if (columns_.empty()) {
      for (const auto& [k, v] : record.fields()) columns_.push_back(k);
      std::string header;
      for (size_t c = 0; c < columns_.size(); ++c) {
        header += (c ? "," : "") + csv_cell(columns_[c]);
      }
      out_ << header << '\n';
    }
    for (const auto& [k, v] : record.fields()) {
      bool known = false;
      for (const auto& c : columns_) known = known || c == k;
      if (!known) {
        throw std::invalid_argument("metrics file '" + path_ + "': field '" + k +
                                    "' is not a column of this CSV file (its header was fixed "
                                    "by the first record); use .jsonl for varying fields");
      }
    }
    for (size_t c = 0; c < columns_.size(); ++c) {
      const Record::Value* v = record.get(columns_[c]);
      line += (c ? "," : "") + (v ? csv_cell(*v) : std::string());
    }
  }
  out_ << line << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("metrics file '" + path_ + "': write failed");
}

}  // namespace fogo::trainer
