// A tiktoken rank file ("<base64 token> <rank>" per line, as tiktoken's load_tiktoken_bpe
// reads it) with its split pattern and special tokens, exact to tiktoken's encode_ordinary and
// decode: split by the pattern (matches only), then byte-pair merge each piece by the ranks of
// the merged bytes.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <unordered_map>

#include "io/atomic_output.h"
#include "core/error.h"
#include "io/json_io.h"
#include "data/bpe_merges.h"
#include "data/split_pattern.h"
#include "data/tokenizer_files.h"
#include "data/utf8.h"

namespace bottle {

namespace {

using nlohmann::json;

// tiktoken's patterns for its encodings (tiktoken_ext/openai_public.py).
const std::map<std::string, std::string, std::less<>>& known_patterns() {
  static const std::map<std::string, std::string, std::less<>> patterns = [] {
    const std::string r50k =
        R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)";
    const std::string o200k =
        R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
        R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
        R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    return std::map<std::string, std::string, std::less<>>{
        {"gpt2", r50k},
        {"r50k_base", r50k},
        {"p50k_base", r50k},
        {"cl100k_base",
         R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)"},
        {"o200k_base", o200k}};
  }();
  return patterns;
}

// Standard base64 (with padding); nullopt for anything else.
std::optional<std::string> base64_decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (in.empty() || in.size() % 4 != 0) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0 || (v[k] = value(c)) < 0) return std::nullopt;
    }
    const uint32_t n =
        (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out += char(n >> 16);
    if (pad < 2) out += char((n >> 8) & 0xFF);
    if (pad < 1) out += char(n & 0xFF);
  }
  return out;
}

