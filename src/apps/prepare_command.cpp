// `bottle prepare`: documents → llm.c token shards (docs/design.md §12, §13).
//
// Inputs are files, directories, globs or `-` (standard input; also when no --input is given),
// as text or JSONL, gzip / zstd compressed or not (data/text_source.h). --documents says what
// a document is: a JSONL record, or a text file's whole, its paragraphs or its lines; by
// default a record for JSONL, a paragraph when the input is one text file (nanoGPT's
// input.txt; a line when its paragraphs are too few for one validation document, as in a file
// of one document per line), a whole file when it is several. Documents are numbered in input order
// from 0; document i goes to the validation split iff floor((i+1)·f) > floor(i·f) for f =
// --val-fraction, which spreads ⌊D·f⌋ validation documents evenly over the input, streaming, with
// no shuffle to seed.
//
// Without --tokenizer the tokens are bottle's byte-level ones (V = 256, token = byte value):
// the shards hold the input bytes concatenated, losslessly (no UTF-8 repair, and no delimiter,
// for which 256 has no room). With a tokenizer each document becomes valid UTF-8
// (utf8_replace_invalid, as the reference libraries see text) and is encoded after the
// tokenizer's document delimiter (BOS, else EOS: llm.c's order); the tokenizer is saved to
// DIR/tokenizer, so that train finds it beside the data. A directory holds one tokenizer: a
// byte-level run removes a DIR/tokenizer left by an earlier one.
//
// Encoding runs on --threads workers, batch by batch, while the main thread reads the next
// batch and appends the previous one in document order: the shards are byte-identical for any
// thread count. Shards are fixed-size (data/shard_writer.h). The run publishes in two phases:
// every file of the new data set (shards, split descriptions, the tokenizer's folder) is first
// written under a temporary name and synced, once the whole input is read and the splits are
// checked; then all are renamed into place, and only then is what they replace removed. So a
// failed run (a bad JSONL line, too few documents, a full disk) leaves an earlier data set as
// it was, never a mix of old and new files, and its error says so.
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <regex>
#include <thread>
#include <utility>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "apps/tokenizer_options.h"
#include "core/arena.h"
#include "core/error.h"
#include "io/atomic_output.h"
#include "sys/worker_pool.h"
#include "data/byte_tokenizer.h"
#include "data/shard_writer.h"
#include "data/text_source.h"
#include "data/tokenizer.h"
#include "data/utf8.h"
#include "train/folder_lock.h"

namespace bottle {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A batch ends at whichever comes first: enough documents to spread over the workers, enough
// text to amortise a hand-over, little enough memory for two batches in flight.
constexpr size_t kBatchDocuments = 1024;

constexpr uint64_t kBatchBytes = uint64_t(8) << 20;
// A document's token vector keeps its capacity for the next batch, unless it grew past this
// (one huge document must not pin its memory for the rest of the run).
constexpr size_t kKeepTokenCapacity = size_t(1) << 22;

bool is_validation(uint64_t i, double f) {
  return std::floor(double(i + 1) * f) > std::floor(double(i) * f);
}

// How many documents an input needs for --val-fraction `f` > 0 to give one validation
// document: the least n with floor(n·f) >= 1.
uint64_t documents_for_one_validation(double f) {
  const double guess = std::ceil(1.0 / f);
  if (guess > 1e18) return uint64_t(1e18);
  auto n = uint64_t(guess);
  // 1/f rounds: step to the exact boundary of the rule as is_validation evaluates it.
  while (std::floor(double(n) * f) < 1) ++n;
  while (n > 1 && std::floor(double(n - 1) * f) >= 1) --n;
  return n;
}

// Documents read together and encoded together. `docs`, `tokens` and `bytes` keep their
// allocations from batch to batch; only the first `size` entries are this batch's.
struct Batch {
  std::vector<Document> docs;
  std::vector<std::vector<int32_t>> tokens;  // per document, the delimiter first
  std::vector<uint64_t> bytes;               // per document, after U+FFFD replacement
  size_t size = 0;
};

// Fills `batch` from `reader`; false when the input is exhausted and the batch is empty.
bool read_batch(DocumentReader& reader, Batch& batch) {
  batch.size = 0;
  uint64_t text_bytes = 0;
  while (batch.size < kBatchDocuments && text_bytes < kBatchBytes) {
    if (batch.size == batch.docs.size()) batch.docs.emplace_back();
    Document& doc = batch.docs[batch.size];
    if (!reader.next(doc)) break;
    text_bytes += doc.text.size();
    ++batch.size;
  }
  if (batch.tokens.size() < batch.size) batch.tokens.resize(batch.size);
  if (batch.bytes.size() < batch.size) batch.bytes.resize(batch.size);
  return batch.size > 0;
}

// Encodes a batch's documents on the pool's workers, each document by whichever worker claims
// it first (sys/worker_pool.h).
class BatchEncoder {
 public:
  BatchEncoder(const Tokenizer& tokenizer, int threads)
      : tokenizer_(tokenizer), delimiter_(tokenizer.document_delimiter()), pool_(threads) {}

