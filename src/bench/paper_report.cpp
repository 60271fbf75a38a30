#include "bench/paper_report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>

#include "bench/paper_figures.h"
#include "bench/paper_prediction.h"
#include "core/arena.h"
#include "core/error.h"
#include "io/atomic_output.h"
#include "train/plot.h"

namespace bottle {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The row of `variant` among one bench tp run's; null when that run did not time it.
const TpRow* find_variant(const std::vector<TpRow>& rows, const std::string& variant) {
  for (const TpRow& r : rows)
    if (r.variant == variant) return &r;
  return nullptr;
}

// A row's field; NaN (shown as "n/a", drawn as missing) for a variant the run did not time.
template <typename T>
double field(const TpRow* row, T TpRow::*member) {
  return row ? double(row->*member) : kNaN;
}
Spread field(const TpRow* row, Spread TpRow::*member) {
  return row ? row->*member : Spread{kNaN, kNaN, kNaN};
}

// "123.4 [120.1–130.2]": a median with the min and max of the same steps.
std::string spread(const Spread& s, int digits = 1) {
  if (std::isnan(s.median)) return "n/a";
  if (std::isnan(s.min) || std::isnan(s.max)) return fmt::format("{:.{}f}", s.median, digits);
  return fmt::format("{:.{}f} [{:.{}f}–{:.{}f}]", s.median, digits, s.min, digits, s.max, digits);
}
std::string spread(const TpRow* row, Spread TpRow::*member, int digits = 1) {
  return spread(field(row, member), digits);
}
// A row's median iteration time (NaN: not timed).
double iter_ms(const TpRow* row) { return field(row, &TpRow::iter_ms).median; }

std::string ratio(double a, double b) {
  if (std::isnan(a) || std::isnan(b) || b == 0) return "n/a";
  return fmt::format("{:.2f}×", a / b);
}

// "1.54× (paper 2.28×: lower)", the paper's ratio being the entry `paper_id`.
std::string versus_paper(double here, const PaperFigures& paper, const std::string& paper_id) {
  const double theirs = paper.value(paper_id);
  const std::string shown = paper.show(paper_id);
  if (std::isnan(here)) return "n/a";
  const char* word = here > 1.1 * theirs   ? "higher"
                     : here < theirs / 1.1 ? "lower"
                                           : "about the same";
  return fmt::format("{:.2f}× (paper {}: {})", here, shown, word);
}

std::string mib(double bytes) { return fmt::format("{:.1f}", bytes / double(1 << 20)); }

// One clustered bar chart with min–max error bars; NaN values are drawn as missing.
struct Series {
  std::string name;
  std::vector<double> value, lo, hi;
  // A median with its min and max as the error bar, each divided by `scale`.
  void add(const Spread& s, double scale = 1) {
    value.push_back(s.median / scale);
    lo.push_back(s.min / scale);
    hi.push_back(s.max / scale);
  }
};

struct Chart {
  std::string title, ylabel;
  std::vector<std::string> categories;
  std::vector<Series> series;
  std::string extra;  // more gnuplot commands (a reference line, a key position)
};

std::string gnuplot_value(double v) { return std::isnan(v) ? "NaN" : fmt::format("{}", v); }

// The chart's data and script stay in plots/ beside the report, to redraw or inspect; each
// whole or not at all (io/atomic_output.h).
void write_plot_file(const fs::path& path, const std::string& text) {
  write_file_atomically(path.string(), text);
}

// The opening of a chart's script: terminal, output and labels.
std::string chart_preamble(const fs::path& png, const std::string& title, const std::string& xlabel,
                           const std::string& ylabel) {
  // gnuplot draws into the partial copy, renamed onto png once whole (io/atomic_output.h);
  // a path it cannot quote is named as given.
  gnuplot_path(png);
  std::string script = gnuplot_png_preamble(partial_path(png.string()), 900, 520) + "set title " +
                       gnuplot_string(title, "the chart's title") + "\n";
  if (!xlabel.empty()) script += "set xlabel " + gnuplot_string(xlabel, "the x label") + "\n";
  return script + "set ylabel " + gnuplot_string(ylabel, "the y label") + "\n";
}

void draw_bars(const Chart& c, const fs::path& out, const std::string& name) {
  const fs::path data = out / "plots" / (name + ".dat"), script = out / "plots" / (name + ".gp");
  const fs::path png = out / (name + ".png");
  std::string rows;
  for (size_t i = 0; i < c.categories.size(); ++i) {
    // A data file's column of text is double-quoted; a category never holds a quote.
    BOTTLE_CHECK(c.categories[i].find_first_of("\"\n") == std::string::npos,
                 "bench paper: the category '{}' of {} holds a quote or line break",
                 c.categories[i], png.string());
    rows += '"' + c.categories[i] + '"';
    for (const Series& s : c.series) {
      const double v = s.value[i];
      const double lo = s.lo.empty() || std::isnan(s.lo[i]) ? v : s.lo[i];
      const double hi = s.hi.empty() || std::isnan(s.hi[i]) ? v : s.hi[i];
      rows += ' ' + gnuplot_value(v) + ' ' + gnuplot_value(lo) + ' ' + gnuplot_value(hi);
    }
    rows += '\n';
  }
  write_plot_file(data, rows);
  std::string g = chart_preamble(png, c.title, "", c.ylabel) +
                  "set style data histograms\nset style histogram errorbars gap 2 lw 1\n"
                  "set style fill solid 0.85 border -1\nset boxwidth 0.9\nset grid ytics\n"
                  "set yrange [0:*]\nset key top left\nset datafile missing 'NaN'\n" +
                  c.extra + "plot ";
  for (size_t k = 0; k < c.series.size(); ++k) {
    const size_t col = 2 + 3 * k;
    g += fmt::format("{}{} using {}:{}:{}{} title {}", k ? ", " : "", k ? "''" : gnuplot_path(data),
                     col, col + 1, col + 2, k == 0 ? ":xtic(1)" : "",
                     gnuplot_string(c.series[k].name, "a series' name"));
  }
  write_plot_file(script, g + "\n");
  write_file_atomically(png.string(), [&](const std::string& temp) { run_gnuplot(script, temp); });
}

// Lines over a numeric x; each series its own points (NaN: not drawn).
void draw_lines(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                const std::vector<double>& x, const std::vector<Series>& series,
                const fs::path& out, const std::string& name, const std::string& extra = "") {
  const fs::path data = out / "plots" / (name + ".dat"), script = out / "plots" / (name + ".gp");
  const fs::path png = out / (name + ".png");
  std::string rows;
  for (size_t i = 0; i < x.size(); ++i) {
    rows += gnuplot_value(x[i]);
    for (const Series& s : series) {
      const double v = s.value[i];
      rows += ' ' + gnuplot_value(v) + ' ' +
              gnuplot_value(s.lo.empty() || std::isnan(s.lo[i]) ? v : s.lo[i]) + ' ' +
              gnuplot_value(s.hi.empty() || std::isnan(s.hi[i]) ? v : s.hi[i]);
    }
    rows += '\n';
  }
  write_plot_file(data, rows);
  std::string g = chart_preamble(png, title, xlabel, ylabel) +
                  "set grid\nset key top left\nset datafile missing 'NaN'\n" + extra + "plot ";
  for (size_t k = 0; k < series.size(); ++k) {
    const size_t col = 2 + 3 * k;
    const std::string file = k ? ", ''" : gnuplot_path(data);
    const std::string series_title = gnuplot_string(series[k].name, "a series' name");
    // Series without a spread are plain lines.
    if (series[k].lo.empty())
      g += fmt::format("{} using 1:{} with lines lw 2 title {}", file, col, series_title);
    else
      g += fmt::format("{} using 1:{}:{}:{} with yerrorlines title {}", file, col, col + 1, col + 2,
                       series_title);
  }
  write_plot_file(script, g + "\n");
  write_file_atomically(png.string(), [&](const std::string& temp) { run_gnuplot(script, temp); });
}

// The three modes of one bench tp run, grouping on, no recomputation.
struct Modes {
  const TpRow *full, *vanilla, *btp;
};
Modes modes_of(const std::vector<TpRow>& rows) {
  return {find_variant(rows, "full"), find_variant(rows, "vanilla"), find_variant(rows, "btp")};
}

class Report {
 public:
  Report(const PaperResults& r, const PaperFigures& paper, fs::path out)
      : r_(r), paper_(paper), out_(std::move(out)) {
    fs::create_directories(out_ / "plots");
  }

