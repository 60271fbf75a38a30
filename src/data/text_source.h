#pragma once
// Where `bottle prepare` reads documents from. Inputs are files, directories (every regular
// file below, recursively, in byte order of the path), glob patterns (matches in byte order)
// and "-" (standard input). Compression is recognised by its magic bytes, whatever the name:
// gzip (zlib; concatenated members too) and zstd (libzstd; concatenated frames too).
// Formats:
//   text   the whole file (or standard input) is one document
//   jsonl  one JSON object per line, the document is its string field `text_field` (C4,
//          FineWeb dumps); blank lines are skipped
// With format auto, a name ending .jsonl or .ndjson (before any .gz / .zst) is jsonl, anything
// else text. Errors name the file, and for JSONL the line number and what is wrong.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bottle {

enum class TextFormat { auto_detect, text, jsonl };

struct TextSourceOptions {
  TextFormat format = TextFormat::auto_detect;
  std::string text_field = "text";
};

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
