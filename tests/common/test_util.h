#pragma once
// Helpers shared by the tests: scratch directories, running the bottle binary and the
// PyTorch reference, tiny models.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "io/token_shard.h"
#include "model/checkpoint.h"

namespace bottle::testing {

namespace fs = std::filesystem;

// A fresh directory, removed with everything in it when the object dies.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() / fmt::format("bottle-test-{}-{}", ::getpid(), counter++);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  // A destructor must not throw: a process a test started in the background may still be
  // writing here (a removal then finds a directory refilled), so it retries for a while and
  // leaves what it cannot remove.
  ~TempDir() {
    std::error_code ec;
    for (int attempt = 0; attempt < 50; ++attempt) {
      fs::remove_all(path_, ec);
      if (!ec) return;
      ::usleep(100'000);
    }
    std::fprintf(stderr, "TempDir: could not remove %s: %s\n", path_.c_str(), ec.message().c_str());
  }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

struct CommandResult {
  int status = -1;     // exit code, or 128 + signal
  std::string output;  // stdout and stderr together
};

inline CommandResult run(const std::string& command) {
  CommandResult r;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen((command + " 2>&1").c_str(), "r"), ::pclose);
  if (!pipe) return r;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), pipe.get())) r.output.append(buf, n);
  const int status = ::pclose(pipe.release());
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline std::string bottle_binary() { return BOTTLE_BINARY; }

#ifdef BOTTLE_MPIEXEC
// mpirun on `ranks` ranks with a hard timeout, so that a hang fails the test (status 124)
// instead of blocking the suite.
inline std::string mpirun(int ranks, int timeout_s = 240) {
  return fmt::format("timeout -k 5 {} {} {} {} --oversubscribe", timeout_s, BOTTLE_MPIEXEC,
                     BOTTLE_MPIEXEC_NUMPROC_FLAG, ranks);
}
#endif

// The [model] section of the tiny CoLA model that the command-line tests train and break.
inline constexpr const char* kTinyColaModelToml = R"([model]
vocab_size = 64
hidden_size = 32
intermediate_size = 48
num_layers = 2
num_heads = 4
bottleneck = "cola"
rank = 8
max_seq_len = 64

)";

// The message of the bottle::Error that `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Standard base64 with padding (what a tiktoken rank file holds).
inline std::string base64(std::string_view bytes) {
  static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) n |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) n |= uint32_t(uint8_t(bytes[i + 2]));
    out += digits[(n >> 18) & 63];
    out += digits[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? digits[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? digits[n & 63] : '=';
  }
  return out;
}

// `count` words drawn from `words` by a fixed generator seeded with `seed`, in sentences of a
// few words ending ".\n": text with repeats, the same on every machine.
inline std::string sentences_of(const std::vector<std::string>& words, int seed, int count) {
  std::string text;
  uint32_t x = uint32_t(seed) * 2654435761u + 1;
  for (int i = 0; i < count; ++i) {
    x = x * 1664525u + 1013904223u;
    text += words[(x >> 16) % words.size()];
    text += (x >> 8) % 9 == 0 ? ".\n" : " ";
  }
  return text;
}

// How often `part` occurs in `text`.
inline int count_occurrences(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}
inline std::string torch_reference() {
  return "/usr/bin/python3 " BOTTLE_SOURCE_DIR "/tools/torch_reference.py";
}

// Random tokens in [0, vocab) as an llm.c shard.
inline void write_random_shard(const std::string& path, int64_t count, int64_t vocab,
                               uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (auto& t : tokens) t = int32_t(rng() % uint32_t(vocab));
  write_token_shard(path, tokens);
}

inline ModelConfig tiny_config(BottleneckKind kind, int64_t kv_heads = 4, bool tied = false) {
  ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = kv_heads;
  c.max_seq_len = 64;
  c.bottleneck = kind;
  c.rank = 8;
  c.tie_embeddings = tied;
  return c;
}

// Initialised weights, with norm gains moved off 1 so that their gradients matter.
inline void init_for_test(LlamaModel& model, uint64_t seed) {
  model.init_weights(seed);
  const ParameterStore& params = model.parameters();
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    if (spec.init == ParamInit::normal) continue;
    const uint64_t key = hash_name(seed + 1, spec.name);
    float* v = params.at(i).value.f32();
    for (int64_t j = 0; j < spec.shape.numel(); ++j)
      v[j] += 0.1f * counter_normal(key, uint64_t(spec.global_index(j)));
  }
}

// A small tmpfs mounted for one test, unmounted when it ends: a disk that fills. Where mount is
// not permitted (no root, a container without CAP_SYS_ADMIN) the test is skipped, saying why.
class SmallDisk {
 public:
  SmallDisk(const std::string& path, int64_t bytes) : path_(path) {
    fs::create_directories(path);
    const CommandResult r =
        run(fmt::format("mount -t tmpfs -o size={} bottle-test-disk {} 2>&1", bytes, path));
    if (r.status == 0)
      mounted_ = true;
    else
      why_ = "cannot mount a tmpfs for a full disk: " + r.output;
    // Under ctest the probe (tests/hostile/full_disk_probe.sh) has mounted one already: this
    // one must mount too, or the case fails rather than skips.
    if (!mounted_ && std::getenv("BOTTLE_REQUIRE_SMALL_DISK")) ADD_FAILURE() << why_;
  }
  ~SmallDisk() {
    if (mounted_) run(fmt::format("umount {} 2>&1", path_));
  }
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }
  // Another size (a tmpfs keeps its files): room for a retry.
  void resize(int64_t bytes) const {
    const CommandResult r = run(fmt::format("mount -o remount,size={} {} 2>&1", bytes, path_));
    ASSERT_EQ(r.status, 0) << r.output;
  }

 private:
  std::string path_, why_;
  bool mounted_ = false;
};

}  // namespace bottle::testing