  std::string write() {
    header();
    iteration_time();
    if (!r_.emulated.empty()) emulated();
    micro_batches();
    kinds();
    collectives();
    grouping();
    memory();
    recomputation();
    online_norm();
    torch_peer();
    loss_curves();
    if (!r_.predicted.is_null()) md_ += paper_prediction_markdown(r_.predicted, paper_);
    return md_;
  }

 private:
  void line(const std::string& text = "") { md_ += text + "\n"; }
  template <typename... Args>
  void linef(fmt::format_string<Args...> f, Args&&... args) {
    line(fmt::format(f, std::forward<Args>(args)...));
  }
  int64_t layers() const { return r_.settings.at("layers").get<int64_t>(); }
  std::string paper(const std::string& id) const { return paper_.show(id); }
  // What the header says of the PyTorch peer: "n/a" without its bench, "unknown" when the
  // peer did not run.
  std::string torch_peer_fact(std::string StepRow::Peer::*member) const {
    if (r_.torch.empty()) return "n/a";
    const std::optional<StepRow::Peer>& peer = r_.torch.front().peer;
    return peer ? (*peer).*member : "unknown";
  }
  std::string versus(double here, const std::string& paper_id) const {
    return versus_paper(here, paper_, paper_id);
  }

  void header() {
    const json& m = r_.machine;
    const json& s = r_.settings;
    line("# BOOST, measured on this machine");
    line();
    linef(
        "Every comparison of the BOOST paper (`{}`), run by `bottle bench paper{}` on {} ({}). "
        "Each figure is the median over {} iterations after {} warm-up iterations, with the "
        "[min–max] of the same iterations; all modes of one comparison were measured in the "
        "same run, their steps interleaved so that the machine's drift hits them alike "
        "(`bottle bench tp`). The paper's figures quoted here, each with its source in the "
        "paper, are in `reference/boost_paper.toml`.",
        paper("paper.summary"), r_.scale == "quick" ? " --quick" : "", m.value("date", ""),
        r_.scale, s.at("steps").get<int>(), s.at("warmup").get<int>());
    line();
    line("| | |");
    line("|---|---|");
    linef("| machine | {} ({}), {} cores, no GPU; {} |", m.value("cpu", ""), m.value("cpu_isa", ""),
          m.value("cores", 0), m.value("os", ""));
    linef(
        "| software | {}; {}; oneDNN {} (its kernels: {}); PyTorch {} (OpenBLAS kernels: {}, {}); "
        "{} |",
        m.value("compiler", ""), m.value("mpi", ""), m.value("onednn", ""),
        m.value("onednn_isa", "unknown"), torch_peer_fact(&StepRow::Peer::version),
        torch_peer_fact(&StepRow::Peer::blas_core),
        torch_peer_fact(&StepRow::Peer::blas_core_source), m.value("gnuplot", ""));
    linef(
        "| model | LLaMA-style, CoLA bottlenecks unless stated: d = {}, d_ff = {}, {} heads, r = "
        "{}, {} blocks, vocabulary 256; micro-batch {} × {} tokens; fp32 |",
        s.at("hidden").get<int64_t>(), s.at("ffn").get<int64_t>(), s.at("heads").get<int64_t>(),
        s.at("rank").get<int64_t>(), s.at("layers").get<int64_t>(), s.at("batch").get<int64_t>(),
        s.at("seq").get<int64_t>());
    // Which order each mode's TP backward ran in (bench tp's rows say), and the pipeline's
    // schedule: the paper compares against Megatron at its best.
    std::set<std::string> orders;
    for (const auto& [t, rows] : r_.tp)
      for (const TpRow& row : rows) orders.insert(row.tp_backward);
    std::string order_text;
    for (const std::string& o : orders)
      order_text += (order_text.empty() ? "" : ", ") + fmt::format("\"{}\"", o);
    linef(
        "| modes | **full**: Megatron TP on the full-rank model of the same widths; **vanilla**: "
        "Megatron TP on the CoLA model; **btp**: bottleneck-aware TP (BOOST) with online "
        "RMSNorm and grouping; every mode's TP backward as `parallel.tp_backward` = {} "
        "(\"async\": Megatron's order, each input gradient's all-reduce under the weight "
        "gradient); the pipelined rows run `parallel.schedule` = \"1f1b\" |",
        order_text.empty() ? "(no TP rows)" : order_text);
    linef("| paper | {} |", paper("paper.testbed"));
    line();
    const int top = r_.tp.rbegin()->first, cores = m.value("cores", 2);
    linef(
        "The machine differs from the paper's in the way that matters most: here a rank is a "
        "CPU core and the ranks all-reduce through shared memory, so compute is ~1,000× slower "
        "and communication relatively cheap; the paper's gains come from cutting communication "
        "and from larger, better-shaped GEMMs.{}",
        top > cores ? fmt::format(" TP = {} runs {} ranks on {} cores (oversubscribed): its "
                                  "times measure ranks sharing cores, not {}-way parallelism.",
                                  top, top, cores, top)
                    : std::string());
    line();
  }