  // The workers begin encoding `batch`, which must stay untouched until wait() returns.
  void start(Batch& batch) {
    pool_.start(batch.size, [this, &batch](size_t i, int) { encode(batch, i); });
  }
  // Until the batch is encoded; rethrows the first error a worker met.
  void wait() { pool_.wait(); }

 private:
  void encode(Batch& batch, size_t i) const {
    const Document& doc = batch.docs[i];
    std::string repaired;
    std::string_view text = doc.text;
    if (!utf8_valid(text)) text = repaired = utf8_replace_invalid(text);
    std::vector<int32_t>& out = batch.tokens[i];
    if (out.capacity() > kKeepTokenCapacity) std::vector<int32_t>().swap(out);
    out.clear();
    if (delimiter_) out.push_back(*delimiter_);
    try {
      tokenizer_.encode(text, out);
    } catch (const Error& e) {
      fail("{}: {}", doc.origin, e.what());
    }
    batch.bytes[i] = text.size();
  }

  const Tokenizer& tokenizer_;
  const std::optional<int32_t> delimiter_;
  WorkerPool pool_;  // last: its workers stop before the members they use go away
};

// One line on stderr, rewritten about four times a second: share of the input read (when its
// size is known), text MB/s, tokens/s and the time left.
class Progress {
 public:
  explicit Progress(bool enabled) : enabled_(enabled), begin_(Clock::now()), last_(begin_) {}
  ~Progress() { end(); }

  // `last`: the final state, shown whatever the time since the previous line.
  void update(const DocumentReader& reader, uint64_t bytes, uint64_t tokens, uint64_t documents,
              bool last = false) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (!last && now - last_ < std::chrono::milliseconds(250)) return;
    last_ = now;
    const double s = std::max(std::chrono::duration<double>(now - begin_).count(), 1e-6);
    std::string line;
    if (reader.bytes_total() > 0) {
      const double p = double(reader.bytes_read()) / double(reader.bytes_total());
      line = fmt::format("{:5.1f}% | ", 100.0 * p);
      if (p > 0) {
        const auto left = int64_t(s * (1.0 - p) / p);
        line += fmt::format("ETA {}:{:02d}:{:02d} | ", left / 3600, left / 60 % 60, left % 60);
      }
    }
    line += fmt::format("{} docs | {:.1f} MB/s | {:.2f} M tokens/s", documents,
                        double(bytes) / 1e6 / s, double(tokens) / 1e6 / s);
    fmt::print(stderr, "\r{:<{}}", line, int(width_));
    width_ = std::max(width_, line.size());
    std::fflush(stderr);
    open_ = true;
  }

  void end() {
    if (open_) fmt::print(stderr, "\n");
    open_ = false;
  }

 private:
  bool enabled_, open_ = false;
  Clock::time_point begin_, last_;
  size_t width_ = 0;
};

// Appends documents to the train or validation writer by their number.
struct Splits {
  ShardWriter train, val;
  double val_fraction;
  std::array<uint64_t, 256> train_byte_counts{};  // the byte-level run's entropy line
  uint64_t next = 0;                              // the next document's number

  ShardWriter& writer_for_next() { return is_validation(next++, val_fraction) ? val : train; }
  uint64_t documents() const { return train.documents() + val.documents(); }
  uint64_t bytes() const { return train.bytes() + val.bytes(); }
  uint64_t tokens() const { return train.tokens() + val.tokens(); }
};

