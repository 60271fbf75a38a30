// `bottle eval`: reads shards from their start in llm.c's order, no shuffling: in each shard
// (files sorted) batch k takes the B·S + 1 tokens from token k·B·S; row j's inputs are
// [k·B·S + j·S, … + S) and its targets the same window shifted by one (docs/design.md §12). Under
// any layout (mpirun -np tp·pp·dp): DP replica r evaluates batches r, r + dp, ...; each
// batch runs through the pipeline stages forward only; the loss sums add up exactly.
#include <fmt/ranges.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "comm/process_groups.h"
#include "data/shard_meta.h"
#include "model/checkpoint.h"
#include "train/data_files.h"
#include "train/data_loader.h"
#include "train/memory_plan.h"
#include "train/run_tokenizer.h"
#include "train/train_config.h"
#include "train/train_step.h"

namespace bottle {
namespace {

// Of the configuration, eval reads the layout it runs on; the model is the checkpoint's.
const CommandKeys kEvalKeys{
    "eval",
    {"parallel.tp", "parallel.tp_mode", "parallel.grouping", "parallel.pp", "parallel.dp"},
    {},
    "it evaluates the checkpoint's model (--checkpoint) on --data with --batch, --seq and "
    "--batches, and reads of the configuration only the layout it runs on (parallel.tp, "
    "parallel.tp_mode, parallel.grouping, parallel.pp, parallel.dp)"};

// The sum of one value per rank of `world`, in double and in rank order: every rank gets
// the same, exact up to the rounding of a double sum (a collective sums in f32).
double exact_sum(Communicator& world, double mine) {
  const size_t bits = std::bit_cast<size_t>(mine);
  double total = 0.0;
  for (const auto& rank : gather_sizes(world, std::span<const size_t>(&bits, 1)))
    total += std::bit_cast<double>(rank[0]);
  return total;
}

// prepare writes a directory's splits as <prefix>_train_NNNNNN.bin and <prefix>_val_NNNNNN.bin:
// a directory holding both is evaluated on its validation split, never on the two mixed, and
// says so on stderr; any other --data is taken as it is.
std::string validation_split_of(const std::string& data) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(data, ec)) return data;
  std::set<std::string> train, val;
  for (const auto& e : fs::directory_iterator(data, ec))
    if (const auto name = parse_shard_name(e.path().filename().string()))
      if (name->split == "train" || name->split == "val")
        (name->split == "val" ? val : train).insert(name->prefix);
  if (train.empty() || val.empty()) return data;
  BOTTLE_CHECK(val.size() == 1,
               "{}: --data holds the validation shards of several data sets ({}); name one, as "
               "'{}/PREFIX_val_*.bin'",
               data, fmt::join(val, ", "), data);
  const std::string pattern = (fs::path(data) / (*val.begin() + "_val_*.bin")).string();
  if (world_communicator().rank() == 0)
    fmt::print(stderr,
               "eval: {} holds a train and a validation split: evaluating the validation split "
               "{}\n",
               data, pattern);
  return pattern;
}