  void iteration_time() {
    line("## Iteration time: full-rank TP vs vanilla TP vs btp");
    line();
    line("![iteration time](iteration.png)");
    line();
    line("| TP | full (ms) | vanilla (ms) | btp (ms) | btp vs full | btp vs vanilla |");
    line("|---|---|---|---|---|---|");
    Chart c{
        "Iteration time per mode and TP degree (median, min-max)", "ms per iteration", {}, {}, ""};
    c.series = {{"full-rank TP", {}, {}, {}}, {"vanilla TP", {}, {}, {}}, {"btp", {}, {}, {}}};
    for (const auto& [t, rows] : r_.tp) {
      const Modes m = modes_of(rows);
      const std::string label = t > r_.machine.value("cores", 2)
                                    ? fmt::format("{} (oversubscribed)", t)
                                    : std::to_string(t);
      linef("| {} | {} | {} | {} | {} | {} |", label, spread(m.full, &TpRow::iter_ms),
            spread(m.vanilla, &TpRow::iter_ms), spread(m.btp, &TpRow::iter_ms),
            ratio(iter_ms(m.full), iter_ms(m.btp)), ratio(iter_ms(m.vanilla), iter_ms(m.btp)));
      c.categories.push_back("TP " + label);
      const TpRow* rows3[] = {m.full, m.vanilla, m.btp};
      for (size_t k = 0; k < 3; ++k) c.series[k].add(field(rows3[k], &TpRow::iter_ms));
    }
    draw_bars(c, out_, "iteration");
    line();
    const Modes top = modes_of(r_.tp.rbegin()->second);
    const Modes two = modes_of(r_.tp.at(2));
    linef(
        "At TP 2, btp is {} faster than full-rank TP and {} faster than vanilla TP; at TP {} "
        "{} and {}. Paper ({}): full-rank {}, vanilla {}, BOOST {} ({} and {} over {}).",
        versus(iter_ms(two.full) / iter_ms(two.btp), "iteration.boost_speedup_over_full_7b"),
        versus(iter_ms(two.vanilla) / iter_ms(two.btp), "iteration.boost_speedup_over_vanilla_7b"),
        r_.tp.rbegin()->first,
        versus(iter_ms(top.full) / iter_ms(top.btp), "iteration.boost_speedup_over_full_7b"),
        versus(iter_ms(top.vanilla) / iter_ms(top.btp), "iteration.boost_speedup_over_vanilla_7b"),
        paper("iteration.setting"), paper("iteration.full_7b"), paper("iteration.vanilla_7b"),
        paper("iteration.boost_7b"), paper("iteration.boost_speedup_over_full_range"),
        paper("iteration.boost_speedup_over_vanilla_range"), paper("iteration.range_models"));
    line();
    linef(
        "Why they differ: btp's lead over full-rank TP comes mostly from the CoLA model's fewer "
        "FLOPs (r = d/4), which a compute-bound CPU turns into time almost one for one, so it "
        "can exceed the paper's. Its lead over vanilla comes from communication and from "
        "vanilla's replicated full-width work (norms, attention over all heads, SwiGLU on "
        "every rank): on {} cores with shared-memory all-reduces vanilla's {} volume costs far "
        "less than at {} tokens per sequence over NVLink, while the replicated work costs "
        "more the more ranks share the cores — which is why the gap grows with TP here. At TP "
        "1 there is no communication: vanilla and btp run the same serial model.",
        r_.machine.value("cores", 2), paper("volume.vanilla_over_full"), paper("llama7b.seq_len"));
    line();
  }

  // The paper's value of list `id` (one per model of iteration.models) for `model`.
  double paper_of_model(const std::string& id, const std::string& model) const {
    const std::vector<std::string> models = paper_iteration_models(paper_);
    const size_t i = size_t(std::find(models.begin(), models.end(), model) - models.begin());
    const std::vector<double> v = paper_.values(id);
    return i < v.size() ? v[i] : kNaN;
  }

  // "1.52 / 1.60 (+5 %)": measured / predicted and the prediction's error.
  static std::string measured_predicted(double measured, double predicted) {
    if (std::isnan(measured) || std::isnan(predicted)) return "n/a";
    return fmt::format("{:.0f} / {:.0f} ({:+.0f} %)", measured, predicted,
                       100 * (predicted / measured - 1));
  }

