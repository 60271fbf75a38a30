#include "train/muon.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace bottle {

namespace {

// out [u, u] = X·Xᵀ (left, u = rows) or Xᵀ·X (u = cols), X [rows, cols] row-major.
void gram(Backend& be, Tensor out, Tensor x, int64_t rows, int64_t cols, bool left) {
  GemmArgs g;
  if (left) {
    g.trans_b = true;
    g.m = rows, g.n = rows, g.k = cols;
    g.ldc = rows;
  } else {
    g.trans_a = true;
    g.m = cols, g.n = cols, g.k = rows;
    g.ldc = cols;
  }
  g.a = x.data, g.lda = cols;
  g.b = x.data, g.ldb = cols;
  g.c = out.data;
  g.dtypes_of(x, x, out);
  be.gemm(g);
}

// What each matrix's buffers take: the constructor's allocations and the memory plan's.
struct Sizes {
  int64_t state = 0, grams = 0, poly = 0, spare = 0, gathered = 0, whole = 0, matrices = 0;
};

Sizes sizes_of(const std::vector<Muon::Matrix>& matrices) {
  Sizes s;
  s.matrices = int64_t(matrices.size());
  for (const Muon::Matrix& m : matrices) {
    s.state += m.count();
    const int64_t u = m.gram_side();
    s.poly = std::max(s.poly, u * u);
    if (m.split == Muon::Split::gather) {
      const int64_t whole = m.full_rows * m.full_cols;
      s.gathered = std::max(s.gathered, whole);
      if (m.shard_dim == 1) s.whole = std::max(s.whole, whole);
      s.spare = std::max(s.spare, whole);
      s.grams = std::max(s.grams, u * u);
    } else {
      s.spare = std::max(s.spare, m.count());
    }
  }
  int64_t grams = 0;
  for (const Muon::Matrix& m : matrices)
    if (m.split != Muon::Split::gather) grams += m.gram_side() * m.gram_side();
  s.grams = std::max(s.grams, grams);
  return s;
}

}  // namespace

bool Muon::Matrix::left_gram() const {
  switch (split) {
    case Split::gram:  // the Gram matrix on the side that is not split
      return shard_dim == 1;
    case Split::gather:  // the reference's: on the smaller side of the whole matrix
      return full_rows <= full_cols;
    case Split::whole:
      break;
  }
  return rows <= cols;
}

int64_t Muon::Matrix::gram_side() const {
  if (split == Split::gather) return left_gram() ? full_rows : full_cols;
  return left_gram() ? rows : cols;
}

double Muon::Matrix::cost() const {
  // The Gram matrix and the update, 2·u²·L each, and the polynomial's u × u product, 2·u³.
  const double u = double(gram_side());
  const double elements = split == Split::gather ? double(full_rows * full_cols) : double(count());
  return 4 * u * elements + 2 * u * u * u;
}

std::vector<Muon::Matrix> Muon::plan(const ParameterStore& params, int tp_size) {
  std::vector<Matrix> gram, whole, gather;
  for (const ParamSpec& spec : params.specs()) {
    if (param_role(spec) != ParamRole::matrix) continue;
    Matrix m;
    m.offset = spec.offset;
    m.rows = spec.shape[0], m.cols = spec.shape[1];
    m.full_rows = spec.full_shape[0], m.full_cols = spec.full_shape[1];
    m.decays = spec.weight_decay;
    if (spec.sharded() && tp_size > 1) {
      m.shard_dim = spec.shard_dim;
      const int64_t split = spec.full_shape[spec.shard_dim],
                    other = spec.full_shape[1 - spec.shard_dim];
      m.split = split > other ? Split::gram : Split::gather;
    }
    (m.split == Split::gram ? gram : m.split == Split::whole ? whole : gather).push_back(m);
  }
  std::vector<Matrix> out = std::move(gram);
  out.insert(out.end(), whole.begin(), whole.end());
  out.insert(out.end(), gather.begin(), gather.end());
  int64_t state = 0;
  for (Matrix& m : out) {
    m.state = state;
    state += m.count();
  }
  return out;
}

std::vector<int> Muon::owners(const std::vector<Matrix>& matrices, int ranks) {
  std::vector<size_t> order(matrices.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return matrices[a].cost() > matrices[b].cost(); });
  std::vector<double> load(size_t(std::max(1, ranks)), 0.0);
  std::vector<int> owner(matrices.size(), 0);
  for (const size_t i : order) {
    const size_t least = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = int(least);
    load[least] += matrices[i].cost();
  }
  return owner;
}