void prepare_bytes(DocumentReader& reader, Splits& splits, Progress& progress) {
  for (Document doc; reader.next(doc);) {
    ShardWriter& w = splits.writer_for_next();
    if (&w == &splits.train)
      for (unsigned char c : doc.text) ++splits.train_byte_counts[c];
    w.append_bytes(doc.text);
    progress.update(reader, splits.bytes(), splits.tokens(), splits.documents());
  }
  progress.update(reader, splits.bytes(), splits.tokens(), splits.documents(), /*last=*/true);
}

void prepare_tokens(DocumentReader& reader, const Tokenizer& tokenizer, int threads, Splits& splits,
                    Progress& progress) {
  // Two batches: the workers encode one while the main thread reads the other, then appends
  // it while the workers encode the next. The batches outlive the pool.
  Batch a, b;
  Batch* encoding = &a;
  Batch* reading = &b;
  BatchEncoder pool(tokenizer, threads);
  if (!read_batch(reader, *encoding)) return;
  pool.start(*encoding);
  for (;;) {
    const bool more = read_batch(reader, *reading);
    pool.wait();
    Batch& done = *encoding;
    if (more) {
      std::swap(encoding, reading);
      pool.start(*encoding);
    }
    for (size_t i = 0; i < done.size; ++i)
      splits.writer_for_next().append(done.tokens[i], done.bytes[i]);
    progress.update(reader, splits.bytes(), splits.tokens(), splits.documents(), !more);
    if (!more) return;
  }
}

// An input directory around the output would read this run's (or an earlier run's) shards
// back as text.
void check_output_outside_inputs(const std::vector<std::string>& files, const std::string& output) {
  const fs::path out_dir = fs::weakly_canonical(output);
  for (const std::string& file : files) {
    if (file == "-") continue;
    const fs::path in = fs::weakly_canonical(file);
    const auto [end, _] = std::mismatch(out_dir.begin(), out_dir.end(), in.begin(), in.end());
    BOTTLE_CHECK(end != out_dir.end(),
                 "{}: this input is inside --output {}; move the output "
                 "out of the input directories",
                 file, output);
  }
}

// The tokenizer travels with the data, into OUT/tokenizer (bytes need none); a stale one of
// another kind must not. The folder is replaced in the two phases of the shards
// (data/shard_writer.h): stage() saves the tokenizer into OUT/.tokenizer.partial-PID, every
// file synced, while OUT/tokenizer stays as it was; commit() renames the earlier folder aside
// (OUT/.tokenizer.old-PID) and the new one into its place, renames only; remove_old() deletes
// the earlier one and a crashed run's leftovers. A byte-level run stages nothing, and its
// commit() moves an earlier tokenizer aside for remove_old() to delete. Until commit(), the
// destructor removes the staged folder, so a failed run leaves OUT/tokenizer untouched.
class TokenizerFolder {
 public:
  explicit TokenizerFolder(const fs::path& out)
      : out_(out),
        dir_(out / "tokenizer"),
        staged_(partial_path(dir_.string())),
        aside_(out / fmt::format(".tokenizer.old-{}", ::getpid())) {}
  ~TokenizerFolder() {
    std::error_code ignored;
    if (staging_ && !committed_) fs::remove_all(staged_, ignored);
  }
  TokenizerFolder(const TokenizerFolder&) = delete;
  TokenizerFolder& operator=(const TokenizerFolder&) = delete;

  const fs::path& path() const { return dir_; }

  void stage(const Tokenizer& tokenizer) {
    std::error_code ec;
    fs::remove_all(staged_, ec);  // a leftover of an earlier process with our pid
    staging_ = true;
    fs::create_directory(staged_, ec);
    BOTTLE_CHECK(!ec, "{}: cannot create the tokenizer's folder: {}", staged_.string(),
                 ec.message());
    tokenizer.save(staged_);
    for (const auto& e : fs::directory_iterator(staged_)) fsync_path(e.path().string());
    fsync_path(staged_.string());
  }

  void commit() {
    std::error_code ec;
    if (fs::exists(fs::symlink_status(dir_, ec))) {
      fs::rename(dir_, aside_, ec);
      BOTTLE_CHECK(!ec, "{}: cannot move the earlier tokenizer aside to {}: {}", dir_.string(),
                   aside_.string(), ec.message());
      moved_aside_ = true;
    }
    if (staging_) {
      fs::rename(staged_, dir_, ec);
      if (ec && moved_aside_) {
        std::error_code back;
        fs::rename(aside_, dir_, back);
        if (!back) moved_aside_ = false;
      }
      BOTTLE_CHECK(!ec, "{}: cannot rename to {}: {}", staged_.string(), dir_.string(),
                   ec.message());
    }
    committed_ = true;
  }

