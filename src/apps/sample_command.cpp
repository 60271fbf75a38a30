// `bottle sample --checkpoint DIR --prompt TEXT [--tokens N] [--temperature T] [--top-k K]
// [--top-p P] [--num-samples M] [--ignore-eos] [--seed S] [--json]`: generation from a model
// directory with the tokenizer saved in it (byte-level when it holds none). The text streams
// out as it is made, never cutting a UTF-8 character; --json prints the ids instead (what a
// comparison with transformers reads). A sample ends after N tokens or at the end of a
// document: EOS, or the delimiter prepare writes before every document (BOS where the
// tokenizer has one), which is not printed.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "comm/communicator.h"
#include "data/utf8.h"
#include "model/checkpoint.h"
#include "train/memory_plan.h"
#include "train/run_tokenizer.h"
#include "train/train_config.h"

namespace bottle {

namespace {

// sample takes --set so that a key gets the same checks and messages as everywhere, and a
// reason rather than CLI11's "not expected"; it runs on one process, so it honours none.
const CommandKeys kSampleKeys{"sample",
                              {},
                              {},
                              "it runs the checkpoint's model on one process, with --tokens, "
                              "--temperature, --top-k, --top-p and --seed"};

// Draws from softmax(logits / T) restricted to the k largest (k = 0: all), then to the fewest
// most likely whose probabilities sum to at least p (nucleus sampling; p = 1: all); T = 0:
// argmax.
int32_t draw(const float* logits, int64_t vocab, float temperature, int64_t top_k, double top_p,
             std::mt19937_64& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) ids[i] = int32_t(i);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b]; };
  if (temperature <= 0.0f) return *std::min_element(ids.begin(), ids.end(), by_logit);
  int64_t keep = top_k > 0 ? std::min(top_k, vocab) : vocab;
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), by_logit);
  std::vector<double> weights(static_cast<size_t>(keep));
  for (int64_t i = 0; i < keep; ++i)
    weights[i] = std::exp(double(logits[ids[i]] - logits[ids[0]]) / temperature);
  double total = 0.0;
  for (double w : weights) total += w;
  if (top_p < 1.0) {
    // The weights fall with i: the nucleus is a prefix of them.
    double mass = 0.0;
    int64_t nucleus = 0;
    while (nucleus < keep && mass < top_p * total) mass += weights[nucleus++];
    keep = std::max<int64_t>(nucleus, 1);
    total = mass;
  }
  // A uniform from 53 random bits: the same stream on every standard library.
  double u = double(rng() >> 11) * 0x1.0p-53 * total;
  for (int64_t i = 0; i < keep; ++i) {
    u -= weights[i];
    if (u <= 0.0) return ids[i];
  }
  return ids[keep - 1];
}

// Prints a growing decoded text as it becomes final: a trailing incomplete UTF-8 character,
// or a U+FFFD that the next token may still turn into one, waits for the next token.
class TextStream {
 public:
  void update(const std::string& text, bool last) {
    // A decoder may rewrite what it gave before (SentencePiece's spaces); then wait for the
    // end, which prints whatever still extends the printed text.
    if (!text.starts_with(printed_)) return;
    size_t end = text.size();
    if (!last) {
      end = utf8_complete_prefix(text);
      static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
      while (end >= printed_.size() + kReplacement.size() &&
             std::string_view(text).substr(end - kReplacement.size(), kReplacement.size()) ==
                 kReplacement)
        end -= kReplacement.size();
    }
    if (end <= printed_.size()) return;
    std::fwrite(text.data() + printed_.size(), 1, end - printed_.size(), stdout);
    std::fflush(stdout);
    printed_.assign(text, 0, end);
  }

 private:
  std::string printed_;  // what went to stdout so far
};

