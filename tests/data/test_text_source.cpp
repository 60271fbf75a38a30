// The input side of `bottle prepare`: UTF-8 repair exactly as Python's
// bytes.decode("utf-8", "replace"), and documents read from text and JSONL files, plain, gzip
// and zstd (concatenated members and frames too), directories and globs in byte order, and
// errors that name the file and line.
#include <sys/stat.h>

#include <fstream>
#include <tuple>

#include "data/text_source.h"
#include "data/utf8.h"
#include "test_util.h"

namespace bottle::testing {
namespace {

using namespace std::string_literals;

struct Utf8Case {
  const char* name;
  std::string input;
  std::string expected;
};

// Expected outputs pasted from Python 3.11: bytes.decode("utf-8", "replace").encode("utf-8").
const Utf8Case kUtf8Cases[] = {
    {"empty", ""s, ""s},
    {"ascii", "hello, world"s, "hello, world"s},
    {"two byte", "caf\xC3\xA9"s, "caf\xC3\xA9"s},
    {"three byte cjk", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E"s,
     "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E"s},
    {"four byte emoji", "a\xF0\x9F\x98\x80\x62"s, "a\xF0\x9F\x98\x80\x62"s},
    {"combining mark", "e\xCC\x81"s, "e\xCC\x81"s},
    {"zwj emoji", "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB"s,
     "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB"s},
    {"boundaries", "\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF"s,
     "\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF"s},
    {"overlong c0", "\xC0\xAF"s, "\xEF\xBF\xBD\xEF\xBF\xBD"s},
    {"overlong c1", "a\xC1\xBF\x62"s, "a\xEF\xBF\xBD\xEF\xBF\xBD\x62"s},
    {"overlong e0", "\xE0\x80\xAF"s, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"s},
    {"overlong e0 9f", "\xE0\x9F\xBF"s, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"s},
    {"overlong f0", "\xF0\x80\x80\xAF"s, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"s},
    {"overlong f0 8f", "\xF0\x8F\xBF\xBF"s, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"s},
    {"overlongs in a row", "\xC0\xAF\xE0\x80\xBF\xF0\x81\x82\x41"s,
     "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\x41"s},
    {"surrogate high", "\xED\xA0\x80"s, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"s},
    {"surrogate low", "\xED\xBF\xBF"s, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"s},
    {"surrogate pair", "\xED\xA0\xBD\xED\xB8\x80"s,
     "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"s},
    {"surrogate truncated", "\xED\xA0"s, "\xEF\xBF\xBD\xEF\xBF\xBD"s},
    {"above max f4 90", "\xF4\x90\x80\x80"s, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"s},
    {"f5", "\xF5\x80\x80\x80"s, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"s},
    {"f8 ff fe", "\xF8\x88\x80\x80\x80x\xFF\xFE"s,
     "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDx\xEF\xBF\xBD\xEF\xBF\xBD"s},
    {"largest valid", "\xF4\x8F\xBF\xBF"s, "\xF4\x8F\xBF\xBF"s},
    {"largest truncated", "\xF4\x8F\xBF"s, "\xEF\xBF\xBD"s},
    {"truncated 2", "ab\xC3"s, "ab\xEF\xBF\xBD"s},
    {"truncated 3", "\xE6\x97"s, "\xEF\xBF\xBD"s},
    {"truncated 4", "\xF0\x9F\x98"s, "\xEF\xBF\xBD"s},
    {"truncated then ascii", "\xF0\x9F\x98x"s, "\xEF\xBF\xBDx"s},
    {"truncated then lead", "\xE6\x97\xE6\x97\xA5"s, "\xEF\xBF\xBD\xE6\x97\xA5"s},
    {"stray continuation", "\x80"s, "\xEF\xBF\xBD"s},
    {"stray continuations", "a\x80\xBF\x80\x62"s, "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\x62"s},
    {"extra continuation", "\xC3\xA9\xA9"s, "\xC3\xA9\xEF\xBF\xBD"s},
    {"unicode table 3-8", "a\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"s,
     "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\x62\xEF\xBF\xBD\x63\xEF\xBF\xBD\xEF\xBF\xBD\x64"s},
    {"long ascii then bad", "abcdefghijklmnopqrstuvwxyz0123456789\xFFtail"s,
     "abcdefghijklmnopqrstuvwxyz0123456789\xEF\xBF\xBDtail"s},
    {"nul bytes", "a\x00\x62\xFF\x00"s, "a\x00\x62\xEF\xBF\xBD\x00"s},
};

TEST(Utf8, ReplaceInvalidMatchesPython) {
  for (const Utf8Case& c : kUtf8Cases) {
    EXPECT_EQ(utf8_replace_invalid(c.input), c.expected) << c.name;
    EXPECT_EQ(utf8_valid(c.input), c.input == c.expected) << c.name;
    EXPECT_TRUE(utf8_valid(c.expected)) << c.name;
  }
}

// Every case at every offset inside long ASCII and multi-byte runs: the 8-byte ASCII fast path
// must hand over to the decoder wherever a sequence starts.
TEST(Utf8, ReplaceInvalidInsideLongRuns) {
  const std::string cjk = "\xE6\x97\xA5";
  for (const Utf8Case& c : kUtf8Cases) {
    for (size_t pad = 0; pad < 17; ++pad) {
      const std::string before(pad, 'x'), after(23 - pad, 'y');
      EXPECT_EQ(utf8_replace_invalid(before + c.input + after), before + c.expected + after)
          << c.name << " at " << pad;
      EXPECT_EQ(utf8_replace_invalid(cjk + before + c.input + cjk), cjk + before + c.expected + cjk)
          << c.name << " at " << pad;
    }
  }
}

TEST(Utf8, CompletePrefix) {
  const struct {
    std::string text;
    size_t expected;
  } cases[] = {
      {"", 0},
      {"abc", 3},
      {"ab\xC3", 2},                 // 2-byte sequence cut after its lead
      {"\xE6\x97", 0},               // 3-byte cut after 2
      {"x\xE6\x97\xA5", 4},          // complete
      {"\xE6\x97\xA5\xE6", 3},       // next one just started
      {"\xF0\x9F", 0},               // 4-byte cut after 2
      {"a\xF0\x9F\x98", 1},          // 4-byte cut after 3
      {"a\xF0\x9F\x98\x80", 5},      // complete emoji
      {"\xF4\x8F\xBF", 0},           // the largest code point, cut
      {"\xC0", 1},                   // never valid: U+FFFD already
      {"\xFF", 1},                   // never valid
      {"ab\x80", 3},                 // stray continuation
      {"\xED\xA0", 2},               // a surrogate cannot be completed
      {"\xE0\x9F", 2},               // an overlong cannot be completed
      {"\xF0\x8F", 2},               // nor this one
      {"\xF4\x90", 2},               // above U+10FFFF
      {"\xC3\xA9\xA9", 3},           // extra continuation
      {std::string("a\x00", 2), 2},  // NUL is ASCII
  };
  for (const auto& c : cases) EXPECT_EQ(utf8_complete_prefix(c.text), c.expected) << c.text;

  // What a streaming decoder prints from any prefix is a prefix of the whole decoding.
  std::string all;
  for (const Utf8Case& c : kUtf8Cases) all += c.input;
  const std::string decoded = utf8_replace_invalid(all);
  for (size_t k = 0; k <= all.size(); ++k) {
    const std::string part = all.substr(0, k);
    const std::string shown = utf8_replace_invalid(part.substr(0, utf8_complete_prefix(part)));
    EXPECT_EQ(decoded.compare(0, shown.size(), shown), 0) << "prefix of " << k << " bytes";
  }
}

// ---- Documents ---------------------------------------------------------------------------

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `path` compressed by the gzip or zstd command-line tool into `path` + ".gz" / ".zst".
std::string gzip(const std::string& path) {
  EXPECT_EQ(run(fmt::format("gzip -n -c '{}' > '{}.gz'", path, path)).status, 0);
  return path + ".gz";
}
std::string zstd(const std::string& path) {
  EXPECT_EQ(run(fmt::format("zstd -q -f -c '{}' > '{}.zst'", path, path)).status, 0);
  return path + ".zst";
}

std::vector<Document> read_all(const std::vector<std::string>& files,
                               TextSourceOptions options = {}) {
  DocumentReader reader(files, std::move(options));
  std::vector<Document> docs;
  Document doc;
  while (reader.next(doc)) docs.push_back(doc);
  EXPECT_FALSE(reader.next(doc));  // and it stays at the end
  return docs;
}

std::vector<std::string> texts_of(const std::vector<Document>& docs) {
  std::vector<std::string> t;
  for (const Document& d : docs) t.push_back(d.text);
  return t;
}

// Whether `message` starts with `prefix`, printed when it does not.
::testing::AssertionResult starts_with(const std::string& message, const std::string& prefix) {
  if (message.starts_with(prefix)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "'" << message << "' does not start with '" << prefix << "'";
}
::testing::AssertionResult contains(const std::string& message, const std::string& part) {
  if (message.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << message << "' does not contain '" << part << "'";
}

TEST(TextSource, TextFilesPlainGzipZstd) {
  TempDir dir;
  const std::string a = "first document\nwith two lines\n", b = "caf\xC3\xA9 \xFF raw bytes";
  write_file(dir / "a.txt", a);
  write_file(dir / "b.txt", b);
  const std::string agz = gzip(dir / "a.txt"), bzst = zstd(dir / "b.txt");
  const std::vector<Document> docs = read_all({dir / "a.txt", agz, bzst, dir / "b.txt"});
  EXPECT_EQ(texts_of(docs), (std::vector<std::string>{a, a, b, b}));
  EXPECT_EQ(docs[0].origin, dir / "a.txt");
  EXPECT_EQ(docs[2].origin, bzst);

  write_file(dir / "empty.txt", "");
  EXPECT_EQ(texts_of(read_all({dir / "empty.txt"})), std::vector<std::string>{""});
}

// A name without .gz or .zst: compression is found by the magic bytes, JSONL by the name.
TEST(TextSource, CompressionIsFoundByItsMagicBytes) {
  TempDir dir;
  write_file(dir / "a", "gzip inside");
  std::rename(gzip(dir / "a").c_str(), (dir / "gz.txt").c_str());
  write_file(dir / "b", R"({"text": "zstd inside"})");
  std::rename(zstd(dir / "b").c_str(), (dir / "zst.jsonl").c_str());
  EXPECT_EQ(texts_of(read_all({dir / "gz.txt", dir / "zst.jsonl"})),
            (std::vector<std::string>{"gzip inside", "zstd inside"}));
}

// Issue 45, case 3: a name ending .gz or .zst decides the decoder. A file so named that does not
// start as that stream (a damaged first byte, the other format, random bytes, nothing) is
// refused naming the file; before, it was read as text and its bytes tokenized.
TEST(TextSource, ACompressedNameThatDoesNotDecodeIsRefused) {
  TempDir dir;
  write_file(dir / "a", "some text");
  std::string damaged = read_file(gzip(dir / "a"));
  damaged[0] = 'x';
  write_file(dir / "damaged.txt.gz", damaged);
  std::rename(zstd(dir / "a").c_str(), (dir / "zstd.txt.gz").c_str());
  std::string random(300, '\0');
  for (size_t i = 0; i < random.size(); ++i) random[i] = char((i * 2654435761u) >> 13);
  write_file(dir / "random.zst", random);
  write_file(dir / "empty.jsonl.zst", "");
  write_file(dir / "text.gz", "plain text\n");
  for (const auto& [name, ext, why] :
       {std::tuple{"damaged.txt.gz", "gz", "it starts with the bytes 78 8b 08 00"},
        std::tuple{"zstd.txt.gz", "gz", "it starts with the bytes 28 b5 2f fd"},
        std::tuple{"random.zst", "zst", "it starts with the bytes"},
        std::tuple{"empty.jsonl.zst", "zst", "it is empty"},
        std::tuple{"text.gz", "gz", "it starts with the bytes 70 6c 61 69"}}) {
    const std::string message = error_of([&, n = name] { read_all({dir / n}); });
    EXPECT_TRUE(starts_with(message, dir / name + ": the name ends in ." + ext +
                                         " but the file is "
                                         "not " +
                                         (std::string(ext) == "gz" ? "gzip" : "zstd") + " data ("))
        << name;
    EXPECT_TRUE(contains(message, why)) << name;
  }
}

TEST(TextSource, ConcatenatedGzipMembersAndZstdFrames) {
  TempDir dir;
  write_file(dir / "a", "one, ");
  write_file(dir / "b", "two, ");
  write_file(dir / "c", "three");
  const std::string gzs =
      read_file(gzip(dir / "a")) + read_file(gzip(dir / "b")) + read_file(gzip(dir / "c"));
  write_file(dir / "all.txt.gz", gzs);
  // Zero padding after the last member, as on tapes: gzip and Python's gzip accept it too.
  write_file(dir / "padded.txt.gz", gzs + std::string(7, '\0'));
  write_file(dir / "all.txt.zst",
             read_file(zstd(dir / "a")) + read_file(zstd(dir / "b")) + read_file(zstd(dir / "c")));
  EXPECT_EQ(texts_of(read_all({dir / "all.txt.gz", dir / "padded.txt.gz", dir / "all.txt.zst"})),
            (std::vector<std::string>(3, "one, two, three")));

  // JSONL records across members and frames, one line split between two of them.
  write_file(dir / "p", "{\"text\": \"x\"}\n{\"te");
  write_file(dir / "q", "xt\": \"y\"}\n\n{\"text\": \"z\"}");
  write_file(dir / "pq.jsonl.gz", read_file(gzip(dir / "p")) + read_file(gzip(dir / "q")));
  write_file(dir / "pq.jsonl.zst", read_file(zstd(dir / "p")) + read_file(zstd(dir / "q")));
  for (const std::string name : {"pq.jsonl.gz", "pq.jsonl.zst"}) {
    const std::vector<Document> docs = read_all({dir / name});
    EXPECT_EQ(texts_of(docs), (std::vector<std::string>{"x", "y", "z"})) << name;
    ASSERT_EQ(docs.size(), 3u);
    EXPECT_EQ(docs[2].origin, dir / name + ":4");  // the blank line 3 counts
  }
}

TEST(TextSource, JsonlLines) {
  TempDir dir;
  write_file(dir / "a.jsonl",
             "{\"id\": 1, \"text\": \"caf\\u00e9\\nline\", \"meta\": {\"deep\": [[[1]]]}}\r\n"
             "\n"
             "   \t\r\n"
             "{\"text\": \"\"}\n"
             "{\"meta\": \"text\", \"text\": \"last, no newline\"}");
  const std::vector<Document> docs = read_all({dir / "a.jsonl"});
  EXPECT_EQ(texts_of(docs),
            (std::vector<std::string>{"caf\xC3\xA9\nline", "", "last, no newline"}));
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].origin, dir / "a.jsonl:1");
  EXPECT_EQ(docs[1].origin, dir / "a.jsonl:4");
  EXPECT_EQ(docs[2].origin, dir / "a.jsonl:5");

  // Another field, a forced format, and auto-detection by name (.ndjson) and by content (a
  // .json file in JSON Lines form, as datasets.to_json writes it).
  write_file(dir / "b.txt", "{\"content\": \"c\"}\n");
  write_file(dir / "c.ndjson", "{\"content\": \"d\"}\n");
  write_file(dir / "d.json", "{\"content\": \"e\"}\n");
  TextSourceOptions content;
  content.text_field = "content";
  EXPECT_EQ(texts_of(read_all({dir / "c.ndjson", dir / "d.json"}, content)),
            (std::vector<std::string>{"d", "e"}));
  content.format = TextFormat::jsonl;
  EXPECT_EQ(texts_of(read_all({dir / "b.txt"}, content)), std::vector<std::string>{"c"});
  TextSourceOptions text;
  text.format = TextFormat::text;
  EXPECT_EQ(texts_of(read_all({dir / "c.ndjson"}, text)),
            std::vector<std::string>{"{\"content\": \"d\"}\n"});
}

// A .json file is JSON Lines when its first non-blank line is a whole object; JSON of any other
// shape is refused by name with the way forward, never read as the text of its syntax.
TEST(TextSource, JsonFilesAreJsonLinesOrRefused) {
  TempDir dir;
  write_file(dir / "records.json", "\n{\"text\": \"a\"}\n{\"text\": \"b\"}\n");
  const std::vector<Document> docs = read_all({gzip(dir / "records.json")});
  EXPECT_EQ(texts_of(docs), (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].origin, dir / "records.json.gz:2");  // line numbers count the blank line
  EXPECT_EQ(docs[1].origin, dir / "records.json.gz:3");
  write_file(dir / "empty.json", "\n \n");
  EXPECT_TRUE(read_all({dir / "empty.json"}).empty());
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"array.json", "[{\"text\": \"a\"}, {\"text\": \"b\"}]\n"},
      {"pretty.json", "{\n  \"text\": \"a\"\n}\n"},
      {"scalar.json", "\"just a string\"\n"},
      {"broken.json", "{\"text\": \"a\"\n"},
      {"two.json", "{\"text\": \"a\"} {\"text\": \"b\"}\n"},
  };
  for (const auto& [name, content] : refused) {
    write_file(dir / name, content);
    try {
      read_all({dir / name});
      ADD_FAILURE() << name << " was read";
    } catch (const Error& e) {
      EXPECT_TRUE(starts_with(e.what(), dir / name + ": a .json file is read as JSON Lines"));
      EXPECT_TRUE(contains(e.what(), "--format text"));
    }
    // Named as text, it is read as text.
    TextSourceOptions text;
    text.format = TextFormat::text;
    EXPECT_EQ(texts_of(read_all({dir / name}, text)), std::vector<std::string>{content}) << name;
  }
}

// Paragraphs and lines: every byte kept, line ends and blank lines with the document before
// them (the leading ones with the first), whatever the line ends and the last line.
TEST(TextSource, ParagraphsAndLinesLoseNoByte) {
  TempDir dir;
  struct Case {
    std::string text;
    std::vector<std::string> paragraphs, lines;
  };
  const std::vector<Case> cases = {
      {"First Citizen:\nBefore we proceed.\n\nAll:\nSpeak, speak.\n",
       {"First Citizen:\nBefore we proceed.\n\n", "All:\nSpeak, speak.\n"},
       {"First Citizen:\n", "Before we proceed.\n\n", "All:\n", "Speak, speak.\n"}},
      {"\n\na\r\n \t\r\n\nb\nc",
       {"\n\na\r\n \t\r\n\n", "b\nc"},
       {"\n\na\r\n \t\r\n\n", "b\n", "c"}},
      {"one line, no end", {"one line, no end"}, {"one line, no end"}},
      {"\n \n", {"\n \n"}, {"\n \n"}},
      {"", {}, {}},
  };
  for (const Case& c : cases) {
    write_file(dir / "t.txt", c.text);
    TextSourceOptions options;
    options.documents = TextDocuments::paragraph;
    EXPECT_EQ(texts_of(read_all({dir / "t.txt"}, options)), c.paragraphs) << c.text;
    options.documents = TextDocuments::line;
    EXPECT_EQ(texts_of(read_all({zstd(dir / "t.txt")}, options)), c.lines) << c.text;
  }
  // Across files and past a decompressed block (1 MiB), origins at each document's first
  // line that is not blank.
  std::string big;
  while (big.size() < (size_t(3) << 19)) big += "a long paragraph line\n";
  write_file(dir / "big.txt", "\n" + big + "\nnext\n");
  write_file(dir / "small.txt", "x\n\ny");
  TextSourceOptions options;
  options.documents = TextDocuments::paragraph;
  const std::vector<Document> docs = read_all({dir / "big.txt", dir / "small.txt"}, options);
  EXPECT_EQ(texts_of(docs), (std::vector<std::string>{"\n" + big + "\n", "next\n", "x\n\n", "y"}));
  ASSERT_EQ(docs.size(), 4u);
  EXPECT_EQ(docs[0].origin, dir / "big.txt:2");
  EXPECT_EQ(docs[2].origin, dir / "small.txt:1");
  EXPECT_EQ(docs[3].origin, dir / "small.txt:3");
}

// Lines and documents longer than a decompressed block (1 MiB), in every compression.
TEST(TextSource, LongLinesAndDocuments) {
  TempDir dir;
  std::string big;
  for (int i = 0; big.size() < (size_t(5) << 18); ++i) big += fmt::format("word{} ", i);
  write_file(dir / "big.jsonl",
             "{\"text\": \"a\"}\n{\"text\": \"" + big + "\"}\n{\"text\": \"b\"}\n");
  write_file(dir / "big.txt", big);
  for (const std::string& f :
       {dir / "big.jsonl", gzip(dir / "big.jsonl"), zstd(dir / "big.jsonl")}) {
    const std::vector<Document> docs = read_all({f});
    ASSERT_EQ(docs.size(), 3u) << f;
    EXPECT_EQ(docs[1].text, big) << f;
    EXPECT_EQ(docs[2].text, "b") << f;
    EXPECT_EQ(docs[2].origin, f + ":3");
  }
  EXPECT_EQ(texts_of(read_all({gzip(dir / "big.txt"), zstd(dir / "big.txt")})),
            (std::vector<std::string>{big, big}));
}

TEST(TextSource, ProgressCountsCompressedBytes) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "compressible ";
  write_file(dir / "a.txt", text);
  const std::vector<std::string> files = {dir / "a.txt", gzip(dir / "a.txt"), zstd(dir / "a.txt")};
  uint64_t total = 0;
  for (const std::string& f : files) total += std::filesystem::file_size(f);
  DocumentReader reader(files, {});
  EXPECT_EQ(reader.bytes_total(), total);
  EXPECT_EQ(reader.bytes_read(), 0u);
  Document doc;
  while (reader.next(doc)) EXPECT_EQ(doc.text, text);
  EXPECT_EQ(reader.bytes_read(), total);
  EXPECT_EQ(DocumentReader({"-", dir / "a.txt"}, {}).bytes_total(), 0u);  // unknown with stdin
}

TEST(TextSource, DirectoriesRecursiveInByteOrder) {
  TempDir dir;
  const std::string d = dir / "d";
  std::filesystem::create_directories(d + "/a");
  std::filesystem::create_directories(d + "/sub/deep");
  for (const char* f :
       {"b.txt", "B.txt", "a.txt", "a/z.txt", "sub/deep/c.jsonl", "\xC3\xA9.txt", "_.txt"})
    write_file(d + "/" + f, f);
  ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0600), 0);  // not a regular file: left out
  // Byte order of the whole path: '.' (2E) < '/' (2F) < 'B' < '_' < 'a' < 'b' < 's' < C3.
  const std::vector<std::string> expected = {d + "/B.txt",       d + "/_.txt",
                                             d + "/a.txt",       d + "/a/z.txt",
                                             d + "/b.txt",       d + "/sub/deep/c.jsonl",
                                             d + "/\xC3\xA9.txt"};
  EXPECT_EQ(expand_inputs({d}), expected);

  // Each file once, in the order first named; "-" passes through.
  EXPECT_EQ(
      expand_inputs({d + "/b.txt", "-", d, d + "/./a.txt", "-"}),
      (std::vector<std::string>{d + "/b.txt", "-", d + "/B.txt", d + "/_.txt", d + "/a.txt",
                                d + "/a/z.txt", d + "/sub/deep/c.jsonl", d + "/\xC3\xA9.txt"}));
}

TEST(TextSource, Globs) {
  TempDir dir;
  for (const char* f : {"x2.txt", "x10.txt", "x1.txt", "y.txt", "x.jsonl"}) write_file(dir / f, f);
  std::filesystem::create_directories(dir / "xdir");
  write_file(dir / "xdir/in.txt", "in");
  EXPECT_EQ(
      expand_inputs({dir / "x*.txt", dir / "y?txt"}),
      (std::vector<std::string>{dir / "x1.txt", dir / "x10.txt", dir / "x2.txt", dir / "y.txt"}));
  // A directory that a glob matches contributes its files.
  EXPECT_EQ(expand_inputs({dir / "x[d]*"}), std::vector<std::string>{dir / "xdir/in.txt"});
  // A name that exists is itself, even when it looks like a glob.
  write_file(dir / "odd[1].txt", "odd");
  EXPECT_EQ(expand_inputs({dir / "odd[1].txt"}), std::vector<std::string>{dir / "odd[1].txt"});
}

TEST(TextSource, InputErrorsNameTheInput) {
  TempDir dir;
  EXPECT_TRUE(contains(error_of([&] { expand_inputs({dir / "missing.txt"}); }),
                       "'" + dir / "missing.txt" + "'"));
  EXPECT_TRUE(contains(error_of([&] { expand_inputs({dir / "*.nothing"}); }),
                       "no file matches the input pattern '" + dir / "*.nothing" + "'"));
}

TEST(TextSource, JsonlErrorsNameFileAndLine) {
  TempDir dir;
  const auto error_for = [&](const std::string& name, const std::string& content,
                             TextSourceOptions options = {}) {
    write_file(dir / name, content);
    return error_of([&] { read_all({dir / name}, options); });
  };
  const std::string ok = "{\"text\": \"fine\"}\n";
  const std::string bad = error_for("bad.jsonl", ok + "\n" + "{\"text\": \"unterminated}\n" + ok);
  EXPECT_TRUE(starts_with(bad, dir / "bad.jsonl:3: invalid JSON: ")) << bad;
  EXPECT_TRUE(contains(bad, "parse error"));

  EXPECT_TRUE(starts_with(error_for("array.jsonl", ok + "[1, 2]\n"),
                          dir / "array.jsonl:2: no string field 'text': the line is a JSON array"));
  EXPECT_TRUE(starts_with(error_for("missing.jsonl", "{\"body\": \"x\"}\n"),
                          dir / "missing.jsonl:1: no string field 'text'"));
  EXPECT_TRUE(starts_with(error_for("number.jsonl", ok + ok + "{\"text\": 5}"),
                          dir / "number.jsonl:3: no string field 'text': 'text' is a JSON number"));
  TextSourceOptions content;
  content.text_field = "content";
  EXPECT_TRUE(starts_with(error_for("other.jsonl", ok, content),
                          dir / "other.jsonl:1: no string field 'content'"));

  // Line numbers survive compression.
  write_file(dir / "z.jsonl", ok + ok + "not json\n");
  const std::string zst = zstd(dir / "z.jsonl"), gz = gzip(dir / "z.jsonl");
  EXPECT_TRUE(starts_with(error_of([&] { read_all({zst}); }), zst + ":3: invalid JSON: "));
  EXPECT_TRUE(starts_with(error_of([&] { read_all({gz}); }), gz + ":3: invalid JSON: "));

  // The parser's message quotes what it read: a huge unterminated string is cut short.
  const std::string huge = error_for("huge.jsonl", "{\"text\": \"" + std::string(100000, 'x'));
  EXPECT_TRUE(starts_with(huge, dir / "huge.jsonl:1: invalid JSON: "));
  EXPECT_LT(huge.size(), 1000u);
}

TEST(TextSource, CorruptStreamsNameTheFile) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 2000; ++i) text += fmt::format("{} ", i);
  write_file(dir / "a.txt", text);
  const std::string gz = read_file(gzip(dir / "a.txt")), zst = read_file(zstd(dir / "a.txt"));

  std::string bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 1;  // the trailer's CRC-32
  write_file(dir / "crc.gz", bad_crc);
  write_file(dir / "cut.gz", gz.substr(0, gz.size() / 2));
  write_file(dir / "garbage.gz", gz + "trailing garbage");
  std::string bad_sum = zst;
  bad_sum.back() ^= 1;  // the frame's content checksum
  write_file(dir / "sum.zst", bad_sum);
  write_file(dir / "cut.zst", zst.substr(0, zst.size() / 2));
  write_file(dir / "garbage.zst", zst + "trailing garbage");
  for (const char* name : {"crc.gz", "cut.gz", "garbage.gz"})
    EXPECT_TRUE(starts_with(error_of([&] { read_all({dir / name}); }),
                            dir / name + ": corrupt gzip stream"));
  for (const char* name : {"sum.zst", "cut.zst", "garbage.zst"})
    EXPECT_TRUE(starts_with(error_of([&] { read_all({dir / name}); }),
                            dir / name + ": corrupt zstd stream"));
}

}  // namespace
}  // namespace bottle::testing