  // After commit(): the folders removed (the earlier tokenizer, by the name it had, and a
  // crashed run's leftovers).
  std::vector<fs::path> remove_old() {
    std::vector<fs::path> removed;
    std::error_code ec;
    if (moved_aside_) {
      fs::remove_all(aside_, ec);
      BOTTLE_CHECK(!ec, "{}: cannot remove the earlier tokenizer (moved aside from {}): {}",
                   aside_.string(), dir_.string(), ec.message());
      removed.push_back(dir_);
    }
    // No other prepare writes OUT while this one holds its lock: these are a killed run's.
    std::vector<fs::path> leftovers;
    for (const auto& e : fs::directory_iterator(out_)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with(".tokenizer.partial-") || name.starts_with(".tokenizer.old-"))
        leftovers.push_back(e.path());
    }
    std::sort(leftovers.begin(), leftovers.end());
    for (const fs::path& p : leftovers) {
      fs::remove_all(p, ec);
      BOTTLE_CHECK(!ec, "{}: cannot remove a killed run's tokenizer: {}", p.string(), ec.message());
      removed.push_back(p);
    }
    return removed;
  }

 private:
  fs::path out_, dir_, staged_, aside_;
  bool staging_ = false, committed_ = false, moved_aside_ = false;
};

// --documents auto: a paragraph when the input is one text file (or standard input), whose
// whole would be a single document; each file when it is several.
TextDocuments text_documents(const std::string& documents, const std::vector<std::string>& files,
                             TextFormat format) {
  if (documents == "file") return TextDocuments::file;
  if (documents == "paragraph") return TextDocuments::paragraph;
  if (documents == "line") return TextDocuments::line;
  size_t text_files = 0;
  for (const std::string& f : files)
    text_files += format_by_name(f == "-" ? std::string() : f, format) == TextFormat::text;
  return text_files == 1 ? TextDocuments::paragraph : TextDocuments::file;
}

// What a document is, as the summary and the refusals say it.
std::string documents_said(const TextSourceOptions& source, const std::vector<std::string>& files) {
  bool text = false, jsonl = false;
  for (const std::string& f : files)
    (format_by_name(f == "-" ? std::string() : f, source.format) == TextFormat::text ? text
                                                                                     : jsonl) =
        true;
  std::string said;
  if (jsonl) said = fmt::format("a JSONL record's field '{}'", source.text_field);
  if (text) {
    if (!said.empty()) said += " or ";
    said += source.documents == TextDocuments::file ? "a whole text file"
            : source.documents == TextDocuments::paragraph
                ? "a paragraph of text, which blank lines end"
                : "a line of text";
  }
  return said;
}

// prepare's options, as CLI11 fills them.
struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string output, prefix = "data", format = "auto", text_field = "text";
  std::string documents = "auto";
  TokenizerOptions tokenizer;
  double val_fraction = 0.05;
  int64_t shard_tokens = 100'000'000;
  std::string max_document_bytes = "1GiB";
  int64_t threads = std::max(1u, std::thread::hardware_concurrency());
  bool progress = false, no_progress = false;
};