// Memory first: a model the machine cannot hold is refused before it is loaded. `tokens`
// bounds the window: the prompt's bytes (at least its tokens) and those to generate.
void check_sample_memory(const std::string& checkpoint, int64_t tokens) {
  const ModelConfig c = read_model_config(checkpoint);
  const int64_t window = std::min<int64_t>(c.max_seq_len, tokens);
  check_batch_shape(c, 1, window, "sample:", "batch", "--tokens + prompt length");
  const std::string what = "sample: the model of " + checkpoint;
  const std::string advice = "use a smaller model or a machine with more memory";
  Communicator& world = world_communicator();
  check_parameter_memory(c, false, 1, 1, 1, world, what, advice);
  const TensorParallel tp{&default_tp_layout(c.shape())};
  check_layers_memory(c, tp, 1, window, world, what, advice);
  check_available_memory(plan_model_memory(c, tp, 1, window, false), world, what, advice);
}

}  // namespace

Command add_sample_command(CLI::App& app) {
  struct Options {
    std::string checkpoint, prompt;
    int64_t tokens = 200, top_k = 0, num_samples = 1;
    float temperature = 0.8f;
    double top_p = 1.0;
    uint64_t seed = 0;
    bool json = false, ignore_eos = false;
    std::vector<std::string> overrides;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--checkpoint", o->checkpoint,
                 "model directory (config.json + model.safetensors), or a run's folder for its "
                 "newest checkpoint")
      ->required();
  app.add_option("--prompt", o->prompt,
                 "text to continue (encoded with the checkpoint's tokenizer)")
      ->required();
  app.add_option("--tokens", o->tokens, "tokens to generate")->check(integer_in(0));
  // A float: above its largest finite value the temperature would read as infinite.
  app.add_option("--temperature", o->temperature, "softmax temperature; 0 = greedy")
      ->check(finite_in(0, 1e30));
  app.add_option("--top-k", o->top_k, "sample among the k most likely tokens (0 = all)")
      ->check(integer_in(0));
  app.add_option(
         "--top-p", o->top_p,
         "sample among the fewest most likely tokens whose probabilities sum to p (1 = all)")
      ->check(finite_in(0, 1));
  app.add_option("--num-samples", o->num_samples,
                 "samples of the prompt, one after another from one random stream")
      ->check(integer_in(1, 1'000'000));
  app.add_flag("--ignore-eos", o->ignore_eos,
               "keep generating past the end of a document (EOS or the document delimiter)");
  app.add_option("--seed", o->seed, "random seed")->check(integer_in(0));
  app.add_flag("--json", o->json,
               "print one JSON object per sample instead of streaming text: {\"prompt_ids\", "
               "\"ids\" (the generated ones), \"text\" (their decoded continuation), "
               "\"stop\" (\"tokens\" or \"eos\")}");
  app.add_option("--set", o->overrides,
                 "train's section.key=value; sample runs on one process and takes none");
  return [o] {
    BOTTLE_CHECK(world_communicator().size() == 1,
                 "sample runs on one process; run it without mpirun (the job has {} ranks)",
                 world_communicator().size());
    o->checkpoint = checkpoint_option(o->checkpoint, "sample");
    check_sample_memory(o->checkpoint, int64_t(o->prompt.size()) + o->tokens);
    auto model = load_model(o->checkpoint);
    ConfigKeysGiven given;
    const TrainConfig config = apply_config_overrides(model->config(), o->overrides, &given);
    check_honoured_keys(config, given, "--set", kSampleKeys);
    auto be = make_backend("cpu");
    const ModelConfig& c = model->config();
    std::unique_ptr<Tokenizer> tokenizer = checkpoint_tokenizer(o->checkpoint, c);
    if (!tokenizer) tokenizer = make_byte_tokenizer();
    // Only ids the tokenizer can decode are drawn: a model may have more rows than that.
    const int64_t vocab = c.vocab_size, drawable = std::min(vocab, tokenizer->vocab_size());
    const std::string prompt =
        tokenizer->kind() == "bytes" ? o->prompt : utf8_replace_invalid(o->prompt);
    std::vector<int32_t> tokens = tokenizer->encode(prompt);
    BOTTLE_CHECK(!tokens.empty(), "sample: --prompt is empty");
    for (int32_t t : tokens)
      BOTTLE_CHECK(t < vocab, "sample: prompt token {} is outside the model's vocabulary of {}", t,
                   vocab);
    const std::vector<int32_t> prompt_ids = tokens;
    // The tokens that end a document: EOS, and the delimiter prepare writes before each one.
    std::vector<int32_t> ends;
    if (!o->ignore_eos)
      for (const std::optional<int32_t> id : {tokenizer->eos_id(), tokenizer->document_delimiter()})
        if (id) ends.push_back(*id);
    // One fixed window; the causal mask makes the positions after the last token irrelevant.
    const int64_t window = std::min<int64_t>(c.max_seq_len, int64_t(tokens.size()) + o->tokens);
    // The model sees at most its context: the start of a longer prompt is dropped, said once.
    if (int64_t(tokens.size()) > window)
      fmt::print(stderr,
                 "sample: the prompt is {} tokens, more than the model's context of {} "
                 "(max_position_embeddings of {}/config.json): only its last {} are seen\n",
                 tokens.size(), window, o->checkpoint, window);
    model->allocate_activations(1, window);
    Arena arena(MemoryTag::workspace, *be);
    const Tensor input = arena.alloc({1, window}, DType::i32);  // [1, window]
    std::vector<int32_t> staged(static_cast<size_t>(window));   // the window, on the host
    std::vector<float> last(static_cast<size_t>(vocab));  // the last position's logits, on the host
    std::mt19937_64 rng(o->seed);
    const std::string decoded_prompt = tokenizer->decode(tokens);
    // The decoded continuation beyond the decoded prompt (a tokenizer need not give the
    // prompt's bytes back exactly); `generated` excludes an ending token.
    auto continuation = [&](const std::vector<int32_t>& generated) {
      std::vector<int32_t> all = prompt_ids;
      all.insert(all.end(), generated.begin(), generated.end());
      const std::string text = tokenizer->decode(all);
      return text.starts_with(decoded_prompt) ? text.substr(decoded_prompt.size()) : text;
    };
    for (int64_t sample = 0; sample < o->num_samples; ++sample) {
      // The prompt as given, then what the model adds.
      if (!o->json) {
        if (sample > 0) fmt::print("---\n");
        std::fwrite(o->prompt.data(), 1, o->prompt.size(), stdout);
      }
      tokens = prompt_ids;
      std::vector<int32_t> generated;
      bool ended = false;
      TextStream stream;
      for (int64_t i = 0; i < o->tokens && !ended; ++i) {
        const int64_t start = std::max<int64_t>(0, int64_t(tokens.size()) - window);
        const int64_t used = int64_t(tokens.size()) - start;
        std::fill(staged.begin(), staged.end(), 0);
        std::copy(tokens.begin() + start, tokens.end(), staged.begin());
        be->from_host(input, staged.data());
        const Tensor logits = model->forward_logits(*be, input);
        be->to_host(last.data(), logits.view((used - 1) * vocab, {vocab}));
        BOTTLE_CHECK(
            std::all_of(last.begin(), last.end(), [](float x) { return std::isfinite(x); }),
            "{}: the model gives non-finite logits after {} tokens; its weights are damaged",
            o->checkpoint, tokens.size());
        const int32_t id = draw(last.data(), drawable, o->temperature, o->top_k, o->top_p, rng);
        tokens.push_back(id);
        ended = std::find(ends.begin(), ends.end(), id) != ends.end();
        if (!ended) generated.push_back(id);
        if (!o->json && !ended) stream.update(continuation(generated), /*last=*/false);
      }
      if (o->json) {
        const nlohmann::json out = {
            {"prompt_ids", prompt_ids},
            {"ids", std::vector<int32_t>(tokens.begin() + long(prompt_ids.size()), tokens.end())},
            {"text", continuation(generated)},
            {"stop", ended ? "eos" : "tokens"}};
        fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        continue;
      }
      if (!generated.empty()) stream.update(continuation(generated), /*last=*/true);
      std::fputc('\n', stdout);
    }
    return 0;
  };
}

}  // namespace bottle
