#pragma once
// Muon (Keller Jordan, 2024; Moonshot's Moonlight, 2025) for the blocks' matrices, AdamW for
// the rest (docs/design.md §9). For a weight W of shape (m, n) and its clipped gradient G:
//   B ← μ·B + G;   U ← G + μ·B (nesterov) or B
//   X ← U / max(‖U‖_F, 1e-7)
//   ns_steps times: A ← X·Xᵀ;  X ← 3.4445·X + (−4.7750·A + 2.0315·A·A)·X
//   W ← W − lr·wd·W − lr·0.2·√max(m, n)·X
// with the Gram matrix A taken on the small side (X transposed when m > n), as the reference
// does; (X·Xᵀ)ᵏ·X = X·(Xᵀ·X)ᵏ, so either side gives the same X in exact arithmetic. This is
// torch.optim.Muon with adjust_lr_fn = "match_rms_adamw" (its momentum is an average, μ·B +
// (1 − μ)·G, which scales U alone, and the normalisation removes the scale).
//
// Every factor of a bottleneck is a matrix of its own, as the checkpoint names it: QKV's three
// down-projections are three orthogonalisations, whatever the grouping of the GEMMs.
//
// The update never depends on how a matrix is split over the TP group:
// - split along its larger side (btp's factors, full-rank TP's MLP weights): each rank holds a
//   slab of X along that side, and the Gram matrix on the other side, u × u, is the sum of the
//   slabs' Gram matrices: one all-reduce per iteration over the TP group, every Gram-split
//   matrix of the stage in one call; the Frobenius norms likewise, in one call before;
// - split along its smaller side or square (vanilla TP's factors, full-rank TP's attention
//   weights): the Gram matrix would be the large side's, so the matrix is gathered instead (one
//   all-gather of its U) and every TP rank runs the whole iteration, Megatron's "duplicated"
//   mode, keeping its own slice of X.
// Under ZeRO 1–3 a DP rank holds slices of the matrices, cut by the gradient buckets, which
// would orthogonalise halves: each matrix gets one owner DP rank instead (balanced by its
// Newton–Schulz cost), the momentum stays element-wise on the owned slices, each slice's U is
// sent to the owner, which runs the iteration on the whole matrix and sends each slice's X
// back, and every rank updates its own slices; ZeRO's gathers then move the weights as they do
// after AdamW.
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "core/arena.h"
#include "model/parameters.h"
#include "train/adamw.h"
#include "train/optimizer.h"

namespace bottle {

// The optimizer.muon_* keys' values (TrainConfig::muon()).
struct MuonConfig {
  float momentum = 0.95f;
  bool nesterov = true;
  int ns_steps = 5;
};

// The quintic Newton–Schulz coefficients of Keller Jordan's Muon.
inline constexpr float kNewtonSchulzA = 3.4445f, kNewtonSchulzB = -4.7750f,
                       kNewtonSchulzC = 2.0315f;

// The bytes Muon holds for a store laid out like `params` (the memory plan's): its state, the
// matrices' momentum and AdamW's moments for the rest (optimizer), and the iteration's
// scratch (workspace). shard: a DP rank's ZeRO layout (DataParallel::layout; any rank's), under
// which the most any DP rank holds is planned; empty: no ZeRO.
struct MuonMemory {
  size_t state = 0, scratch = 0;
};
MuonMemory muon_memory(const ParameterStore& params, int tp_size, const ShardLayout& shard = {});

class Muon : public Optimizer {
 public:
  // The matrices of `params` take Muon, every other parameter `adamw`; tp: the model's TP group
  // (null: one rank), over which the matrices are split. shard and dp: what this rank owns
  // under ZeRO 1–3 (DataParallel::shard) and the DP group; an empty layout owns everything.
  Muon(const ParameterStore& params, const MuonConfig& config, const AdamWConfig& adamw,
       Communicator* tp, const ShardLayout& shard = {}, Communicator* dp = nullptr);
  // The roles AdamW takes beside it.
  static const std::vector<ParamRole>& adamw_roles();

  const char* name() const override { return "muon"; }
  // The matrices' gradients (their owned slices under ZeRO) become their orthogonalised updates
  // in place.
  void step(Backend& be, const ParameterStore& params, float lr, Tensor control,
            Tensor grad_shard = {}) override;
  size_t bytes() const override { return state_arena_.bytes() + adamw_.bytes(); }
  // AdamW's "exp_avg/" and "exp_avg_sq/" (its parameters) and "momentum_buffer/" (the
  // matrices, their owned slices under ZeRO).
  std::vector<FlatSource> held_state() const override;