// The reader's options: --format, and --documents resolved for these inputs (record means
// JSONL whatever the names).
TextSourceOptions source_options(const PrepareOptions& o, const std::vector<std::string>& files) {
  TextSourceOptions source;
  source.format = o.format == "text"                               ? TextFormat::text
                  : o.format == "jsonl" || o.documents == "record" ? TextFormat::jsonl
                                                                   : TextFormat::auto_detect;
  BOTTLE_CHECK(!(o.format == "text" && o.documents == "record"),
               "--documents record reads JSONL, but --format text was given: drop one of them");
  source.documents = text_documents(o.documents, files, source.format);
  source.text_field = o.text_field;
  const std::optional<int64_t> bound = parse_byte_size(o.max_document_bytes);
  BOTTLE_CHECK(bound && *bound > 0,
               "--max-document-bytes '{}': not a byte size (such as 1GiB or 500MB)",
               o.max_document_bytes);
  source.max_document_bytes = uint64_t(*bound);
  // One text file without blank lines (a document per line) holds one paragraph: by default
  // its lines are the documents then, when its paragraphs are too few for one validation
  // document. Counting stops once there are enough; standard input cannot be read twice.
  if (o.documents == "auto" && source.documents == TextDocuments::paragraph && o.val_fraction > 0 &&
      files.size() == 1 && files[0] != "-") {
    const uint64_t need = documents_for_one_validation(o.val_fraction);
    DocumentReader paragraphs(files, source);
    Document doc;
    uint64_t found = 0;
    while (found < need && paragraphs.next(doc)) ++found;
    if (found < need) {
      source.documents = TextDocuments::line;
      fmt::print(
          "{}: {} paragraph(s) are too few for --val-fraction {:g} (it takes {} for one "
          "validation document): a document is a line (--documents paragraph keeps paragraphs)\n",
          files[0], found, o.val_fraction, need);
    }
  }
  return source;
}

// The output directory, made if missing and locked for the run's life: two prepares into one
// --output would replace each other's shards and descriptions, so the second is refused naming
// the first (train/folder_lock.h). The lock file goes with the lock, and a run that writes
// nothing (refused) removes the directory when it made it.
class OutputDirectory {
 public:
  explicit OutputDirectory(const std::string& dir) : dir_(dir) {
    std::error_code ec;
    made_ = !fs::exists(dir, ec);
    fs::create_directories(dir, ec);
    BOTTLE_CHECK(fs::is_directory(dir), "{}: cannot create output directory{}", dir,
                 ec ? ": " + ec.message() : "");
    try {
      lock_.emplace((dir_ / kFolderLockFile).string(),
                    LockSubject{"--output", dir, "bottle prepare",
                                "two runs writing one directory would replace each other's "
                                "shards",
                                true});
    } catch (const Error&) {
      if (made_ && fs::is_empty(dir, ec)) fs::remove(dir, ec);
      throw;
    }
  }
  ~OutputDirectory() {
    lock_.reset();
    std::error_code ignored;
    if (made_ && fs::is_empty(dir_, ignored)) fs::remove(dir_, ignored);
  }
  OutputDirectory(const OutputDirectory&) = delete;
  OutputDirectory& operator=(const OutputDirectory&) = delete;

 private:
  fs::path dir_;
  bool made_ = false;
  std::optional<FolderLock> lock_;
};

// The refusals of a run whose input is read: checked before anything is staged, so that a run
// refused here changes nothing on disk. A training window needs at least 2 tokens (an input
// and its target); so does a validation split when one is asked for.
void check_splits(const Splits& splits, const PrepareOptions& o, const TextSourceOptions& source,
                  const std::vector<std::string>& files, const std::string& names) {
  const ShardWriter& train = splits.train;
  const ShardWriter& val = splits.val;
  const bool want_val = o.val_fraction > 0;
  if (want_val && val.documents() == 0) {
    // The finer splits of text not yet in use, then the way without validation.
    const std::string finer = source.documents == TextDocuments::file        ? "paragraph or line"
                              : source.documents == TextDocuments::paragraph ? "line"
                                                                             : "";
    fail(
        "{}: {} document(s) are too few for --val-fraction {}: it takes {} for one validation "
        "document (a document is {}); {}pass --val-fraction 0 for no validation split",
        names, splits.documents(), o.val_fraction, documents_for_one_validation(o.val_fraction),
        documents_said(source, files),
        finer.empty() ? "" : fmt::format("split the text finer (--documents {}), or ", finer));
  }
  BOTTLE_CHECK(train.tokens() >= 2 && (!want_val || val.tokens() >= 2),
               "{}: too few tokens to split: train has {} token(s) in {} document(s), "
               "validation {} token(s) in {} document(s) (--val-fraction {}); each needs at "
               "least 2",
               names, train.tokens(), train.documents(), val.tokens(), val.documents(),
               o.val_fraction);
}

// Whether `dir` holds anything but the lock file: an earlier run's output, which a failed run
// leaves as it was, and says so.
bool holds_earlier_output(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename() != kFolderLockFile) return true;
  return false;
}

