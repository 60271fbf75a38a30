#pragma once
// Sharded checkpoints (docs/design.md §12): every rank writes what it holds of the parameters
// and of the optimizer state into a file of its own, in parallel, and nothing is gathered:
// no rank ever holds more of the model than it trains with (a ZeRO-3 rank its shard alone).
// PyTorch's distributed checkpoint, Megatron's dist-checkpointing and TorchTitan save this way.
//
// A rank's file, rank-RRRRR.safetensors (R: its world rank), holds one 1-D tensor per piece:
// the part of one parameter-shaped tensor (a weight "model.norm.weight", a moment
// "exp_avg/model.norm.weight") that one of the rank's owned flat ranges covers. Where the piece
// lies in the whole tensor is its TP slice (the dimension split, and the slice's bounds along
// it) and a range of that slice's elements in row-major order. The file's metadata lists its
// pieces; the writing rank's leader merges them into checkpoint_index.json, which names for
// every tensor its whole shape and the pieces that tile it.
//
// A reader asks for any range of any TP slice of a tensor (its own layout: another TP degree
// or mode, another ZeRO shard) and gets it from whichever pieces overlap it, a row segment at a
// time; a checkpoint that does not cover what is asked exactly once is an error naming the
// tensor. `bottle export` consolidates tensor by tensor, one whole tensor in memory at a time.
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/parameters.h"

namespace bottle {

inline constexpr const char* kCheckpointIndexFile = "checkpoint_index.json";

// The file of world rank `rank`'s pieces: rank-RRRRR.safetensors.
std::string rank_file_name(int rank);
// Whether `name` (a file name, no directory) is one of those.
bool is_rank_file_name(const std::string& name);

// What a rank holds of one flat buffer laid out like ParameterStore::values(): the flat ranges
// of `owned`, each at its `local` offset in `data` (ShardPiece's bucket fields unused).
struct FlatSource {
  std::string prefix;  // "" for the weights, "exp_avg/" for a moment, ...
  Tensor data;         // f32, on the store's backend
  std::vector<ShardPiece> owned;
};

// The whole buffer [count] as one owned range.
std::vector<ShardPiece> whole_buffer(int64_t count);
// The owned slices of `layout` found where they lie in a whole [total] buffer (local = flat
// offset): ZeRO-1 and 2 keep the masters whole, valid in the owned slices alone.
std::vector<ShardPiece> owned_in_whole_buffer(const ShardLayout& layout);

// Writes this rank's pieces of `sources` to `path`: one piece per (source, parameter, owned
// range it overlaps), the parameters in the store's order, `skip` left out (the last stage's
// copy of a tied table, written by the first), and the parameters that every TP rank holds
// whole only where `replicated` (TP rank 0: one copy). The values reach the file through a
// host buffer of at most kStagingValues. `stage`: the pipeline stage (it orders the index).
// Errors name `path`.
inline constexpr int64_t kStagingValues = int64_t(1) << 20;
void write_rank_pieces(const std::string& path, const ParameterStore& params, int stage,
                       const std::vector<FlatSource>& sources, bool replicated,
                       const std::string& skip = "");

// The same in two steps, for a save that goes on while training does (checkpoint.async): the
// pieces are planned, copied to host memory at once (snapshot, on the thread that owns the
// backend), and written later from that copy, on any thread.
class RankPieces {
 public:
  RankPieces(const ParameterStore& params, int stage, const std::vector<FlatSource>& sources,
             bool replicated, const std::string& skip);
  // Every piece's values, end to end.
  int64_t values() const { return values_; }
  // The file at `path`, from the pieces' own memory through a bounded host buffer.
  void write(const std::string& path, Backend& be) const;
  // [values()] a host copy of the pieces as they are now.
  std::vector<float> snapshot(Backend& be) const;
  // The file at `path` from such a copy; touches no backend.
  void write_snapshot(const std::string& path, std::span<const float> snapshot) const;

 private:
  struct Planned {
    std::string key;
    Tensor view;  // [n] of its source
  };
  SafeTensorsWriter open(const std::string& path) const;
  std::vector<Planned> planned_;
  std::string listed_;  // the pieces' descriptions, JSON text for the file's metadata
  int64_t values_ = 0;
};

// The reverse: what `source` holds (its owned ranges of every parameter, named prefix + name)
// read from `checkpoint` into source.data, whatever layout wrote it.
class ShardedCheckpoint;
void read_rank_pieces(const ShardedCheckpoint& checkpoint, const ParameterStore& params,
                      const FlatSource& source);

// Merges the pieces listed by every rank-*.safetensors of `dir` into dir/checkpoint_index.json
// with `metadata` (the optimizer's name and steps). Errors name the file.
void write_checkpoint_index(const std::string& dir,
                            const std::map<std::string, std::string>& metadata);

// Whether `dir` holds a sharded checkpoint (its checkpoint_index.json).
bool is_sharded_checkpoint(const std::string& dir);

class ShardedCheckpoint {
 public:
  // Reads and checks dir/checkpoint_index.json (files named inside `dir` only, pieces inside
  // their tensors); every error names it.
  explicit ShardedCheckpoint(std::string dir);
  ~ShardedCheckpoint();
  ShardedCheckpoint(const ShardedCheckpoint&) = delete;
  ShardedCheckpoint& operator=(const ShardedCheckpoint&) = delete;

  const std::string& dir() const { return dir_; }
  std::string index_path() const;
  // The tensors in the order they were written (stage, then the store's order).
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // The whole tensor's shape; throws naming the tensor when it is missing.
  const Shape& shape(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // out [end - begin] ← elements [begin, end) of the TP slice that `slice` describes (its
  // shape, full_shape, shard_dim and shard_offset) of the tensor `name`, in row-major order.
  // Throws naming the tensor unless the pieces cover those elements exactly once, or when a
  // piece reads as damaged (a missing key, a wrong size, a non-finite value).
  void read(const std::string& name, const ParamSpec& slice, int64_t begin, int64_t end,
            std::span<float> out) const;
  // The whole tensor.
  std::vector<float> read_whole(const std::string& name) const;

 private:
  struct Piece {
    std::string file, key;
    int dim = -1;                            // the dimension of its TP slice; -1: none
    int64_t slice_begin = 0, slice_end = 0;  // the slice along dim
    int64_t begin = 0, end = 0;              // its elements of the slice, row-major
  };
  struct Entry {
    Shape shape;
    std::vector<Piece> pieces;
  };
  const SafeTensorsReader& reader(const std::string& file) const;

  std::string dir_;
  std::vector<std::string> names_;
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
  mutable std::map<std::string, std::unique_ptr<SafeTensorsReader>> readers_;
};

// The safetensors file of a whole model at `path` (what transformers reads): the weights
// `names`, in that order, from the sharded checkpoint `from`, one whole tensor in memory at a
// time; `stored` as export's --dtype. A weight of the index that is not in `names` is refused.
void consolidate_weights(const ShardedCheckpoint& from, const std::vector<std::string>& names,
                         const std::string& path, DType stored);

}  // namespace bottle
