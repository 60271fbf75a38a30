#include "data/text_source.h"

#include <glob.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <tuple>

#include "core/error.h"

namespace bottle {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr size_t kBlockBytes = size_t(1) << 20;
constexpr const char* kStdinName = "<stdin>";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// ---- expand_inputs ----------------------------------------------------------------------

void add_directory(const std::string& dir, std::vector<std::string>& found) {
  std::vector<std::string> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  BOTTLE_CHECK(!ec, "cannot read directory '{}': {}", dir, ec.message());
  for (; it != end; it.increment(ec)) {
    BOTTLE_CHECK(!ec, "cannot read directory '{}': {}", dir, ec.message());
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    std::string file = it->path().string();
    // Refused now rather than hours into a run, when the reader reaches it.
    BOTTLE_CHECK(::access(file.c_str(), R_OK) == 0, "cannot read input '{}': {}", file,
                 std::strerror(errno));
    files.push_back(std::move(file));
  }
  BOTTLE_CHECK(!ec, "cannot read directory '{}': {}", dir, ec.message());
  // std::string compares bytes as unsigned char: the order does not depend on the locale.
  std::sort(files.begin(), files.end());
  found.insert(found.end(), files.begin(), files.end());
}

// `path` exists: a directory contributes its files, anything else is read as it is (a FIFO or
// /dev/stdin named on purpose included).
void add_existing(const std::string& path, std::vector<std::string>& found) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    add_directory(path, found);
    return;
  }
  BOTTLE_CHECK(::access(path.c_str(), R_OK) == 0, "cannot read input '{}': {}", path,
               std::strerror(errno));
  found.push_back(path);
}

void add_glob(const std::string& pattern, std::vector<std::string>& found) {
  glob_t g{};
  // Sorted below by bytes: glob's own sort follows the locale's collation.
  const int rc = ::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &g);
  std::unique_ptr<glob_t, decltype(&::globfree)> guard(&g, ::globfree);
  BOTTLE_CHECK(rc != GLOB_NOMATCH, "no file matches the input pattern '{}'", pattern);
  BOTTLE_CHECK(rc == 0, "cannot expand the input pattern '{}' (glob error {})", pattern, rc);
  std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  std::sort(matches.begin(), matches.end());
  for (const std::string& m : matches) add_existing(m, found);
}

// ---- Compressed streams -----------------------------------------------------------------

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f != stdin) std::fclose(f);
  }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

// The raw bytes of one file, a block at a time, counted into the reader's progress.
class RawInput {
 public:
  RawInput(FilePtr file, std::string name, uint64_t& counter)
      : file_(std::move(file)), name_(std::move(name)), buf_(kBlockBytes), counter_(counter) {}

  const std::string& name() const { return name_; }
  std::string_view available() const { return {buf_.data() + pos_, end_ - pos_}; }
  void consume(size_t n) { pos_ += n; }

  // Reads the next block once the current one is consumed; false at the end of the file.
  bool refill() {
    if (pos_ < end_) return true;
    if (eof_) return false;
    // fread returns short only at the end of the file or on an error, so a block is whole:
    // the magic bytes are all in the first one.
    const size_t n = std::fread(buf_.data(), 1, buf_.size(), file_.get());
    if (n < buf_.size()) {
      BOTTLE_CHECK(!std::ferror(file_.get()), "{}: read error: {}", name_, std::strerror(errno));
      eof_ = true;
    }
    pos_ = 0;
    end_ = n;
    counter_ += n;
    return n > 0;
  }

 private:
  FilePtr file_;
  std::string name_;
  std::vector<char> buf_;
  size_t pos_ = 0, end_ = 0;
  bool eof_ = false;
  uint64_t& counter_;
};

// Decompressed bytes of one file; read returns 0 at its end, and again after it.
class Decoder {
 public:
  explicit Decoder(RawInput input) : input_(std::move(input)) {}
  virtual ~Decoder() = default;
  virtual size_t read(char* out, size_t cap) = 0;

 protected:
  RawInput input_;
};

class PlainDecoder final : public Decoder {
 public:
  using Decoder::Decoder;
  size_t read(char* out, size_t cap) override {
    if (!input_.refill()) return 0;
    const std::string_view in = input_.available();
    const size_t n = std::min(cap, in.size());
    std::memcpy(out, in.data(), n);
    input_.consume(n);
    return n;
  }
};

