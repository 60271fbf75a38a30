// `bottle bench paper` (bench/paper_bench.h): the BOOST paper's comparisons (../shared/reference),
// scaled to this machine, in one report. It is a launcher: each measurement is another bottle
// command run under mpirun (bench tp, bench norm, bench step, train) whose JSON it collects; every
// mode of one comparison is timed in the same run (bench tp interleaves them). It writes
// DIR/report.md, PNG plots (gnuplot), DIR/results.json and each run's log in DIR/logs. Its
// last section runs nothing: the paper's own runs predicted on the paper's cluster by
// `bottle plan` (bench/paper_prediction.h), beside the paper's figures.
#include "bench/paper_bench.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/paper_figures.h"
#include "bench/paper_prediction.h"
#include "bench/paper_report.h"
#include "bench/subprocess.h"
#include "core/arena.h"
#include "core/error.h"
#include "io/atomic_output.h"
#include "nn/projection.h"
#include "sys/system_info.h"
#include "train/plot.h"
#include "train/train_config.h"

namespace bottle {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// What one report measures, at the scale of --quick or of a full run.
struct Scale {
  const char* name;
  int64_t hidden, ffn, layers, heads, rank, seq, batch;
  int steps, warmup;
  int64_t norm_rows, norm_hidden, norm_rank;
  int64_t loss_steps;
};
constexpr Scale kQuick{"quick", 256, 688, 2, 4, 64, 64, 4, 5, 1, 512, 512, 128, 60};
constexpr Scale kFull{"full", 1024, 2752, 4, 16, 256, 256, 4, 8, 2, 4096, 4096, 1024, 400};

// A model of `model`'s shape with its key/value heads resolved as the loader would (one per
// query head), for a configuration written whole by to_toml.
ModelConfig paper_model(int64_t vocab, int64_t hidden, int64_t ffn, int64_t layers, int64_t heads,
                        const std::string& bottleneck, int64_t rank, int64_t max_seq_len) {
  ModelConfig m;
  m.vocab_size = vocab;
  m.hidden_size = hidden;
  m.intermediate_size = ffn;
  m.num_layers = layers;
  m.num_heads = heads;
  m.num_kv_heads = heads;
  m.bottleneck = parse_bottleneck_kind(bottleneck);
  m.rank = rank;
  m.max_seq_len = max_seq_len;
  return m;
}

// The model the benches time at `s`'s scale, one micro-batch of it.
TrainConfig bench_config(const Scale& s, const std::string& bottleneck) {
  TrainConfig c;
  c.model = paper_model(256, s.hidden, s.ffn, s.layers, s.heads, bottleneck, s.rank, s.seq);
  c.training.micro_batch_size = s.batch;
  c.training.seq_len = s.seq;
  c.training.seed = 1;
  c.parallel.grouping = true;
  return c;
}

// CoLA LLaMA-7B as in the paper (its shape from reference/boost_paper.toml), for planning its
// memory.
TrainConfig llama7b_cola_config(const PaperFigures& paper) {
  auto count = [&](const char* id) { return int64_t(paper.value(id)); };
  TrainConfig c;
  c.model = paper_model(count("llama7b.vocab"), count("llama7b.hidden"), count("llama7b.ffn"),
                        count("llama7b.layers"), count("llama7b.heads"), "cola",
                        count("llama7b.rank"), count("llama7b.seq_len"));
  c.training.micro_batch_size = 1;
  c.training.seq_len = count("llama7b.seq_len");
  c.parallel.tp = int(count("llama7b.tp"));
  c.parallel.grouping = true;
  return c;
}

// The loss-curve runs: a small CoLA model on a real text corpus.
TrainConfig train_config(const Scale& s, const fs::path& data, const fs::path& folder) {
  TrainConfig c;
  c.model = paper_model(256, 128, 352, 2, 4, "cola", 32, 64);
  c.training.steps = s.loss_steps;
  c.training.micro_batch_size = 8;
  c.training.seq_len = 64;
  c.training.seed = 1;
  c.training.eval_interval = 0;
  c.optimizer.lr = 1e-3;
  c.optimizer.weight_decay = 0.0;
  c.lr_scheduler.warmup_steps = 10;
  c.data.train = {(data / "data_train_000000.bin").string()};
  c.checkpoint.folder = folder.string();
  c.checkpoint.interval = 0;
  c.metrics.log_freq = 1;
  return c;
}

// Writes `config` where a child command reads it: every key, resolved (to_toml); the keys a
// command does not read hold their defaults, which check_honoured_keys lets through.
void write_config(const fs::path& path, const TrainConfig& config) {
  std::ofstream(path) << to_toml(config);
}

template <typename Row>
Row row_from_json(const json& j, const std::string& what);
template <>
TpRow row_from_json(const json& j, const std::string& what) {
  return tp_row_from_json(j, what);
}
template <>
FitRow row_from_json(const json& j, const std::string& what) {
  return fit_row_from_json(j, what);
}
template <>
NormRow row_from_json(const json& j, const std::string& what) {
  return norm_row_from_json(j, what);
}
template <>
StepRow row_from_json(const json& j, const std::string& what) {
  return step_row_from_json(j, what);
}

// Runs bottle commands (alone or under mpirun), each logged in DIR/logs/NAME.log; a command
// that fails ends the report with its name, status and last lines.
class Launcher {
 public:
  Launcher(fs::path out, std::string mpirun)
      : out_(std::move(out)),
        mpirun_(std::move(mpirun)),
        cores_(int(sysconf(_SC_NPROCESSORS_ONLN))) {
    char self[4096] = {};
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    BOTTLE_CHECK(n > 0, "bench paper: cannot find its own executable (/proc/self/exe)");
    exe_ = std::string(self, size_t(n));
    fs::create_directories(out_ / "logs");
  }
  int cores() const { return cores_; }
  const std::string& exe() const { return exe_; }