namespace {

// Rank `rank`'s layout from any rank's: the same buckets, each rank's slice `rank` slices in.
ShardLayout layout_of_rank(const ShardLayout& any, int rank) {
  ShardLayout out = any;
  for (ShardPiece& p : out.pieces) p.begin = p.bucket + p.count * rank;
  return out;
}

// The ranks a ZeRO layout cuts its buckets over (1: no ZeRO).
int layout_ranks(const ShardLayout& shard) {
  if (shard.pieces.empty() || shard.owns_all() || shard.count == 0) return 1;
  return int(shard.total / shard.count);
}

// Calls f(matrix index, flat begin, count, shard local) for each stretch of a matrix inside one
// of `layout`'s owned slices, by matrix, then in flat order. The slices lie in flat order from
// the last piece to the first, so each matrix finds its first by bisection.
template <typename F>
void for_each_held(const std::vector<Muon::Matrix>& matrices, const ShardLayout& layout, F f) {
  const std::vector<ShardPiece> pieces(layout.pieces.rbegin(), layout.pieces.rend());
  for (size_t i = 0; i < matrices.size(); ++i) {
    const int64_t lo = matrices[i].offset, hi = lo + matrices[i].count();
    auto p = std::partition_point(pieces.begin(), pieces.end(),
                                  [lo](const ShardPiece& q) { return q.begin + q.count <= lo; });
    for (; p != pieces.end() && p->begin < hi; ++p) {
      const int64_t a = std::max(lo, p->begin), b = std::min(hi, p->begin + p->count);
      if (a < b) f(i, a, b - a, p->local + (a - p->begin));
    }
  }
}

}  // namespace

MuonMemory muon_memory(const ParameterStore& params, int tp_size, const ShardLayout& shard) {
  const std::vector<Muon::Matrix> matrices = Muon::plan(params, tp_size);
  const Sizes s = sizes_of(matrices);
  auto floats = [](int64_t n) { return n ? aligned_size(size_t(n) * sizeof(float)) : 0; };
  const int ranks = layout_ranks(shard);
  size_t state = 0, assembly = 0;
  if (ranks == 1) {
    state = floats(s.state) + 2 * floats(AdamW::moment_elements(params, {}, Muon::adamw_roles()));
  } else {
    // The most any DP rank holds: its slices and moments differ with where the buckets fall.
    const std::vector<int> owner = Muon::owners(matrices, ranks);
    for (int k = 0; k < ranks; ++k) {
      const ShardLayout layout = layout_of_rank(shard, k);
      int64_t held = 0, owned = 0;
      for_each_held(matrices, layout,
                    [&](size_t, int64_t, int64_t count, int64_t) { held += count; });
      for (size_t i = 0; i < matrices.size(); ++i)
        if (owner[i] == k) owned += matrices[i].count();
      state = std::max(state, floats(held) + 2 * floats(AdamW::moment_elements(
                                                     params, layout, Muon::adamw_roles())));
      assembly = std::max(assembly, floats(owned));
    }
  }
  return {.state = state,
          .scratch = assembly + floats(s.grams) + floats(s.poly) + floats(s.spare) +
                     floats(s.gathered) + floats(s.whole) + floats(2 * s.matrices) +
                     floats(s.matrices)};
}