  // How a matrix runs the iteration (see the file comment).
  enum class Split { whole, gram, gather };
  struct Matrix {
    int64_t offset = 0;          // in the flat buffers
    int64_t rows = 0, cols = 0;  // this rank's slice
    int64_t full_rows = 0, full_cols = 0;
    int shard_dim = -1;  // the split dimension (-1: whole)
    Split split = Split::whole;
    int64_t state = 0;   // where its momentum starts (without ZeRO)
    bool decays = true;  // takes optimizer.weight_decay (declared with it)
    int64_t count() const { return rows * cols; }
    // Whether its Gram matrix is X·Xᵀ (rows × rows) rather than Xᵀ·X.
    bool left_gram() const;
    int64_t gram_side() const;  // u: the Gram matrix is u × u
    // Its Newton–Schulz FLOPs per iteration on this rank (4·u²·L + 2·u³), which balance the
    // ZeRO owners.
    double cost() const;
  };
  // The matrices of a store, Gram-split first, then whole, then gathered (each in flat order).
  static std::vector<Matrix> plan(const ParameterStore& params, int tp_size);
  // ZeRO: each matrix's owner among `ranks` DP ranks, the largest cost first to the least
  // loaded rank (the same on every rank, and on every TP rank of a replica).
  static std::vector<int> owners(const std::vector<Matrix>& matrices, int ranks);

 private:
  // Matrix `index` of matrices_ at `at` in a buffer.
  struct Placed {
    size_t index = 0;
    int64_t at = 0;
  };
  // Newton–Schulz of `which` (an ascending list of matrices_, so Gram-split ones come first),
  // each X [rows, cols] in `base` at its place, in place of its U: the Gram-split and whole ones
  // together (their norms, then each iteration's Gram matrices with one all-reduce over TP for
  // the Gram-split, then their polynomial steps), then each gathered one by itself.
  void orthogonalise(Backend& be, Tensor base, const std::vector<Placed>& which);
  // A gathered matrix: its U gathered over the TP group, the whole iteration, its own slice of X
  // kept. x: [rows, cols] its U in place.
  void orthogonalise_gathered(Backend& be, const Matrix& m, Tensor x);
  // One polynomial step of X [rows, cols] in place, its Gram matrix `gram` [u, u] given.
  void polynomial_step(Backend& be, Tensor x, Tensor gram, int64_t rows, int64_t cols, bool left);
  // ZeRO: the owned slices' U to their matrices' owners, and back as X.
  void exchange(Backend& be, const ParameterStore& params, Tensor grad_shard, bool back);

  MuonConfig config_;
  AdamWConfig adamw_config_;
  AdamW adamw_;                   // the embedding, the LM head and the 1-D parameters
  Communicator* tp_;              // null for one rank
  Communicator* dp_;              // ZeRO's DP group; null without ZeRO
  std::vector<Matrix> matrices_;  // plan()'s order
  // ZeRO: a slice of a matrix this rank owns (flat [begin, begin + count), at `local` in the
  // DP shard and at `state` in the momentum), and a slice another rank sends for a matrix this
  // rank is the owner of (at `at` in the matrix).
  struct Slice {
    size_t index = 0;
    int64_t begin = 0, count = 0, local = 0, state = 0;
  };
  struct Incoming {
    size_t index = 0;
    int from = 0;
    int64_t at = 0, count = 0;
  };
  // [h.count] a held slice's gradients, in the flat buffer or ZeRO-2's and 3's shard.
  static Tensor slice_grads(const ParameterStore& params, Tensor grad_shard, const Slice& h);
  std::vector<Slice> held_;         // by matrix, then flat order
  std::vector<Incoming> incoming_;  // by matrix, then place
  std::vector<int> owner_;          // per matrix
  std::vector<Placed> owned_;       // the matrices this rank runs, in the assembly buffer
  std::vector<int64_t> assembled_;  // per matrix: where it lies in assembly_ (-1: elsewhere)
  Arena state_arena_, scratch_arena_;
  Tensor momentum_;  // [Σ matrix elements (held slices under ZeRO)] end to end
  Tensor assembly_;  // ZeRO: [Σ owned matrix elements] the owned matrices, whole
  Tensor grams_;     // [Σ u²] the Gram matrices of the Gram-split and whole matrices (at least
                     // a gathered matrix's, which reuses the start)
  Tensor poly_;      // [max u²] b·A + c·A·A
  Tensor spare_;     // [max elements of a matrix, whole] the iteration's other buffer
  Tensor gathered_;  // [max elements of a gathered matrix, whole] its slices, rank after rank
  Tensor whole_;     // [same] a column-split matrix put together
  Tensor norms_;     // f64 [matrices] their squared Frobenius norms
  Tensor norms32_;   // f32 [matrices] the same, as the all-reduce and muon_normalize take them
};

}  // namespace bottle
