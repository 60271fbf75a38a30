#include "pipeline/executor.h"

#include <algorithm>

#include "core/error.h"

namespace bottle {

namespace {

// Tags: the message of micro-batch m sent by chunk c (of `chunks` per stage), activation part k
// → 32·(m·chunks + c) + k; gradient part k → 32·(m·chunks + c) + 16 + k. With one chunk that is
// 32·m + k as before chunks existed. Between two stages a message is named by its micro-batch,
// direction and sending chunk (the receiver knows the sender's chunk: Action::peer_chunk), so
// no two messages of a step share a tag.
constexpr int kPartsPerDirection = 16;

int tag(int micro_batch, int sender_chunk, int chunks, bool gradient, size_t part) {
  BOTTLE_ASSERT(part < size_t(kPartsPerDirection), "pipeline: {} tensors cross a boundary",
                part + 1);
  BOTTLE_ASSERT(sender_chunk >= 0 && sender_chunk < chunks, "pipeline: chunk {} of {}",
                sender_chunk, chunks);
  return 2 * kPartsPerDirection * (micro_batch * chunks + sender_chunk) +
         (gradient ? kPartsPerDirection : 0) + int(part);
}

// Posts the receives of one receive action: one per tensor crossing the boundary.
std::vector<PendingCall> post_receive(Communicator* pp, const std::vector<Tensor>& parts,
                                      const Action& a, int chunks, const char* site) {
  const bool gradient = a.kind == ActionKind::recv_gradient;
  std::vector<PendingCall> calls;
  for (size_t k = 0; k < parts.size(); ++k)
    calls.push_back(pp->start_recv(parts[k], a.peer,
                                   tag(a.micro_batch, a.peer_chunk, chunks, gradient, k), site));
  return calls;
}

void send(Communicator* pp, const std::vector<Tensor>& parts, const Action& a, int chunks,
          const char* site) {
  const bool gradient = a.kind == ActionKind::send_gradient;
  for (size_t k = 0; k < parts.size(); ++k)
    pp->send_async(parts[k], a.peer, tag(a.micro_batch, a.chunk, chunks, gradient, k), site);
}

}  // namespace

void run_pipeline(const std::vector<Action>& actions, StageWork& work, Communicator* pp) {
  const int slots = work.slots();
  int chunks = 1;
  for (const Action& a : actions) chunks = std::max({chunks, a.chunk + 1, a.peer_chunk + 1});
  // [chunks][micro-batches seen]: whether (m, c)'s W or BW has run, which frees its slot.
  std::vector<std::vector<bool>> released(static_cast<size_t>(chunks));
  auto slot_free = [&](int m, int c) {
    const std::vector<bool>& done = released[size_t(c)];
    return m < slots || (size_t(m - slots) < done.size() && done[size_t(m - slots)]);
  };
  // The receives posted so far, by action index; `next` is the first receive action not posted.
  std::vector<std::vector<PendingCall>> posted(actions.size());
  size_t next = 0;
  auto post = [&](size_t index) {
    const Action& a = actions[index];
    posted[index] =
        a.kind == ActionKind::recv_gradient
            ? post_receive(pp, work.gradient_in(a.micro_batch, a.chunk), a, chunks, "pp.gradient")
            : post_receive(pp, work.activation_in(a.micro_batch, a.chunk), a, chunks,
                           "pp.activation");
  };
  auto post_ahead = [&] {
    for (; next < actions.size(); ++next) {
      const Action& a = actions[next];
      if (!is_receive(a.kind)) continue;
      if (!slot_free(a.micro_batch, a.chunk)) return;  // in order: the later ones wait for it
      post(next);
    }
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int m = a.micro_batch, c = a.chunk;
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
      case ActionKind::compute:
        switch (a.pass) {
          case Pass::F:
            work.forward(m, c);
            break;
          case Pass::B:
            work.backward_input(m, c);
            break;
          case Pass::W:
          case Pass::BW: {
            if (a.pass == Pass::W)
              work.backward_weight(m, c);
            else
              work.backward(m, c);
            std::vector<bool>& done = released[size_t(c)];
            if (done.size() <= size_t(m)) done.resize(size_t(m) + 1, false);
            done[size_t(m)] = true;
            break;
          }
        }
        break;
      case ActionKind::send_activation:
        send(pp, work.activation_out(m, c), a, chunks, "pp.activation");
        break;
      case ActionKind::send_gradient:
        send(pp, work.gradient_out(m, c), a, chunks, "pp.gradient");
        break;
    }
  }
  if (pp) pp->wait_sends();
}

std::vector<Action> forward_only_schedule(int stages, int stage, int micro_batches) {
  std::vector<Action> out;
  for (const Action& a : pipeline_schedule(PipelineSchedule::gpipe, stages, stage, micro_batches))
    if (a.kind == ActionKind::recv_activation || a.kind == ActionKind::send_activation ||
        (a.kind == ActionKind::compute && a.pass == Pass::F))
      out.push_back(a);
  return out;
}

}  // namespace bottle
