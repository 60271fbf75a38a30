#include "train/muon.h"

#include <algorithm>
#include <cmath>

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
  int64_t state = 0, grams = 0;
  for (Matrix& m : out) {
    m.state = state;
    state += m.count();
    if (m.split == Split::gather) continue;
    m.gram = grams;
    grams += m.gram_side() * m.gram_side();
  }
  return out;
}

MuonMemory muon_memory(const ParameterStore& params, int tp_size) {
  const Sizes s = sizes_of(Muon::plan(params, tp_size));
  auto floats = [](int64_t n) { return n ? aligned_size(size_t(n) * sizeof(float)) : 0; };
  const int64_t moments = AdamW::moment_elements(params, {}, Muon::adamw_roles());
  return {.state = floats(s.state) + 2 * floats(moments),
          .scratch = floats(s.grams) + floats(s.poly) + floats(s.spare) + floats(s.gathered) +
                     floats(s.whole) + floats(2 * s.matrices) + floats(s.matrices)};
}

Muon::Muon(const ParameterStore& params, const MuonConfig& config, const AdamWConfig& adamw,
           Communicator* tp)
    : config_(config),
      adamw_config_(adamw),
      adamw_(params, adamw, {}, adamw_roles()),
      tp_(tp && tp->size() > 1 ? tp : nullptr),
      matrices_(plan(params, tp_ ? tp_->size() : 1)),
      state_arena_(MemoryTag::optimizer, params.backend()),
      scratch_arena_(MemoryTag::workspace, params.backend()) {
  BOTTLE_ASSERT(!params.value_slots() && !params.grad_slots(),
                "Muon: the parameters are sharded by ZeRO, which Muon does not run under");
  for (const Matrix& m : matrices_) {
    if (m.split == Split::gram) ++gram_count_, gram_elements_ += m.gram_side() * m.gram_side();
    if (m.split != Split::gather) ++local_count_;
  }
  const Sizes s = sizes_of(matrices_);
  auto floats = [&](Arena& arena, int64_t n, DType dtype = DType::f32) {
    return n ? arena.alloc({n}, dtype) : Tensor{};
  };
  momentum_ = floats(state_arena_, s.state);
  Backend& be = params.backend();
  if (!momentum_.empty()) be.fill_zero(momentum_);
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

void Muon::orthogonalise_local(Backend& be, Tensor grads) {
  const int64_t n = local_count_;
  if (n == 0) return;
  std::vector<SumRange> ranges;
  for (int64_t i = 0; i < n; ++i)
    ranges.push_back({matrices_[size_t(i)].offset, matrices_[size_t(i)].count(), int(i)});
  be.sum_squares_ranges(norms_.view(0, {n}), grads, ranges);
  be.copy(norms32_.view(0, {n}), norms_.view(0, {n}));
  // A Gram-split matrix's squares are spread over the TP group; a whole one's are all here.
  if (tp_ && gram_count_)
    tp_->all_reduce(norms32_.view(0, {gram_count_}), ReduceOp::sum, "tp.muon_norm");
  auto x_of = [&](const Matrix& m) { return grads.view(m.offset, {m.count()}); };
  for (int64_t i = 0; i < n; ++i)
    be.muon_normalize(x_of(matrices_[size_t(i)]), norms32_.view(i, {1}));
  for (int step = 0; step < config_.ns_steps; ++step) {
    for (int64_t i = 0; i < n; ++i) {
      const Matrix& m = matrices_[size_t(i)];
      const int64_t u = m.gram_side();
      gram(be, grams_.view(m.gram, {u * u}), x_of(m), m.rows, m.cols, m.left_gram());
    }
    if (tp_ && gram_count_)
      tp_->all_reduce(grams_.view(0, {gram_elements_}), ReduceOp::sum, "tp.muon_gram");
    for (int64_t i = 0; i < n; ++i) {
      const Matrix& m = matrices_[size_t(i)];
      const int64_t u = m.gram_side();
      polynomial_step(be, x_of(m), grams_.view(m.gram, {u * u}), m.rows, m.cols, m.left_gram());
    }
  }
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

void Muon::step(Backend& be, const ParameterStore& params, float lr, Tensor control,
                Tensor grad_shard) {
  BOTTLE_ASSERT(grad_shard.empty(), "Muon::step: ZeRO-2's gradient shard given");
  adamw_.step_at(be, params, lr, control, grad_shard, steps_taken() + 1);
  const Tensor grads = params.grads();
  MuonArgs args;
  args.momentum = config_.momentum;
  args.nesterov = config_.nesterov;
  // U in place of G: the step is the gradients' last reader.
  for (const Matrix& m : matrices_) {
    const Tensor g = grads.view(m.offset, {m.count()});
    be.muon_momentum(g, momentum_.view(m.state, {m.count()}), g, control, args);
  }
  orthogonalise_local(be, grads);
  for (size_t i = size_t(local_count_); i < matrices_.size(); ++i) {
    const Matrix& m = matrices_[i];
    orthogonalise_gathered(be, m, grads.view(m.offset, {m.count()}));
  }
  args.lr = lr;
  for (const Matrix& m : matrices_) {
    args.weight_decay = m.decays ? adamw_config_.weight_decay : 0.0f;
    args.adjust = 0.2f * std::sqrt(float(std::max(m.full_rows, m.full_cols)));
    const Shape range{m.count()};
    const Tensor compute =
        params.mixed_precision() ? params.compute_values().view(m.offset, range) : Tensor{};
    be.muon_apply(params.values().view(m.offset, range), compute, grads.view(m.offset, range),
                  control, args);
  }
}

}  // namespace bottle
