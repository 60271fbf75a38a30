// `bottle lowrank --from DIR --kind svd|cola --rank R --out DIR [--data SHARDS]`: a full-rank
// model directory (bottle's, or a LLaMA that transformers saved) factorised into a low-rank
// bottle model by truncated SVD of every projection (model/lowrank.h), with each projection's
// relative reconstruction error and, given --data, the loss before and after.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "comm/communicator.h"
#include "io/atomic_output.h"
#include "model/checkpoint.h"
#include "model/lowrank.h"
#include "train/data_loader.h"
#include "train/memory_plan.h"
#include "train/run_tokenizer.h"

namespace bottle {

namespace {

// Mean cross-entropy of `model` over the first `batches` batches of `data`, read in order (as
// `bottle eval` reads them).
double mean_loss(Backend& be, LlamaModel& model, const std::string& data, int64_t batch,
                 int64_t seq, int64_t batches) {
  TokenLoader loader(data, batch, seq, 0, 0, 1, /*shuffle=*/false);
  model.allocate_activations(batch, seq);
  Arena arena(MemoryTag::workspace, be);
  const Tensor inputs = arena.alloc({batch, seq}, DType::i32),  // [batch, seq]
      targets = arena.alloc({batch, seq}, DType::i32);          // [batch, seq]
  double total = 0.0;
  for (int64_t k = 0; k < batches; ++k) {
    loader.next(be, inputs, targets);
    for (const auto ids : {loader.staged_inputs(), loader.staged_targets()})
      for (const int32_t id : ids)
        BOTTLE_CHECK(id >= 0 && id < model.config().vocab_size,
                     "{}: token id {} is outside the model's vocabulary [0, {})",
                     loader.last_file(), id, model.config().vocab_size);
    total += model.forward(be, inputs, targets);
  }
  return total / double(batches);
}

}  // namespace

Command add_lowrank_command(CLI::App& app) {
  struct Options {
    std::string from, kind, out, data;
    int64_t rank = 0, batch = 4, seq = 0, batches = 8;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--from", o->from,
                 "full-rank model directory (config.json + safetensors), or a run's folder (its "
                 "newest checkpoint)")
      ->required();
  app.add_option("--kind", o->kind, "bottleneck of the result: svd (B·A·x) or cola (B·σ(A·x))")
      ->required()
      ->check(CLI::IsMember({"svd", "cola"}));
  app.add_option("--rank", o->rank, "rank r of every projection, at most min(d_in, d_out)")
      ->required()
      ->check(integer_in(1));
  app.add_option("--out", o->out, "new directory for the low-rank model")
      ->required()
      ->check(output_directory());
  app.add_option("--data", o->data,
                 "token shards (file, directory or glob): report the loss before and after");
  app.add_option("--batch", o->batch, "rows per batch of the loss")->check(integer_in(1));
  app.add_option("--seq", o->seq,
                 "sequence length of the loss (default: min(1024, max_position_embeddings))")
      ->check(integer_in(1));
  app.add_option("--batches", o->batches, "batches of the loss, read in order from the start")
      ->check(integer_in(1));
  return [o] {
    namespace fs = std::filesystem;
    BOTTLE_CHECK(world_communicator().size() == 1,
                 "lowrank: run it as one process, not under mpirun -np {}",
                 world_communicator().size());
    check_new_model_directory(o->out);  // before the work
    // A run's folder stands for its newest complete checkpoint, as for eval, sample, export.
    o->from = checkpoint_option(o->from, "lowrank");
    const ModelConfig dense_config = read_model_config(o->from);
    const BottleneckKind kind = parse_bottleneck_kind(o->kind);
    const ModelConfig low_config = lowrank_config(dense_config, kind, o->rank);
    const std::string advice = "use a machine with more memory";
    check_parameter_memory(dense_config, false, 1, 1, 1, world_communicator(),
                           "lowrank: the model of " + o->from, advice);
    const auto tokenizer = checkpoint_tokenizer(o->from, dense_config);
    auto dense = load_model(o->from);
    auto be = make_backend("cpu");
    const int64_t seq = o->seq > 0 ? o->seq : std::min<int64_t>(1024, dense_config.max_seq_len);
    if (!o->data.empty()) {
      BOTTLE_CHECK(seq <= dense_config.max_seq_len,
                   "--seq: must be <= max_position_embeddings of {}/config.json ({}), got {}",
                   o->from, dense_config.max_seq_len, seq);
      check_batch_shape(dense_config, o->batch, seq, "lowrank:", "--batch", "--seq");
      const TokenLoader probe(o->data, o->batch, seq, 0, 0, 1, false);
      BOTTLE_CHECK(int64_t(probe.windows_per_epoch()) >= o->batches,
                   "{}: the shards hold {} full batch(es) of {} x {} (+1) tokens; --batches {}",
                   o->data, probe.windows_per_epoch(), o->batch, seq, o->batches);
    }
    std::vector<FactorReport> reports;
    auto low = factorize_model(*dense, kind, o->rank, reports);
    fmt::print("{:<48} {:>13} {:>6} {:>10}\n", "projection", "d_out x d_in", "rank", "rel. error");
    double worst = 0.0, sum = 0.0;
    for (const FactorReport& r : reports) {
      fmt::print("{:<48} {:>13} {:6} {:>10.6f}\n", r.name, fmt::format("{}x{}", r.d_out, r.d_in),
                 r.rank, r.relative_error);
      worst = std::max(worst, r.relative_error);
      sum += r.relative_error;
    }
    fmt::print("relative Frobenius error ||W - B·A|| / ||W||: mean {:.6f}, worst {:.6f}\n",
               sum / double(reports.size()), worst);
    fmt::print(
        "parameters: {} dense -> {} {} rank {} ({:.1f}%)\n", dense_config.parameter_count(),
        low_config.parameter_count(), o->kind, o->rank,
        100.0 * double(low_config.parameter_count()) / double(dense_config.parameter_count()));
    if (!o->data.empty()) {
      const double before = mean_loss(*be, *dense, o->data, o->batch, seq, o->batches);
      dense.reset();  // its activations and weights are no longer needed
      const double after = mean_loss(*be, *low, o->data, o->batch, seq, o->batches);
      BOTTLE_CHECK(std::isfinite(after), "lowrank: the factorised model's loss is {}", after);
      fmt::print(
          "loss over {} batches of {} x {}: dense {:.6f}, {} rank {} {:.6f} ({:+.6f}, {:+.3f}%)\n",
          o->batches, o->batch, seq, before, o->kind, o->rank, after, after - before,
          100.0 * (after - before) / before);
    }
    // Whole or not at all (io/atomic_output.h): a full disk leaves nothing to refuse later.
    write_directory_atomically(o->out, [&](const std::string& temp) {
      save_model(*low, temp, DType::f32, special_token_ids(tokenizer.get()));
      if (tokenizer) tokenizer->save(temp);
    });
    fmt::print("wrote {} ({} rank {}); it trains on with `bottle train --init-from {}`\n", o->out,
               o->kind, o->rank, o->out);
    return 0;
  };
}

}  // namespace bottle