// The shards record the tokenizer prepare made them with: a model of another tokenizer would
// give a loss of ids that mean other text.
void check_tokenizer_matches_data(const Tokenizer* tokenizer, const std::string& checkpoint,
                                  const std::string& data) {
  const std::vector<std::string> files = resolve_data_files(data);
  const auto meta = split_meta_of_shard(files.front());
  if (!meta || meta->second.tokenizer_kind.empty()) return;
  const SplitMeta& m = meta->second;
  const std::string kind = tokenizer ? std::string(tokenizer->kind()) : "bytes";
  const int64_t vocab = tokenizer ? tokenizer->vocab_size() : 256;
  BOTTLE_CHECK(kind == m.tokenizer_kind && vocab == m.vocab_size,
               "{}: the shards were made with {} ({} kind, vocabulary {}), but the model of {} "
               "reads {}; evaluate it on shards that `bottle prepare --tokenizer {}` made",
               meta->first.string(), m.tokenizer, m.tokenizer_kind, m.vocab_size, checkpoint,
               tokenizer ? tokenizer->describe() : std::string("byte-level ids (no tokenizer)"),
               checkpoint);
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  struct Options {
    std::string checkpoint, data, backend = "cpu";
    int64_t batches = 0, seq = 0, batch = 4;
    int threads = 0;
    bool json = false;
    std::vector<std::string> overrides;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--checkpoint", o->checkpoint,
                 "model directory (config.json + model.safetensors), or a run's folder for its "
                 "newest checkpoint")
      ->required();
  app.add_option("--data", o->data,
                 "token shards: a file, a glob, or a directory (its validation split where it "
                 "holds prepare's train and val shards)")
      ->required();
  app.add_option("--batches", o->batches, "number of batches (default: every full batch)")
      ->check(integer_in(1));
  app.add_option("--seq", o->seq, "sequence length (default: min(1024, max_position_embeddings))")
      ->check(integer_in(1));
  app.add_option("--batch", o->batch, "rows per batch")->check(integer_in(1));
  app.add_option("--threads", o->threads, "OpenMP threads (default: OMP_NUM_THREADS or all cores)")
      ->check(integer_in(1, kMaxThreads));
  app.add_option("--backend", o->backend, "kernel backend: cpu or reference");
  app.add_flag("--json", o->json, "print one JSON object: {\"loss\", \"tokens\", ...}");
  app.add_option("--set", o->overrides,
                 "the layout, as train's keys: parallel.tp, parallel.tp_mode, parallel.grouping, "
                 "parallel.pp, parallel.dp (under mpirun -np tp*pp*dp)");
  return [o] {
    if (o->threads > 0) omp_set_num_threads(o->threads);
    o->checkpoint = checkpoint_option(o->checkpoint, "eval");
    o->data = validation_split_of(o->data);
    auto be = make_backend(o->backend);
    const ModelConfig c = read_model_config(o->checkpoint);
    ConfigKeysGiven given;
    const TrainConfig config = apply_config_overrides(c, o->overrides, &given);
    check_honoured_keys(config, given, "--set", kEvalKeys);
    const ParallelConfig& p = config.parallel;
    Communicator& world = world_communicator();
    ProcessGroups groups = ProcessGroups::create(world, {p.tp, p.pp, p.dp});
    const PipelineStage stage{p.pp, groups.pp_rank};
    const int64_t seq = o->seq > 0 ? o->seq : std::min<int64_t>(1024, c.max_seq_len);
    BOTTLE_CHECK(seq <= c.max_seq_len,
                 "--seq: must be <= max_position_embeddings of {}/config.json ({}), got {}",
                 o->checkpoint, c.max_seq_len, seq);
    // Sizes first, then memory, before anything is allocated.
    check_batch_shape(c, o->batch, seq, "eval:", "--batch", "--seq");
    const TensorParallel tp{p.tp_mode, groups.tp.get(), p.grouping};
    const std::string what = "eval: the model of " + o->checkpoint,
                      advice =
                          "lower --batch or --seq, or spread the model over more ranks "
                          "(--set parallel.tp=N or parallel.pp=N under mpirun)";
    check_parameter_memory(c, false, p.tp * p.pp, 1, 1, world, what, advice);
    if (p.pp == 1) check_layers_memory(c, tp, o->batch, seq, world, what, advice);
    // Planning reserves address space for the activations: a batch too large for even that
    // is named by its options, not by the reservation.
    MemoryBreakdown planned;
    try {
      planned = plan_model_memory(c, tp, o->batch, seq, false, stage);
    } catch (const InternalError&) {
      throw;
    } catch (const Error& e) {
      fail("{}: --batch {} x --seq {} is too large to plan: {}; {}", what, o->batch, seq, e.what(),
           advice);
    }
    check_available_memory(planned, world, what, advice);
    // A checkpoint that disagrees with itself, or with the shards' own description.
    check_tokenizer_matches_data(checkpoint_tokenizer(o->checkpoint, c).get(), o->checkpoint,
                                 o->data);
    LlamaModel model(c, tp, 1, stage, /*reserve_only=*/false, *be);
    load_model_weights(model, o->checkpoint);
    TokenLoader loader(o->data, o->batch, seq, 0, groups.dp_rank, p.dp, /*shuffle=*/false);
    const int64_t available = int64_t(loader.windows_per_epoch());
    const int64_t batches = o->batches > 0 ? o->batches : available;
    BOTTLE_CHECK(batches <= available,
                 "{}: the shards hold {} full batch(es) of {} x {} (+1) tokens; {} requested",
                 o->data, available, o->batch, seq, batches);
    model.allocate_activations(o->batch, seq);
    Arena arena(MemoryTag::workspace, *be);
    std::vector<Tensor> inputs{arena.alloc({o->batch, seq}, DType::i32)},
        targets{arena.alloc({o->batch, seq}, DType::i32)};
    const Tensor loss_sum = arena.alloc({1}, DType::f64);  // eval_step's, on the device
    double mine = 0.0;
    for (int64_t k = groups.dp_rank; k < batches; k += p.dp) {
      loader.next(*be, inputs[0], targets[0]);
      // Token ids must fit the model; the error names the shard rather than a kernel.
      for (const auto ids : {loader.staged_inputs(), loader.staged_targets()})
        for (const int32_t id : ids)
          if (id < 0 || id >= c.vocab_size)
            fail("{}: token id {} is outside the vocabulary [0, {}) of the model in {}",
                 loader.last_file(), id, c.vocab_size, o->checkpoint);
      mine += eval_step(*be, model, groups.pp.get(), inputs, targets, loss_sum);
    }
    // The last stage holds the losses, alike on its TP ranks: one of them counts.
    const bool counts = stage.last() && groups.tp_rank == 0;
    const double total = exact_sum(world, counts ? mine : 0.0);
    // Checked after the sum, so that every rank stops alike.
    BOTTLE_CHECK(std::isfinite(total),
                 "{}: the loss is {}: the model's weights give non-finite values", o->checkpoint,
                 message_number(total));
    const int64_t per_batch = o->batch * seq;
    const double loss = total / double(batches);
    const int64_t count = batches * per_batch;
    if (world.rank() != 0) return 0;  // every rank holds the same loss
    // Bits per byte compares models across tokenizers: known when `bottle prepare` recorded
    // the bytes of the shards' split (the ratio of the whole split, which the batches sample).
    const std::optional<double> bytes_per_token_ = bytes_per_token(loader.files());
    std::optional<double> bits_per_byte;
    if (bytes_per_token_) bits_per_byte = loss / std::log(2.0) / *bytes_per_token_;
    if (o->json) {
      nlohmann::ordered_json j{{"loss", loss},       {"tokens", count},
                               {"batches", batches}, {"batch", o->batch},
                               {"seq", seq},         {"perplexity", std::exp(loss)}};
      j["bits_per_byte"] = bits_per_byte ? nlohmann::ordered_json(*bits_per_byte) : nullptr;
      fmt::print("{}\n", j.dump());
    } else {
      const std::string per_byte =
          bits_per_byte ? fmt::format("; {:.4f} bits per byte ({:.3f} bytes per token)",
                                      *bits_per_byte, *bytes_per_token_)
                        : std::string();
      fmt::print("loss {:.6f} nats (perplexity {:.3f}) over {} tokens ({} batches of {} x {}){}\n",
                 loss, std::exp(loss), count, batches, o->batch, seq, per_byte);
    }
    return 0;
  };
}

}  // namespace bottle