struct InflateEnd {
  void operator()(z_stream* z) const {
    inflateEnd(z);
    std::default_delete<z_stream>()(z);
  }
};

class GzipDecoder final : public Decoder {
 public:
  explicit GzipDecoder(RawInput input) : Decoder(std::move(input)) {
    auto z = std::make_unique<z_stream>();
    // 15 + 32: the largest window, gzip or zlib header detected by inflate itself.
    BOTTLE_CHECK(inflateInit2(z.get(), 15 + 32) == Z_OK, "{}: cannot start the gzip decoder",
                 input_.name());
    z_.reset(z.release());
  }

  size_t read(char* out, size_t cap) override {
    size_t produced = 0;
    while (produced < cap && !done_) {
      if (member_done_) {
        if (!skip_padding()) {
          done_ = true;
          break;
        }
        inflateReset(z_.get());  // another member follows (a concatenated gzip file)
        member_done_ = false;
      }
      std::string_view in = input_.available();
      // A full output buffer may leave output inside zlib: inflate again before reading on.
      if (in.empty() && !pending_) {
        BOTTLE_CHECK(input_.refill(), "{}: corrupt gzip stream: it ends inside a member",
                     input_.name());
        in = input_.available();
      }
      z_->next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
      z_->avail_in = static_cast<uInt>(in.size());
      z_->next_out = reinterpret_cast<Bytef*>(out + produced);
      z_->avail_out = static_cast<uInt>(cap - produced);
      const int rc = inflate(z_.get(), Z_NO_FLUSH);
      input_.consume(in.size() - z_->avail_in);
      produced = cap - z_->avail_out;
      pending_ = false;
      if (rc == Z_STREAM_END) {
        member_done_ = true;
      } else if (rc == Z_OK) {
        pending_ = z_->avail_out == 0;
      } else if (rc != Z_BUF_ERROR) {  // Z_BUF_ERROR: nothing pending, more input needed
        fail("{}: corrupt gzip stream: {}", input_.name(), z_->msg ? z_->msg : zError(rc));
      }
    }
    return produced;
  }

 private:
  // Skips the zero bytes after a member (padding, which gzip and Python's gzip accept too);
  // false at the end of the file.
  bool skip_padding() {
    while (input_.refill()) {
      const std::string_view in = input_.available();
      size_t i = 0;
      while (i < in.size() && in[i] == 0) ++i;
      input_.consume(i);
      if (i < in.size()) return true;
    }
    return false;
  }

  std::unique_ptr<z_stream, InflateEnd> z_;
  bool member_done_ = false, pending_ = false, done_ = false;
};

struct FreeDCtx {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

class ZstdDecoder final : public Decoder {
 public:
  explicit ZstdDecoder(RawInput input) : Decoder(std::move(input)), d_(ZSTD_createDCtx()) {
    BOTTLE_CHECK(d_ != nullptr, "{}: cannot start the zstd decoder", input_.name());
  }

  size_t read(char* out, size_t cap) override {
    ZSTD_outBuffer ob{out, cap, 0};
    while (ob.pos < ob.size && !done_) {
      std::string_view in = input_.available();
      // A full output buffer may leave output inside the decoder: call it again first.
      if (in.empty() && !pending_) {
        if (!input_.refill()) {
          BOTTLE_CHECK(frame_done_, "{}: corrupt zstd stream: it ends inside a frame",
                       input_.name());
          done_ = true;
          break;
        }
        in = input_.available();
      }
      ZSTD_inBuffer ib{in.data(), in.size(), 0};
      // Reads the following frames of a concatenated file by itself.
      const size_t rc = ZSTD_decompressStream(d_.get(), &ob, &ib);
      input_.consume(ib.pos);
      BOTTLE_CHECK(!ZSTD_isError(rc), "{}: corrupt zstd stream: {}", input_.name(),
                   ZSTD_getErrorName(rc));
      frame_done_ = rc == 0;
      pending_ = ob.pos == ob.size;
    }
    return ob.pos;
  }

