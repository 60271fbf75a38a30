// `bottle bench tokenize` (bench/tokenize_bench.h): a tokenizer's encoding throughput beside
// the HF tokenizers peer's.
#include "bench/tokenize_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "bench/subprocess.h"
#include "core/error.h"
#include "data/tokenizer_files.h"
#include "data/utf8.h"
#include "io/file_read.h"
#include "sys/system_info.h"
#include "sys/worker_pool.h"

namespace bottle {
namespace {

struct Pass {
  double seconds = 0;
  uint64_t tokens = 0;
};

// Encodes every document on `threads` workers (each run of documents by whichever claims it
// first, as prepare's do), `repeat` times, and returns the fastest pass. The workers live through
// all passes, as prepare's do through a corpus, so their caches of pre-tokens are warm after the
// first.
Pass fastest_pass(const Tokenizer& tokenizer, const std::vector<std::string>& docs, int threads,
                  int repeat) {
  // Per worker: its ids and its count, a cache line apart.
  struct alignas(64) Worker {
    std::vector<int32_t> ids;
    uint64_t count = 0;
  };
  std::vector<Worker> workers(static_cast<size_t>(threads));
  WorkerPool pool(threads);
  // Lines are tens of bytes: claimed a few dozen at a time, 16 claims a worker per pass.
  const size_t grain = std::max<size_t>(1, docs.size() / (size_t(threads) * 16));
  Pass best;
  for (int r = 0; r < repeat; ++r) {
    for (Worker& w : workers) w.count = 0;
    const auto start = std::chrono::steady_clock::now();
    pool.run(
        docs.size(),
        [&](size_t i, int worker) {
          Worker& w = workers[size_t(worker)];
          w.ids.clear();
          tokenizer.encode(docs[i], w.ids);
          w.count += w.ids.size();
        },
        grain);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r == 0 || seconds < best.seconds) {
      best.seconds = seconds;
      best.tokens = 0;
      for (const Worker& w : workers) best.tokens += w.count;
    }
  }
  return best;
}

}  // namespace

void run_bench_tokenize(const Tokenizer& tokenizer, const BenchTokenizeOptions& o) {
  const std::string text =
      utf8_replace_invalid(read_file_bytes(o.input, "--input", kMaxTextInputBytes));
  std::vector<std::string> docs;
  if (o.documents == "file") {
    docs.push_back(text);
  } else {
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      if (end > pos) docs.push_back(text.substr(pos, end - pos));
      pos = end + 1;
    }
  }
  uint64_t bytes = 0;
  for (const std::string& d : docs) bytes += d.size();
  BOTTLE_CHECK(bytes > 0, "{}: no text to encode", o.input);
  const double mb = double(bytes) / 1e6;
  std::vector<nlohmann::ordered_json> rows;
  std::vector<Pass> best;
  for (int threads : o.threads) best.push_back(fastest_pass(tokenizer, docs, threads, o.repeat));
  const uint64_t tokens = best.front().tokens;
  const double baseline = mb / best.front().seconds;
  for (size_t k = 0; k < o.threads.size(); ++k) {
    const double rate = mb / best[k].seconds;
    rows.push_back({{"engine", "bottle"},
                    {"threads", o.threads[k]},
                    {"mb_per_s", rate},
                    {"tokens_per_s", double(best[k].tokens) / best[k].seconds},
                    {"tokens", best[k].tokens},
                    {"speedup", rate / baseline}});
  }
  std::string peer = o.peer;
  std::string peer_note;
  const bool tokenizer_json = tokenizer.kind() == "bpe";
  if (peer == "auto") {
    const std::string venv = BOTTLE_SOURCE_DIR "/.venv/bin/python";
    if (!tokenizer_json)
      peer = "none", peer_note = "the HF peer reads a tokenizer.json only";
    else if (!std::filesystem::exists(venv))
      peer = "none", peer_note = venv + " is missing: run scripts/setup.sh";
    else
      peer = venv;
  }
  if (peer != "none") {
    BOTTLE_CHECK(tokenizer_json, "--peer: the HF tokenizers peer reads a tokenizer.json, not {}",
                 tokenizer.describe());
    const std::string path = std::filesystem::is_directory(o.tokenizer_path)
                                 ? o.tokenizer_path + "/tokenizer.json"
                                 : o.tokenizer_path;
    const std::string out = run_command(
        fmt::format("{} {} --tokenizer {} --input {} --documents {} --repeat {}", shell_quote(peer),
                    shell_quote(BOTTLE_SOURCE_DIR "/tools/hf_tokenize_peer.py"), shell_quote(path),
                    shell_quote(o.input), o.documents, o.repeat));
    const nlohmann::json j = nlohmann::json::parse(out.substr(out.rfind('{')));
    const double rate = j.at("mb_per_s").get<double>();
    BOTTLE_CHECK(j.at("tokens").get<uint64_t>() == tokens && j.at("bytes").get<uint64_t>() == bytes,
                 "bench tokenize: the HF peer made {} tokens of {} bytes, bottle {} of {}: they "
                 "do not encode the same documents alike",
                 j.at("tokens").get<uint64_t>(), j.at("bytes").get<uint64_t>(), tokens, bytes);
    rows.push_back({{"engine", "hf-tokenizers"},
                    {"threads", 1},
                    {"mb_per_s", rate},
                    {"tokens_per_s", double(tokens) * rate / mb},
                    {"tokens", tokens},
                    {"speedup", rate / baseline}});
  }
  if (o.json) {
    for (const auto& row : rows) fmt::print("{}\n", row.dump());
    return;
  }
  fmt::print("{}\n{}: {} documents, {:.2f} MB, {} tokens ({:.3f} bytes per token)\n",
             tokenizer.describe(), o.input, docs.size(), mb, tokens,
             double(bytes) / double(tokens));
  fmt::print("CPU: {}\n", cpu_summary());
  fmt::print("{:<14} {:>7} {:>9} {:>12} {:>9}\n", "engine", "threads", "MB/s", "tokens/s",
             "vs first");
  for (const auto& row : rows)
    fmt::print("{:<14} {:7} {:>9.2f} {:>12.0f} {:>8.2f}x\n", row["engine"].get<std::string>(),
               row["threads"].get<int>(), row["mb_per_s"].get<double>(),
               row["tokens_per_s"].get<double>(), row["speedup"].get<double>());
  if (!peer_note.empty()) fmt::print("HF peer not run: {}\n", peer_note);
}

}  // namespace bottle