// Phase 2 of data/shard_writer.h for the whole data set: the renames of both splits and of the
// tokenizer's folder, which need no disk space; then the removal of what the new data set
// replaces (stale shards and descriptions, the earlier tokenizer) and `output` synced. Returns
// the tokenizer folders removed.
std::vector<fs::path> commit_outputs(const std::string& output, Splits& splits,
                                     TokenizerFolder& tokenizer) {
  try {
    splits.train.commit();
    splits.val.commit();
    tokenizer.commit();
  } catch (const InternalError&) {
    throw;
  } catch (const Error& e) {
    fail(
        "{}; {} may now hold files of both the earlier output and this run's: run the command "
        "again",
        e.what(), output);
  }
  splits.train.remove_stale();
  splits.val.remove_stale();
  std::vector<fs::path> removed = tokenizer.remove_old();
  fsync_path(output);
  return removed;
}

// The run's figures: documents, bytes, tokens per split, bytes per token, the tokenizer (and
// the byte-unigram entropy of the train split for bytes, or where the tokenizer was saved),
// the time taken.
void print_summary(const Splits& splits, const Tokenizer& tokenizer,
                   const std::vector<std::string>& files, const std::string& documents,
                   const fs::path& tokenizer_dir, double seconds) {
  const uint64_t text_bytes = splits.bytes(), tokens = splits.tokens();
  fmt::print(
      "input: {} file(s), {} bytes, {} document(s) (train {}, val {}); a document is "
      "{}\n",
      files.size(), text_bytes, splits.documents(), splits.train.documents(),
      splits.val.documents(), documents);
  fmt::print("train: {} tokens in {} shard(s)\n", splits.train.tokens(),
             splits.train.meta().shards.size());
  fmt::print("val: {} tokens in {} shard(s)\n", splits.val.tokens(),
             splits.val.meta().shards.size());
  fmt::print("bytes per token: {:.4f}\n", double(text_bytes) / double(tokens));
  fmt::print("vocabulary: {}\n", tokenizer.vocab_size());
  fmt::print("tokenizer: {}\n", tokenizer.describe());
  if (tokenizer.kind() == "bytes") {
    const double entropy = unigram_entropy(splits.train_byte_counts);
    fmt::print("train byte-unigram entropy: {:.6f} nats/token ({:.4f} bits)\n", entropy,
               entropy / std::log(2.0));
  } else {
    fmt::print("tokenizer saved to {}\n", tokenizer_dir.string());
  }
  fmt::print("elapsed: {:.2f} s ({:.1f} MB/s of text)\n", seconds,
             double(text_bytes) / 1e6 / std::max(seconds, 1e-9));
}

}  // namespace