  void emulated() {
    const EmulatedRow& first = r_.emulated.front();
    line("## Iteration time on an emulated GPU cluster: the paper's rows, scaled down");
    line();
    line("![btp's speedups on the emulated cluster](emulated.png)");
    line();
    linef(
        "Each row is one of the paper's models with its hidden size, FFN and heads divided by "
        "the same factor, r = d/4, a few blocks and a byte vocabulary (its configuration is "
        "named below), run in the paper's layout on a cluster emulated on this machine "
        "(`tools/cluster/bench_emulated.sh --paper`, docs/design.md §24): every rank in a "
        "network namespace of its own, Open MPI over TCP, the links of the {} preset dilated "
        "by k, the ratio of the GPU's {} rate to one rank's measured here with every rank busy "
        "(bandwidth ÷ k, latency × k). The planner's prediction for each run is made from the "
        "cluster file of the very links the run had (its all-reduce measured on them). Cells: "
        "measured / predicted ms (the prediction's error).",
        first.preset, first.precision);
    line();
    line(
        "| paper model | layout | k | full (ms) | vanilla (ms) | btp (ms) | btp vs full: "
        "measured, predicted, paper | btp vs vanilla: measured, predicted, paper |");
    line("|---|---|---|---|---|---|---|---|");
    Chart c{"btp's speedup on the emulated cluster, beside the paper's",
            "speedup of btp (×)",
            {},
            {{"over full-rank TP, measured", {}, {}, {}},
             {"over full-rank TP, paper", {}, {}, {}},
             {"over vanilla TP, measured", {}, {}, {}},
             {"over vanilla TP, paper", {}, {}, {}}},
            "set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2\n"};
    int within = 0, total = 0;
    for (const EmulatedRow& row : r_.emulated) {
      auto cell = [&](const std::string& mode) {
        const auto m = row.modes.find(mode);
        if (m == row.modes.end()) return std::string("n/a");
        ++total;
        const double error = m->second.predicted_ms / m->second.measured_ms - 1;
        if (std::abs(error) <= 0.15) ++within;
        return measured_predicted(m->second.measured_ms, m->second.predicted_ms);
      };
      auto speedups = [&](const std::string& over, const std::string& paper_id) {
        const double paper = paper_of_model(paper_id, row.model);
        return fmt::format("{} · {} · {}", ratio(row.speedup(over, false).value_or(kNaN), 1),
                           ratio(row.speedup(over, true).value_or(kNaN), 1), ratio(paper, 1));
      };
      const std::string layout =
          fmt::format("TP {}{}{} ({})", row.tp, row.pp > 1 ? fmt::format(" × PP {}", row.pp) : "",
                      row.dp > 1 ? fmt::format(" × DP {}", row.dp) : "",
                      fs::path(row.config).filename().string());
      linef("| {} | {} | {:.0f} | {} | {} | {} | {} | {} |", row.model, layout, row.k, cell("full"),
            cell("vanilla"), cell("btp"), speedups("full", "iteration.boost_speedup_over_full"),
            speedups("vanilla", "iteration.boost_speedup_over_vanilla"));
      c.categories.push_back(fmt::format("{} (TP {}{})", row.model, row.tp,
                                         row.pp > 1 ? fmt::format(", PP {}", row.pp) : ""));
      const double values[] = {row.speedup("full", false).value_or(kNaN),
                               paper_of_model("iteration.boost_speedup_over_full", row.model),
                               row.speedup("vanilla", false).value_or(kNaN),
                               paper_of_model("iteration.boost_speedup_over_vanilla", row.model)};
      for (size_t k = 0; k < 4; ++k) c.series[k].value.push_back(values[k]);
    }
    draw_bars(c, out_, "emulated");
    line();
    linef(
        "{} of {} iteration times predicted within ±15 %. Why the speedups differ from the "
        "paper's: a model scaled down by s does s² less compute per token but only s times "
        "less TP traffic, so communication weighs more here than on the paper's GPUs, which "
        "favours btp over vanilla TP (7·r values per token and block against 5·d + 2·d_ff) "
        "and over full-rank TP (2·d, but on a model with more compute); and the intra-node "
        "tier is clamped at what the emulation's switch carries, slower than a dilated NVLink "
        "(design §24). Where the prediction lands near the measurement, the planner explains "
        "the difference from the paper by these two; where it does not, the error column says "
        "by how much it does not.",
        within, total);
    line();
  }

