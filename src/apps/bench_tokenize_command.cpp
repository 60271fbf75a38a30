// `bottle bench tokenize`'s command line: the options and the tokenizer they name
// (bench/tokenize_bench.h runs it).
#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "apps/tokenizer_options.h"
#include "bench/tokenize_bench.h"

namespace bottle {

Command add_bench_tokenize_command(CLI::App& app) {
  struct Options {
    TokenizerOptions tokenizer;
    std::string input, documents = "lines", peer = "auto";
    std::vector<int> threads{1, 2};
    int repeat = 10;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  add_tokenizer_options(app, o->tokenizer, /*required=*/true);
  app.add_option("--input", o->input, "a text file (UTF-8; invalid bytes become U+FFFD)")
      ->required();
  app.add_option("--documents", o->documents, "how the file splits into documents: lines | file")
      ->check(CLI::IsMember({"lines", "file"}));
  app.add_option("--threads", o->threads, "thread counts to time (the first is the baseline)")
      ->delimiter(',')
      ->check(integer_in(1, kMaxThreads));
  app.add_option("--repeat", o->repeat, "passes per measurement; the best counts")
      ->check(integer_in(1, 1000));
  app.add_option("--peer", o->peer,
                 "the HF tokenizers peer: auto (run it for a tokenizer.json when .venv has it), "
                 "none, or the python to run it with");
  app.add_flag("--json", o->json, "one JSON object per measurement");
  return [o] {
    const auto tokenizer = open_tokenizer(o->tokenizer);
    run_bench_tokenize(*tokenizer, {.tokenizer_path = o->tokenizer.path,
                                    .input = o->input,
                                    .documents = o->documents,
                                    .peer = o->peer,
                                    .threads = o->threads,
                                    .repeat = o->repeat,
                                    .json = o->json});
    return 0;
  };
}

}  // namespace bottle
