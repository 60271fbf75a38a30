#include "pipeline/executor.h"

namespace bottle {

void run_pipeline(const std::vector<Action>& actions, StageWork& work, Communicator* pp) {
  const int stage = pp ? pp->rank() : 0;
  for (const Action& a : actions) {
    const int m = a.micro_batch, activation_tag = 2 * m, gradient_tag = 2 * m + 1;
    switch (a.kind) {
      case ActionKind::recv_activation:
        pp->recv(work.activation_in(m), stage - 1, activation_tag, "pp.activation");
        break;
      case ActionKind::forward:
        work.forward(m);
        break;
      case ActionKind::send_activation:
        pp->send_async(work.activation_out(m), stage + 1, activation_tag, "pp.activation");
        break;
      case ActionKind::recv_gradient:
        pp->recv(work.gradient_in(m), stage + 1, gradient_tag, "pp.gradient");
        break;
      case ActionKind::backward:
        work.backward(m);
        break;
      case ActionKind::send_gradient:
        pp->send_async(work.gradient_out(m), stage - 1, gradient_tag, "pp.gradient");
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