  void micro_batches() {
    line("## Micro-batch sweep under a memory limit");
    line();
    linef(
        "Per-rank limit: **{}** ({}), at TP 2. Whether a run fits is planned before it runs: "
        "the model is laid out in reserved address space (exact buffer sizes) plus AdamW's "
        "moments (`bottle bench tp --fit`).",
        format_bytes(r_.memory_limit),
        r_.memory_limit_default
            ? fmt::format("{:g}× the CoLA model's state per rank: the proportion of {} to "
                          "CoLA-7B's {:g} GB of weights, gradients and optimizer state per GPU "
                          "in the paper",
                          paper_memory_per_model_state(paper_), paper("memory.gpu_memory"),
                          paper_.value("memory.weights") + paper_.value("memory.gradients") +
                              paper_.value("memory.optimizer"))
            : "--memory-limit");
    line();
    line("![micro-batch sweep](microbatch.png)");
    line();
    line("| micro-batch | full (ms) | vanilla (ms) | btp (ms) | btp vs full | btp vs vanilla |");
    line("|---|---|---|---|---|---|");
    auto max_batch = [&](const std::string& mode) {
      for (const FitRow& f : r_.fits)
        if (f.mode == mode && f.recompute == "none") return f.max_micro_batch;
      return int64_t(0);
    };
    std::vector<double> x;
    std::vector<Series> series{
        {"full-rank TP", {}, {}, {}}, {"vanilla TP", {}, {}, {}}, {"btp", {}, {}, {}}};
    const char* names[] = {"full", "vanilla", "btp"};
    for (const auto& [b, rows] : r_.batch) {
      const Modes m = modes_of(rows);
      const TpRow* by_mode[] = {m.full, m.vanilla, m.btp};
      std::string cells[3];
      double ms[3];
      x.push_back(double(b));
      for (size_t k = 0; k < 3; ++k) {
        const bool fits = b <= max_batch(names[k]);
        const Spread t = fits ? field(by_mode[k], &TpRow::iter_ms) : Spread{kNaN, kNaN, kNaN};
        ms[k] = t.median;
        cells[k] = fits ? spread(t) : "does not fit";
        series[k].add(t);
      }
      linef("| {} | {} | {} | {} | {} | {} |", b, cells[0], cells[1], cells[2], ratio(ms[0], ms[2]),
            ratio(ms[1], ms[2]));
    }
    draw_lines(fmt::format("Iteration time by micro-batch, TP 2, limit {} per rank (missing: "
                           "does not fit)",
                           format_bytes(r_.memory_limit)),
               "micro-batch", "ms per iteration", x, series, out_, "microbatch",
               "set logscale x 2\nset xtics (1, 2, 4, 8)\n");
    line();
    line("Largest micro-batch each mode plans under the limit (up to 8):");
    line();
    line("| mode | recompute | largest micro-batch | planned per rank at it |");
    line("|---|---|---|---|");
    for (const FitRow& f : r_.fits)
      linef("| {} | {} | {} | {} |", f.mode, f.recompute,
            f.max_micro_batch ? std::to_string(f.max_micro_batch) : "none",
            format_bytes(f.total_bytes));
    line();
    linef(
        "The paper's own setting, planned at CoLA-7B's real shape (d {}, d_ff {}, {} blocks, "
        "{} heads, r {}, vocabulary {}, sequence {}), TP {}, {:g} GiB per rank, in fp32 (the "
        "paper trains in bf16, where activations take half these bytes):",
        paper("llama7b.hidden"), paper("llama7b.ffn"), paper("llama7b.layers"),
        paper("llama7b.heads"), paper("llama7b.rank"), paper("llama7b.vocab"),
        paper("llama7b.seq_len"), paper("llama7b.tp"), paper_.value("memory.gpu_memory"));
    line();
    line(
        "| mode | recompute | largest micro-batch | weights + gradients + optimizer | activations "
        "+ buffers | total |");
    line("|---|---|---|---|---|---|");
    for (const FitRow& f : r_.fits_7b) {
      const int64_t b = f.max_micro_batch;
      const bool capped = b == f.tried_up_to;
      linef("| {} | {} | {} | {} | {} | {} |", f.mode, f.recompute,
            b ? fmt::format("{}{}", capped ? "≥ " : "", b) : "none",
            format_bytes(f.weights_bytes + f.gradients_bytes + f.optimizer_bytes),
            format_bytes(f.activation_and_buffer_bytes), format_bytes(f.total_bytes));
    }
    line();
    // The sweep's largest micro-batch: which modes fit it without recomputation.
    const int64_t largest = r_.batch.empty() ? 0 : r_.batch.rbegin()->first;
    std::string fit_largest;
    for (const char* mode : {"full", "vanilla", "btp"})
      if (max_batch(mode) >= largest)
        fit_largest += std::string(fit_largest.empty() ? "" : ", ") + mode;
    linef(
        "Under this limit micro-batch {} fits {} without recomputation. Paper ({}): full-rank "
        "{}, vanilla {}, BOOST {} at micro-batch {} ({} over full-rank); at {} only BOOST fits "
        "({}). Which modes fit follows from each mode's activations: vanilla replicates every "
        "full-width tensor on each rank, btp shards them. At the timed shapes (few blocks, "
        "short sequences) the model state is a larger share of the footprint than at 7B and "
        "{} tokens, so the activations decide less there; at 7B's shape (above) they decide.",
        largest, fit_largest.empty() ? "no mode" : fit_largest, paper("microbatch.setting"),
        paper("microbatch.full"), paper("microbatch.vanilla"), paper("microbatch.boost"),
        paper("microbatch.micro_batches"), paper("microbatch.boost_speedup_over_full"),
        paper("microbatch.only_boost_fits"), paper("microbatch.boost_at_only_boost_fits"),
        paper("llama7b.seq_len"));
    line();
  }

  void kinds() {
    line("## Bottleneck kinds: SVD, CoLA, LaX");
    line();
    line("![bottleneck kinds](kinds.png)");
    line();
    line("| model | vanilla (ms) | btp (ms) | btp vs vanilla | btp vs full-rank |");
    line("|---|---|---|---|---|");
    const double full = iter_ms(modes_of(r_.kinds.at("cola")).full);
    Chart c{
        fmt::format("Iteration time by bottleneck, TP 2 (full-rank TP: {:.0f} ms, dashed)", full),
        "ms per iteration",
        {},
        {{"vanilla TP", {}, {}, {}}, {"btp", {}, {}, {}}},
        fmt::format("set arrow from graph 0, first {0} to graph 1, first {0} nohead dt 2 lw 2\n",
                    full)};
    for (const char* kind : {"svd", "cola", "lax"}) {
      const Modes m = modes_of(r_.kinds.at(kind));
      linef("| {} | {} | {} | {} | {} |", kind, spread(m.vanilla, &TpRow::iter_ms),
            spread(m.btp, &TpRow::iter_ms), ratio(iter_ms(m.vanilla), iter_ms(m.btp)),
            ratio(full, iter_ms(m.btp)));
      c.categories.push_back(kind);
      const TpRow* rows2[] = {m.vanilla, m.btp};
      for (size_t k = 0; k < 2; ++k) c.series[k].add(field(rows2[k], &TpRow::iter_ms));
    }
    linef("| full-rank TP | {} | | | |",
          spread(modes_of(r_.kinds.at("cola")).full, &TpRow::iter_ms));
    draw_bars(c, out_, "kinds");
    line();
    std::string here;
    for (const char* kind : {"svd", "cola", "lax"}) {
      const Modes m = modes_of(r_.kinds.at(kind));
      here += fmt::format("{}{} {:.2f}×", here.empty() ? "" : ", ", kind,
                          iter_ms(m.vanilla) / iter_ms(m.btp));
    }
    linef(
        "btp vs vanilla here: {}. Paper ({}): {} for {}, and {} over full-rank. SVD has nothing "
        "between its factors and LaX adds its crossing and LayerNorm (under vanilla also an "
        "all-gather of each latent); the ratios are smaller here for the reasons of the first "
        "section.",
        here, paper("kinds.setting"), paper("kinds.boost_speedup_over_vanilla"),
        paper("kinds.models"), paper("kinds.boost_speedup_over_full"));
    line();
  }

