#pragma once
// Metrics files for the example trainers: one record per line, JSON Lines (.jsonl) or CSV
// (.csv), chosen by the file's extension.
//
//   auto log = fogo::trainer::MetricsWriter::create("runs/x/train.jsonl");
//   log.write(Record().set("step", step).set("loss", loss).set("optimizer", "fogo"));
//
// Every line is flushed as it is written, so a crashed run keeps what it logged. When a run is
// resumed from a checkpoint taken at step N, MetricsWriter::resume() drops the records the
// interrupted run wrote after N (their `step` > N) before appending, so the file ends up exactly
// as if the run had never stopped.
//
// JSONL: {"step":12,"loss":0.5321,"optimizer":"fogo"}; NaN and infinities are written as null.
// CSV: a header line with the first record's keys; later records may leave keys out (empty
// cells) but may not add new ones (an error names the key).

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace fogo::trainer {

class Record {
 public:
  using Value = std::variant<int64_t, double, std::string, bool>;
  Record& set(const std::string& key, int64_t value);
  Record& set(const std::string& key, int value) { return set(key, static_cast<int64_t>(value)); }
  Record& set(const std::string& key, double value);
  Record& set(const std::string& key, const std::string& value);
  Record& set(const std::string& key, const char* value) { return set(key, std::string(value)); }
  Record& set(const std::string& key, bool value);
  /// Insertion order; setting a key again replaces its value in place.
  const std::vector<std::pair<std::string, Value>>& fields() const { return fields_; }
  const Value* get(const std::string& key) const;

 private:
  Record& put(const std::string& key, Value value);
  std::vector<std::pair<std::string, Value>> fields_;
};

enum class MetricsFormat { Jsonl, Csv };

/// Jsonl for ".jsonl"/".json", Csv for ".csv"; throws std::invalid_argument naming the path
/// otherwise.
MetricsFormat metrics_format(const std::string& path);

class MetricsWriter {
 public:
  /// Creates (or truncates) `path`; parent directories are created.
  static MetricsWriter create(const std::string& path);
  /// Keeps the records whose integer field `key` is <= `upto` (and records without it), drops
  /// the rest, and appends after them. A missing file is created.
  static MetricsWriter resume(const std::string& path, int64_t upto,
                              const std::string& key = "step");

  void write(const Record& record);
  const std::string& path() const { return path_; }

  MetricsWriter(MetricsWriter&&) = default;
  MetricsWriter& operator=(MetricsWriter&&) = default;

 private:
  MetricsWriter(std::string path, MetricsFormat format, std::vector<std::string> columns,
                bool append);
  std::string path_;
  MetricsFormat format_;
  std::vector<std::string> columns_;  ///< CSV header; empty until the first record
  std::ofstream out_;
};

}  // namespace fogo::trainer
