#pragma once
// Helpers shared by the GPT-2 tests.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>

#include "train.h"

namespace gpt2::test {

/// A fresh directory, deleted with its contents on destruction. Deletion walks the tree with
/// std::filesystem::remove: the torch wheel's libtorch.so exports its own
/// std::filesystem::remove_all, which crashes when it wins symbol resolution.
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / ("gpt2_" + name + "_XXXXXX")).string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() { remove_tree(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  static void remove_tree(const std::filesystem::path& p) {
    std::error_code ec;
    if (std::filesystem::is_directory(std::filesystem::symlink_status(p, ec))) {
      for (const auto& entry : std::filesystem::directory_iterator(p, ec))
        remove_tree(entry.path());
    }
    std::filesystem::remove(p, ec);
  }
  std::filesystem::path path_;
};

/// The message of an exception, without the C++ backtrace that a c10::Error carries.
inline std::string message(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error ? c10_error->what_without_backtrace() : e.what();
}

/// Runs `fn` and expects an exception whose message contains every one of `parts`.
template <class Fn>
void expect_error(Fn fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const std::exception& e) {
    const std::string what = message(e);
    for (const auto& part : parts) {
      EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
    }
  }
}

/// Tests run torch single-threaded: the tensors are tiny, and OpenMP threads spinning against
/// other processes on a small shared machine slow them down by 10-100x.
class SingleThread : public ::testing::Environment {
 public:
  void SetUp() override { at::set_num_threads(1); }
};
inline ::testing::Environment* const kSingleThread =
    ::testing::AddGlobalTestEnvironment(new SingleThread);

/// A temporary folder (named after the test) holding corpus.txt, a small learnable corpus (a few
/// verses repeated with variations), and a tiny-model CPU training configuration over it.
class CorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    temp_ =
        std::make_unique<TempDir>(::testing::UnitTest::GetInstance()->current_test_info()->name());
    dir_ = temp_->path();
    std::ofstream f(dir_ / "corpus.txt");
    for (int i = 0; i < 400; ++i) {
      f << "Ge1:" << i % 31 << " And God said, Let there be light: and there was light.\n"
        << "Ex2:" << i % 7 << " And the evening and the morning were the day " << i % 5 << ".\n";
    }
  }

  /// `optimizer` on the tiny model at lr 3e-3, 16 validation windows, output in <dir>/`out`; one
  /// thread (a fixed thread count keeps CPU reductions bitwise reproducible), quiet.
  TrainConfig tiny_config(const std::string& optimizer, const std::string& out) const {
    TrainConfig c;
    c.model = "tiny";
    c.data.path = (dir_ / "corpus.txt").string();
    c.data.chunk_bytes = 2048;
    c.optimizer.name = optimizer;
    c.optimizer.lr = 3e-3;
    c.eval_sequences = 16;
    c.device = "cpu";
    c.threads = 1;
    c.quiet = true;
    c.out_dir = (dir_ / out).string();
    return c;
  }

  std::unique_ptr<TempDir> temp_;
  std::filesystem::path dir_;
};

}  // namespace gpt2::test