  void collectives() {
    line("## Collectives per block and pass");
    line();
    line("![collective time](comm.png)");
    line();
    line(
        "| TP | mode | elements per token and block, forward / backward | collectives per "
        "block and pass | all-reduce time per block and pass (ms) |");
    line("|---|---|---|---|---|");
    Chart c{"All-reduce time per block and pass (median, min-max)", "ms", {}, {}, ""};
    c.series = {{"full-rank TP", {}, {}, {}}, {"vanilla TP", {}, {}, {}}, {"btp", {}, {}, {}}};
    for (const auto& [t, rows] : r_.tp) {
      if (t == 1) continue;
      const Modes m = modes_of(rows);
      const TpRow* by_mode[] = {m.full, m.vanilla, m.btp};
      c.categories.push_back(fmt::format("TP {}", t));
      for (size_t k = 0; k < 3; ++k) {
        const TpRow* row = by_mode[k];
        linef("| {} | {} | {:.0f} / {:.0f} | {:.0f} | {} |", t, row ? row->mode : "",
              field(row, &TpRow::fwd_elems_per_token_block),
              field(row, &TpRow::bwd_elems_per_token_block),
              field(row, &TpRow::collectives_per_block),
              spread(row, &TpRow::block_comm_ms_per_pass, 3));
        c.series[k].add(field(row, &TpRow::block_comm_ms_per_pass));
      }
    }
    draw_bars(c, out_, "comm");
    line();
    const int64_t d = r_.settings.at("hidden").get<int64_t>(),
                  ff = r_.settings.at("ffn").get<int64_t>(),
                  rank = r_.settings.at("rank").get<int64_t>();
    linef(
        "The volumes the communicator counts equal docs/design.md §4's formulas exactly: "
        "full 2·d = {}, vanilla 5·d + 2·d_ff = {} ({} full at 7B widths), btp 7·r + 2 = {} "
        "({} at 7B widths; + 2: the online RMSNorm's statistics ride in the same "
        "all-reduces). Paper ({}): full-rank {}, vanilla {}, BOOST {} per block and pass, btp "
        "{:.2f}× full and {:.1f}× less than vanilla. Here one collective on shared memory "
        "costs a few µs plus ~4 GB/s, so the times follow the volumes less closely than on "
        "NVLink, and with ranks oversubscribed they include waiting for a core.",
        2 * d, 5 * d + 2 * ff, paper("volume.vanilla_over_full"), 7 * rank + 2,
        paper("volume.boost_over_full"), paper("collectives.setting"), paper("collectives.full_7b"),
        paper("collectives.vanilla_7b"), paper("collectives.boost_7b"),
        paper_.value("collectives.boost_7b") / paper_.value("collectives.full_7b"),
        paper_.value("collectives.vanilla_7b") / paper_.value("collectives.boost_7b"));
    line();
  }

  void grouping() {
    line("## Linear-layer grouping, per component");
    line();
    line("![grouping](grouping.png)");
    line();
    Chart c{"Grouping: time per block (forward + backward), btp, TP 2", "ms per block", {}, {}, ""};
    c.series = {{"default (ungrouped)", {}, {}, {}}, {"grouped", {}, {}, {}}};
    const double L = double(layers());
    for (const auto& [b, rows] : r_.grouping) {
      const TpRow* grouped = find_variant(rows, "btp");
      const TpRow* ungrouped = find_variant(rows, "btp ungrouped");
      linef(
          "Micro-batch {}, btp, ms per block (forward + backward; whole step per block: "
          "iteration / {} blocks):",
          b, layers());
      line();
      line("| | default | grouped | speedup |");
      line("|---|---|---|---|");
      // A component's compute or all-reduce ("" for the whole step), per step.
      const std::pair<const char*, std::pair<const char*, bool>> parts[] = {
          {"gate and up, compute", {"gate_up", false}},
          {"gate and up, all-reduce", {"gate_up", true}},
          {"QKV, compute", {"qkv", false}},
          {"QKV, all-reduce", {"qkv", true}},
          {"whole step per block", {"", false}}};
      for (const auto& [label, part] : parts) {
        const auto& [component, comm] = part;
        auto times = [&](const TpRow* row) {
          if (!row) return Spread{kNaN, kNaN, kNaN};
          if (!*component) return row->iter_ms;
          const TpComponentTimes& t = row->component(component);
          return comm ? t.comm_ms : t.compute_ms;
        };
        const Spread u = times(ungrouped), g = times(grouped);
        linef("| {} | {:.3f} [{:.3f}–{:.3f}] | {:.3f} [{:.3f}–{:.3f}] | {} |", label, u.median / L,
              u.min / L, u.max / L, g.median / L, g.min / L, g.max / L,
              ratio(u.median / L, g.median / L));
        c.categories.push_back(fmt::format("b{} {}", b, label));
        c.series[0].add(u, L);
        c.series[1].add(g, L);
      }
      line();
    }
    c.extra = "set xtics rotate by -30\nset logscale y\nset yrange [*:*]\n";
    draw_bars(c, out_, "grouping");
    linef(
        "Paper ({}): at micro-batch {} QKV compute {}, QKV all-reduce {}, gate/up compute {} "
        "and all-reduce {}, whole block {}; at micro-batch {} whole block {}. Grouping pays most "
        "where GEMMs are small and launches and collectives are many. On a "
        "CPU a GEMM call costs far less than a GPU kernel launch, so the compute gain is "
        "smaller than the paper's; one collective instead of three still saves its fixed "
        "cost. All-reduce times include waiting for the other rank, so they are noisy; the "
        "whole step is the figure to trust.",
        paper("grouping.setting"), paper("grouping.batch1.micro_batch"),
        paper("grouping.batch1.qkv_compute"), paper("grouping.batch1.qkv_allreduce"),
        paper("grouping.batch1.gate_up_compute"), paper("grouping.batch1.gate_up_allreduce"),
        paper("grouping.batch1.whole_block"), paper("grouping.batch4.micro_batch"),
        paper("grouping.batch4.whole_block"));
    line();
  }

