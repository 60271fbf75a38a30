#include "model/sharded_checkpoint.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "io/json_io.h"

namespace bottle {

namespace fs = std::filesystem;

namespace {

// The metadata key of a rank file that lists its pieces (JSON text).
constexpr const char* kPiecesKey = "bottle_pieces";
constexpr const char* kRankFilePrefix = "rank-";
constexpr const char* kRankFileSuffix = ".safetensors";

// A TP slice of a tensor seen as a matrix [rows, cols] (cols: the last dimension; a 1-D tensor
// is one row): the slice is rows [row0, row0 + height) × cols [col0, col0 + width).
struct SliceGeometry {
  int64_t row0 = 0, height = 0, col0 = 0, width = 0;
};

SliceGeometry geometry(const Shape& whole, int dim, int64_t slice_begin, int64_t slice_end) {
  BOTTLE_ASSERT(whole.rank >= 1 && whole.rank <= 2, "a checkpoint tensor of rank {}", whole.rank);
  const int64_t cols = whole[whole.rank - 1], rows = whole.numel() / std::max<int64_t>(cols, 1);
  SliceGeometry g{0, rows, 0, cols};
  if (dim == whole.rank - 1) {
    g.col0 = slice_begin;
    g.width = slice_end - slice_begin;
  } else if (dim == 0) {  // rows of a matrix
    g.row0 = slice_begin;
    g.height = slice_end - slice_begin;
  }
  return g;
}

// Row segments shared by a stored piece and a requested range: calls copy(from, to, n) for
// each run of n elements at `from` in the piece's range and `to` in the requested range.
template <typename Copy>
void overlap(const SliceGeometry& p, int64_t p_begin, int64_t p_end, const SliceGeometry& t,
             int64_t t_begin, int64_t t_end, Copy copy) {
  if (p_begin >= p_end || t_begin >= t_end || p.width == 0 || t.width == 0) return;
  // The global rows each range touches; only their common rows are visited.
  const int64_t p_first = p.row0 + p_begin / p.width, p_last = p.row0 + (p_end - 1) / p.width;
  const int64_t t_first = t.row0 + t_begin / t.width, t_last = t.row0 + (t_end - 1) / t.width;
  const int64_t first = std::max(p_first, t_first), last = std::min(p_last, t_last);
  const int64_t c_lo = std::max(p.col0, t.col0),
                c_hi = std::min(p.col0 + p.width, t.col0 + t.width);
  if (c_lo >= c_hi) return;
  for (int64_t row = first; row <= last; ++row) {
    // The piece's elements of this row, as global columns.
    const int64_t pr = row - p.row0;
    const int64_t pc0 = std::max<int64_t>(0, p_begin - pr * p.width),
                  pc1 = std::min(p.width, p_end - pr * p.width);
    const int64_t x0 = std::max(p.col0 + pc0, c_lo), x1 = std::min(p.col0 + pc1, c_hi);
    if (x0 >= x1) continue;
    const int64_t tr = row - t.row0;
    int64_t to = tr * t.width + (x0 - t.col0), n = x1 - x0;
    int64_t from = pr * p.width + (x0 - p.col0);
    // The requested range may start or end inside the run.
    if (to < t_begin) {
      const int64_t cut = t_begin - to;
      to += cut, from += cut, n -= cut;
    }
    n = std::min(n, t_end - to);
    if (n > 0) copy(from - p_begin, to - t_begin, n);
  }
}

Shape shape_of(const nlohmann::json& j, const std::string& where) {
  BOTTLE_CHECK(j.is_array() && !j.empty() && j.size() <= 2,
               "{}: a shape must be a list of 1 or 2 sizes", where);
  Shape shape;
  for (const auto& d : j) {
    BOTTLE_CHECK(
        d.is_number_integer() && d.get<int64_t>() > 0 && d.get<int64_t>() < (int64_t(1) << 40),
        "{}: a size must be a positive integer below 2^40, got {}", where, d.dump());
    shape.dims[size_t(shape.rank++)] = d.get<int64_t>();
  }
  return shape;
}

// Calls f(begin, end, data) for each stretch [begin, end) of `spec`'s slice that an owned range
// of `source` holds, with `data` its [end - begin] view of source.data: where a writer reads
// and a reader writes.
template <typename F>
void for_each_held(const ParamSpec& spec, const FlatSource& source, F f) {
  const int64_t begin = spec.offset, end = spec.offset + spec.shape.numel();
  for (const ShardPiece& owned : source.owned) {
    const int64_t lo = std::max(begin, owned.begin), hi = std::min(end, owned.begin + owned.count);
    if (lo < hi)
      f(lo - begin, hi - begin, source.data.view(owned.local + lo - owned.begin, {hi - lo}));
  }
}

}  // namespace

std::string rank_file_name(int rank) {
  return fmt::format("{}{:05d}{}", kRankFilePrefix, rank, kRankFileSuffix);
}

bool is_rank_file_name(const std::string& name) {
  return name.starts_with(kRankFilePrefix) && name.ends_with(kRankFileSuffix);
}

std::vector<ShardPiece> whole_buffer(int64_t count) {
  ShardPiece p;
  p.begin = 0;
  p.count = count;
  p.local = 0;
  return {p};
}

std::vector<ShardPiece> owned_in_whole_buffer(const ShardLayout& layout) {
  std::vector<ShardPiece> out;
  for (ShardPiece p : layout.pieces) {
    p.local = p.begin;
    out.push_back(p);
  }
  return out;
}

RankPieces::RankPieces(const ParameterStore& params, int stage,
                       const std::vector<FlatSource>& sources, bool replicated,
                       const std::string& skip) {
  nlohmann::json listed = nlohmann::json::array();
  for (const FlatSource& source : sources) {
    BOTTLE_ASSERT(source.data.dtype == DType::f32, "a checkpoint source of dtype {}",
                  dtype_name(source.data.dtype));
    for (size_t i = 0; i < params.specs().size(); ++i) {
      const ParamSpec& spec = params.specs()[i];
      if (spec.name == skip || (!spec.sharded() && !replicated)) continue;
      for_each_held(spec, source, [&](int64_t lo, int64_t hi, Tensor view) {
        const std::string tensor = source.prefix + spec.name;
        Planned& p = planned_.emplace_back();
        p.key = fmt::format("{}@{}", tensor, lo);
        p.view = view;
        values_ += hi - lo;
        const Shape& whole = spec.sharded() ? spec.full_shape : spec.shape;
        listed.push_back(
            {{"tensor", tensor},
             {"key", p.key},
             {"shape", std::vector<int64_t>(whole.dims.begin(), whole.dims.begin() + whole.rank)},
             {"dim", spec.sharded() ? spec.shard_dim : -1},
             {"slice",
              {spec.sharded() ? spec.shard_offset : 0,
               spec.sharded() ? spec.shard_offset + spec.shape[spec.shard_dim] : 0}},
             {"range", {lo, hi}},
             {"stage", stage},
             {"order", i}});
      });
    }
  }
  listed_ = listed.dump();
}

SafeTensorsWriter RankPieces::open(const std::string& path) const {
  std::vector<SafeTensorsWriter::Spec> specs;
  for (const Planned& p : planned_) specs.push_back({p.key, {p.view.numel()}});
  return SafeTensorsWriter(path, specs, {{kPiecesKey, listed_}});
}

void RankPieces::write(const std::string& path, Backend& be) const {
  SafeTensorsWriter out = open(path);
  // Through a bounded host buffer: the save's memory is this buffer, whatever the model's size.
  int64_t largest = 0;
  for (const Planned& p : planned_) largest = std::max(largest, p.view.numel());
  std::vector<float> staging(size_t(std::min(largest, kStagingValues)));  // [≤ kStagingValues]
  for (const Planned& p : planned_)
    for (int64_t at = 0; at < p.view.numel(); at += kStagingValues) {
      const int64_t n = std::min(kStagingValues, p.view.numel() - at);
      be.to_host(staging.data(), p.view.view(at, {n}));
      out.write(std::span<const float>(staging.data(), size_t(n)));
    }
  out.close();
}

std::vector<float> RankPieces::snapshot(Backend& be) const {
  std::vector<float> copy(static_cast<size_t>(values_));  // [values_]
  int64_t at = 0;
  for (const Planned& p : planned_) {
    be.to_host(copy.data() + at, p.view);
    at += p.view.numel();
  }
  return copy;
}

void RankPieces::write_snapshot(const std::string& path, std::span<const float> snapshot) const {
  BOTTLE_ASSERT(snapshot.size() == size_t(values_), "a snapshot of {} values for {}",
                snapshot.size(), values_);
  SafeTensorsWriter out = open(path);
  out.write(snapshot);
  out.close();
}

void write_rank_pieces(const std::string& path, const ParameterStore& params, int stage,
                       const std::vector<FlatSource>& sources, bool replicated,
                       const std::string& skip) {
  RankPieces(params, stage, sources, replicated, skip).write(path, params.backend());
}

void read_rank_pieces(const ShardedCheckpoint& checkpoint, const ParameterStore& params,
                      const FlatSource& source) {
  Backend& be = params.backend();
  std::vector<float> staging;  // [≤ one parameter's slice]
  for (const ParamSpec& spec : params.specs())
    for_each_held(spec, source, [&](int64_t lo, int64_t hi, Tensor view) {
      staging.resize(size_t(hi - lo));
      checkpoint.read(source.prefix + spec.name, spec, lo, hi, staging);
      be.from_host(view, staging.data());
    });
}

void write_checkpoint_index(const std::string& dir,
                            const std::map<std::string, std::string>& metadata) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (is_rank_file_name(e.path().filename().string())) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  // Tensors by (stage, order in the store), pieces by file then position.
  std::map<std::string, std::tuple<int, int64_t>> place;
  std::map<std::string, nlohmann::ordered_json> tensors;
  for (const fs::path& file : files) {
    const SafeTensorsReader reader(file.string());
    const auto it = reader.metadata().find(kPiecesKey);
    BOTTLE_CHECK(it != reader.metadata().end(), "{}: no list of pieces in its metadata",
                 file.string());
    for (const auto& piece : nlohmann::json::parse(it->second)) {
      const std::string tensor = piece.at("tensor").get<std::string>();
      nlohmann::ordered_json& t = tensors[tensor];
      if (t.empty()) {
        t["name"] = tensor;
        t["shape"] = piece.at("shape");
        t["pieces"] = nlohmann::ordered_json::array();
        place[tensor] = {piece.at("stage").get<int>(), piece.at("order").get<int64_t>()};
      }
      t["pieces"].push_back({{"file", file.filename().string()},
                             {"key", piece.at("key")},
                             {"dim", piece.at("dim")},
                             {"slice", piece.at("slice")},
                             {"range", piece.at("range")}});
    }
  }
  std::vector<std::string> order;
  for (const auto& [name, t] : tensors) order.push_back(name);
  std::sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
    // The weights first, then each state in the same order: prefix, then place.
    const std::string pa = a.substr(0, a.find('/') == std::string::npos ? 0 : a.find('/') + 1),
                      pb = b.substr(0, b.find('/') == std::string::npos ? 0 : b.find('/') + 1);
    if (pa != pb) return pa < pb;
    return place[a] < place[b];
  });
  // One tensor a line: a reader of the file sees the layout at a glance.
  nlohmann::ordered_json head;
  head["format"] = "bottle-sharded";
  head["version"] = 1;
  head["metadata"] = metadata;
  std::string text = head.dump();
  text.pop_back();
  text += ",\n\"tensors\": [";
  for (size_t i = 0; i < order.size(); ++i)
    text += (i ? ",\n  " : "\n  ") + tensors[order[i]].dump();
  text += "\n]}";
  const fs::path path = fs::path(dir) / kCheckpointIndexFile;
  std::ofstream out(path);
  out << text << "\n";
  out.close();
  BOTTLE_CHECK(out, "{}: write failed", path.string());
}

