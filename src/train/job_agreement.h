#pragma once
// What the ranks of one job must agree on before they train: that they were given one
// configuration, and the outcome of a step only one rank takes (the folder lock). Every
// exchange has a shape all ranks know in advance, so ranks given different settings still
// meet in the same collectives and fail together instead of hanging or corrupting buffers.
#include <functional>
#include <string>

#include "comm/communicator.h"

namespace bottle {

// `text` of rank `root`, on every rank of `comm` (its length first, then its bytes).
std::string broadcast_text(Communicator& comm, const std::string& text, int root);

// Runs `step` on rank `root` alone; when it throws bottle::Error, every rank fails with that
// message, so the job ends with one clear error on all of them.
void run_on_root_or_fail_together(Communicator& comm, int root, const std::function<void()>& step);

// Runs `step` on every rank (each doing its own share, such as the file it writes); when it
// throws bottle::Error on any of them, every rank fails with the message of the lowest such
// rank, instead of the others waiting in their next collective for one that has stopped.
void run_everywhere_or_fail_together(Communicator& comm, const std::function<void()>& step);

// FNV-1a, 64 bits: a digest that is the same on every machine and build.
uint64_t fnv1a64(const std::string& text);

// Every rank passes the resolved configuration as TOML (to_toml) and what else must match
// (the options, the data files); on any difference every rank fails with one message naming
// the first key that differs and a rank that differs from rank 0. `config_path` starts it.
void check_same_configuration(Communicator& comm, const std::string& resolved_toml,
                              const std::string& config_path);

}  // namespace bottle