  void memory() {
    line("## Memory per rank");
    line();
    line("![memory](memory.png)");
    line();
    line("TP 2, no recomputation; every buffer is allocated up front and tagged (MiB per rank):");
    line();
    line("| mode | weights | gradients | optimizer | activations + buffers | total |");
    line("|---|---|---|---|---|---|");
    const Modes m = modes_of(r_.tp.at(2));
    Chart c{"Memory per rank, TP 2 (MiB)",
            "MiB",
            {"weights", "gradients", "optimizer", "activations + buffers", "total"},
            {},
            ""};
    const std::pair<const char*, const TpRow*> by_mode[] = {
        {"full-rank TP", m.full}, {"vanilla TP", m.vanilla}, {"btp", m.btp}};
    for (const auto& [name, row] : by_mode) {
      const double act = field(row, &TpRow::activation_bytes) + field(row, &TpRow::buffer_bytes);
      const double values[] = {
          field(row, &TpRow::weights_bytes), field(row, &TpRow::gradients_bytes),
          field(row, &TpRow::optimizer_bytes), act, field(row, &TpRow::peak_bytes)};
      linef("| {} | {} | {} | {} | {} | {} |", name, mib(values[0]), mib(values[1]), mib(values[2]),
            mib(values[3]), mib(values[4]));
      Series s{name, {}, {}, {}};
      for (double v : values) s.value.push_back(v / double(1 << 20));
      c.series.push_back(s);
    }
    draw_bars(c, out_, "memory");
    const double btp_act =
        field(m.btp, &TpRow::activation_bytes) + field(m.btp, &TpRow::buffer_bytes);
    const double van_act =
        field(m.vanilla, &TpRow::activation_bytes) + field(m.vanilla, &TpRow::buffer_bytes);
    line();
    const double paper_ratio =
        paper_.value("memory.activations_boost") / paper_.value("memory.activations_vanilla");
    linef(
        "btp's activations and buffers are **{}** vanilla's (paper, {}: {} / {} = {:.2f}×, "
        "target ≤ {:.2f}×; totals {} vs {}). Weights, gradients and optimizer state are the "
        "same in both, as in the paper. Vanilla keeps every full-width tensor whole on each "
        "rank; btp keeps them sharded and only the r-wide latents whole.",
        ratio(btp_act, van_act), paper("memory.setting"), paper("memory.activations_boost"),
        paper("memory.activations_vanilla"), paper_ratio, paper_ratio, paper("memory.total_boost"),
        paper("memory.total_vanilla"));
    line();
  }

  void recomputation() {
    line("## Activation recomputation: MB saved per ms");
    line();
    line("![recomputation](recompute.png)");
    line();
    line(
        "TP 2. Saved: activation memory against the same mode without recomputation. Time: "
        "the recomputation itself, timed around it in backward (the iteration difference is "
        "shown too).");
    line();
    line(
        "| mode | recompute | activations (MiB) | saved (MB) | recompute (ms) | iteration +ms "
        "| MB per ms | collectives re-run per block |");
    line("|---|---|---|---|---|---|---|---|");
    Chart c{"Activation memory saved per ms of recomputation, TP 2", "MB per ms", {}, {}, ""};
    c.series = {{"MB saved per ms", {}, {}, {}}};
    double lowrank = kNaN, vanilla_block = kNaN;
    for (const TpRow& row : r_.tp.at(2)) {
      if (row.recompute == "none" || !row.grouping) continue;
      const double per_ms = row.saved_mb_per_ms;
      linef("| {} | {} | {} | {:.1f} | {} | {:.1f} | {:.2f} | {:.0f} |", row.mode, row.recompute,
            mib(double(row.activation_bytes)), row.saved_mb, spread(row.recompute_ms), row.extra_ms,
            per_ms, row.recompute_collectives);
      c.categories.push_back(row.mode + " " + row.recompute);
      c.series[0].value.push_back(per_ms);
      c.series[0].lo.push_back(kNaN);
      c.series[0].hi.push_back(kNaN);
      if (row.mode == "btp" && row.recompute == "lowrank") lowrank = per_ms;
      if (row.mode == "vanilla" && row.recompute == "block") vanilla_block = per_ms;
    }
    draw_bars(c, out_, "recompute");
    line();
    linef(
        "btp + lowrank saves **{}** the MB per ms of vanilla + block (paper, {}: {} / {} = {}; "
        "{} at micro-batch {}). lowrank never re-runs a collective "
        "(counted: 0 per block); vanilla + block re-runs all of its block's. lowrank is fast "
        "because it skips the A GEMMs and every collective; it saves less than block because "
        "it keeps the 7·r latents and the mid-block residual per block while block keeps only "
        "the block's input. How these two balance depends on the widths, the micro-batch and "
        "how many blocks share the one recomputation region, so the ratio moves with the "
        "shapes (the README gives it at d = 1024).",
        versus(lowrank / vanilla_block, "recompute.boost_advantage_batch4"),
        paper("recompute.setting"), paper("recompute.boost_batch4"),
        paper("recompute.vanilla_batch4"), paper("recompute.boost_advantage_batch4"),
        paper("recompute.boost_advantage_batch8"), paper("recompute.larger_micro_batch"));
    line();
  }

