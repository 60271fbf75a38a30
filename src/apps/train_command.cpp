// `bottle train CONFIG.toml [--set section.key=value ...] [--resume] [--init-from DIR]`
#include <fmt/format.h>

#include <filesystem>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "comm/communicator.h"
#include "data/utf8.h"
#include "train/plot.h"
#include "train/trainer.h"

namespace bottle {

Command add_train_command(CLI::App& app) {
  struct Options {
    std::string config;
    std::vector<std::string> overrides;
    TrainOptions train;
    bool help_config = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("config", o->config, "TOML configuration (see configs/)");
  app.add_option("--set", o->overrides, "override a key: section.key=value (repeatable)");
  app.add_flag("--resume", o->train.resume,
               "continue from the newest checkpoint in checkpoint.folder");
  app.add_option("--init-from", o->train.init_from, "start from the weights of a model directory");
  app.add_flag("--help-config", o->help_config, "list every configuration key with its default");
  return [o] {
    if (o->help_config) {
      fmt::print("{}", describe_config_keys());
      return 0;
    }
    BOTTLE_CHECK(!o->config.empty(),
                 "train: a configuration file is required (e.g. configs/tiny.toml)");
    BOTTLE_CHECK(!(o->train.resume && !o->train.init_from.empty()),
                 "train: --resume and --init-from exclude each other");
    if (const std::string why = text_value_problem(o->train.init_from); !why.empty())
      fail("--init-from {} holds {}; paths must be UTF-8 text without control characters",
           o->train.init_from, why);
    ConfigKeysGiven given;
    TrainConfig config = load_train_config(o->config, o->overrides, &given);
    // `mpirun -np N bottle train cfg.toml` without parallel.dp: the ranks that tp x pp leave
    // are data-parallel replicas (torchrun's habit). Read again with the key set, so that
    // every check sees it; every rank infers the same.
    const int world = world_communicator().size();
    const int64_t tp_pp = int64_t(config.parallel.tp) * config.parallel.pp;
    if (world > 1 && !given.file.count("parallel.dp") && !given.set.count("parallel.dp") &&
        world % tp_pp == 0 && world / tp_pp != config.parallel.dp) {
      std::vector<std::string> with_dp = o->overrides;
      with_dp.push_back(fmt::format("parallel.dp={}", world / tp_pp));
      config = load_train_config(o->config, with_dp);
      if (world_communicator().rank() == 0)
        fmt::print("parallel.dp = {}: inferred from the job's {} ranks (tp {} x pp {})\n",
                   world / tp_pp, world, config.parallel.tp, config.parallel.pp);
    }
    o->train.config_path = o->config;
    const TrainResult r = train(config, o->train);
    if (world_communicator().rank() != 0 || r.already_complete) return 0;
    fmt::print("done: {} steps, loss {:.4f}{}, {:.0f} tokens/s (median), checkpoint {}\n",
               r.steps_done, r.last_loss,
               r.last_val_loss >= 0 ? fmt::format(", val loss {:.4f}", r.last_val_loss) : "",
               r.tokens_per_s, r.last_checkpoint);
    return 0;
  };
}

Command add_plot_command(CLI::App& app) {
  struct Options {
    std::vector<std::string> metrics;
    std::string out;
  };
  auto o = std::make_shared<Options>();
  app.add_option("metrics", o->metrics,
                 "metrics.jsonl written by bottle train; several: their runs in one plot")
      ->required();
  app.add_option("--out", o->out, "PNG to write (default: beside the first metrics, loss.png)")
      ->check(output_file());
  return [o] {
    const std::string out =
        o->out.empty()
            ? (std::filesystem::path(o->metrics.front()).parent_path() / "loss.png").string()
            : o->out;
    plot_metrics(o->metrics, out);
    fmt::print("{}\n", out);
    return 0;
  };
}

}  // namespace bottle
