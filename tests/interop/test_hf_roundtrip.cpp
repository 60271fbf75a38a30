// The HF round trip, against transformers itself (tests/interop/hf_oracle.py, run by the Python of
// .venv-hf that scripts/setup.sh makes: transformers 4.45.2 on Debian's PyTorch):
//  - bottle's models load in transformers with no missing, unexpected or mismatched keys and
//    no warnings: full-rank as LlamaForCausalLM, SVD / CoLA / LaX through the modeling file
//    bottle writes; their fp32 logits agree within 1e-4 and greedy generate() gives the ids of
//    `bottle sample --temperature 0`;
//  - training checkpoints and exports carry tokenizers that AutoTokenizer loads and that
//    encode as bottle does, and `model.generate(**tokenizer(text, return_tensors="pt"))` runs
//    on them without a complaint;
//  - LLaMA checkpoints saved by transformers (one file or sharded; f32, bf16, f16) evaluate in
//    bottle with transformers' loss and train on with --init-from on TP and PP layouts;
//  - bottle lowrank; and bad input, one clear error each.
// Fails, never skips, when .venv-hf is missing.
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace bottle::testing {
namespace {

using nlohmann::json;

const std::string kHfPython = BOTTLE_SOURCE_DIR "/.venv-hf/bin/python";

// The last line of `output` that is a JSON object (null, and a test failure, when none is).
json last_json(const CommandResult& r, const std::string& what) {
  EXPECT_EQ(r.status, 0) << what << " failed:\n" << r.output;
  size_t end = r.output.size();
  while (end > 0) {
    const size_t begin = r.output.rfind('\n', end - 1);
    const size_t from = begin == std::string::npos ? 0 : begin + 1;
    const std::string line = r.output.substr(from, end - from);
    if (!line.empty() && line[0] == '{') return json::parse(line, nullptr, false);
    if (begin == std::string::npos) break;
    end = begin;
  }
  ADD_FAILURE() << what << " printed no JSON object:\n" << r.output;
  return json();
}

json oracle(const std::string& args) {
  if (!fs::exists(kHfPython)) {
    ADD_FAILURE() << "no " << kHfPython << ": run scripts/setup.sh (it makes .venv-hf)";
    return json();
  }
  return last_json(run(kHfPython + " " BOTTLE_SOURCE_DIR "/tests/interop/hf_oracle.py " + args),
                   "hf_oracle.py " + args.substr(0, args.find(' ')));
}

json bottle_json(const std::string& args) {
  return last_json(run(bottle_binary() + " " + args), "bottle " + args.substr(0, args.find(' ')));
}

// What transformers reported about loading a model: nothing missing, unexpected, mismatched
// or warned about.
void expect_clean_load(const json& hf, const std::string& expected_class) {
  ASSERT_TRUE(hf.is_object());
  EXPECT_EQ(hf["class"], expected_class);
  EXPECT_EQ(hf["missing"], json::array());
  EXPECT_EQ(hf["unexpected"], json::array());
  EXPECT_EQ(hf["mismatched"], json::array());
  EXPECT_EQ(hf["load_warnings"], json::array());
}

struct ModelCase {
  const char* name;
  BottleneckKind kind;
  int64_t kv_heads;
  bool tied;
};

class TransformersLoads : public ::testing::TestWithParam<ModelCase> {};

TEST_P(TransformersLoads, LogitsAndGreedyGenerationMatch) {
  const ModelCase mc = GetParam();
  TempDir dir;
  ModelConfig config = tiny_config(mc.kind, mc.kv_heads, mc.tied);
  config.vocab_size = 256;  // bytes: `sample` encodes its prompt with the byte tokenizer
  const int64_t batch = 2, seq = 16;
  {
    LlamaModel model(config);
    init_for_test(model, 7);
    // Logits of a few units, not the tenths that initial weights give: a sharper comparison.
    for (const char* name : {"model.embed_tokens.weight", "lm_head.weight"})
      if (model.parameters().contains(name)) {
        const Tensor w = model.parameters().get(name).value;
        for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] *= 6.0f;
      }
    save_model(model, dir / "model");
    auto be = make_backend("cpu");
    Arena arena{MemoryTag::workspace};
    const Tensor tokens = arena.alloc({batch, seq}, DType::i32);  // [B, S]
    const Tensor tokens_f32 = arena.alloc({batch, seq});          // [B, S], for the file
    std::mt19937 rng(3);
    for (int64_t i = 0; i < batch * seq; ++i)
      tokens.i32()[i] = int32_t(rng() % 256), tokens_f32.f32()[i] = float(tokens.i32()[i]);
    model.allocate_activations(batch, seq);
    const Tensor logits = model.forward_logits(*be, tokens);  // [B·S, V]
    write_safetensors(dir / "batch.safetensors",
                      {{"tokens", tokens_f32}, {"logits", logits.view(0, {batch, seq, 256})}});
  }
  const json sampled = bottle_json(fmt::format(
      "sample --checkpoint {} --prompt 'The cat sat' --tokens 32 --temperature 0 --json",
      dir / "model"));
  ASSERT_TRUE(sampled.is_object());
  const json hf =
      oracle(fmt::format("model --model {} --tokens {} --generate '{}' --new-tokens 32",
                         dir / "model", dir / "batch.safetensors", sampled["prompt_ids"].dump()));
  expect_clean_load(hf, mc.kind == BottleneckKind::none ? "LlamaForCausalLM" : "BottleForCausalLM");
  ASSERT_TRUE(hf.contains("max_abs_diff"));
  EXPECT_LE(hf["max_abs_diff"].get<double>(), 1e-4);
  EXPECT_EQ(hf["generated"], sampled["ids"]);
  std::printf(
      "%s: logits max |bottle - transformers| %.2e (max |logit| %.3f); greedy 32 tokens %s\n",
      mc.name, hf["max_abs_diff"].get<double>(), hf["max_abs_logit"].get<double>(),
      hf["generated"] == sampled["ids"] ? "identical" : "DIFFERENT");
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, TransformersLoads,
    ::testing::Values(ModelCase{"none_MHA", BottleneckKind::none, 4, false},
                      ModelCase{"none_GQA", BottleneckKind::none, 2, false},
                      ModelCase{"none_GQA_tied", BottleneckKind::none, 2, true},
                      ModelCase{"svd_GQA", BottleneckKind::svd, 2, false},
                      ModelCase{"cola_MHA_tied", BottleneckKind::cola, 4, true},
                      ModelCase{"lax_GQA", BottleneckKind::lax, 2, false}),
    [](const auto& info) { return std::string(info.param.name); });

// Random byte tokens as DIR/data/data_train_000000.bin (what the import tests read).
std::string random_shard(const TempDir& dir) {
  fs::create_directories(dir / "data");
  const std::string shard = dir / "data/data_train_000000.bin";
  write_random_shard(shard, 4096, 256, 9);
  return shard;
}

// A random LlamaForCausalLM (d 64, d_ff 160, 2 blocks, 4 heads, 256 ids) that transformers
// saves into `out`; `options`: hf_oracle.py save-llama's others.
void save_llama(const std::string& out, const std::string& options) {
  ASSERT_TRUE(oracle(fmt::format("save-llama --out {} --hidden 64 --intermediate 160 --layers 2 "
                                 "--heads 4 --vocab 256 {}",
                                 out, options))
                  .is_object());
}

// Two training steps of save_llama's shape from `init` on `shard`, under `launcher` (mpirun or
// nothing); `model`: the other [model] keys (kind, KV heads), `layout`: parallel.* keys.
CommandResult train_from(const std::string& launcher, const std::string& init,
                         const std::string& shard, const std::string& folder,
                         const std::string& model, const std::string& layout = "") {
  return run(fmt::format(
      "{} {} train {}/configs/tiny.toml --init-from {} {} --set model.hidden_size=64 "
      "--set model.intermediate_size=160 --set model.num_layers=2 --set model.num_heads=4 "
      "--set model.max_seq_len=128 --set model.rms_norm_eps=1e-6 --set 'data.train={}' "
      "--set data.val= --set training.steps=2 --set training.micro_batch_size=2 "
      "--set training.seq_len=32 --set training.eval_interval=0 --set checkpoint.interval=0 "
      "--set checkpoint.folder={} --set metrics.plot= {}",
      launcher, bottle_binary(), BOTTLE_SOURCE_DIR, init, model, shard, folder, layout));
}

// A tiny model trained for two steps on `data` (prepared shards) into `folder`.
void train_tiny(const std::string& data, const std::string& folder, const std::string& kind,
                const std::string& extra = "") {
  TempDir config_dir;
  const std::string config = config_dir / "tiny.toml";
  std::ofstream(config) << kTinyColaModelToml;
  const CommandResult r = run(fmt::format(
      "{} train {} --set model.vocab_size=512 --set model.bottleneck={} --set "
      "'data.train={}/*train*.bin' "
      "--set training.steps=2 --set training.micro_batch_size=2 --set training.seq_len=32 "
      "--set training.eval_interval=0 --set checkpoint.interval=2 --set checkpoint.folder={} "
      "--set metrics.plot= {}",
      bottle_binary(), config, kind, data, folder, extra));
  ASSERT_EQ(r.status, 0) << r.output;
}

// Every tokenizer kind, through prepare → train → checkpoint → export: AutoTokenizer loads the
// files of the checkpoint and of the export and encodes the test text id for id as bottle does.
TEST(HfTokenizers, CheckpointAndExportTokenizersLoadWithAutoTokenizer) {
  TempDir dir;
  const json trained = oracle("tokenizers --out " + dir / "tok");
  ASSERT_TRUE(trained.is_object());
  const std::string corpus = trained["corpus"], text = dir / "text.txt";
  {
    // The tokenizer test text without its special-token strings (LlamaTokenizer's slow class
    // matches those even with split_special_tokens) plus a line of runs of spaces and newlines.
    std::ifstream in(BOTTLE_SOURCE_DIR "/tests/fixtures/tokenizer_test_text.txt", std::ios::binary);
    std::string t((std::istreambuf_iterator<char>(in)), {});
    for (const char* special : {"<|endoftext|>", "<s>", "</s>", "<unk>"})
      for (size_t at; (at = t.find(special)) != std::string::npos;) t.erase(at, strlen(special));
    std::ofstream(text, std::ios::binary) << t << "a  b   c\n\n\nd\r\n";
  }
  struct Kind {
    std::string name, tokenizer, options;
    bool fast_exact;  // transformers' fast class reproduces the ids too
  };
  const std::vector<Kind> kinds = {
      {"bytes", "", "", true},  // prepare's default: bottle's byte tokenizer
      {"bpe", dir / "tok/bpe/tokenizer.json", "", true},
      {"sp_llama", dir / "tok/sp_llama/tokenizer.model", "", true},
      // The fast class is converted from the model without its normalizer (nmt_nfkc, extra
      // whitespace removed): only the slow LlamaTokenizer gives SentencePiece's ids there.
      {"sp_unigram", dir / "tok/sp_unigram/tokenizer.model", "", false},
      {"tiktoken", dir / "tok/tiktoken/tokenizer.tiktoken",
       fmt::format("--tiktoken-pattern gpt2 --tiktoken-special '<|endoftext|>={}'",
                   trained["tiktoken_special"].get<int>()),
       true}};
  for (const Kind& k : kinds) {
    SCOPED_TRACE(k.name);
    const std::string data = dir / ("data_" + k.name), run_dir = dir / ("run_" + k.name),
                      exported = dir / ("export_" + k.name);
    const CommandResult prepared = run(fmt::format(
        "{} prepare --input {} --output {} {} {} --val-fraction 0 --no-progress", bottle_binary(),
        corpus, data, k.tokenizer.empty() ? "" : "--tokenizer " + k.tokenizer, k.options));
    ASSERT_EQ(prepared.status, 0) << prepared.output;
    train_tiny(data, run_dir, "none");
    const std::string checkpoint = run_dir + "/step_00000002";
    const CommandResult exported_run = run(
        fmt::format("{} export --checkpoint {} --out {}", bottle_binary(), checkpoint, exported));
    ASSERT_EQ(exported_run.status, 0) << exported_run.output;
    const CommandResult tokenized =
        run(fmt::format("{} tokenize --tokenizer {} --input {}", bottle_binary(), exported, text));
    ASSERT_EQ(tokenized.status, 0) << tokenized.output;
    const json ours = json::parse(tokenized.output, nullptr, false);
    ASSERT_TRUE(ours.is_array()) << tokenized.output;
    // A training checkpoint is sharded as the run held it (docs/design.md §12): transformers
    // reads its export.
    for (const std::string& model_dir : {exported}) {
      const json slow = oracle(fmt::format("model --model {} --text {} --slow", model_dir, text));
      expect_clean_load(slow, "LlamaForCausalLM");
      if (k.name.starts_with("sp")) {
        EXPECT_EQ(slow["tokenizer_class"], "LlamaTokenizer");
        EXPECT_EQ(slow["tokenizer_ids"], ours) << model_dir;
      }
      const json fast = oracle(fmt::format(
          "model --model {} --text {} --prompt 'Q: why?' --new-tokens 8", model_dir, text));
      // transformers' usual call: no token_type_ids, nothing printed, logged or warned.
      EXPECT_EQ(fast["prompt_inputs"], json({"attention_mask", "input_ids"}));
      EXPECT_EQ(fast["prompt_complaints"], json::array()) << model_dir;
      const size_t generated = fast["prompt_generated"].size();
      EXPECT_TRUE(generated == 8 || (generated >= 1 && fast["prompt_ended_at_eos"])) << fast;
      EXPECT_TRUE(fast["tokenizer_class"].get<std::string>().ends_with("Fast"));
      if (k.fast_exact) {
        EXPECT_EQ(fast["tokenizer_ids"], ours) << model_dir;
      }
      std::printf("%s (%s): %zu ids; %s %s, %s %s\n", k.name.c_str(), model_dir.c_str(),
                  ours.size(), slow["tokenizer_class"].get<std::string>().c_str(),
                  slow["tokenizer_ids"] == ours ? "identical" : "different",
                  fast["tokenizer_class"].get<std::string>().c_str(),
                  fast["tokenizer_ids"] == ours ? "identical" : "different");
    }
  }
}

// A low-rank training checkpoint carries the modeling file, and its export loads through it.
TEST(HfTokenizers, LowRankCheckpointLoadsThroughTheModelingFile) {
  TempDir dir;
  random_shard(dir);
  train_tiny(dir / "data", dir / "run", "lax");
  for (const char* file : {"configuration_bottle.py", "modeling_bottle.py"})
    EXPECT_TRUE(fs::exists(dir / ("run/step_00000002/" + std::string(file)))) << file;
  const CommandResult exported = run(fmt::format("{} export --checkpoint {} --out {}",
                                                 bottle_binary(), dir / "run/step_00000002",
                                                 dir / "exported"));
  ASSERT_EQ(exported.status, 0) << exported.output;
  expect_clean_load(oracle("model --model " + dir / "exported"), "BottleForCausalLM");
}

// The loss bottle evaluates and transformers' on the same batches.
void expect_same_loss(const std::string& model, const std::string& shard, double tolerance,
                      const std::string& what) {
  const json ours = bottle_json(fmt::format(
      "eval --checkpoint {} --data {} --batch 2 --seq 32 --batches 3 --json", model, shard));
  const json theirs =
      oracle(fmt::format("loss --model {} --data {} --batch 2 --seq 32 --batches 3", model, shard));
  ASSERT_TRUE(ours.is_object() && theirs.is_object());
  const double a = ours["loss"], b = theirs["loss"];
  EXPECT_LE(std::fabs(a - b) / b, tolerance)
      << what << ": bottle " << a << " vs transformers " << b;
  std::printf("%s: loss bottle %.7f, transformers %.7f (relative %.1e)\n", what.c_str(), a, b,
              std::fabs(a - b) / b);
}

// LLaMA checkpoints saved by transformers, one file and sharded, f32 / bf16 / f16: bottle's
// eval gives transformers' loss, and --init-from trains on under TP = 2 and PP = 2 with the
// first step's loss of a one-rank run.
TEST(HfImport, TransformersCheckpointsEvaluateAndTrainOn) {
  TempDir dir;
  const std::string shard = random_shard(dir);
  struct Saved {
    std::string name, options;
  };
  const std::vector<Saved> saved = {
      {"f32", "--dtype f32"},
      {"f32_sharded_tied", "--dtype f32 --tied --max-shard-size 60KB"},
      {"bf16_sharded", "--dtype bf16 --max-shard-size 60KB"},
      {"f16", "--dtype f16"}};
  for (const Saved& s : saved) {
    SCOPED_TRACE(s.name);
    save_llama(dir / s.name, "--kv-heads 2 --seed 3 " + s.options);
    if (s.name.find("sharded") != std::string::npos) {
      EXPECT_TRUE(fs::exists(dir / (s.name + "/model.safetensors.index.json")));
    }
    expect_same_loss(dir / s.name, shard, 1e-5, "transformers-saved " + s.name);
  }
  // --init-from on three layouts: the first step sees the same batch and the same weights.
  std::vector<double> first_losses;
  for (const auto& [ranks, layout] : std::vector<std::pair<int, std::string>>{
           {1, ""}, {2, "--set parallel.tp=2"}, {2, "--set parallel.pp=2"}}) {
    const std::string folder = dir / fmt::format("run{}", first_losses.size());
    const CommandResult r =
        train_from(mpirun(ranks), dir / "bf16_sharded", shard, folder,
                   "--set model.bottleneck=none --set model.num_kv_heads=2", layout);
    ASSERT_EQ(r.status, 0) << layout << ":\n" << r.output;
    std::ifstream metrics(folder + "/metrics.jsonl");
    std::string line;
    ASSERT_TRUE(std::getline(metrics, line)) << layout;
    first_losses.push_back(json::parse(line)["loss"].get<double>());
  }
  EXPECT_NEAR(first_losses[1], first_losses[0], 1e-4 * first_losses[0]) << "TP = 2";
  EXPECT_NEAR(first_losses[2], first_losses[0], 1e-4 * first_losses[0]) << "PP = 2";
  std::printf(
      "--init-from a bf16 sharded transformers checkpoint, first step's loss: %.6f (1 rank), "
      "%.6f (TP 2), %.6f (PP 2)\n",
      first_losses[0], first_losses[1], first_losses[2]);
}

// bottle lowrank: exact at full rank, a reported gap at d/4, a model that transformers loads
// and bottle trains on; a rank above min(d_in, d_out) refused.
TEST(HfLowRank, FactorisesTransformersCheckpoints) {
  TempDir dir;
  const std::string shard = random_shard(dir);
  save_llama(dir / "dense", "--kv-heads 4 --seed 4");
  for (const auto& [kind, rank] :
       std::vector<std::pair<std::string, int>>{{"svd", 64}, {"svd", 16}, {"cola", 16}}) {
    const std::string out = dir / fmt::format("{}{}", kind, rank);
    const CommandResult r =
        run(fmt::format("{} lowrank --from {} --kind {} --rank {} --out {} --data {} --batch 2 "
                        "--seq 32 --batches 3",
                        bottle_binary(), dir / "dense", kind, rank, out, shard));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("relative Frobenius error"), std::string::npos) << r.output;
    std::printf("lowrank %s r=%d: %s", kind.c_str(), rank,
                r.output.substr(r.output.find("loss over")).c_str());
    if (kind == "svd" && rank == 64) {
      EXPECT_NE(r.output.find("worst 0.000000"), std::string::npos) << r.output;
      const json dense = bottle_json(
          fmt::format("eval --checkpoint {} --data {} --batch 2 --seq 32 --batches 3 --json",
                      dir / "dense", shard));
      const json low = bottle_json(fmt::format(
          "eval --checkpoint {} --data {} --batch 2 --seq 32 --batches 3 --json", out, shard));
      EXPECT_NEAR(low["loss"].get<double>(), dense["loss"].get<double>(),
                  1e-4 * dense["loss"].get<double>());
    }
    // Low-rank results load in transformers with their modeling file, with bottle's loss.
    expect_clean_load(oracle("model --model " + out), "BottleForCausalLM");
    expect_same_loss(out, shard, 1e-5, "lowrank " + kind + " " + std::to_string(rank));
  }
  const CommandResult train =
      train_from("", dir / "cola16", shard, dir / "run",
                 "--set model.bottleneck=cola --set model.rank=16 --set model.mlp_gate_act=true");
  EXPECT_EQ(train.status, 0) << train.output;
  const CommandResult too_big =
      run(fmt::format("{} lowrank --from {} --kind svd --rank 65 --out {}", bottle_binary(),
                      dir / "dense", dir / "bad"));
  EXPECT_EQ(too_big.status, 1);
  EXPECT_NE(too_big.output.find("--rank 65 exceeds the q projection's min(d_in, d_out)"),
            std::string::npos)
      << too_big.output;
  EXPECT_FALSE(fs::exists(dir / "bad"));
}

