// `bottle eval`: reads shards from their start in llm.c's order, no shuffling: in each shard
// (files sorted) batch k takes the B·S + 1 tokens from token k·B·S; row j's inputs are
// [k·B·S + j·S, … + S) and its targets the same window shifted by one (DESIGN §7).
#include <omp.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "model/checkpoint.h"
#include "train/data_loader.h"

namespace bottle {

Command add_eval_command(CLI::App& app) {
  struct Options {
    std::string checkpoint, data, backend = "cpu";
    int64_t batches = 0, seq = 0, batch = 4;
    int threads = 0;
    bool json = false;
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
  return [o] {
    if (o->threads > 0) omp_set_num_threads(o->threads);
    auto be = make_backend(o->backend);
    auto model = load_model(o->checkpoint);
    const ModelConfig& c = model->config();
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
      total += model->forward(*be, inputs, targets);
    }
    const int64_t per_batch = o->batch * seq;
    const double loss = total / double(batches);
    const int64_t count = batches * per_batch;
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
