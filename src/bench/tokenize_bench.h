#pragma once
// `bottle bench tokenize --tokenizer PATH --input FILE`: encoding throughput of a tokenizer on
// one text, on 1 and more threads, beside the Hugging Face tokenizers library on one thread
// (tools/hf_tokenize_peer.py, for a tokenizer.json) on the same documents. Both sides time the
// best of --repeat passes over all documents (warm caches on both sides), reading and splitting
// excluded; both count the documents' UTF-8 bytes, and the token counts must agree.
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace bottle {

struct BenchTokenizeOptions {
  std::string tokenizer_path;       // --tokenizer: the HF peer reads its tokenizer.json
  std::string input;                // a text file (UTF-8; invalid bytes become U+FFFD)
  std::string documents = "lines";  // how the file splits into documents: lines | file
  std::string peer = "auto";        // auto, none, or the python to run the HF peer with
  std::vector<int> threads{1, 2};   // thread counts to time (the first is the baseline)
  int repeat = 10;                  // passes per measurement; the best counts
  bool json = false;                // one JSON object per measurement
};

// Times `tokenizer` (opened from options.tokenizer_path) and prints the table or the rows.
void run_bench_tokenize(const Tokenizer& tokenizer, const BenchTokenizeOptions& options);

}  // namespace bottle