 private:
  std::unique_ptr<ZSTD_DCtx, FreeDCtx> d_;
  bool frame_done_ = false, pending_ = false, done_ = false;
};

// The first (up to four) bytes of `head` in hexadecimal: what a message shows of a file that
// is not what its name says.
std::string hex_bytes(std::string_view head) {
  std::string out;
  for (size_t i = 0; i < std::min<size_t>(head.size(), 4); ++i)
    out += fmt::format("{}{:02x}", i ? " " : "", uint8_t(head[i]));
  return out;
}

std::unique_ptr<Decoder> open_decoder(const std::string& file, uint64_t& counter) {
  FilePtr f;
  std::string name = file;
  if (file == "-") {
    f.reset(stdin);
    name = kStdinName;
  } else {
    f.reset(std::fopen(file.c_str(), "rb"));
    BOTTLE_CHECK(f != nullptr, "cannot open input '{}': {}", file, std::strerror(errno));
  }
  RawInput input(std::move(f), std::move(name), counter);
  input.refill();
  const std::string_view head = input.available();
  const bool gzip = head.size() >= 2 && head[0] == '\x1F' && head[1] == '\x8B';
  const bool zstd =
      head.size() >= 4 && head.substr(0, 4) == std::string_view("\x28\xB5\x2F\xFD", 4);
  // A name ending .gz or .zst says what the file holds: one that does not start as such a
  // stream (a damaged first byte, another format, text) would otherwise be read as text, its
  // compressed bytes tokenized as if they were the corpus.
  for (const auto& [ext, format, matches] :
       {std::tuple{".gz", "gzip", gzip}, std::tuple{".zst", "zstd", zstd}}) {
    if (file != "-" && ends_with(file, ext))
      BOTTLE_CHECK(matches,
                   "{}: the name ends in {} but the file is not {} data ({}); rename it if it "
                   "holds plain text",
                   file, ext, format,
                   head.empty() ? std::string("it is empty")
                                : fmt::format("it starts with the bytes {}", hex_bytes(head)));
  }
  if (gzip) return std::make_unique<GzipDecoder>(std::move(input));
  if (zstd) return std::make_unique<ZstdDecoder>(std::move(input));
  return std::make_unique<PlainDecoder>(std::move(input));
}

// A file's name without a .gz or .zst suffix: the name its format is told by.
std::string_view without_compression(std::string_view name) {
  for (std::string_view ext : {".gz", ".zst"})
    if (ends_with(name, ext)) return name.substr(0, name.size() - ext.size());
  return name;
}

// A name ending .json (before any .gz / .zst): JSON Lines or not is decided by the content.
bool json_name(std::string_view name) { return ends_with(without_compression(name), ".json"); }

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// nlohmann's messages quote the token last read, which for an unterminated string is the
// rest of the line: a document's worth of text in one error message.
std::string shorten(std::string message) {
  constexpr size_t kMax = 300;
  if (message.size() > kMax) message = message.substr(0, kMax) + "...";
  return message;
}

}  // namespace

TextFormat format_by_name(const std::string& file, TextFormat requested) {
  if (requested != TextFormat::auto_detect) return requested;
  const std::string_view name = without_compression(file);
  return ends_with(name, ".jsonl") || ends_with(name, ".ndjson") || ends_with(name, ".json")
             ? TextFormat::jsonl
             : TextFormat::text;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> found;
  for (const std::string& input : inputs) {
    if (input == "-") {
      found.push_back(input);
      continue;
    }
    std::error_code ec;
    // A name that exists is taken as it is, even when it holds glob characters.
    if (fs::exists(input, ec)) {
      add_existing(input, found);
    } else if (has_glob_chars(input)) {
      add_glob(input, found);
    } else {
      fail("cannot read input '{}': {}", input,
           ec ? ec.message() : std::string("no such file or directory"));
    }
  }
  std::vector<std::string> unique;
  std::set<std::string> seen;
  for (std::string& f : found) {
    const std::string key = f == "-" ? f : fs::path(f).lexically_normal().string();
    if (seen.insert(key).second) unique.push_back(std::move(f));
  }
  return unique;
}

struct DocumentReader::State {
  std::vector<std::string> files;
  TextSourceOptions options;
  uint64_t bytes_read = 0;
  uint64_t bytes_total = 0;

