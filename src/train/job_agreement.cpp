#include "train/job_agreement.h"

#include <algorithm>
#include <climits>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace bottle {

std::string broadcast_text(Communicator& comm, const std::string& text, int root) {
  if (comm.size() == 1) return text;
  // Collectives carry i32 or f32: the length, then the bytes packed four to a word.
  int32_t length = comm.rank() == root ? int32_t(std::min<size_t>(text.size(), INT32_MAX / 2)) : 0;
  comm.broadcast(host_tensor(std::span(&length, 1)), root, "job.text_length");
  std::vector<int32_t> words((size_t(length) + 3) / 4 + 1, 0);
  if (comm.rank() == root)
    for (size_t i = 0; i < size_t(length); ++i)
      words[i / 4] = int32_t(uint32_t(words[i / 4]) | uint32_t(uint8_t(text[i])) << (8 * (i % 4)));
  comm.broadcast(host_tensor(std::span(words)), root, "job.text");
  std::string out(size_t(length), '\0');
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = char(uint8_t(uint32_t(words[i / 4]) >> (8 * (i % 4))));
  return out;
}

void run_on_root_or_fail_together(Communicator& comm, int root, const std::function<void()>& step) {
  std::string error;
  if (comm.rank() == root) {
    try {
      step();
    } catch (const Error& e) {
      error = e.what();
      // An empty message would read as success on the other ranks.
      if (error.empty()) error = "an error without a message";
    }
  }
  error = broadcast_text(comm, error, root);
  if (!error.empty()) fail("{}", error);
}

}  // namespace bottle