bool is_sharded_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / kCheckpointIndexFile, ec);
}

ShardedCheckpoint::ShardedCheckpoint(std::string dir) : dir_(std::move(dir)) {
  const std::string path = index_path();
  const nlohmann::json j = read_json_file(path);
  BOTTLE_CHECK(j.is_object() && j.value("format", "") == "bottle-sharded" &&
                   j.contains("tensors") && j["tensors"].is_array(),
               "{}: not a sharded checkpoint's index (format \"bottle-sharded\" with a list of "
               "tensors)",
               path);
  BOTTLE_CHECK(j.value("version", 0) == 1, "{}: version {} of the format; this bottle reads 1",
               path, j.value("version", 0));
  if (j.contains("metadata") && j["metadata"].is_object())
    for (const auto& [key, value] : j["metadata"].items())
      if (value.is_string()) metadata_[key] = value.get<std::string>();
  for (const auto& t : j["tensors"]) {
    BOTTLE_CHECK(t.is_object() && t.contains("name") && t["name"].is_string() &&
                     t.contains("pieces") && t["pieces"].is_array(),
                 "{}: every tensor needs a name and a list of pieces", path);
    const std::string name = t["name"].get<std::string>();
    const std::string where = fmt::format("{}: tensor '{}'", path, name);
    BOTTLE_CHECK(!tensors_.count(name), "{} is listed twice", where);
    Entry e;
    e.shape = shape_of(t.value("shape", nlohmann::json()), where);
    for (const auto& p : t["pieces"]) {
      Piece piece;
      try {
        piece.file = p.at("file").get<std::string>();
        piece.key = p.at("key").get<std::string>();
        piece.dim = p.at("dim").get<int>();
        piece.slice_begin = p.at("slice").at(0).get<int64_t>();
        piece.slice_end = p.at("slice").at(1).get<int64_t>();
        piece.begin = p.at("range").at(0).get<int64_t>();
        piece.end = p.at("range").at(1).get<int64_t>();
      } catch (const nlohmann::json::exception& err) {
        fail("{}: a piece is malformed: {}", where, err.what());
      }
      // Files lie beside the index: a path could read any file on the machine.
      BOTTLE_CHECK(!piece.file.empty() && piece.file.find('/') == std::string::npos &&
                       piece.file != "." && piece.file != "..",
                   "{}: a piece names '{}'; it must be a file name in {} (no directories)", where,
                   piece.file, dir_);
      BOTTLE_CHECK(piece.dim >= -1 && piece.dim < e.shape.rank, "{}: a piece splits dimension {}",
                   where, piece.dim);
      const int64_t along = piece.dim < 0 ? 0 : e.shape[piece.dim];
      BOTTLE_CHECK(piece.dim < 0 ? piece.slice_begin == 0 && piece.slice_end == 0
                                 : 0 <= piece.slice_begin && piece.slice_begin < piece.slice_end &&
                                       piece.slice_end <= along,
                   "{}: a piece's slice [{}, {}) lies outside its dimension of {}", where,
                   piece.slice_begin, piece.slice_end, along);
      const int64_t slice_numel =
          piece.dim < 0 ? e.shape.numel()
                        : e.shape.numel() / along * (piece.slice_end - piece.slice_begin);
      BOTTLE_CHECK(0 <= piece.begin && piece.begin < piece.end && piece.end <= slice_numel,
                   "{}: a piece's range [{}, {}) lies outside its slice of {} elements", where,
                   piece.begin, piece.end, slice_numel);
      e.pieces.push_back(std::move(piece));
    }
    names_.push_back(name);
    tensors_.emplace(name, std::move(e));
  }
}