// The pattern as HF tokenizers' Oniguruma reads it: "X{1,3}+" is possessive to tiktoken (and
// PCRE2) but "(X{1,3})+" to Oniguruma's Ruby syntax, which would make one piece of a whole run
// of digits. Dropping that "+" keeps the match: a possessive bounded repeat followed by
// anything matches what the greedy one does wherever tiktoken's patterns use it.
std::string onig_pattern(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    out += c;
    if (c == '\\' && i + 1 < pattern.size()) {
      out += pattern[++i];
    } else if (c == '[') {
      in_class = true;
    } else if (c == ']') {
      in_class = false;
    } else if (c == '}' && !in_class && i + 1 < pattern.size() && pattern[i + 1] == '+') {
      ++i;
    }
  }
  return out;
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class TiktokenTokenizer final : public Tokenizer {
 public:
  TiktokenTokenizer(const fs::path& path, const TiktokenOptions& options)
      : path_(path),
        raw_(read_file_bytes(path)),
        pattern_(resolve_pattern(options.pattern), path.string() + ": pattern") {
    const std::string where = path.string();
    size_t line_no = 0;
    for (size_t pos = 0; pos < raw_.size();) {
      size_t end = raw_.find('\n', pos);
      if (end == std::string::npos) end = raw_.size();
      const std::string_view line(raw_.data() + pos, end - pos);
      ++line_no;
      pos = end + 1;
      if (line.empty()) continue;
      const size_t space = line.find(' ');
      int64_t rank = -1;
      const char* rank_end = line.data() + line.size();
      const bool rank_ok =
          space != std::string_view::npos &&
          std::from_chars(line.data() + space + 1, rank_end, rank).ptr == rank_end && rank >= 0 &&
          rank < kMaxTokenizerIds;
      const std::optional<std::string> token =
          space == std::string_view::npos ? std::nullopt : base64_decode(line.substr(0, space));
      BOTTLE_CHECK(rank_ok && token,
                   "{}:{}: not a tiktoken rank line (expected \"<base64 token> <rank>\", a rank "
                   "in [0, {}))",
                   where, line_no, kMaxTokenizerIds);
      BOTTLE_CHECK(ranks_.emplace(*token, int32_t(rank)).second, "{}:{}: token listed twice", where,
                   line_no);
      if (size_t(rank) >= bytes_of_.size()) bytes_of_.resize(size_t(rank) + 1);
      BOTTLE_CHECK(!bytes_of_[size_t(rank)], "{}:{}: rank {} given to two tokens", where, line_no,
                   rank);
      bytes_of_[size_t(rank)] = *token;
    }
    BOTTLE_CHECK(!ranks_.empty(), "{}: no tiktoken ranks in the file", where);
    for (int b = 0; b < 256; ++b)
      BOTTLE_CHECK(ranks_.contains(std::string(1, char(b))),
                   "{}: byte 0x{:02X} has no rank: every byte needs one", where, b);
    specials_ = options.special_tokens;
    if (specials_.empty()) specials_.emplace_back("<|endoftext|>", int32_t(bytes_of_.size()));
    for (const auto& [text, id] : specials_) {
      BOTTLE_CHECK(id >= 0 && (size_t(id) >= bytes_of_.size() || !bytes_of_[size_t(id)]),
                   "{}: special token {:?} has id {}, which a rank already uses", where, text, id);
      special_text_[id] = text;
      if (text == "<|endoftext|>" || text == "<|end_of_text|>") eos_ = id;
      if (text == "<|begin_of_text|>" || text == "<|startoftext|>") bos_ = id;
    }
  }

  std::string_view kind() const override { return "tiktoken"; }
  std::string describe() const override {
    return fmt::format("tiktoken, vocabulary {}, {}", vocab_size(), path_.string());
  }
  int64_t vocab_size() const override {
    int64_t n = int64_t(bytes_of_.size());
    for (const auto& [text, id] : specials_) n = std::max<int64_t>(n, int64_t(id) + 1);
    return n;
  }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> eos_id() const override { return eos_; }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::vector<std::string_view> pieces;
    pattern_.split(text, /*keep_gaps=*/false, pieces);
    std::vector<BpeSymbol> symbols;
    for (std::string_view piece : pieces) {
      if (const auto it = ranks_.find(piece); it != ranks_.end()) {
        out.push_back(it->second);
        continue;
      }
      symbols.clear();
      for (uint32_t i = 0; i < piece.size(); ++i)
        symbols.push_back({ranks_.find(piece.substr(i, 1))->second, i, i + 1});
      bpe_merge(symbols, [&](const BpeSymbol& a, const BpeSymbol& b) -> std::optional<BpeMerge> {
        const auto it = ranks_.find(piece.substr(a.begin, b.end - a.begin));
        if (it == ranks_.end()) return std::nullopt;
        return BpeMerge{uint32_t(it->second), it->second};
      });
      for (const BpeSymbol& s : symbols) out.push_back(s.id);
    }
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string bytes;
    for (int32_t id : ids) {
      if (id >= 0 && size_t(id) < bytes_of_.size() && bytes_of_[size_t(id)]) {
        bytes += *bytes_of_[size_t(id)];
      } else if (const auto it = special_text_.find(id); it != special_text_.end()) {
        bytes += it->second;
      } else {
        fail("token {} is not in the vocabulary of {} ({} ids)", id, path_.string(), vocab_size());
      }
    }
    return utf8_replace_invalid(bytes);
  }

  void save(const fs::path& dir) const override {
    write_file_atomically(dir / "tokenizer.tiktoken", raw_);
    SpecialTokenNames names;
    if (bos_) names.bos = special_text_.at(*bos_);
    if (eos_) names.eos = special_text_.at(*eos_);
    json specials = json::object();
    for (const auto& [text, id] : specials_) specials[text] = id;
    // transformers has no class for a bare rank file: it reads the tokenizer.json beside it
    // (PreTrainedTokenizerFast). bottle reads the rank file, with the pattern and special
    // tokens that tiktoken keeps in code kept here.
    write_file_atomically(dir / "tokenizer.json", tokenizer_json().dump() + "\n");
    write_hf_tokenizer_config(
        dir, "PreTrainedTokenizerFast", names,
        {{"tiktoken", {{"pattern", pattern_.pattern()}, {"special_tokens", specials}}}});
  }

  // The same tokenizer as an HF tokenizer.json, as transformers' TikTokenConverter makes one:
  // the byte-level spelling of every rank; for each token of two or more bytes, the merge
  // that byte-pair encoding of its own bytes with the lower ranks ends with (tokens no pair
  // of lower ranks makes get none); the split pattern, then ByteLevel without its own regex;
  // ignore_merges, since tiktoken takes a piece that is a token whole.
  json tokenizer_json() const {
    const auto& chars = byte_level_chars();
    auto spelled = [&](std::string_view bytes) {
      std::string s;
      for (unsigned char b : bytes) s += chars[b];
      return s;
    };
    json vocab = json::object(), merges = json::array();
    std::vector<std::string> parts;
    for (size_t rank = 0; rank < bytes_of_.size(); ++rank) {
      if (!bytes_of_[rank]) continue;
      const std::string& token = *bytes_of_[rank];
      vocab[spelled(token)] = rank;
      parts.clear();
      for (char c : token) parts.emplace_back(1, c);
      while (parts.size() > 2) {
        size_t best = parts.size();
        int64_t best_rank = int64_t(rank);
        for (size_t i = 0; i + 1 < parts.size(); ++i) {
          const auto it = ranks_.find(parts[i] + parts[i + 1]);
          if (it != ranks_.end() && it->second < best_rank) best = i, best_rank = it->second;
        }
        if (best == parts.size()) break;
        parts[best] += parts[best + 1];
        parts.erase(parts.begin() + std::ptrdiff_t(best) + 1);
      }
      if (parts.size() == 2) merges.push_back(spelled(parts[0]) + " " + spelled(parts[1]));
    }
    json added = json::array();
    for (const auto& [text, id] : specials_)
      added.push_back({{"id", id},
                       {"content", text},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
    const json split = {{"type", "Split"},
                        {"pattern", {{"Regex", onig_pattern(pattern_.pattern())}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
    return byte_level_bpe_json(std::move(vocab), std::move(merges), true, split, std::move(added));
  }

 private:
  static std::string resolve_pattern(const std::string& name) {
    const auto& known = known_patterns();
    const auto it = known.find(name);
    return it == known.end() ? name : it->second;
  }

  fs::path path_;
  std::string raw_;  // the file, saved verbatim
  SplitPattern pattern_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ranks_;  // bytes → rank
  std::vector<std::optional<std::string>> bytes_of_;                             // rank → bytes
  std::vector<std::pair<std::string, int32_t>> specials_;
  std::unordered_map<int32_t, std::string> special_text_;
  std::optional<int32_t> bos_, eos_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_tiktoken(const fs::path& path, const TiktokenOptions& options) {
  return std::make_unique<TiktokenTokenizer>(path, options);
}

// The options save() wrote beside a rank file, or the defaults.
TiktokenOptions read_tiktoken_options(const fs::path& dir) {
  TiktokenOptions options;
  const fs::path config = dir / "tokenizer_config.json";
  if (!fs::exists(config)) return options;
  const json j = read_json_file(config.string());
  if (!j.is_object() || !j.contains("tiktoken")) return options;
  try {
    const json& t = j["tiktoken"];
    options.pattern = t.at("pattern").get<std::string>();
    for (const auto& [text, id] : t.at("special_tokens").items())
      options.special_tokens.emplace_back(text, id.get<int32_t>());
  } catch (const json::exception& e) {
    fail("{}: malformed \"tiktoken\" entry: {}", config.string(), e.what());
  }
  return options;
}

}  // namespace bottle
