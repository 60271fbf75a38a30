#pragma once
// What a run chooses about its backend beyond its name: which attention kernels the cuda
// backend runs (training.attention). The host backends have one attention kernel each.
#include <memory>
#include <string_view>

#include "core/backend.h"

namespace bottle {

// training.attention: "auto" runs cuDNN's SDPA for bf16 where cuDNN is loadable and supports
// the shape, else the own kernels; "cudnn" runs cuDNN or fails saying why; "own" always runs
// the backend's own kernels.
enum class AttentionChoice { automatic, cudnn, own };
// "auto", "cudnn" or "own".
const char* attention_choice_name(AttentionChoice choice);

struct BackendOptions {
  AttentionChoice attention = AttentionChoice::automatic;
};

// make_backend(name) with options: a host backend refuses attention "cudnn" (cuDNN runs on the
// cuda backend only); the cuda backend refuses it where cuDNN cannot be loaded.
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options);

}  // namespace bottle
