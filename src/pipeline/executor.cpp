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

void receive(Communicator* pp, const std::vector<Tensor>& parts, int from, int m, bool gradient,
             const char* site) {
  for (size_t k = 0; k < parts.size(); ++k) pp->recv(parts[k], from, tag(m, gradient, k), site);
}

void send(Communicator* pp, const std::vector<Tensor>& parts, int to, int m, bool gradient,
          const char* site) {
  for (size_t k = 0; k < parts.size(); ++k) pp->send_async(parts[k], to, tag(m, gradient, k), site);
}

}  // namespace

void run_pipeline(const std::vector<Action>& actions, StageWork& work, Communicator* pp) {
  const int stage = pp ? pp->rank() : 0;
  for (const Action& a : actions) {
    const int m = a.micro_batch;
    switch (a.kind) {
      case ActionKind::recv_activation:
        receive(pp, work.activation_in(m), stage - 1, m, false, "pp.activation");
        break;
      case ActionKind::forward:
        work.forward(m);
        break;
      case ActionKind::send_activation:
        send(pp, work.activation_out(m), stage + 1, m, false, "pp.activation");
        break;
      case ActionKind::recv_gradient:
        receive(pp, work.gradient_in(m), stage + 1, m, true, "pp.gradient");
        break;
      case ActionKind::backward:
        work.backward(m);
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
