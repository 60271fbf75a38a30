// `bottle tokenize --tokenizer PATH [--input FILE]`: text → one JSON array of ids on stdout;
// with --decode, a JSON array of ids → the text. What the exactness tests compare with the
// reference libraries, and a way to look at what a tokenizer does to a text.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "apps/commands.h"
#include "apps/tokenizer_options.h"
#include "core/error.h"
#include "io/file_read.h"
#include "io/json_io.h"
#include "data/utf8.h"

namespace bottle {

namespace {

std::string read_all(const std::string& path) {
  if (path == "-") {
    std::ios::sync_with_stdio(false);
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  return read_bounded_file(path, "--input", kMaxTextInputBytes);
}

}  // namespace

Command add_tokenize_command(CLI::App& app) {
  struct Options {
    TokenizerOptions tokenizer;
    std::string input = "-", text;
    bool decode = false;
  };
  auto o = std::make_shared<Options>();
  add_tokenizer_options(app, o->tokenizer, /*required=*/false);
  CLI::Option* input =
      app.add_option("--input", o->input,
                     "a file of the text (or, with --decode, of a JSON array of ids); '-': stdin");
  app.add_option("--text", o->text, "the text itself (or, with --decode, the JSON array of ids)")
      ->excludes(input);
  app.add_flag("--decode", o->decode, "ids → text instead of text → ids");
  return [o] {
    const auto tokenizer = open_tokenizer(o->tokenizer);
    // A text given to --input (a habit from other tools) is named, with the option it meant.
    std::error_code ec;
    if (o->text.empty() && o->input != "-" && !std::filesystem::exists(o->input, ec))
      fail("--input {}: no such file; --input reads a file, --text takes the text itself",
           o->input);
    const std::string input = o->text.empty() ? read_all(o->input) : o->text;
    if (o->decode) {
      const nlohmann::json ids = parse_json_text(input, o->input);
      BOTTLE_CHECK(ids.is_array(), "{}: expected a JSON array of token ids", o->input);
      std::vector<int32_t> tokens;
      for (const auto& id : ids) {
        BOTTLE_CHECK(id.is_number_integer() && id.get<int64_t>() >= INT32_MIN &&
                         id.get<int64_t>() <= INT32_MAX,
                     "{}: {} is not a token id", o->input, id.dump());
        tokens.push_back(int32_t(id.get<int64_t>()));
      }
      const std::string text = tokenizer->decode(tokens);
      std::fwrite(text.data(), 1, text.size(), stdout);
      return 0;
    }
    // Text tokenizers see Unicode, as their reference libraries do: invalid UTF-8 becomes
    // U+FFFD first. Bytes are bytes.
    const std::string text = tokenizer->kind() == "bytes" ? input : utf8_replace_invalid(input);
    // An encoding error (a split pattern that gives up on this text) names the text too.
    std::vector<int32_t> ids;
    try {
      ids = tokenizer->encode(text);
    } catch (const Error& e) {
      fail("{}: {}", o->text.empty() ? (o->input == "-" ? "stdin" : o->input) : "--text", e.what());
    }
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  };
}

}  // namespace bottle