  void online_norm() {
    line("## Online RMSNorm error (fp32)");
    line();
    linef(
        "Online RMSNorm + row-parallel A on t ranks against RMSNorm + A on one rank (`bottle "
        "bench norm`); paper, {}: max {}, mean {}; docs/design.md §5's target ≤ {}.",
        paper("online_norm.setting"), paper("online_norm.fp32_max"), paper("online_norm.fp32_mean"),
        paper("online_norm.design_target"));
    line();
    line(
        "| backend | ranks | rows × d → r | max \\|Δ\\| | mean \\|Δ\\| | backward max | backward "
        "mean |");
    line("|---|---|---|---|---|---|---|");
    for (const NormRow& n : r_.norm)
      linef("| {} | {} | {} × {} → {} | {:.2e} | {:.2e} | {:.2e} | {:.2e} |", n.backend, n.tp,
            n.rows, n.hidden, n.rank, n.max_abs_diff, n.mean_abs_diff, n.bwd_max_abs_diff,
            n.bwd_mean_abs_diff);
    line();
    line(
        "The `reference` backend sums its GEMMs in double, so its difference is the online "
        "RMSNorm's own; the `cpu` backend's oneDNN GEMM sums in fp32 in an order that depends "
        "on K (d on one rank, d/t per rank before the all-reduce), and that rounding, not the "
        "norm, sets its larger difference.");
    line();
  }

  void torch_peer() {
    line("## The PyTorch peer");
    line();
    line(
        "The same model, weights and tokens, one training step (forward, backward, AdamW) on "
        "one process with all cores, in bottle and in PyTorch (Debian's python3-torch, eager):");
    line();
    if (!r_.torch.empty()) {
      // The kernels the peer ran, and the ones the environment pinned when bench step chose
      // better (or why it kept them): the ratio below is against the kernels named first.
      const std::optional<StepRow::Peer>& t = r_.torch.front().peer;
      const std::string pinned = t ? t->blas_core_pinned : "";
      linef("PyTorch {}, OpenBLAS kernels {} ({}{}){}.", torch_peer_fact(&StepRow::Peer::version),
            torch_peer_fact(&StepRow::Peer::blas_core),
            torch_peer_fact(&StepRow::Peer::blas_core_source),
            pinned.empty() ? "" : fmt::format("; the environment pinned {}", pinned),
            t && t->blas_fallback ? fmt::format("; {}", *t->blas_fallback) : std::string());
    }
    line();
    line("| model | bottle (ms) | PyTorch (ms) | bottle vs PyTorch |");
    line("|---|---|---|---|");
    for (const StepRow& row : r_.torch) {
      // Without the peer its cells read "nan", as they always have.
      const Spread torch = row.peer ? row.peer->ms : Spread{kNaN, kNaN, kNaN};
      linef("| {} | {} | {} | {} |", row.kind,
            fmt::format("{:.1f} [{:.1f}–{:.1f}]", row.ms.median, row.ms.min, row.ms.max),
            fmt::format("{:.1f} [{:.1f}–{:.1f}]", torch.median, torch.min, torch.max),
            ratio(torch.median, row.ms.median));
    }
    line();
    linef("{} Debian's PyTorch runs its own GEMMs on this CPU, bottle runs oneDNN's.",
          paper("claims.framework"));
    line();
  }

  void loss_curves() {
    line("## Loss curves: btp at TP 2 against one rank");
    line();
    line("![loss curves](loss.png)");
    line();
    const std::vector<double>& one = r_.loss.at(1);
    const std::vector<double>& two = r_.loss.at(2);
    const size_t n = std::min(one.size(), two.size());
    double worst = 0, early = 0;
    const size_t first = std::min<size_t>(n, 50);
    for (size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::fabs(one[i] - two[i]));
      if (i < first) early = std::max(early, worst);
    }
    linef(
        "A small CoLA model (d = 128, r = 32, 2 blocks) trained {} steps on Debian's license "
        "texts, byte-level, with the same seed and data order: the curves coincide. The "
        "largest difference is **{:.1e}** nats over the first {} steps and {:.1e} over all "
        "(final loss {:.4f} on one rank, {:.4f} at TP 2): the ranks sum in another order, and "
        "fp32 rounding differences grow slowly with the steps. {}",
        n, early, first, worst, one[n - 1], two[n - 1], paper("claims.loss_curves"));
    std::vector<double> x;
    Series a{"TP 1", {}, {}, {}}, b{"btp, TP 2", {}, {}, {}};
    for (size_t i = 0; i < n; ++i) {
      x.push_back(double(i + 1));
      a.value.push_back(one[i]);
      b.value.push_back(two[i]);
    }
    draw_lines("Training loss: btp at TP 2 over one rank", "step", "loss (nats)", x, {a, b}, out_,
               "loss");
    line();
  }

  const PaperResults& r_;
  const PaperFigures& paper_;
  fs::path out_;
  std::string md_;
};

// Records as a JSON list, each as its bench prints it (results.h).
template <typename Row>
json rows_json(const std::vector<Row>& rows) {
  json list = json::array();
  for (const Row& row : rows) list.push_back(json(to_json(row)));
  return list;
}

}  // namespace

void write_paper_report(const PaperResults& r, const fs::path& out) {
  const PaperFigures paper = PaperFigures::built_in();
  const std::string md = Report(r, paper, out).write();
  // Each file whole or not at all (io/atomic_output.h).
  write_file_atomically((out / "report.md").string(), md);
  json all{{"scale", r.scale},           {"machine", r.machine},
           {"settings", r.settings},     {"memory_limit", r.memory_limit},
           {"fits", rows_json(r.fits)},  {"norm", rows_json(r.norm)},
           {"torch", rows_json(r.torch)}};
  for (const auto& [t, rows] : r.tp) all["tp"][std::to_string(t)] = rows_json(rows);
  for (const auto& [b, rows] : r.batch) all["batch"][std::to_string(b)] = rows_json(rows);
  for (const auto& [k, rows] : r.kinds) all["kinds"][k] = rows_json(rows);
  for (const auto& [b, rows] : r.grouping) all["grouping"][std::to_string(b)] = rows_json(rows);
  for (const auto& [t, losses] : r.loss) all["loss"][std::to_string(t)] = losses;
  if (!r.predicted.is_null()) all["predicted"] = r.predicted;
  for (const EmulatedRow& row : r.emulated) all["emulated"].push_back(to_json(row));
  // The paper's figures the report quoted, as read from the file and as printed.
  all["paper"] = {{"file", paper.file_name()}, {"quoted", paper.quoted()}};
  write_file_atomically((out / "results.json").string(), all.dump(1) + "\n");
}

}  // namespace bottle