ShardedCheckpoint::~ShardedCheckpoint() = default;

std::string ShardedCheckpoint::index_path() const {
  return (fs::path(dir_) / kCheckpointIndexFile).string();
}

const Shape& ShardedCheckpoint::shape(const std::string& name) const {
  const auto it = tensors_.find(name);
  BOTTLE_CHECK(it != tensors_.end(), "{}: tensor '{}' is missing", index_path(), name);
  return it->second.shape;
}

const SafeTensorsReader& ShardedCheckpoint::reader(const std::string& file) const {
  auto& r = readers_[file];
  if (!r) r = std::make_unique<SafeTensorsReader>((fs::path(dir_) / file).string());
  return *r;
}

void ShardedCheckpoint::read(const std::string& name, const ParamSpec& slice, int64_t begin,
                             int64_t end, std::span<float> out) const {
  shape(name);  // a missing tensor is named
  const Entry& e = tensors_.at(name);
  const Shape& whole = slice.sharded() ? slice.full_shape : slice.shape;
  BOTTLE_CHECK(whole == e.shape, "{}: tensor '{}' has shape {}, expected {}", index_path(), name,
               e.shape.str(), whole.str());
  BOTTLE_ASSERT(
      0 <= begin && begin <= end && end <= slice.shape.numel() && out.size() == size_t(end - begin),
      "a read of [{}, {}) of '{}'", begin, end, name);
  const SliceGeometry target = slice.sharded()
                                   ? geometry(whole, slice.shard_dim, slice.shard_offset,
                                              slice.shard_offset + slice.shape[slice.shard_dim])
                                   : geometry(whole, -1, 0, 0);
  int64_t covered = 0;
  std::vector<float> values;  // [a piece] its stored elements
  for (const Piece& p : e.pieces) {
    const SliceGeometry stored = geometry(whole, p.dim, p.slice_begin, p.slice_end);
    bool read = false;
    overlap(stored, p.begin, p.end, target, begin, end, [&](int64_t from, int64_t to, int64_t n) {
      if (!read) {
        const SafeTensorsReader& r = reader(p.file);
        values.resize(size_t(p.end - p.begin));
        try {
          r.read_f32(p.key, values);
        } catch (const Error& err) {
          fail("{} (tensor '{}' of {})", err.what(), name, index_path());
        }
        read = true;
      }
      std::copy_n(values.begin() + from, n, out.begin() + to);
      covered += n;
    });
  }
  BOTTLE_CHECK(covered == end - begin,
               "{}: tensor '{}': its pieces hold {} of the {} elements asked for ({}, elements "
               "[{}, {})); the checkpoint is incomplete or damaged",
               index_path(), name, covered, end - begin,
               slice.sharded()
                   ? fmt::format("the slice [{}, {}) of dimension {}", slice.shard_offset,
                                 slice.shard_offset + slice.shape[slice.shard_dim], slice.shard_dim)
                   : std::string("the whole tensor"),
               begin, end);
}

std::vector<float> ShardedCheckpoint::read_whole(const std::string& name) const {
  ParamSpec whole;
  whole.name = name;
  whole.shape = shape(name);
  std::vector<float> out(size_t(whole.shape.numel()));
  read(name, whole, 0, whole.shape.numel(), out);
  return out;
}

void consolidate_weights(const ShardedCheckpoint& from, const std::vector<std::string>& names,
                         const std::string& path, DType stored) {
  for (const std::string& name : from.names())
    BOTTLE_CHECK(name.find('/') != std::string::npos ||
                     std::find(names.begin(), names.end(), name) != names.end(),
                 "{}: unexpected tensor '{}' (not a parameter of the model its config.json "
                 "describes)",
                 from.index_path(), name);
  std::vector<SafeTensorsWriter::Spec> specs;
  for (const std::string& name : names) {
    const Shape& s = from.shape(name);
    specs.push_back({name, std::vector<int64_t>(s.dims.begin(), s.dims.begin() + s.rank)});
  }
  SafeTensorsWriter out(path, specs, {{"format", "pt"}}, stored);
  for (const std::string& name : names) out.write(from.read_whole(name));
  out.close();
}

}  // namespace bottle
