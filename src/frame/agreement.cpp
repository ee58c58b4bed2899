// The job's agreement on decisions (fogo_private/frame/agreement.h): the hook the distributed
// layer installs so that timed or measured choices (ns_form Auto, ns_dtype auto) are one per job.
#include "fogo_private/frame/agreement.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace fogo {

namespace detail {
namespace {
struct Agreements {
  std::mutex mutex;
  std::vector<std::pair<int64_t, Agreement>> installed;  // the last one is used
  int64_t next_handle = 0;
};

Agreements& agreements() {
  static Agreements state;
  return state;
}
}  // namespace

int64_t install_agreement(Agreement agreement) {
  Agreements& state = agreements();
  const std::lock_guard<std::mutex> lock(state.mutex);
  state.installed.emplace_back(state.next_handle, std::move(agreement));
  return state.next_handle++;
}

void remove_agreement(int64_t handle) {
  Agreements& state = agreements();
  const std::lock_guard<std::mutex> lock(state.mutex);
  auto& v = state.installed;
  v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& a) { return a.first == handle; }),
          v.end());
}

int64_t agree(const std::string& key, int64_t local) {
  Agreement current;
  {
    Agreements& state = agreements();
    const std::lock_guard<std::mutex> lock(state.mutex);
    if (!state.installed.empty()) current = state.installed.back().second;
  }
  return current ? current(key, local) : local;  // outside the lock: it may wait for a store
}
}  // namespace detail

}  // namespace fogo
