#pragma once
// What a run chooses about its backend beyond its name: which attention kernels the cuda
// backend runs (training.attention). The host backends have one attention kernel each.
#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"

namespace bottle {

// The backends a run can name (training.backend, bench --backend), in the order of train's
// BackendKind; the one list the configuration, the benches and the registry's messages read.
// ("cpu-widened", the cpu kernels behind the widening backend, is a fallback to name that no
// list offers.)
inline constexpr std::array<const char*, 3> kBackendNames = {"cpu", "reference", "cuda"};
// Whether the backend `name` computes in host memory: "cpu", "cpu-widened" and "reference".
bool is_host_backend(std::string_view name);
// kBackendNames' host backends, for a command that runs on the host only.
std::vector<std::string> host_backend_names();

// training.attention: "auto" runs cuDNN's SDPA for bf16 where cuDNN is loadable and supports
// the shape, else the own kernels; "cudnn" runs cuDNN or fails saying why; "own" always runs
// the backend's own kernels.
enum class AttentionChoice { automatic, cudnn, own };
// Their names, in AttentionChoice's order.
inline constexpr std::array<const char*, 3> kAttentionChoiceNames = {"auto", "cudnn", "own"};
// "auto", "cudnn" or "own".
inline const char* attention_choice_name(AttentionChoice choice) {
  return kAttentionChoiceNames[int(choice)];
}
// The choice `name` spells; fails naming the choices for another name.
AttentionChoice parse_attention_choice(std::string_view name);

struct BackendOptions {
  AttentionChoice attention = AttentionChoice::automatic;
};

// make_backend(name) with options: a host backend refuses attention "cudnn" (cuDNN runs on the
// cuda backend only); the cuda backend refuses it where cuDNN cannot be loaded.
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options);

}  // namespace bottle