  size_t next_file = 0;
  std::unique_ptr<Decoder> decoder;  // of files[next_file - 1] while it is open
  std::string name;                  // that file as messages name it
  TextFormat format = TextFormat::text;
  int64_t line_number = 0;

  // Decompressed bytes not yet split into lines, and a line that crosses blocks.
  std::vector<char> block = std::vector<char>(kBlockBytes);
  size_t block_pos = 0, block_end = 0;
  std::string carry;
  bool line_ended = false;  // the line next_line gave last ended in '\n'
  // A line read to decide a .json file's format, given again by the next next_line.
  std::optional<std::string> pushed_back;

  // A text file split into paragraphs or lines: the document being gathered, where it
  // starts, and whether it holds a non-blank line and a blank one after it.
  std::string gathering, gathering_origin;
  bool gathered_text = false, gathered_blank = false;

  // The next line of the open file, without its '\n'; false at the end. The view lives
  // until the next call.
  bool next_line(std::string_view& line) {
    if (pushed_back) {
      carry = std::move(*pushed_back);
      pushed_back.reset();
      line = carry;
      return true;
    }
    carry.clear();
    line_ended = true;
    while (true) {
      if (block_pos == block_end) {
        block_pos = 0;
        block_end = decoder->read(block.data(), block.size());
        if (block_end == 0) {
          if (carry.empty()) return false;  // no partial line: the file ended with '\n'
          line_ended = false;
          line = carry;
          return true;
        }
      }
      const char* start = block.data() + block_pos;
      const size_t left = block_end - block_pos;
      const auto* newline = static_cast<const char*>(std::memchr(start, '\n', left));
      if (newline == nullptr) {
        carry.append(start, left);
        block_pos = block_end;
        check_document_size(carry.size(), "a line");
        continue;
      }
      const size_t length = static_cast<size_t>(newline - start);
      block_pos += length + 1;
      if (carry.empty()) {
        line = std::string_view(start, length);
      } else {
        carry.append(start, length);
        line = carry;
      }
      return true;
    }
  }

  // Fails, naming the file, once `bytes` of one document (or line) pass the bound.
  void check_document_size(uint64_t bytes, const char* what) const {
    BOTTLE_CHECK(bytes <= options.max_document_bytes,
                 "{}: {} longer than {} bytes (--max-document-bytes), from line {} on: a "
                 "document is held whole in memory; split the input into documents (--documents "
                 "paragraph or line), or raise the bound",
                 name, what, options.max_document_bytes, line_number + 1);
  }

