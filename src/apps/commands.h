#pragma once
// Each sub-command registers its options on the CLI11 app and returns the action to run.
#include <CLI/CLI.hpp>
#include <functional>

namespace bottle {

using Command = std::function<int()>;

Command add_train_command(CLI::App& app);
Command add_eval_command(CLI::App& app);
Command add_plot_command(CLI::App& app);
Command add_sample_command(CLI::App& app);
Command add_prepare_command(CLI::App& app);
Command add_tokenize_command(CLI::App& app);
Command add_bench_step_command(CLI::App& bench);
Command add_bench_tp_command(CLI::App& bench);
Command add_bench_norm_command(CLI::App& bench);
Command add_bench_paper_command(CLI::App& bench);
Command add_export_command(CLI::App& app);
Command add_lowrank_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
Command add_inspect_command(CLI::App& app);
Command add_bench_pipeline_command(CLI::App& bench);
Command add_bench_tokenize_command(CLI::App& bench);

}  // namespace bottle