Command add_prepare_command(CLI::App& app) {
  using Options = PrepareOptions;
  auto o = std::make_shared<Options>();
  app.add_option("--input", o->inputs,
                 "text / JSONL files, directories, globs or '-' (none: standard input); .gz and "
                 ".zst are read as such");
  app.add_option("--output", o->output, "directory for the shards (created if missing)")
      ->required()
      ->check(output_directory());
  add_tokenizer_options(app, o->tokenizer, /*required=*/false);
  app.add_option("--format", o->format,
                 "auto (.jsonl / .ndjson names are JSONL, and .json ones in JSON Lines form), "
                 "text or jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}));
  app.add_option("--documents", o->documents,
                 "what a document is: auto (record for JSONL; paragraph for one text file, or "
                 "line when its paragraphs are too few for validation; file "
                 "for several), file, paragraph (blank lines end one), line, or record (a JSONL "
                 "line: --format jsonl)")
      ->check(CLI::IsMember({"auto", "file", "paragraph", "line", "record"}));
  app.add_option("--text-field", o->text_field, "the JSONL field holding a document's text");
  app.add_option("--val-fraction", o->val_fraction,
                 "fraction of the documents, spread evenly, for validation (0 <= f < 1)")
      ->check(finite_in(0, 1, /*hi_open=*/true));
  app.add_option("--shard-tokens", o->shard_tokens,
                 "tokens per shard (the last one of a split holds the rest)")
      ->check(integer_in(1, INT32_MAX));
  app.add_option("--max-document-bytes", o->max_document_bytes,
                 "the most bytes one document (or line) may hold, such as 1GiB (default): a "
                 "document is held whole in memory");
  app.add_option("--prefix", o->prefix, "shard name prefix: <prefix>_train_000000.bin, ...");
  app.add_option("--threads", o->threads, "encoding threads (default: the machine's cores)")
      ->check(integer_in(1, kMaxThreads));
  CLI::Option* progress =
      app.add_flag("--progress", o->progress, "a progress line on stderr even when not a terminal");
  app.add_flag("--no-progress", o->no_progress, "no progress line (default: on a terminal)")
      ->excludes(progress);
  return [o] {
    BOTTLE_CHECK(!o->prefix.empty() && std::regex_match(o->prefix, std::regex("[A-Za-z0-9._-]+")),
                 "--prefix '{}': use letters, digits, '.', '_' or '-'", o->prefix);
    BOTTLE_CHECK(o->val_fraction >= 0.0 && o->val_fraction < 1.0,
                 "--val-fraction {}: must be at least 0 and below 1", o->val_fraction);
    BOTTLE_CHECK(!o->text_field.empty(), "--text-field: must not be empty");
    const auto begin = Clock::now();

    const std::unique_ptr<Tokenizer> tokenizer = open_tokenizer(o->tokenizer);
    const bool bytes = tokenizer->kind() == "bytes";

    if (o->inputs.empty()) o->inputs.push_back("-");
    const std::vector<std::string> files = expand_inputs(o->inputs);
    const std::string names = fmt::format("{}", fmt::join(o->inputs, ", "));
    check_output_outside_inputs(files, o->output);
    const OutputDirectory output(o->output);
    const TextSourceOptions source = source_options(*o, files);
    DocumentReader reader(files, source);

    const fs::path out(o->output);
    const bool earlier = holds_earlier_output(out);
    Splits splits{ShardWriter(out, o->prefix, "train", o->shard_tokens, tokenizer->vocab_size()),
                  ShardWriter(out, o->prefix, "val", o->shard_tokens, tokenizer->vocab_size()),
                  o->val_fraction};
    TokenizerFolder tokenizer_folder(out);
    const std::string kind(tokenizer->kind());
    const std::string description = tokenizer->describe();
    // Phase 1 (data/shard_writer.h): every byte of the new data set is written under a
    // temporary name and synced, the tokenizer too, before anything in --output is renamed.
    // A failure here (a bad input, a refusal, a full disk) leaves the earlier output whole;
    // the writers' destructors remove the temporary files as the error unwinds.
    try {
      {
        Progress progress(o->no_progress ? false : o->progress || ::isatty(STDERR_FILENO));
        if (bytes)
          prepare_bytes(reader, splits, progress);
        else
          prepare_tokens(reader, *tokenizer, int(o->threads), splits, progress);
      }
      check_splits(splits, *o, source, files, names);
      splits.train.stage(kind, description);
      splits.val.stage(kind, description);
      if (!bytes) tokenizer_folder.stage(*tokenizer);
    } catch (const InternalError&) {
      throw;
    } catch (const Error& e) {
      if (!earlier) throw;
      fail("{}; the earlier output in {} is unchanged", e.what(), o->output);
    }
    // Phase 2: renames only, then the removals of what the new data set replaces.
    const std::vector<fs::path> removed_tokenizers =
        commit_outputs(o->output, splits, tokenizer_folder);
    for (const ShardWriter* w : {&splits.train, &splits.val}) {
      const auto paths = w->shard_paths();
      for (size_t i = 0; i < paths.size(); ++i)
        fmt::print("wrote {} ({} tokens)\n", paths[i].string(), w->meta().shards[i].tokens);
      for (const fs::path& p : w->removed()) fmt::print("removed stale {}\n", p.string());
    }
    // A tokenizer replaced by another is not stale; one that bytes no longer need is.
    for (const fs::path& p : removed_tokenizers)
      if (bytes || p != tokenizer_folder.path()) fmt::print("removed stale {}\n", p.string());

    const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    print_summary(splits, *tokenizer, files, documents_said(source, files), tokenizer_folder.path(),
                  seconds);
    std::string data = fmt::format("[data] train = \"{}/{}_train_*.bin\"", o->output, o->prefix);
    if (!splits.val.meta().shards.empty())
      data += fmt::format(", val = \"{}/{}_val_*.bin\"", o->output, o->prefix);
    fmt::print("{}\n", data);
    return 0;
  };
}

}  // namespace bottle