Muon::Muon(const ParameterStore& params, const MuonConfig& config, const AdamWConfig& adamw,
           Communicator* tp, const ShardLayout& shard, Communicator* dp)
    : config_(config),
      adamw_config_(adamw),
      adamw_(params, adamw, shard, adamw_roles()),
      tp_(tp && tp->size() > 1 ? tp : nullptr),
      dp_(dp && dp->size() > 1 && layout_ranks(shard) > 1 ? dp : nullptr),
      matrices_(plan(params, tp_ ? tp_->size() : 1)),
      state_arena_(MemoryTag::optimizer, params.backend()),
      scratch_arena_(MemoryTag::workspace, params.backend()) {
  const Sizes s = sizes_of(matrices_);
  auto floats = [&](Arena& arena, int64_t n, DType dtype = DType::f32) {
    return n ? arena.alloc({n}, dtype) : Tensor{};
  };
  assembled_.assign(matrices_.size(), -1);
  int64_t state = s.state;
  if (dp_) {
    BOTTLE_ASSERT(layout_ranks(shard) == dp_->size(),
                  "Muon: a ZeRO layout over {} ranks for a DP group of {}", layout_ranks(shard),
                  dp_->size());
    owner_ = owners(matrices_, dp_->size());
    const int me = dp_->rank();
    state = 0;
    for_each_held(matrices_, shard, [&](size_t i, int64_t begin, int64_t count, int64_t local) {
      held_.push_back({i, begin, count, local, state});
      state += count;
    });
    int64_t at = 0;
    for (size_t i = 0; i < matrices_.size(); ++i) {
      if (owner_[i] != me) continue;
      assembled_[i] = at;
      owned_.push_back({i, at});
      at += matrices_[i].count();
    }
    // The slices of the owned matrices that other ranks hold. Each sender's arrive in its order
    // (by matrix, then flat); the receives follow it.
    for (int k = 0; k < dp_->size(); ++k) {
      if (k == me) continue;
      for_each_held(matrices_, layout_of_rank(shard, k),
                    [&](size_t i, int64_t begin, int64_t count, int64_t) {
                      if (owner_[i] == me)
                        incoming_.push_back({i, k, begin - matrices_[i].offset, count});
                    });
    }
    std::sort(incoming_.begin(), incoming_.end(), [](const Incoming& a, const Incoming& b) {
      return std::tie(a.index, a.from, a.at) < std::tie(b.index, b.from, b.at);
    });
    assembly_ = floats(scratch_arena_, at);
  }
  momentum_ = floats(state_arena_, state);  // zero, as an arena's memory comes
  grams_ = floats(scratch_arena_, s.grams);
  poly_ = floats(scratch_arena_, s.poly);
  spare_ = floats(scratch_arena_, s.spare);
  gathered_ = floats(scratch_arena_, s.gathered);
  whole_ = floats(scratch_arena_, s.whole);
  norms_ = floats(scratch_arena_, s.matrices, DType::f64);
  norms32_ = floats(scratch_arena_, s.matrices);
}

const std::vector<ParamRole>& Muon::adamw_roles() {
  static const std::vector<ParamRole> roles{ParamRole::embedding, ParamRole::lm_head,
                                            ParamRole::vector};
  return roles;
}

std::vector<FlatSource> Muon::held_state() const {
  std::vector<FlatSource> out = adamw_.held_state();
  FlatSource momentum{"momentum_buffer/", momentum_, {}};
  if (dp_)
    for (const Slice& h : held_)
      momentum.owned.push_back({.begin = h.begin, .count = h.count, .local = h.state});
  else
    for (const Matrix& m : matrices_)
      momentum.owned.push_back({.begin = m.offset, .count = m.count(), .local = m.state});
  // The pieces in flat order, as the other sources hold theirs.
  std::sort(momentum.owned.begin(), momentum.owned.end(),
            [](const ShardPiece& a, const ShardPiece& b) { return a.begin < b.begin; });
  out.push_back(std::move(momentum));
  return out;
}

void Muon::polynomial_step(Backend& be, Tensor x, Tensor gram, int64_t rows, int64_t cols,
                           bool left) {
  const int64_t u = left ? rows : cols;
  // poly [u, u] = b·A + c·A·A, the residual riding in the GEMM's epilogue.
  GemmArgs p;
  p.m = u, p.n = u, p.k = u;
  p.alpha = kNewtonSchulzC, p.beta = kNewtonSchulzB;
  p.a = gram.data, p.lda = u;
  p.b = gram.data, p.ldb = u;
  p.c = poly_.data, p.ldc = u;
  p.c_in = gram.data;
  p.dtypes_of(gram, gram, poly_);
  be.gemm(p);
  // spare [rows, cols] = a·X + poly·X (left) or X·poly, then back into X.
  GemmArgs g;
  g.m = rows, g.n = cols;
  if (left) {
    g.k = rows;
    g.a = poly_.data, g.lda = rows;
    g.b = x.data, g.ldb = cols;
  } else {
    g.k = cols;
    g.a = x.data, g.lda = cols;
    g.b = poly_.data, g.ldb = cols;
  }
  g.beta = kNewtonSchulzA;
  g.c_in = x.data;
  g.c = spare_.data, g.ldc = cols;
  g.dtypes_of(x, x, spare_);
  be.gemm(g);
  be.copy(x, spare_.view(0, {rows * cols}));
}

