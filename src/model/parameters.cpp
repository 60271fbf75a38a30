#include "model/parameters.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "sys/host_parallel.h"

namespace bottle {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t hash_name(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL ^ splitmix64(seed);  // FNV-1a over the name
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  return splitmix64(h);
}

float counter_normal(uint64_t key, uint64_t index) {
  // Box–Muller on two uniforms in (0, 1] drawn from the counter.
  const uint64_t a = splitmix64(key ^ splitmix64(2 * index));
  const uint64_t b = splitmix64(key ^ splitmix64(2 * index + 1));
  const double u1 = (double(a >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = double(b >> 11) * 0x1.0p-53;
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

int64_t ParamSpec::global_index(int64_t local) const { return global_index(local, shard_offset); }

int64_t ParamSpec::global_index(int64_t local, int64_t offset) const {
  if (shard_dim < 0) return local;
  // Row-major: split the index into (outer, along, inner) around shard_dim.
  int64_t inner = 1;
  for (int i = shard_dim + 1; i < shape.rank; ++i) inner *= shape[i];
  const int64_t along = shape[shard_dim];
  const int64_t outer_index = local / (along * inner), rest = local % (along * inner);
  const int64_t a = rest / inner, in = rest % inner;
  return (outer_index * full_shape[shard_dim] + offset + a) * inner + in;
}

void ParameterStore::begin_unit(int64_t align, bool kept) {
  BOTTLE_CHECK(!values_.data, "a parameter unit begun after allocation");
  // Where declare() puts the next parameter, moved up to a multiple of `align` too.
  const int64_t step = std::lcm<int64_t>(128, std::max<int64_t>(1, align));
  count_ = align > 1 ? (count_ + step - 1) / step * step : count_;
  const int64_t begin = (count_ + 127) / 128 * 128;
  if (!units_.empty() && units_.back().begin == begin) units_.pop_back();  // an empty unit
  units_.push_back({.begin = begin, .kept = kept});
}

void ParameterStore::declare(ParamSpec spec) {
  BOTTLE_CHECK(!values_.data, "parameter '{}' declared after allocation", spec.name);
  BOTTLE_CHECK(!index_.count(spec.name), "parameter '{}' declared twice", spec.name);
  if (spec.full_shape.rank == 0) spec.full_shape = spec.shape;
  // Each parameter starts on a multiple of 128 elements of the flat buffer: 256 bytes in the
  // bf16 compute copy (512 in fp32), the alignment of the arenas, which cuBLASLt's fastest
  // GEMM kernels ask of every operand.
  spec.offset = (count_ + 127) / 128 * 128;
  count_ = spec.offset + spec.shape.numel();
  index_[spec.name] = specs_.size();
  specs_.push_back(std::move(spec));
}

void ParameterStore::allocate(Backend& memory, const ParamSharding& sharding, bool reserve_only,
                              DType compute) {
  BOTTLE_CHECK(compute == DType::f32 || compute == DType::bf16,
               "parameters: compute dtype {} (f32 or bf16)", dtype_name(compute));
  BOTTLE_ASSERT(!sharding.value_slots || sharding.grad_slots,
                "parameters: values in slots without gradients in slots");
  backend_ = &memory;
  value_arena_ = std::make_unique<Arena>(MemoryTag::weights, memory, reserve_only);
  grad_arena_ = std::make_unique<Arena>(MemoryTag::gradients, memory, reserve_only);
  const int64_t multiple = sharding.ranks;
  padded_ = (count_ + multiple - 1) / multiple * multiple;
  // The units tile the buffer: each ends where the next begins, the last at the padded end.
  if (units_.empty() || units_.front().begin != 0) units_.insert(units_.begin(), ParamUnit{});
  for (size_t u = 0; u < units_.size(); ++u)
    units_[u].end = u + 1 < units_.size() ? units_[u + 1].begin : padded_;
  grad_slots_ = sharding.grad_slots;
  value_slots_ = sharding.value_slots;
  compute_dtype_ = compute;
  // Per parity, the largest unit that is not kept; the kept ones end to end.
  int64_t largest[2] = {0, 0}, kept = 0;
  if (grad_slots_) {
    for (size_t u = 0; u < units_.size(); ++u) {
      ParamUnit& unit = units_[u];
      BOTTLE_ASSERT(unit.count() % multiple == 0,
                    "parameter unit [{}, {}) is not a multiple of {} elements", unit.begin,
                    unit.end, multiple);
      if (unit.kept) {
        unit.kept_offset = kept;
        kept += unit.count();
      } else {
        largest[u % 2] = std::max(largest[u % 2], unit.count());
      }
    }
  }
  if (!grad_slots_) {
    grads_ = grad_arena_->alloc({padded_});
  } else {
    for (int p = 0; p < 2; ++p)
      if (largest[p]) grad_slot_[p] = grad_arena_->alloc({largest[p]});
    if (kept) kept_grads_ = grad_arena_->alloc({kept});
  }
  if (compute != DType::f32)
    compute_arena_ = std::make_unique<Arena>(MemoryTag::weights, memory, reserve_only);
  if (!value_slots_) {
    values_ = value_arena_->alloc({padded_});
    compute_ = compute_arena_ ? compute_arena_->alloc({padded_}, compute) : values_;
    return;
  }
  // ZeRO-3: the shard of the masters, the slots the units are gathered into, the kept units.
  std::vector<ElementRange> ranges;
  for (const ParamUnit& u : units_) ranges.push_back({u.begin, u.count()});
  values_shard_ = ShardLayout::cut(ranges, std::max<int64_t>(multiple, sharding.bucket),
                                   int(multiple), sharding.rank);
  values_ = value_arena_->alloc({values_shard_.count});
  for (int p = 0; p < 2; ++p) {
    if (!largest[p]) continue;
    value_slot_[p] = value_arena_->alloc({largest[p]});
    compute_slot_[p] =
        compute_arena_ ? compute_arena_->alloc({largest[p]}, compute) : value_slot_[p];
  }
  if (kept) {
    kept_values_ = value_arena_->alloc({kept});
    kept_compute_ = compute_arena_ ? compute_arena_->alloc({kept}, compute) : kept_values_;
  }
}

void ParameterStore::refresh_compute(Backend& be, int64_t begin, int64_t end) const {
  if (!mixed_precision()) return;
  if (value_slots_) {
    if (!kept_values_.empty()) be.copy(kept_compute_, kept_values_);
    return;
  }
  if (end < 0) end = values_.numel();
  be.copy(compute_.view(begin, {end - begin}), values_.view(begin, {end - begin}));
}

Tensor ParameterStore::unit_values(size_t u) const {
  BOTTLE_ASSERT(value_slots_, "unit values outside ZeRO-3");
  const ParamUnit& unit = units_.at(u);
  if (unit.kept) return kept_values_.view(unit.kept_offset, {unit.count()});
  return value_slot_[u % 2].view(0, {unit.count()});
}

Tensor ParameterStore::unit_compute(size_t u) const {
  BOTTLE_ASSERT(value_slots_, "unit values outside ZeRO-3");
  const ParamUnit& unit = units_.at(u);
  if (unit.kept) return kept_compute_.view(unit.kept_offset, {unit.count()});
  return compute_slot_[u % 2].view(0, {unit.count()});
}

void ParameterStore::set_values(size_t i, const float* host) const {
  const ParamSpec& s = specs_[i];
  if (!value_slots_) {
    backend().from_host(at(i).value, host);
    return;
  }
  // The owned slices of the parameter's range, into the shard.
  const int64_t begin = s.offset, end = s.offset + s.shape.numel();
  for (const ShardPiece& p : values_shard_.pieces) {
    const int64_t lo = std::max(begin, p.begin), hi = std::min(end, p.begin + p.count);
    if (lo < hi)
      backend().from_host(values_.view(p.local + lo - p.begin, {hi - lo}), host + (lo - begin));
  }
  const size_t u = unit_of(s.offset);
  if (units_[u].kept) backend().from_host(at(i).value, host);
}

Tensor ParameterStore::grads() const {
  BOTTLE_ASSERT(!grad_slots_, "the gradients of a ZeRO-2 store are in slots, not one buffer");
  return grads_;
}

size_t ParameterStore::unit_of(int64_t offset) const {
  const auto after = std::upper_bound(units_.begin(), units_.end(), offset,
                                      [](int64_t o, const ParamUnit& u) { return o < u.begin; });
  BOTTLE_ASSERT(after != units_.begin(), "offset {} before the first unit", offset);
  return size_t(after - units_.begin()) - 1;
}

Tensor ParameterStore::unit_grads(size_t u) const {
  const ParamUnit& unit = units_.at(u);
  if (!grad_slots_) return grads_.view(unit.begin, {unit.count()});
  if (unit.kept) return kept_grads_.view(unit.kept_offset, {unit.count()});
  return grad_slot_[u % 2].view(0, {unit.count()});
}

void ParameterStore::zero_grads(Backend& be) const {
  if (!grad_slots_)
    be.fill_zero(grads_);
  else if (!kept_grads_.empty())
    be.fill_zero(kept_grads_);
}

Param ParameterStore::at(size_t i) const {
  const ParamSpec& s = specs_[i];
  Param p;
  if (!grad_slots_) {
    p.value = values_.view(s.offset, s.shape);
    p.grad = grads_.view(s.offset, s.shape);
    p.compute = compute_.view(s.offset, s.shape);
    return p;
  }
  // Views into the unit's slot (or kept buffer), bound once: a slot holds whichever unit of
  // its parity was gathered last, so consumers keep the same pointers all run long.
  const size_t u = unit_of(s.offset);
  const int64_t within = s.offset - units_[u].begin;
  p.grad = unit_grads(u).view(within, s.shape);
  p.value = value_slots_ ? unit_values(u).view(within, s.shape) : values_.view(s.offset, s.shape);
  p.compute =
      value_slots_ ? unit_compute(u).view(within, s.shape) : compute_.view(s.offset, s.shape);
  return p;
}

Param ParameterStore::get(const std::string& name) const {
  auto it = index_.find(name);
  BOTTLE_CHECK(it != index_.end(), "no parameter named '{}'", name);
  return at(it->second);
}

void ParameterStore::initialize(uint64_t seed) {
  BOTTLE_CHECK(!value_arena_->reserve_only(), "initialising parameters that are only planned");
  std::vector<float> host;  // one parameter's slice, drawn on the host and staged in
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    const int64_t n = s.shape.numel();
    host.assign(size_t(n), s.init == ParamInit::ones ? 1.0f : 0.0f);
    if (s.init == ParamInit::normal) {
      const uint64_t key = hash_name(seed, s.name);
      float* v = host.data();
      host_parallel_for(
          n, [&](int64_t j) { v[j] = s.std * counter_normal(key, uint64_t(s.global_index(j))); });
    }
    set_values(i, host.data());
  }
  refresh_compute(backend());
}

}  // namespace bottle