  // `args` after the bottle binary; ranks 0: one process without mpirun.
  std::string run(const std::string& name, int ranks, const std::string& args) {
    std::string command;
    const int threads = std::max(1, cores_ / std::max(1, ranks));
    if (ranks == 0)
      command = fmt::format("OMP_NUM_THREADS={} {} {}", threads, shell_quote(exe_), args);
    else
      command = fmt::format("OMP_NUM_THREADS={} {} -np {}{} {} {}", threads, mpirun_, ranks,
                            ranks > cores_ ? " --oversubscribe" : "", shell_quote(exe_), args);
    const fs::path log = out_ / "logs" / (name + ".log");
    fmt::print(stderr, "bench paper: {} ...", name);
    std::fflush(stderr);
    const auto start = std::time(nullptr);
    const auto [status, output] = run_shell(command + " 2>&1");
    std::ofstream(log) << "$ " << command << "\n" << output;
    fmt::print(stderr, " {}s\n", std::time(nullptr) - start);
    if (status != 0) {
      const size_t tail = output.size() > 2000 ? output.size() - 2000 : 0;
      fail("bench paper: '{}' failed (status {}; log {}):\n{}", name, status, log.string(),
           output.substr(tail));
    }
    return output;
  }

  // The JSON objects a command printed, one per line.
  std::vector<json> run_json(const std::string& name, int ranks, const std::string& args) {
    const std::string output = run(name, ranks, args);
    std::vector<json> rows;
    std::istringstream lines(output);
    for (std::string line; std::getline(lines, line);)
      if (!line.empty() && line[0] == '{') {
        try {
          rows.push_back(json::parse(line));
        } catch (const json::exception& e) {
          fail("bench paper: '{}' printed a line that is not JSON ({}): {}", name, e.what(), line);
        }
      }
    BOTTLE_CHECK(!rows.empty(), "bench paper: '{}' printed no JSON (log {})", name,
                 (out_ / "logs" / (name + ".log")).string());
    return rows;
  }

  // The rows a bench printed, read once into its records (bench/results.h).
  template <typename Row>
  std::vector<Row> run_rows(const std::string& name, int ranks, const std::string& args) {
    std::vector<Row> rows;
    const std::string what = fmt::format("bench paper: '{}'", name);
    for (const json& j : run_json(name, ranks, args)) rows.push_back(row_from_json<Row>(j, what));
    return rows;
  }