void Muon::orthogonalise(Backend& be, Tensor base, const std::vector<Placed>& which) {
  // The Gram-split and whole ones (which come first), their Gram matrices end to end, the
  // Gram-split ones' first: those are all-reduced.
  std::vector<Placed> local;
  std::vector<int64_t> gram_at;
  int64_t gram_split = 0, grams = 0, reduced = 0;
  for (const Placed& p : which) {
    const Matrix& m = matrices_[p.index];
    if (m.split == Split::gather) continue;
    local.push_back(p);
    gram_at.push_back(grams);
    grams += m.gram_side() * m.gram_side();
    if (m.split == Split::gram) ++gram_split, reduced = grams;
  }
  const int64_t n = int64_t(local.size());
  auto x_of = [&](const Placed& p) { return base.view(p.at, {matrices_[p.index].count()}); };
  if (n > 0) {
    std::vector<SumRange> ranges;
    for (int64_t i = 0; i < n; ++i)
      ranges.push_back({local[size_t(i)].at, matrices_[local[size_t(i)].index].count(), int(i)});
    be.sum_squares_ranges(norms_.view(0, {n}), base, ranges);
    be.copy(norms32_.view(0, {n}), norms_.view(0, {n}));
    // A Gram-split matrix's squares are spread over the TP group; a whole one's are all here.
    if (tp_ && gram_split)
      tp_->all_reduce(norms32_.view(0, {gram_split}), ReduceOp::sum, "tp.muon_norm");
    for (int64_t i = 0; i < n; ++i)
      be.muon_normalize(x_of(local[size_t(i)]), norms32_.view(i, {1}));
    for (int step = 0; step < config_.ns_steps; ++step) {
      for (int64_t i = 0; i < n; ++i) {
        const Matrix& m = matrices_[local[size_t(i)].index];
        const int64_t u = m.gram_side();
        gram(be, grams_.view(gram_at[size_t(i)], {u * u}), x_of(local[size_t(i)]), m.rows, m.cols,
             m.left_gram());
      }
      if (tp_ && gram_split)
        tp_->all_reduce(grams_.view(0, {reduced}), ReduceOp::sum, "tp.muon_gram");
      for (int64_t i = 0; i < n; ++i) {
        const Matrix& m = matrices_[local[size_t(i)].index];
        const int64_t u = m.gram_side();
        polynomial_step(be, x_of(local[size_t(i)]), grams_.view(gram_at[size_t(i)], {u * u}),
                        m.rows, m.cols, m.left_gram());
      }
    }
  }
  for (const Placed& p : which)
    if (matrices_[p.index].split == Split::gather)
      orthogonalise_gathered(be, matrices_[p.index], x_of(p));
}

void Muon::orthogonalise_gathered(Backend& be, const Matrix& m, Tensor x) {
  const int t = tp_->size(), r = tp_->rank();
  const int64_t count = m.count(), whole_count = m.full_rows * m.full_cols;
  // gathered [t, count]: the ranks' slices one after another, which is the whole matrix when
  // it is split by rows; a column split is put together in whole_.
  const Tensor gathered = gathered_.view(0, {whole_count});
  tp_->all_gather(gathered, x, "tp.muon_gather");
  Tensor whole = gathered;
  if (m.shard_dim == 1) {
    whole = whole_.view(0, {m.full_rows, m.full_cols});
    for (int k = 0; k < t; ++k)
      be.copy_columns(whole, k * m.cols, gathered.view(k * count, {m.rows, m.cols}), 0, m.cols);
    whole = whole.view(0, {whole_count});
  }
  const SumRange all{0, whole_count, 0};
  be.sum_squares_ranges(norms_.view(0, {1}), whole, std::span(&all, 1));
  be.copy(norms32_.view(0, {1}), norms_.view(0, {1}));
  be.muon_normalize(whole, norms32_.view(0, {1}));
  const int64_t u = m.gram_side();
  const bool left = m.left_gram();
  for (int step = 0; step < config_.ns_steps; ++step) {
    gram(be, grams_.view(0, {u * u}), whole, m.full_rows, m.full_cols, left);
    polynomial_step(be, whole, grams_.view(0, {u * u}), m.full_rows, m.full_cols, left);
  }
  // This rank's slice of X, back in place of its U.
  if (m.shard_dim == 0)
    be.copy(x, whole.view(r * count, {count}));
  else
    be.copy_columns(x.view(0, {m.rows, m.cols}), 0, whole.view(0, {m.full_rows, m.full_cols}),
                    r * m.cols, m.cols);
}

