#pragma once
// What the ranks of one job must agree on before they train: the outcome of a step only one
// rank takes (the folder lock). Every
// exchange has a shape all ranks know in advance, so the ranks meet in the same collectives
// and fail together instead of hanging.
#include <functional>
#include <string>

#include "comm/communicator.h"

namespace bottle {

// `text` of rank `root`, on every rank of `comm` (its length first, then its bytes).
std::string broadcast_text(Communicator& comm, const std::string& text, int root);

// Runs `step` on rank `root` alone; when it throws bottle::Error, every rank fails with that
// message, so the job ends with one clear error on all of them.
void run_on_root_or_fail_together(Communicator& comm, int root, const std::function<void()>& step);

}  // namespace bottle