 private:
  fs::path out_;
  std::string mpirun_, exe_;
  int cores_;
};

// The first line a command prints ("unknown" when it prints none or fails).
std::string first_line(const std::string& command) {
  const ShellResult r = run_shell(command + " 2>/dev/null");
  std::string line = r.status == 0 ? r.output.substr(0, r.output.find('\n')) : std::string();
  while (!line.empty() && line.back() == '\r') line.pop_back();
  return line.empty() ? "unknown" : line;
}

std::string find_in_path(const std::string& program) {
  const std::string found = first_line("command -v " + program);
  return found == "unknown" ? std::string() : found;
}

json machine_facts(const Launcher& launcher) {
  json m;
  m["cpu"] = cpu_model();
  m["cpu_isa"] = fmt::format("{}", fmt::join(cpu_vector_isa(), ", "));
  m["onednn_isa"] = onednn_isa();
  m["cores"] = launcher.cores();
  m["os"] = first_line("sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '\"'");
  m["mpi"] = first_line("mpirun --version");
  m["compiler"] = fmt::format("GCC {}.{}.{}", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
  m["onednn"] = first_line("dpkg-query -W -f='${Version}' libdnnl-dev");
  m["gnuplot"] = first_line("gnuplot --version");
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  m["date"] = date;
  return m;
}

// Corpus text for the loss curves: Debian's license texts are on every machine.
std::vector<std::string> default_corpus() {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/usr/share/common-licenses", ec))
    if (entry.is_regular_file()) files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// The micro-batch sweep's memory limit (`limit`, or the paper's proportion of GPU memory to
// model state applied to the CoLA model's state at TP 2), the largest micro-batch each mode fits
// under it, and the paper's own setting planned: CoLA-7B on its GPUs' memory.
void plan_memory_fits(Launcher& launcher, const PaperFigures& paper, const fs::path& out,
                      const std::string& cola, std::optional<int64_t> limit, PaperResults& r) {
  const std::vector<FitRow> plan_state = launcher.run_rows<FitRow>(
      "fit_state", 2,
      fmt::format("bench tp {} --set parallel.tp=2 --fit 1TiB --fit-max 1 --json",
                  shell_quote(cola)));
  size_t state = 0;  // of the CoLA model, as the paper's 5 GB is CoLA-7B's
  for (const FitRow& row : plan_state)
    if (row.mode == "btp")
      state = std::max(state, row.weights_bytes + row.gradients_bytes + row.optimizer_bytes);
  r.memory_limit =
      limit ? size_t(*limit) : size_t(paper_memory_per_model_state(paper) * double(state));
  r.memory_limit_default = !limit;
  r.fits = launcher.run_rows<FitRow>(
      "fit", 2,
      fmt::format("bench tp {} --set parallel.tp=2 --fit {} --fit-max 8 --json", shell_quote(cola),
                  r.memory_limit));
  // The paper's own setting, planned (nothing is allocated): CoLA-7B on its GPUs' memory.
  {
    const fs::path path = out / "configs" / "llama7b_cola.toml";
    write_config(path, llama7b_cola_config(paper));
    r.fits_7b = launcher.run_rows<FitRow>(
        "fit_7b", int(paper.value("llama7b.tp")),
        fmt::format("bench tp {} --fit {:g}GiB --fit-max 16 --json", shell_quote(path.string()),
                    paper.value("memory.gpu_memory")));
  }
}

// Loss curves: btp at TP 2 against one rank, on a real corpus.
void run_loss_curves(Launcher& launcher, const Scale& s, const fs::path& out,
                     const std::vector<std::string>& corpus, PaperResults& r) {
  std::string inputs;
  for (const std::string& f : corpus) inputs += " " + shell_quote(f);
  launcher.run("prepare", 0,
               // The curves are training losses: every document goes to the train split.
               fmt::format("prepare --input{} --output {} --val-fraction 0", inputs,
                           shell_quote((out / "data").string())));
  for (int t : {1, 2}) {
    const fs::path folder = out / "runs" / fmt::format("tp{}", t);
    fs::remove_all(folder);
    const fs::path config = out / "configs" / fmt::format("train_tp{}.toml", t);
    write_config(config, train_config(s, out / "data", folder));
    launcher.run(fmt::format("train_tp{}", t), t,
                 fmt::format("train {} --set parallel.tp={} --set parallel.tp_mode=btp",
                             shell_quote(config.string()), t));
    std::ifstream metrics(folder / "metrics.jsonl");
    for (std::string line; std::getline(metrics, line);)
      r.loss[t].push_back(json::parse(line).at("loss").get<double>());
    BOTTLE_CHECK(!r.loss[t].empty(), "bench paper: {} has no losses",
                 (folder / "metrics.jsonl").string());
  }
}

}  // namespace

void run_bench_paper(PaperBenchOptions o) {
  BOTTLE_CHECK(!std::getenv("OMPI_COMM_WORLD_SIZE"),
               "bench paper: run it as one process; it launches mpirun itself");
  const std::string mpirun = find_in_path("mpirun");
  BOTTLE_CHECK(!mpirun.empty(), "bench paper: mpirun not found (Debian package openmpi-bin)");
  BOTTLE_CHECK(!find_in_path("gnuplot").empty(),
               "bench paper: gnuplot not found (Debian package gnuplot-nox)");
  // A folder that gnuplot cannot be told to write into fails now, not after the runs, and so
  // does a report's name taken by a device, FIFO or directory (never replaced).
  gnuplot_path(fs::path(o.out) / "report.png");
  check_output_directory(o.out, "bench paper --out");
  for (const char* file : {"report.md", "results.json"})
    check_output_file((fs::path(o.out) / file).string(), "a file of bench paper's report");
  std::optional<int64_t> limit;
  if (!o.memory_limit.empty()) {
    limit = parse_byte_size(o.memory_limit);
    BOTTLE_CHECK(limit && *limit > 0, "--memory-limit: '{}' is not a byte size (such as \"2GiB\")",
                 o.memory_limit);
  }
  if (o.corpus.empty()) o.corpus = default_corpus();
  BOTTLE_CHECK(!o.corpus.empty(),
               "bench paper: no corpus for the loss curves (/usr/share/common-licenses is "
               "empty); pass --corpus FILES");
  for (const std::string& f : o.corpus)
    BOTTLE_CHECK(fs::is_regular_file(f), "--corpus: {} is not a file", f);
  if (geteuid() == 0) {  // Open MPI refuses root unless told
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  const PaperFigures paper = PaperFigures::built_in();
  // Read before anything runs: a bad file fails now, not after the runs.
  std::vector<EmulatedRow> emulated;
  if (!o.emulated.empty()) emulated = read_emulated_rows(o.emulated, paper_iteration_models(paper));
  const Scale& s = o.quick ? kQuick : kFull;
  const fs::path out(o.out);
  fs::create_directories(out / "configs");
  Launcher launcher(out, mpirun);
  PaperResults r;
  r.scale = s.name;
  r.machine = machine_facts(launcher);
  r.settings = {{"hidden", s.hidden}, {"ffn", s.ffn}, {"layers", s.layers},      {"heads", s.heads},
                {"rank", s.rank},     {"seq", s.seq}, {"batch", s.batch},        {"steps", s.steps},
                {"warmup", s.warmup}, {"vocab", 256}, {"max_ranks", o.max_ranks}};
  auto config_for = [&](const std::string& bottleneck) {
    const fs::path path = out / "configs" / ("bench_" + bottleneck + ".toml");
    write_config(path, bench_config(s, bottleneck));
    return path.string();
  };
  const std::string cola = config_for("cola");
  const std::string timing = fmt::format("--steps {} --warmup {} --json", s.steps, s.warmup);
  auto bench_tp = [&](const std::string& name, int t, const std::string& config,
                      const std::string& extra) {
    return launcher.run_rows<TpRow>(name, t,
                                    fmt::format("bench tp {} {} --set parallel.tp={} {}",
                                                shell_quote(config), timing, t, extra));
  };
  // Iteration time, memory, collectives and recomputation at each TP degree.
  for (int t = 1; t <= o.max_ranks; t *= 2)
    r.tp[t] = bench_tp(fmt::format("tp{}", t), t, cola, t == 2 ? "--recompute" : "");
  // The micro-batch sweep under a memory limit, at TP 2.
  plan_memory_fits(launcher, paper, out, cola, limit, r);
  for (int64_t b : {1, 2, 4, 8})
    r.batch[b] = b == s.batch ? r.tp[2]
                              : bench_tp(fmt::format("batch{}", b), 2, cola,
                                         fmt::format("--set training.micro_batch_size={}", b));
  // The bottleneck kinds.
  r.kinds["cola"] = r.tp[2];
  for (const char* kind : {"svd", "lax"}) r.kinds[kind] = bench_tp(kind, 2, config_for(kind), "");
  // Grouping, per component, at micro-batch 1 and 4.
  for (int64_t b : {1, 4})
    r.grouping[b] = bench_tp(fmt::format("grouping_batch{}", b), 2, cola,
                             fmt::format("--variants --components --set "
                                         "training.micro_batch_size={}",
                                         b));
  // Online RMSNorm against RMSNorm + linear on one rank.
  r.norm.push_back(
      launcher.run_rows<NormRow>("norm", o.max_ranks,
                                 fmt::format("bench norm --rows {} --hidden {} --rank {} --json",
                                             s.norm_rows, s.norm_hidden, s.norm_rank))[0]);
  // The same with GEMMs summed in double: the norm's own error.
  r.norm.push_back(launcher.run_rows<NormRow>(
      "norm_reference", o.max_ranks,
      fmt::format("bench norm --backend reference --rows 128 --hidden {} --rank {} --json",
                  s.norm_hidden, s.norm_rank))[0]);
  // The same training step in PyTorch.
  r.torch = launcher.run_rows<StepRow>(
      "torch", 0,
      fmt::format("bench step --hidden {} --ffn {} --layers {} --heads {} --rank {} --batch {} "
                  "--seq {} --steps {} --warmup {} --threads {} --json",
                  s.hidden, s.ffn, s.layers, s.heads, s.rank, s.batch, s.seq, s.steps, s.warmup,
                  launcher.cores()));
  run_loss_curves(launcher, s, out, o.corpus, r);
  // The paper's own runs, on its cluster: predicted, nothing run (bottle plan --paper).
  r.predicted = predict_paper_runs(load_cluster("a100-perlmutter"));
  r.emulated = std::move(emulated);
  write_paper_report(r, out);
  fmt::print("bench paper: wrote {} and its plots\n", (out / "report.md").string());
}

}  // namespace bottle