// A slice's gradient (then its U, then its X) lies where this rank's reduced gradients are: the
// flat buffer under ZeRO-1, the gradient shard under ZeRO-2 and 3.
Tensor Muon::slice_grads(const ParameterStore& params, Tensor grad_shard, const Slice& h) {
  return grad_shard.empty() ? params.grads().view(h.begin, {h.count})
                            : grad_shard.view(h.local, {h.count});
}

void Muon::exchange(Backend& be, const ParameterStore& params, Tensor grad_shard, bool back) {
  const int me = dp_->rank();
  auto held = [&](const Slice& h) { return slice_grads(params, grad_shard, h); };
  auto in_assembly = [&](size_t index, int64_t at, int64_t count) {
    return assembly_.view(assembled_[index] + at, {count});
  };
  // Tags tell the matrices apart; one sender's slices of a matrix arrive in its order.
  auto tag = [](size_t index) { return int(index % 30000); };
  const char* site = back ? "dp.muon_scatter" : "dp.muon_gather";
  if (!back) {
    for (const Slice& h : held_) {
      const Matrix& m = matrices_[h.index];
      if (owner_[h.index] == me)
        be.copy(in_assembly(h.index, h.begin - m.offset, h.count), held(h));
      else
        dp_->send_async(held(h), owner_[h.index], tag(h.index), site);
    }
    for (const Incoming& in : incoming_)
      dp_->recv(in_assembly(in.index, in.at, in.count), in.from, tag(in.index), site);
  } else {
    for (const Incoming& in : incoming_)
      dp_->send_async(in_assembly(in.index, in.at, in.count), in.from, tag(in.index), site);
    for (const Slice& h : held_) {
      const Matrix& m = matrices_[h.index];
      if (owner_[h.index] == me)
        be.copy(held(h), in_assembly(h.index, h.begin - m.offset, h.count));
      else
        dp_->recv(held(h), owner_[h.index], tag(h.index), site);
    }
  }
  dp_->wait_sends();
}

void Muon::step(Backend& be, const ParameterStore& params, float lr, Tensor control,
                Tensor grad_shard) {
  adamw_.step_at(be, params, lr, control, grad_shard, steps_taken() + 1);
  MuonArgs args;
  args.momentum = config_.momentum;
  args.nesterov = config_.nesterov;
  args.lr = lr;
  auto apply = [&](const Matrix& m, Tensor values, Tensor compute, Tensor x) {
    args.weight_decay = m.decays ? adamw_config_.weight_decay : 0.0f;
    args.adjust = 0.2f * std::sqrt(float(std::max(m.full_rows, m.full_cols)));
    be.muon_apply(values, compute, x, control, args);
  };
  if (!dp_) {
    // U in place of G: the step is the gradients' last reader.
    const Tensor grads = params.grads();
    std::vector<Placed> all;
    for (size_t i = 0; i < matrices_.size(); ++i) {
      const Matrix& m = matrices_[i];
      const Tensor g = grads.view(m.offset, {m.count()});
      be.muon_momentum(g, momentum_.view(m.state, {m.count()}), g, control, args);
      all.push_back({i, m.offset});
    }
    orthogonalise(be, grads, all);
    for (const Matrix& m : matrices_) {
      const Shape range{m.count()};
      apply(m, params.values().view(m.offset, range),
            params.mixed_precision() ? params.compute_values().view(m.offset, range) : Tensor{},
            grads.view(m.offset, range));
    }
    return;
  }
  // ZeRO: the momentum of the owned slices, U to the owners, Newton–Schulz there, X back, and
  // each rank's update of its slices (ZeRO-3: of its shard of the masters; the compute copies
  // are cast where the units are gathered).
  auto held = [&](const Slice& h) { return slice_grads(params, grad_shard, h); };
  for (const Slice& h : held_)
    be.muon_momentum(held(h), momentum_.view(h.state, {h.count}), held(h), control, args);
  exchange(be, params, grad_shard, /*back=*/false);
  orthogonalise(be, assembly_, owned_);
  exchange(be, params, grad_shard, /*back=*/true);
  const bool sharded = params.value_slots();
  for (const Slice& h : held_) {
    const Shape range{h.count};
    apply(matrices_[h.index], params.values().view(sharded ? h.local : h.begin, range),
          params.mixed_precision() && !sharded ? params.compute_values().view(h.begin, range)
                                               : Tensor{},
          held(h));
  }
}

}  // namespace bottle