// Bad transformers checkpoints: one error line naming what is wrong, exit status 1.
TEST(HfImport, BadCheckpointsGetOneClearError) {
  TempDir dir;
  const std::string shard = random_shard(dir);
  save_llama(dir / "good", "--kv-heads 2 --max-shard-size 60KB");
  auto copy_of_good = [&](const std::string& name) {
    fs::copy(dir / "good", dir / name, fs::copy_options::recursive);
    return dir / name;
  };
  auto edit = [](const std::string& path, const std::string& from, const std::string& to) {
    std::ifstream in(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from << " in " << path;
    text.replace(at, from.size(), to);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  };
  // The shard that holds `tensor`, from the index.
  auto shard_of = [&](const std::string& model, const std::string& tensor) {
    std::ifstream in(model + "/model.safetensors.index.json");
    return json::parse(in)["weight_map"][tensor].get<std::string>();
  };
  auto expect_error = [&](const std::string& model, const std::string& needle) {
    const CommandResult r = run(
        fmt::format("{} eval --checkpoint {} --data {} --seq 32", bottle_binary(), model, shard));
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_EQ(count_occurrences(r.output, "bottle: error:"), 1) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in:\n"
                                                        << r.output;
  };
  // Another architecture.
  const std::string mistral = copy_of_good("mistral");
  edit(mistral + "/config.json", "\"LlamaForCausalLM\"", "\"MistralForCausalLM\"");
  expect_error(mistral, "mistral/config.json: key 'architectures' is [\"MistralForCausalLM\"]");
  // A renamed tensor: the first shard's copy of the embedding under another name. The header's
  // name is rewritten in place, with the same length so the offsets hold.
  const std::string renamed = copy_of_good("renamed");
  edit(renamed + "/" + shard_of(renamed, "model.embed_tokens.weight"), "model.embed_tokens.weight",
       "model.embed_tokens.weigh_");
  edit(renamed + "/model.safetensors.index.json", "model.embed_tokens.weight",
       "model.embed_tokens.weigh_");
  expect_error(renamed, "model.embed_tokens.weigh_");
  // An index naming a shard that is not there.
  const std::string missing = copy_of_good("missing"),
                    gone = shard_of(missing, "model.norm.weight");
  fs::remove(missing + "/" + gone);
  expect_error(missing, gone);
}

// A newcomer's first hour, with nothing a new user would not know: one plain input.txt
// prepared with defaults, a copy of configs/tiny.toml edited to point at it, then eval,
// sample and export given the run's folder, and transformers' usual call on the export.
TEST(Newcomer, InputTxtToTransformersGenerate) {
  TempDir dir;
  const std::vector<std::string> words = {"the",   "king", "lord", "good", "sir",  "come",
                                          "speak", "now",  "what", "love", "thou", "art"};
  std::string text;
  for (int p = 0; text.size() < 200'000; ++p)
    text += fmt::format("CITIZEN {}:\n{}\n", p, sentences_of(words, p, 90));
  { std::ofstream(dir / "input.txt", std::ios::binary) << text; }
  const CommandResult prepared =
      run(fmt::format("cd {} && {} prepare --input input.txt --output "
                      "data/shakespeare",
                      dir.str(), bottle_binary()));
  ASSERT_EQ(prepared.status, 0) << prepared.output;
  EXPECT_NE(prepared.output.find("a document is a paragraph"), std::string::npos)
      << prepared.output;
  // The user's copy of tiny.toml, its data and folder edited as its comments say.
  std::ifstream in(BOTTLE_SOURCE_DIR "/configs/tiny.toml");
  std::string config((std::istreambuf_iterator<char>(in)), {});
  for (const auto& [from, to] :
       {std::pair{"data/fortunes", "data/shakespeare"}, std::pair{"runs/tiny", "runs/shakespeare"}})
    for (size_t at; (at = config.find(from)) != std::string::npos;)
      config.replace(at, strlen(from), to);
  std::ofstream(dir / "mine.toml") << config;
  const std::string cd = "cd " + dir.str() + " && " + bottle_binary();
  const CommandResult trained = run(cd + " train mine.toml --set training.steps=30");
  ASSERT_EQ(trained.status, 0) << trained.output;
  const CommandResult evaluated =
      run(cd + " eval --checkpoint runs/shakespeare --data data/shakespeare");
  ASSERT_EQ(evaluated.status, 0) << evaluated.output;
  EXPECT_NE(evaluated.output.find("bits per byte"), std::string::npos) << evaluated.output;
  const CommandResult sampled =
      run(cd + " sample --checkpoint runs/shakespeare --prompt 'CITIZEN 7:' --tokens 40");
  ASSERT_EQ(sampled.status, 0) << sampled.output;
  EXPECT_NE(sampled.output.find("CITIZEN 7:"), std::string::npos) << sampled.output;
  const CommandResult exported =
      run(cd + " export --checkpoint runs/shakespeare --out shakespeare-hf");
  ASSERT_EQ(exported.status, 0) << exported.output;
  const json hf = oracle(fmt::format("model --model {} --prompt 'CITIZEN 7:' --new-tokens 16",
                                     dir / "shakespeare-hf"));
  expect_clean_load(hf, "BottleForCausalLM");
  EXPECT_EQ(hf["prompt_complaints"], json::array());
  EXPECT_EQ(hf["prompt_generated"].size(), 16u);  // byte-level: no EOS to stop at
}

}  // namespace
}  // namespace bottle::testing
