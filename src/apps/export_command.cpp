// `bottle export`: any checkpoint (one file, or the shards a pipeline wrote with their
// index) as the single HF-style model directory of docs/design.md §12: config.json +
// model.safetensors and the checkpoint's tokenizer, loadable by LlamaForCausalLM (full-rank),
// by AutoModelForCausalLM with trust_remote_code (low-rank: the modeling files come along), by
// AutoTokenizer, and by every bottle command.
#include <fmt/format.h>

#include <filesystem>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "comm/communicator.h"
#include "io/atomic_output.h"
#include "model/checkpoint.h"
#include "train/run_tokenizer.h"

namespace bottle {

Command add_export_command(CLI::App& app) {
  struct Options {
    std::string checkpoint, out, dtype = "f32";
  };
  auto o = std::make_shared<Options>();
  app.add_option("--checkpoint", o->checkpoint,
                 "checkpoint directory (any layout), or a run's folder for its newest one")
      ->required();
  app.add_option("--out", o->out,
                 "new directory for config.json, model.safetensors and the tokenizer")
      ->required()
      ->check(output_directory());
  app.add_option("--dtype", o->dtype,
                 "the weights' dtype in the file: f32 (as trained), or bf16 (rounded to nearest "
                 "even: half the bytes, for inference)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  return [o] {
    namespace fs = std::filesystem;
    o->checkpoint = checkpoint_option(o->checkpoint, "export");
    BOTTLE_CHECK(fs::weakly_canonical(o->out) != fs::weakly_canonical(o->checkpoint),
                 "export: --out must differ from --checkpoint ({})", o->checkpoint);
    BOTTLE_CHECK(world_communicator().size() == 1,
                 "export: run it as one process (it writes one model), not under mpirun -np {}",
                 world_communicator().size());
    check_new_model_directory(o->out);  // before the work of loading
    const ModelConfig config = read_model_config(o->checkpoint);
    const auto tokenizer = checkpoint_tokenizer(o->checkpoint, config);
    // Whole or not at all (io/atomic_output.h): a full disk leaves nothing to refuse later. A
    // sharded checkpoint is consolidated one tensor at a time.
    write_directory_atomically(o->out, [&](const std::string& temp) {
      export_model(o->checkpoint, temp, o->dtype == "bf16" ? DType::bf16 : DType::f32,
                   special_token_ids(tokenizer.get()));
      if (tokenizer) tokenizer->save(temp);
    });
    fmt::print("exported {} ({} parameters, {}) to {}\n", o->checkpoint, config.parameter_count(),
               o->dtype, o->out);
    return 0;
  };
}

}  // namespace bottle
