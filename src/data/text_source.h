#pragma once
// Where `bottle prepare` reads documents from. Inputs are files, directories (every regular
// file below, recursively, in byte order of the path), glob patterns (matches in byte order)
// and "-" (standard input). Compression is recognised by its magic bytes, whatever the name:
// gzip (zlib; concatenated members too) and zstd (libzstd; concatenated frames too).
// Formats:
//   text   documents split by `documents`: the whole file (or standard input), paragraphs
//          (a run of blank lines ends one) or lines
//   jsonl  one JSON object per line, the document is its string field `text_field` (C4,
//          FineWeb dumps, what `datasets.to_json` writes); blank lines are skipped
// With format auto, a name ending .jsonl or .ndjson (before any .gz / .zst) is jsonl; a name
// ending .json is jsonl when its first line is a whole JSON object, and refused when it is
// JSON of another shape (an array, an object over several lines), which no split reads as
// documents; anything else is text. Errors name the file, and for JSONL the line number and
// what is wrong.
//
// Splitting text loses no byte: a paragraph or line keeps its line end, and blank lines stay
// with the document before them (the leading ones of a file with its first), so the
// documents of a file concatenate to the file.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bottle {

enum class TextFormat { auto_detect, text, jsonl };
// How a text input splits into documents.
enum class TextDocuments { file, paragraph, line };
inline constexpr const char* kTextDocumentsNames[] = {"file", "paragraph", "line"};

struct TextSourceOptions {
  TextFormat format = TextFormat::auto_detect;
  TextDocuments documents = TextDocuments::file;
  std::string text_field = "text";
  // The most bytes one document (and one line, which a document gathers) may hold: the
  // reader keeps a document whole in memory, so an endless line (/dev/zero) or a huge file
  // read as one document is refused at this size, naming the file, instead of growing
  // without limit.
  uint64_t max_document_bytes = uint64_t(1) << 30;
};

// The format `file` is read in under `requested` by its name alone (a .json file's content
// decides at read time): what `bottle prepare` reports before it reads.
TextFormat format_by_name(const std::string& file, TextFormat requested);

struct Document {
  std::string text;    // the document's bytes as read (not yet checked for UTF-8)
  std::string origin;  // "FILE" or "FILE:LINE", for messages
};

// The input files an argument list names, in order, each once; "-" stays "-". Errors name an
// input that matches nothing or cannot be read.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs);

// Reads the documents of `files` (from expand_inputs) in order, streaming: memory holds one
// decompressed block and one document at a time.
class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> files, TextSourceOptions options);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // The next document, or false at the end of the last file.
  bool next(Document& doc);
  // Compressed bytes read from the files so far, and their total size (0 when unknown, as for
  // standard input): the progress of a run.
  uint64_t bytes_read() const;
  uint64_t bytes_total() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace bottle
