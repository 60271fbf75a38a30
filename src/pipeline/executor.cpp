#include "pipeline/executor.h"

#include "core/error.h"

namespace bottle {

namespace {

// Tags: micro-batch m, activation part k → 32·m + k; gradient part k → 32·m + 16 + k.
constexpr int kPartsPerDirection = 16;

int tag(int micro_batch, bool gradient, size_t part) {
  BOTTLE_ASSERT(part < size_t(kPartsPerDirection), "pipeline: {} tensors cross a boundary",
                part + 1);
  return 2 * kPartsPerDirection * micro_batch + (gradient ? kPartsPerDirection : 0) + int(part);
}

// Posts the receives of one receive action: one per tensor crossing the boundary.
std::vector<PendingCall> post_receive(Communicator* pp, const std::vector<Tensor>& parts, int from,
                                      int m, bool gradient, const char* site) {
  std::vector<PendingCall> calls;
  for (size_t k = 0; k < parts.size(); ++k)
    calls.push_back(pp->start_recv(parts[k], from, tag(m, gradient, k), site));
  return calls;
}

void send(Communicator* pp, const std::vector<Tensor>& parts, int to, int m, bool gradient,
          const char* site) {
  for (size_t k = 0; k < parts.size(); ++k) pp->send_async(parts[k], to, tag(m, gradient, k), site);
}

}  // namespace

void run_pipeline(const std::vector<Action>& actions, StageWork& work, Communicator* pp) {
  const int stage = pp ? pp->rank() : 0;
  const int slots = work.slots();
  std::vector<bool> backward_done;  // [micro-batches seen] whose backward has run
  auto slot_free = [&](int m) {
    return m < slots ||
           (size_t(m - slots) < backward_done.size() && backward_done[size_t(m - slots)]);
  };
  // The receives posted so far, by action index; `next` is the first receive action not posted.
  std::vector<std::vector<PendingCall>> posted(actions.size());
  size_t next = 0;
  auto post = [&](size_t index) {
    const Action& a = actions[index];
    posted[index] = a.kind == ActionKind::recv_gradient
                        ? post_receive(pp, work.gradient_in(a.micro_batch), stage + 1,
                                       a.micro_batch, true, "pp.gradient")
                        : post_receive(pp, work.activation_in(a.micro_batch), stage - 1,
                                       a.micro_batch, false, "pp.activation");
  };
  auto post_ahead = [&] {
    for (; next < actions.size(); ++next) {
      const Action& a = actions[next];
      if (a.kind != ActionKind::recv_gradient && a.kind != ActionKind::recv_activation) continue;
      if (!slot_free(a.micro_batch)) return;  // in order: the later ones wait for this one
      post(next);
    }
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int m = a.micro_batch;
    if (pp) post_ahead();
    switch (a.kind) {
      case ActionKind::recv_activation:
      case ActionKind::recv_gradient:
        // A schedule keeping at most slots() micro-batches alive has freed the slot by now, so
        // post_ahead above has posted it; one that does not (a forward-only schedule of several
        // micro-batches in one slot) receives here, where its buffer is free.
        if (next <= i) {
          post(i);
          next = i + 1;
        }
        for (PendingCall& call : posted[i]) call.wait();
        break;
      case ActionKind::forward:
        work.forward(m);
        break;
      case ActionKind::send_activation:
        send(pp, work.activation_out(m), stage + 1, m, false, "pp.activation");
        break;
      case ActionKind::backward:
        work.backward(m);
        if (backward_done.size() <= size_t(m)) backward_done.resize(size_t(m) + 1, false);
        backward_done[size_t(m)] = true;
        break;
      case ActionKind::send_gradient:
        send(pp, work.gradient_out(m), stage - 1, m, true, "pp.gradient");
        break;
    }
  }
  if (pp) pp->wait_sends();
}

std::vector<Action> forward_only_schedule(int stages, int stage, int micro_batches) {
  std::vector<Action> out;
  for (const Action& a : pipeline_schedule(PipelineSchedule::gpipe, stages, stage, micro_batches))
    if (a.kind == ActionKind::recv_activation || a.kind == ActionKind::forward ||
        a.kind == ActionKind::send_activation)
      out.push_back(a);
  return out;
}

}  // namespace bottle