  void parse_line(std::string_view line, Document& doc) const {
    const std::string& field = options.text_field;
    // Keeps only the field wanted from the top-level object: the rest of a line (metadata of
    // any size or depth) is parsed and dropped, never built.
    auto keep = [&field](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key && depth == 1)
        return parsed.get_ref<const std::string&>() == field;
      return true;
    };
    json j;
    try {
      j = json::parse(line.begin(), line.end(), keep);
    } catch (const json::exception& e) {
      fail("{}:{}: invalid JSON: {}", name, line_number, shorten(e.what()));
    }
    BOTTLE_CHECK(j.is_object(), "{}:{}: no string field '{}': the line is a JSON {}, not an object",
                 name, line_number, field, j.type_name());
    const auto it = j.find(field);
    BOTTLE_CHECK(it != j.end(), "{}:{}: no string field '{}': the object has no key '{}'", name,
                 line_number, field, field);
    BOTTLE_CHECK(it->is_string(), "{}:{}: no string field '{}': '{}' is a JSON {}", name,
                 line_number, field, field, it->type_name());
    doc.text = std::move(it->get_ref<std::string&>());
    doc.origin = fmt::format("{}:{}", name, line_number);
  }

  void read_whole(Document& doc) {
    doc.text.clear();
    while (true) {
      const size_t at = doc.text.size();
      doc.text.resize(at + kBlockBytes);
      const size_t n = decoder->read(doc.text.data() + at, kBlockBytes);
      doc.text.resize(at + n);
      if (n == 0) break;
      check_document_size(doc.text.size(), "a document (the whole file, --documents file)");
    }
    doc.origin = name;
  }

  void open_next() {
    const std::string& file = files[next_file++];
    decoder = open_decoder(file, bytes_read);
    name = file == "-" ? kStdinName : file;
    format = format_by_name(file == "-" ? std::string() : file, options.format);
    line_number = 0;
    block_pos = block_end = 0;
    pushed_back.reset();
    if (options.format == TextFormat::auto_detect && json_name(name)) check_json_lines();
  }

  // A .json file read as JSON Lines: its first non-blank line must be a whole JSON object.
  // Pretty-printed JSON or an array is refused, not tokenized as the text of its syntax.
  void check_json_lines() {
    std::string_view line;
    int64_t skipped = 0;
    bool got = false;
    while ((got = next_line(line)) && is_blank(line)) ++skipped;
    if (!got) return;  // empty or blank: no documents
    const bool object = json::accept(line.begin(), line.end()) &&
                        line.find_first_not_of(" \t\r") != std::string_view::npos &&
                        line[line.find_first_not_of(" \t\r")] == '{';
    BOTTLE_CHECK(object,
                 "{}: a .json file is read as JSON Lines (one object per line, as "
                 "datasets.to_json writes), but its line {} is not a whole JSON object; convert "
                 "it to JSON Lines, or pass --format text to read the file as text",
                 name, skipped + 1);
    pushed_back = std::string(line);
    line_number = skipped;
  }

  // The next document of a text file split into paragraphs or lines; false at its end.
  bool next_split(Document& doc) {
    const bool by_line = options.documents == TextDocuments::line;
    std::string_view line;
    while (next_line(line)) {
      ++line_number;
      const bool blank = is_blank(line);
      // A non-blank line after a whole document starts the next one.
      if (!blank && gathered_text && (by_line || gathered_blank)) {
        take_gathered(doc);
        append_line(line);
        gathered_text = true;
        gathering_origin = fmt::format("{}:{}", name, line_number);
        return true;
      }
      append_line(line);
      if (blank) {
        gathered_blank = gathered_text;
      } else if (!gathered_text) {
        gathered_text = true;
        gathering_origin = fmt::format("{}:{}", name, line_number);
      }
    }
    if (gathering.empty()) return false;
    if (gathering_origin.empty()) gathering_origin = name;  // blank lines only
    take_gathered(doc);
    return true;
  }

  void append_line(std::string_view line) {
    gathering.append(line);
    if (line_ended) gathering.push_back('\n');
    check_document_size(gathering.size(), "a document");
  }

  void take_gathered(Document& doc) {
    doc.text = std::move(gathering);
    doc.origin = std::move(gathering_origin);
    gathering.clear();
    gathering_origin.clear();
    gathered_text = gathered_blank = false;
  }
};

DocumentReader::DocumentReader(std::vector<std::string> files, TextSourceOptions options)
    : state_(std::make_unique<State>()) {
  state_->files = std::move(files);
  state_->options = std::move(options);
  for (const std::string& file : state_->files) {
    std::error_code ec;
    const uint64_t size = file == "-" ? 0 : fs::file_size(file, ec);
    if (file == "-" || ec) {  // standard input or a FIFO: the total is unknown
      state_->bytes_total = 0;
      break;
    }
    state_->bytes_total += size;
  }
}

DocumentReader::~DocumentReader() = default;

bool DocumentReader::next(Document& doc) {
  State& s = *state_;
  while (true) {
    if (!s.decoder) {
      if (s.next_file == s.files.size()) return false;
      s.open_next();
    }
    if (s.format == TextFormat::text && s.options.documents == TextDocuments::file) {
      s.read_whole(doc);
      s.decoder.reset();
      return true;
    }
    if (s.format == TextFormat::text) {
      if (s.next_split(doc)) return true;
      s.decoder.reset();
      continue;
    }
    std::string_view line;
    while (s.next_line(line)) {
      ++s.line_number;
      if (is_blank(line)) continue;
      s.parse_line(line, doc);
      return true;
    }
    s.decoder.reset();
  }
}

uint64_t DocumentReader::bytes_read() const { return state_->bytes_read; }
uint64_t DocumentReader::bytes_total() const { return state_->bytes_total; }

}  // namespace bottle
