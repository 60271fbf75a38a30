#include "bench/results.h"

#include <limits>

#include "core/error.h"
#include "parallel/tp_layouts.h"

namespace bottle {
namespace {

using json = nlohmann::json;
using ordered = nlohmann::ordered_json;

// Reads the keys of one row, failing with the row's source and the key it lacks.
class RowReader {
 public:
  RowReader(const json& j, const std::string& what) : j_(j), what_(what) {
    BOTTLE_CHECK(j.is_object(), "{}: a result row is not a JSON object: {}", what, j.dump());
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  const json& at(const std::string& key) const {
    BOTTLE_CHECK(j_.contains(key), "{}: the result row has no key '{}'", what_, key);
    return j_[key];
  }
  // JSON writes a NaN as null: read back as NaN, so that a row survives the round trip.
  double number(const std::string& key) const {
    const json& v = at(key);
    if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
    BOTTLE_CHECK(v.is_number(), "{}: key '{}' is not a number: {}", what_, key, v.dump());
    return v.get<double>();
  }
  template <typename Int>
  Int integer(const std::string& key) const {
    const json& v = at(key);
    BOTTLE_CHECK(v.is_number_integer() && (!std::is_unsigned_v<Int> || v.get<int64_t>() >= 0),
                 "{}: key '{}' is not a whole number{}: {}", what_, key,
                 std::is_unsigned_v<Int> ? " ≥ 0" : "", v.dump());
    return v.get<Int>();
  }
  std::string text(const std::string& key) const {
    const json& v = at(key);
    BOTTLE_CHECK(v.is_string(), "{}: key '{}' is not a string: {}", what_, key, v.dump());
    return v.get<std::string>();
  }
  bool flag(const std::string& key) const {
    const json& v = at(key);
    BOTTLE_CHECK(v.is_boolean(), "{}: key '{}' is not true or false: {}", what_, key, v.dump());
    return v.get<bool>();
  }
  // A median under `key` with its `key`_min and `key`_max.
  Spread spread(const std::string& key) const {
    return {number(key), number(key + "_min"), number(key + "_max")};
  }
  std::map<std::string, double> numbers(const std::string& key) const {
    const json& v = at(key);
    BOTTLE_CHECK(v.is_object(), "{}: key '{}' is not an object: {}", what_, key, v.dump());
    std::map<std::string, double> out;
    for (const auto& [name, value] : v.items())
      out[name] = RowReader(v, what_ + " '" + key + "'").number(name);
    return out;
  }

 private:
  const json& j_;
  std::string what_;
};

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

const json& to_json(const StepRow& r) { return r.json; }

StepRow step_row_from_json(const json& j, const std::string& what) {
  const RowReader in(j, what);
  StepRow r;
  r.kind = in.text("kind");
  r.ms = {in.number("ms_per_step"), in.number("ms_min"), in.number("ms_max")};
  // The peer's columns come together: torch_ms_per_step names them all.
  if (in.has("torch_ms_per_step")) {
    StepRow::Peer p;
    p.ms = {in.number("torch_ms_per_step"), in.number("torch_ms_min"), in.number("torch_ms_max")};
    p.version = in.text("torch_version");
    p.blas_core = in.text("torch_blas_core");
    p.blas_core_source = in.text("torch_blas_core_source");
    p.blas_core_pinned = in.text("torch_blas_core_pinned");
    if (in.has("torch_blas_fallback")) p.blas_fallback = in.text("torch_blas_fallback");
    r.peer = p;
  }
  r.json = j;
  return r;
}

}  // namespace bottle
