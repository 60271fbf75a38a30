#include "bench/results.h"

#include <limits>
#include <type_traits>

#include "core/error.h"
#include "parallel/tp_layouts.h"

namespace bottle {
namespace {

using json = nlohmann::json;
using ordered = nlohmann::ordered_json;

// Reads the keys of one row, failing with the row's source and the key it lacks; `Json`: json,
// or ordered_json for a row that kept its keys' order.
template <typename Json>
class BasicRowReader {
 public:
  BasicRowReader(const Json& j, const std::string& what) : j_(j), what_(what) {
    BOTTLE_CHECK(j.is_object(), "{}: a result row is not a JSON object: {}", what, j.dump());
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  const Json& at(const std::string& key) const {
    BOTTLE_CHECK(j_.contains(key), "{}: the result row has no key '{}'", what_, key);
    return j_[key];
  }
  // JSON writes a NaN as null: read back as NaN, so that a row survives the round trip.
  double number(const std::string& key) const {
    const Json& v = at(key);
    if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
    BOTTLE_CHECK(v.is_number(), "{}: key '{}' is not a number: {}", what_, key, v.dump());
    return v.template get<double>();
  }
  template <typename Int>
  Int integer(const std::string& key) const {
    const Json& v = at(key);
    BOTTLE_CHECK(
        v.is_number_integer() && (!std::is_unsigned_v<Int> || v.template get<int64_t>() >= 0),
        "{}: key '{}' is not a whole number{}: {}", what_, key,
        std::is_unsigned_v<Int> ? " ≥ 0" : "", v.dump());
    return v.template get<Int>();
  }
  std::string text(const std::string& key) const {
    const Json& v = at(key);
    BOTTLE_CHECK(v.is_string(), "{}: key '{}' is not a string: {}", what_, key, v.dump());
    return v.template get<std::string>();
  }
  bool flag(const std::string& key) const {
    const Json& v = at(key);
    BOTTLE_CHECK(v.is_boolean(), "{}: key '{}' is not true or false: {}", what_, key, v.dump());
    return v.template get<bool>();
  }
  // A median under `key` with its `key`_min and `key`_max.
  Spread spread(const std::string& key) const {
    return {number(key), number(key + "_min"), number(key + "_max")};
  }
  const std::string& what() const { return what_; }
  std::map<std::string, double> numbers(const std::string& key) const {
    const Json& v = at(key);
    BOTTLE_CHECK(v.is_object(), "{}: key '{}' is not an object: {}", what_, key, v.dump());
    std::map<std::string, double> out;
    for (const auto& [name, value] : v.items())
      out[name] = BasicRowReader(v, what_ + " '" + key + "'").number(name);
    return out;
  }

 private:
  const Json& j_;
  std::string what_;
};
using RowReader = BasicRowReader<json>;

void add_min_max(ordered& j, const std::string& key, const Spread& s) {
  j[key + "_min"] = s.min;
  j[key + "_max"] = s.max;
}

}  // namespace

const TpComponentTimes& TpRow::component(const std::string& name) const {
  for (const TpComponentTimes& c : components)
    if (c.name == name) return c;
  fail("bench tp row '{}' has no key '{}_compute_ms' (it ran without --components)", variant, name);
}

ordered to_json(const TpRow& r) {
  ordered j{{"mode", r.mode},
            {"variant", r.variant},
            {"grouping", r.grouping},
            {"model", r.model},
            {"tp", r.tp},
            {"recompute", r.recompute},
            {"tp_overlap", r.tp_overlap},
            {"tp_backward", r.tp_backward},
            {"precision", r.precision},
            {"fwd_elems_per_block", r.fwd_elems_per_block},
            {"bwd_elems_per_block", r.bwd_elems_per_block},
            {"fwd_elems_per_token_block", r.fwd_elems_per_token_block},
            {"bwd_elems_per_token_block", r.bwd_elems_per_token_block},
            {"fwd_bytes_per_token_block", r.fwd_bytes_per_token_block},
            {"bwd_bytes_per_token_block", r.bwd_bytes_per_token_block},
            {"collectives_per_block", r.collectives_per_block},
            {"bwd_collectives_per_block", r.bwd_collectives_per_block},
            {"recompute_collectives", r.recompute_collectives},
            {"optimizer_elements", r.optimizer_elements},
            {"optimizer_collectives", r.optimizer_collectives},
            {"optimizer_share", r.optimizer_share},
            {"recompute_elems_per_block", r.recompute_elems_per_block},
            {"fwd_comm_ms_per_block", r.fwd_comm_ms_per_block},
            {"bwd_comm_ms_per_block", r.bwd_comm_ms_per_block},
            {"comm_ms", r.comm_ms.median},
            {"comm_exposed_ms", r.comm_exposed_ms},
            {"compute_ms", r.compute_ms},
            {"iter_ms", r.iter_ms.median},
            {"recompute_ms", r.recompute_ms.median},
            {"tokens_per_s", r.tokens_per_s},
            {"peak_bytes", r.peak_bytes},
            {"weights_bytes", r.weights_bytes},
            {"gradients_bytes", r.gradients_bytes},
            {"optimizer_bytes", r.optimizer_bytes},
            {"activation_bytes", r.activation_bytes},
            {"buffer_bytes", r.buffer_bytes},
            {"saved_mb", r.saved_mb},
            {"extra_ms", r.extra_ms},
            {"saved_mb_per_ms", r.saved_mb_per_ms}};
  ordered ranks;
  for (size_t tag = 0; tag < size_t(MemoryTag::count); ++tag)
    for (size_t bytes : r.memory_per_rank[tag])
      ranks[memory_tag_name(MemoryTag(tag))].push_back(bytes);
  j["memory_per_rank"] = ranks;
  add_min_max(j, "iter_ms", r.iter_ms);
  add_min_max(j, "comm_ms", r.comm_ms);
  add_min_max(j, "recompute_ms", r.recompute_ms);
  j["block_comm_ms_per_pass"] = r.block_comm_ms_per_pass.median;
  add_min_max(j, "block_comm_ms_per_pass", r.block_comm_ms_per_pass);
  for (const TpComponentTimes& c : r.components) {
    j[c.name + "_compute_ms"] = c.compute_ms.median;
    add_min_max(j, c.name + "_compute_ms", c.compute_ms);
    j[c.name + "_comm_ms"] = c.comm_ms.median;
    add_min_max(j, c.name + "_comm_ms", c.comm_ms);
  }
  if (r.comm_ms_by_site) {
    j["comm_ms_by_site"] = *r.comm_ms_by_site;
    // What the step waited for at each site; comm_ms_by_site minus it was hidden behind
    // computation (started calls, Communicator::start_*).
    j["comm_exposed_ms_by_site"] =
        r.comm_exposed_ms_by_site.value_or(std::map<std::string, double>{});
  }
  return j;
}

TpRow tp_row_from_json(const json& j, const std::string& what) {
  const RowReader in(j, what);
  TpRow r;
  r.mode = in.text("mode");
  r.variant = in.text("variant");
  r.grouping = in.flag("grouping");
  r.model = in.text("model");
  r.tp = in.integer<int>("tp");
  r.recompute = in.text("recompute");
  r.tp_overlap = in.flag("tp_overlap");
  r.tp_backward = in.text("tp_backward");
  r.precision = in.text("precision");
  r.fwd_elems_per_block = in.number("fwd_elems_per_block");
  r.bwd_elems_per_block = in.number("bwd_elems_per_block");
  r.fwd_elems_per_token_block = in.number("fwd_elems_per_token_block");
  r.bwd_elems_per_token_block = in.number("bwd_elems_per_token_block");
  r.fwd_bytes_per_token_block = in.number("fwd_bytes_per_token_block");
  r.bwd_bytes_per_token_block = in.number("bwd_bytes_per_token_block");
  r.collectives_per_block = in.number("collectives_per_block");
  r.bwd_collectives_per_block = in.number("bwd_collectives_per_block");
  r.recompute_collectives = in.number("recompute_collectives");
  r.optimizer_elements = in.number("optimizer_elements");
  r.optimizer_collectives = in.number("optimizer_collectives");
  r.optimizer_share = in.number("optimizer_share");
  r.recompute_elems_per_block = in.number("recompute_elems_per_block");
  r.fwd_comm_ms_per_block = in.number("fwd_comm_ms_per_block");
  r.bwd_comm_ms_per_block = in.number("bwd_comm_ms_per_block");
  r.comm_exposed_ms = in.number("comm_exposed_ms");
  r.compute_ms = in.number("compute_ms");
  r.tokens_per_s = in.number("tokens_per_s");
  r.peak_bytes = in.integer<size_t>("peak_bytes");
  r.weights_bytes = in.integer<size_t>("weights_bytes");
  r.gradients_bytes = in.integer<size_t>("gradients_bytes");
  r.optimizer_bytes = in.integer<size_t>("optimizer_bytes");
  r.activation_bytes = in.integer<size_t>("activation_bytes");
  r.buffer_bytes = in.integer<size_t>("buffer_bytes");
  r.saved_mb = in.number("saved_mb");
  r.extra_ms = in.number("extra_ms");
  r.saved_mb_per_ms = in.number("saved_mb_per_ms");
  const RowReader ranks(in.at("memory_per_rank"), what + " 'memory_per_rank'");
  for (size_t tag = 0; tag < size_t(MemoryTag::count); ++tag) {
    const std::string name = memory_tag_name(MemoryTag(tag));
    const json& bytes = ranks.at(name);
    BOTTLE_CHECK(bytes.is_array(), "{}: memory_per_rank '{}' is not a list", what, name);
    for (const json& b : bytes) {
      BOTTLE_CHECK(b.is_number_unsigned(), "{}: memory_per_rank '{}' holds {}", what, name,
                   b.dump());
      r.memory_per_rank[tag].push_back(b.get<size_t>());
    }
  }
  r.iter_ms = in.spread("iter_ms");
  r.comm_ms = in.spread("comm_ms");
  r.recompute_ms = in.spread("recompute_ms");
  r.block_comm_ms_per_pass = in.spread("block_comm_ms_per_pass");
  // A component's keys are there with --components, all six of them or none.
  if (const TpLayout* layout = find_tp_layout(r.mode))
    for (const TpComponent& c : layout->components())
      if (in.has(std::string(c.name) + "_compute_ms"))
        r.components.push_back({c.name, in.spread(std::string(c.name) + "_compute_ms"),
                                in.spread(std::string(c.name) + "_comm_ms")});
  if (in.has("comm_ms_by_site")) {
    r.comm_ms_by_site = in.numbers("comm_ms_by_site");
    r.comm_exposed_ms_by_site = in.numbers("comm_exposed_ms_by_site");
  }
  return r;
}

ordered to_json(const FitRow& r) {
  return {{"fit_limit_bytes", r.fit_limit_bytes},
          {"mode", r.mode},
          {"recompute", r.recompute},
          {"tp", r.tp},
          {"seq_len", r.seq_len},
          {"max_micro_batch", r.max_micro_batch},
          {"tried_up_to", r.tried_up_to},
          {"weights_bytes", r.weights_bytes},
          {"gradients_bytes", r.gradients_bytes},
          {"optimizer_bytes", r.optimizer_bytes},
          {"activation_and_buffer_bytes", r.activation_and_buffer_bytes},
          {"total_bytes", r.total_bytes}};
}

FitRow fit_row_from_json(const json& j, const std::string& what) {
  const RowReader in(j, what);
  FitRow r;
  r.fit_limit_bytes = in.integer<int64_t>("fit_limit_bytes");
  r.mode = in.text("mode");
  r.recompute = in.text("recompute");
  r.tp = in.integer<int64_t>("tp");
  r.seq_len = in.integer<int64_t>("seq_len");
  r.max_micro_batch = in.integer<int64_t>("max_micro_batch");
  r.tried_up_to = in.integer<int64_t>("tried_up_to");
  r.weights_bytes = in.integer<size_t>("weights_bytes");
  r.gradients_bytes = in.integer<size_t>("gradients_bytes");
  r.optimizer_bytes = in.integer<size_t>("optimizer_bytes");
  r.activation_and_buffer_bytes = in.integer<size_t>("activation_and_buffer_bytes");
  r.total_bytes = in.integer<size_t>("total_bytes");
  return r;
}

ordered to_json(const NormRow& r) {
  return {{"tp", r.tp},
          {"rows", r.rows},
          {"hidden", r.hidden},
          {"rank", r.rank},
          {"backend", r.backend},
          {"max_abs_diff", r.max_abs_diff},
          {"mean_abs_diff", r.mean_abs_diff},
          {"bwd_max_abs_diff", r.bwd_max_abs_diff},
          {"bwd_mean_abs_diff", r.bwd_mean_abs_diff}};
}

NormRow norm_row_from_json(const json& j, const std::string& what) {
  const RowReader in(j, what);
  NormRow r;
  r.tp = in.integer<int>("tp");
  r.rows = in.integer<int64_t>("rows");
  r.hidden = in.integer<int64_t>("hidden");
  r.rank = in.integer<int64_t>("rank");
  r.backend = in.text("backend");
  r.max_abs_diff = in.number("max_abs_diff");
  r.mean_abs_diff = in.number("mean_abs_diff");
  r.bwd_max_abs_diff = in.number("bwd_max_abs_diff");
  r.bwd_mean_abs_diff = in.number("bwd_mean_abs_diff");
  return r;
}

ordered to_json(const StepRow& r) {
  ordered j{{"kind", r.kind},
            {"precision", r.precision},
            {"backend", r.backend},
            {"optimizer", r.optimizer},
            {"optimizer_ms_per_step", r.optimizer_ms.median},
            {"optimizer_ms_min", r.optimizer_ms.min},
            {"optimizer_ms_max", r.optimizer_ms.max},
            {"rank", r.rank},
            {"params", r.params},
            {"ms_per_step", r.ms.median},
            {"ms_min", r.ms.min},
            {"ms_max", r.ms.max},
            {"tokens_per_s", r.tokens_per_s},
            {"gflops", r.gflops},
            {"mfu", r.mfu ? ordered(*r.mfu) : ordered(nullptr)},
            {"gemm_peak_gflops", r.gemm_peak_gflops}};
  if (r.nominal) {
    j["mfu_nominal"] = r.nominal->mfu;
    j["nominal_peak_tflops"] = r.nominal->peak_tflops;
  }
  if (r.device) j["device"] = *r.device;
  j["attention"] = r.attention;
  j["cpu"] = r.cpu;
  j["onednn_isa"] = r.onednn_isa;
  if (r.host_waits_per_step) j["host_waits_per_step"] = *r.host_waits_per_step;
  j["loss"] = r.loss;
  j["grad_norm"] = r.grad_norm;
  j["lr"] = r.lr;
  j["peak_bytes"] = r.peak_bytes;
  if (r.bf16_gemm_path) j["bf16_gemm_path"] = *r.bf16_gemm_path;
  if (r.speedup_vs_full_rank) j["speedup_vs_full_rank"] = *r.speedup_vs_full_rank;
  if (r.step_vs_adamw) j["step_vs_adamw"] = *r.step_vs_adamw;
  if (r.speedup_vs_precision)
    j["speedup_vs_" + r.speedup_vs_precision->first] = r.speedup_vs_precision->second;
  if (r.torch_error) j["torch_error"] = *r.torch_error;
  if (const auto& p = r.peer) {
    j["torch_ms_per_step"] = p->ms.median;
    add_min_max(j, "torch_ms", p->ms);
    j["torch_version"] = p->version;
    j["torch_blas_core"] = p->blas_core;
    j["torch_blas_core_source"] = p->blas_core_source;
    j["torch_blas_core_pinned"] = p->blas_core_pinned;
    if (p->blas_fallback) j["torch_blas_fallback"] = *p->blas_fallback;
    j["torch_first_loss"] = p->first_loss;
    j["torch_first_grad_norm"] = p->first_grad_norm;
    j["first_loss"] = p->bottle_first_loss;
    j["first_grad_norm"] = p->bottle_first_grad_norm;
    j["torch_device"] = p->device;
    j["torch_dtype"] = p->dtype;
    j["torch_attention"] = p->attention;
    if (p->gpu) j["torch_gpu"] = *p->gpu;
    j["speedup_vs_torch"] = p->speedup_vs_torch;
  }
  if (r.compiled) {
    j["torch_compile_ms_per_step"] = r.compiled->ms.median;
    add_min_max(j, "torch_compile_ms", r.compiled->ms);
    j["speedup_vs_torch_compile"] = r.compiled->speedup;
  }
  if (const auto& f = r.compile_failure) {
    if (f->raised) j["torch_compile_error"] = f->error;
    j["torch_compile_failed"] = true;
    j["torch_compile_error"] = f->error;
  }
  if (const auto& p = r.profile) {
    j["ops_per_step"] = p->ops_per_step;
    j["kernel_ms_per_step"] = p->kernel_ms_per_step;
    j["attention_ms_per_step"] = p->attention_ms_per_step;
    ordered ops = ordered::object();
    for (const auto& [name, t] : p->ops) ops[name] = {{"calls", t.calls}, {"ms", t.ms}};
    j["profile"] = std::move(ops);
  }
  return j;
}

namespace {

// The peer's columns come together: torch_ms_per_step names them all.
template <typename Json>
StepRow::Peer step_peer_from_json(const BasicRowReader<Json>& in) {
  StepRow::Peer p;
  p.ms = {in.number("torch_ms_per_step"), in.number("torch_ms_min"), in.number("torch_ms_max")};
  p.version = in.text("torch_version");
  p.blas_core = in.text("torch_blas_core");
  p.blas_core_source = in.text("torch_blas_core_source");
  p.blas_core_pinned = in.text("torch_blas_core_pinned");
  if (in.has("torch_blas_fallback")) p.blas_fallback = in.text("torch_blas_fallback");
  p.first_loss = in.number("torch_first_loss");
  p.first_grad_norm = in.number("torch_first_grad_norm");
  p.bottle_first_loss = in.number("first_loss");
  p.bottle_first_grad_norm = in.number("first_grad_norm");
  p.device = in.text("torch_device");
  p.dtype = in.text("torch_dtype");
  p.attention = in.text("torch_attention");
  if (in.has("torch_gpu")) p.gpu = in.text("torch_gpu");
  p.speedup_vs_torch = in.number("speedup_vs_torch");
  return p;
}

// --torch-compile's columns and --profile's, where the row has them.
template <typename Json>
void step_extras_from_json(const Json& j, const BasicRowReader<Json>& in, StepRow& r) {
  if (in.has("torch_compile_ms_per_step"))
    r.compiled =
        StepRow::Compiled{{in.number("torch_compile_ms_per_step"),
                           in.number("torch_compile_ms_min"), in.number("torch_compile_ms_max")},
                          in.number("speedup_vs_torch_compile")};
  if (in.has("torch_compile_failed")) {
    BOTTLE_CHECK(in.flag("torch_compile_failed"), "{}: key 'torch_compile_failed' is false",
                 in.what());
    StepRow::CompileFailure f{in.text("torch_compile_error")};
    // Only an ordered row knows which key came first (an unordered one sorts them).
    if constexpr (std::is_same_v<Json, ordered>)
      for (const auto& [key, value] : j.items())
        if (key == "torch_compile_error" || key == "torch_compile_failed") {
          f.raised = key == "torch_compile_error";
          break;
        }
    r.compile_failure = f;
  }
  if (in.has("profile")) {
    StepRow::Profile p;
    p.ops_per_step = in.number("ops_per_step");
    p.kernel_ms_per_step = in.number("kernel_ms_per_step");
    p.attention_ms_per_step = in.number("attention_ms_per_step");
    const Json& ops = in.at("profile");
    BOTTLE_CHECK(ops.is_object(), "{}: key 'profile' is not an object: {}", in.what(), ops.dump());
    for (const auto& [name, t] : ops.items()) {
      const BasicRowReader<Json> op(t, in.what() + " 'profile' '" + name + "'");
      p.ops[name] = {op.number("calls"), op.number("ms")};
    }
    r.profile = std::move(p);
  }
}

template <typename Json>
StepRow step_row_from(const Json& j, const std::string& what) {
  const BasicRowReader<Json> in(j, what);
  StepRow r;
  r.kind = in.text("kind");
  r.precision = in.text("precision");
  r.backend = in.text("backend");
  r.optimizer = in.text("optimizer");
  r.optimizer_ms = {in.number("optimizer_ms_per_step"), in.number("optimizer_ms_min"),
                    in.number("optimizer_ms_max")};
  if (in.has("step_vs_adamw")) r.step_vs_adamw = in.number("step_vs_adamw");
  r.rank = in.template integer<int64_t>("rank");
  r.params = in.template integer<int64_t>("params");
  r.ms = {in.number("ms_per_step"), in.number("ms_min"), in.number("ms_max")};
  r.tokens_per_s = in.number("tokens_per_s");
  r.gflops = in.number("gflops");
  if (!in.at("mfu").is_null()) r.mfu = in.number("mfu");
  r.gemm_peak_gflops = in.number("gemm_peak_gflops");
  if (in.has("nominal_peak_tflops"))
    r.nominal = StepRow::Nominal{in.number("mfu_nominal"), in.number("nominal_peak_tflops")};
  if (in.has("device")) r.device = in.text("device");
  r.attention = in.text("attention");
  r.cpu = in.text("cpu");
  r.onednn_isa = in.text("onednn_isa");
  if (in.has("host_waits_per_step")) r.host_waits_per_step = in.number("host_waits_per_step");
  r.loss = in.number("loss");
  r.grad_norm = in.number("grad_norm");
  r.lr = in.number("lr");
  r.peak_bytes = in.template integer<size_t>("peak_bytes");
  if (in.has("bf16_gemm_path")) r.bf16_gemm_path = in.text("bf16_gemm_path");
  if (in.has("speedup_vs_full_rank")) r.speedup_vs_full_rank = in.number("speedup_vs_full_rank");
  for (const char* other : {"fp32", "bf16"})
    if (in.has(std::string("speedup_vs_") + other))
      r.speedup_vs_precision = {other, in.number(std::string("speedup_vs_") + other)};
  if (in.has("torch_error")) r.torch_error = in.text("torch_error");
  if (in.has("torch_ms_per_step")) r.peer = step_peer_from_json(in);
  step_extras_from_json(j, in, r);
  return r;
}

}  // namespace

StepRow step_row_from_json(const json& j, const std::string& what) {
  return step_row_from(j, what);
}

StepRow step_row_from_json(const ordered& j, const std::string& what) {
  return step_row_from(j, what);
}

}  // namespace bottle
