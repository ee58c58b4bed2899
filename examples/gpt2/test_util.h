#pragma once
// Helpers shared by the GPT-2 tests.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <initializer_list>
#include <stdexcept>
#include <string>

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

}  // namespace gpt2::test
