// `bottle eval`: reads shards from their start in llm.c's order, no shuffling: in each shard
// (files sorted) batch k takes the B·S + 1 tokens from token k·B·S; row j's inputs are
// [k·B·S + j·S, … + S) and its targets the same window shifted by one (DESIGN §7).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "comm/process_groups.h"
#include "model/checkpoint.h"
#include "train/data_loader.h"

namespace bottle {
namespace {

struct EvalParallel {
  int tp = 1;
  TpMode mode = TpMode::full;
  bool grouping = true;
};

EvalParallel parse_eval_parallel(const std::vector<std::string>& overrides,
                                 const ModelConfig& config) {
  EvalParallel p;
  p.mode = default_tp_mode(config);
  for (const std::string& item : overrides) {
    const auto eq = item.find('=');
    BOTTLE_CHECK(eq != std::string::npos, "--set: expected KEY=VALUE, got '{}'", item);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "parallel.tp") {
      char* end = nullptr;
      const long tp = std::strtol(value.c_str(), &end, 10);
      BOTTLE_CHECK(!value.empty() && *end == '\0' && tp > 0,
                   "--set: key 'parallel.tp' must be a positive integer, got '{}'", value);
      p.tp = int(tp);
    } else if (key == "parallel.tp_mode") {
      const auto it = std::find(kTpModeNames.begin(), kTpModeNames.end(), value);
      BOTTLE_CHECK(it != kTpModeNames.end(),
                   "--set: key 'parallel.tp_mode' must be full, vanilla or btp, got '{}'", value);
      p.mode = TpMode(it - kTpModeNames.begin());
    } else if (key == "parallel.grouping") {
      BOTTLE_CHECK(value == "true" || value == "false",
                   "--set: key 'parallel.grouping' must be true or false, got '{}'", value);
      p.grouping = value == "true";
    } else {
      fail("--set: eval takes parallel.tp, parallel.tp_mode and parallel.grouping, not '{}'", key);
    }
  }
  return p;
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
  app.add_option("--checkpoint", o->checkpoint, "model directory (config.json + model.safetensors)")
      ->required();
  app.add_option("--data", o->data, "token shard: a file, a directory or a glob")->required();
  app.add_option("--batches", o->batches, "number of batches (default: every full batch)");
  app.add_option("--seq", o->seq, "sequence length (default: min(1024, max_position_embeddings))");
  app.add_option("--batch", o->batch, "rows per batch")->check(CLI::PositiveNumber);
  app.add_option("--threads", o->threads, "OpenMP threads (default: OMP_NUM_THREADS or all cores)");
  app.add_option("--backend", o->backend, "kernel backend: cpu or reference");
  app.add_flag("--json", o->json, "print one JSON object: {\"loss\", \"tokens\", ...}");
  app.add_option("--set", o->overrides,
                 "parallel.tp=N, parallel.tp_mode=full|vanilla|btp or parallel.grouping=BOOL "
                 "(under mpirun -np N)");
  return [o] {
    if (o->threads > 0) omp_set_num_threads(o->threads);
    auto be = make_backend(o->backend);
    const ModelConfig c = read_model_config(o->checkpoint);
    const EvalParallel parallel = parse_eval_parallel(o->overrides, c);
    Communicator& world = world_communicator();
    ProcessGroups groups = ProcessGroups::create(world, {parallel.tp, 1, 1});
    auto model = std::make_unique<LlamaModel>(
        c, TensorParallel{parallel.mode, groups.tp.get(), parallel.grouping});
    load_model_weights(*model, o->checkpoint);
    const int64_t seq = o->seq > 0 ? o->seq : std::min<int64_t>(1024, c.max_seq_len);
    TokenLoader loader(o->data, o->batch, seq, 0, 0, 1, /*shuffle=*/false);
    const int64_t available = int64_t(loader.windows_per_epoch());
    const int64_t batches = o->batches > 0 ? o->batches : available;
    BOTTLE_CHECK(batches <= available,
                 "{}: the shards hold {} full batch(es) of {} x {} (+1) tokens; {} requested",
                 o->data, available, o->batch, seq, batches);
    model->allocate_activations(o->batch, seq);
    Arena arena(MemoryTag::workspace);
    Tensor inputs = arena.alloc({o->batch, seq}, DType::i32),
           targets = arena.alloc({o->batch, seq}, DType::i32);
    double total = 0.0;
    for (int64_t k = 0; k < batches; ++k) {
      loader.next(inputs.i32(), targets.i32());
      // Token ids must fit the model; the error names the shard rather than a kernel.
      for (const Tensor& t : {inputs, targets})
        for (int64_t i = 0; i < t.numel(); ++i)
          BOTTLE_CHECK(t.i32()[i] >= 0 && t.i32()[i] < c.vocab_size,
                       "{}: token id {} is outside the vocabulary [0, {}) of the model in {}",
                       loader.last_file(), t.i32()[i], c.vocab_size, o->checkpoint);
      const double batch_loss = model->forward(*be, inputs, targets);
      BOTTLE_CHECK(std::isfinite(batch_loss),
                   "{}: the loss of batch {} is {}: the model's weights give non-finite values",
                   o->checkpoint, k + 1, batch_loss);
      total += batch_loss;
    }
    const int64_t per_batch = o->batch * seq;
    const double loss = total / double(batches);
    const int64_t count = batches * per_batch;
    if (world.rank() != 0) return 0;  // every rank holds the same loss
    if (o->json) {
      nlohmann::ordered_json j{{"loss", loss},       {"tokens", count},
                               {"batches", batches}, {"batch", o->batch},
                               {"seq", seq},         {"perplexity", std::exp(loss)}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf(
          "loss %.6f nats (perplexity %.3f) over %lld tokens (%lld batches of %lld x %lld)\n", loss,
          std::exp(loss), (long long)count, (long long)batches, (long long)o->batch,
          (long long)seq);
    }
    return 0;
  };
}

}  // namespace bottle
