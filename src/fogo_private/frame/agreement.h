#pragma once
// Agreement of a process's automatic decisions with the other processes of its job. Some
// choices are made by measuring (ns_form Auto times Plain against Gram on first sight of a
// shape): in a data-parallel job each rank would measure on its own and replicated ranks could
// take different forms, so that their parameters drift apart by rounding. fogo::dist installs an
// agreement for each process group of more than one rank; newton_schulz.cpp consults it.
// Private to the library (and its tests).

#include <cstdint>
#include <functional>
#include <string>

namespace fogo::detail {

/// agree(key, local): the job's value for `key`, given this process's own `local` one. fogo::dist
/// answers with the first value any process of the job offered for `key` (a compare-and-set in
/// the group's store: not a collective, so it may be called by some ranks only, in any order).
/// It may throw (the store is gone): the caller's operation then fails.
using Agreement = std::function<int64_t(const std::string& key, int64_t local)>;

/// Installs `agreement` for this process; the last installed one is used. Returns a handle for
/// remove_agreement.
int64_t install_agreement(Agreement agreement);
/// Removes the agreement installed with `handle` (the one installed before it is used again).
void remove_agreement(int64_t handle);
/// The job's value for `key`: `local` when no agreement is installed. `key` names the decision
/// and what it is for ("ns_form/..."), without anything that differs between ranks (a device
/// index).
int64_t agree(const std::string& key, int64_t local);

}  // namespace fogo::detail
