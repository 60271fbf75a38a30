// An HF tokenizer.json with a BPE model, exact to the `tokenizers` library for what it
// accepts. Encoding runs the library's pipeline: split off added (non-special) tokens,
// normalize each remaining segment, pre-tokenize, BPE each pre-token. Decoding runs the
// decoder chain over the tokens' strings. Every component is read by name and anything this
// file does not implement exactly is refused with that name.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
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

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // ▁ (U+2581)

// A step of the normalizer (Prepend, Replace with a string pattern).
struct NormalizerStep {
  enum Kind { prepend, replace } kind;
  std::string pattern, content;
};

// A step of the pre-tokenizer.
struct PreTokenizerStep {
  enum Kind { split, byte_level, metaspace } kind;
  std::optional<SplitPattern> regex;  // split; byte_level with use_regex
  bool add_prefix_space = false;      // byte_level
  bool prepend_first_only = false;    // metaspace: prepend_scheme "first" (else "always")
  bool prepend = true;                // metaspace: prepend_scheme != "never"
  bool split_on_replacement = false;  // metaspace: split
};

// A step of the decoder chain.
struct DecoderStep {
  enum Kind { replace, byte_fallback, fuse, strip, byte_level, metaspace } kind;
  std::string pattern, content;  // replace; strip: content is the stripped character
  size_t start = 0, stop = 0;    // strip
  bool prepend = true;           // metaspace: strips the first token's replacement characters
};

std::string type_of(const json& j, const std::string& where) {
  BOTTLE_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
               "{}: expected an object with a string \"type\"", where);
  return j["type"].get<std::string>();
}

bool flag(const json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return j[key].get<bool>();
}

// Replace's pattern: {"String": s}; a {"Regex": ...} pattern is not implemented.
std::string string_pattern(const json& step, const std::string& where) {
  const json& p = step.at("pattern");
  BOTTLE_CHECK(p.is_object() && p.contains("String") && p["String"].is_string(),
               "{}: Replace with a {} pattern is not implemented (only a String pattern)", where,
               p.is_object() && p.contains("Regex") ? "Regex" : "non-string");
  return p["String"].get<std::string>();
}

// The steps of a component that may be a Sequence of steps.
std::vector<json> steps_of(const json& component, const char* list_key, const std::string& where) {
  if (component.is_null()) return {};
  if (type_of(component, where) == "Sequence") {
    BOTTLE_CHECK(component.contains(list_key) && component[list_key].is_array(),
                 "{}: a Sequence needs an array \"{}\"", where, list_key);
    return component[list_key].get<std::vector<json>>();
  }
  return {component};
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size())
    out.append(s, pos, hit - pos).append(to);
  if (pos == 0) return;
  out.append(s, pos);
  s = std::move(out);
}

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

size_t utf8_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

class HfBpeTokenizer final : public Tokenizer {
 public:
  HfBpeTokenizer(const fs::path& path, const SpecialTokenNames& names)
      : path_(path), raw_(read_file_bytes(path)) {
    const std::string where = path.string();
    const json root = parse_json_text(raw_, where);
    BOTTLE_CHECK(root.is_object() && root.contains("model"),
                 "{}: not an HF tokenizer.json (no \"model\" object)", where);
    try {
      read_model(root["model"], where + ": model");
      read_added_tokens(root.value("added_tokens", json::array()), where + ": added_tokens");
      read_normalizer(root.value("normalizer", json()), where + ": normalizer");
      read_pre_tokenizer(root.value("pre_tokenizer", json()), where + ": pre_tokenizer");
      read_decoder(root.value("decoder", json()), where + ": decoder");
    } catch (const json::exception& e) {
      fail("{}: malformed tokenizer.json: {}", where, e.what());
    }
    BOTTLE_CHECK(!id_to_token_.empty(),
                 "{}: the vocabulary is empty (model.vocab and added_tokens hold no token)", where);
    byte_level_ = std::any_of(pre_.begin(), pre_.end(), [](const PreTokenizerStep& s) {
      return s.kind == PreTokenizerStep::byte_level;
    });
    if (byte_level_) {
      for (int b = 0; b < 256; ++b) {
        const auto it = vocab_.find(byte_level_chars()[b]);
        byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
      }
    }
    if (byte_fallback_) {
      for (int b = 0; b < 256; ++b) {
        const auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
        byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
      }
    }
    find_special_tokens(names);
  }

  std::string_view kind() const override { return "bpe"; }
  std::string describe() const override {
    return fmt::format("tokenizer.json BPE ({}), vocabulary {}, {}",
                       byte_level_ ? "byte-level" : "SentencePiece-style", vocab_size(),
                       path_.string());
  }
  int64_t vocab_size() const override { return int64_t(id_to_token_.size()); }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> eos_id() const override { return eos_; }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    // Non-special added tokens are found in the raw text first, as the library does; special
    // ones are not (ordinary text).
    size_t pos = 0;
    while (pos <= text.size()) {
      size_t hit = text.size(), hit_len = 0;
      int32_t hit_id = -1;
      for (const auto& [content, id] : matched_added_) {
        const size_t at = text.find(content, pos);
        if (at < hit || (at == hit && at != text.size() && content.size() > hit_len))
          hit = at, hit_len = content.size(), hit_id = id;
      }
      encode_segment(text.substr(pos, hit - pos), pos == 0, out);
      if (hit_id < 0) break;
      out.push_back(hit_id);
      pos = hit + hit_len;
    }
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      BOTTLE_CHECK(id >= 0 && id < vocab_size() && !id_to_token_[size_t(id)].empty(),
                   "token {} is not in the vocabulary of {} ({} ids)", id, path_.string(),
                   vocab_size());
      tokens.push_back(id_to_token_[size_t(id)]);
    }
    if (decoder_.empty()) {
      // No decoder: the library joins the tokens with spaces.
      std::string joined;
      for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
      return joined;
    }
    for (const DecoderStep& step : decoder_) apply(step, tokens);
    std::string text;
    for (const std::string& t : tokens) text += t;
    return text;
  }

  void save(const fs::path& dir) const override {
    write_file_atomically(dir / "tokenizer.json", raw_);
    SpecialTokenNames names;
    if (bos_) names.bos = id_to_token_[size_t(*bos_)];
    if (eos_) names.eos = id_to_token_[size_t(*eos_)];
    if (unk_) names.unk = id_to_token_[size_t(*unk_)];
    json added = json::object();
    // tokenizer_config.json's entries are AddedToken's arguments, keyed by id: an "id" inside
    // one makes the tokenizers library print "Ignored unknown kwarg option id" on every load.
    for (json t : added_tokens_) {
      const std::string id = std::to_string(t["id"].get<int64_t>());
      t.erase("id");
      added[id] = std::move(t);
    }
    write_hf_tokenizer_config(
        dir, "PreTrainedTokenizerFast", names,
        {{"added_tokens_decoder", added}, {"clean_up_tokenization_spaces", false}});
  }

 private:
  void read_model(const json& model, const std::string& where) {
    const std::string type = type_of(model, where);
    BOTTLE_CHECK(
        type == "BPE",
        "{}: a {} model is not implemented: bottle reads BPE tokenizer.json files "
        "only{}",
        where, type,
        type == "Unigram" ? " (a SentencePiece unigram model reads from its .model file)" : "");
    BOTTLE_CHECK(model.value("dropout", json()).is_null(),
                 "{}: BPE dropout is not implemented (it makes encoding random)", where);
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json v = model.value(key, json());
      BOTTLE_CHECK(v.is_null() || (v.is_string() && v.get<std::string>().empty()),
                   "{}: {} is not implemented", where, key);
    }
    byte_fallback_ = flag(model, "byte_fallback", false);
    fuse_unk_ = flag(model, "fuse_unk", false);
    ignore_merges_ = flag(model, "ignore_merges", false);
    BOTTLE_CHECK(model.contains("vocab") && model["vocab"].is_object(), "{}: no \"vocab\" object",
                 where);
    for (const auto& [token, id] : model["vocab"].items()) {
      BOTTLE_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 &&
                       id.get<int64_t>() < (int64_t(1) << 31),
                   "{}: vocab[{:?}] is not a token id", where, token);
      set_token(int32_t(id.get<int64_t>()), token, where);
    }
    if (const json unk = model.value("unk_token", json()); unk.is_string()) {
      const auto it = vocab_.find(unk.get<std::string>());
      BOTTLE_CHECK(it != vocab_.end(), "{}: unk_token {:?} is not in the vocabulary", where,
                   unk.get<std::string>());
      unk_ = it->second;
    }
    BOTTLE_CHECK(model.contains("merges") && model["merges"].is_array(), "{}: no \"merges\" array",
                 where);
    uint32_t rank = 0;
    for (const json& m : model["merges"]) {
      std::string left, right;
      if (m.is_string()) {  // "left right"
        const std::string line = m.get<std::string>();
        const size_t space = line.find(' ');
        BOTTLE_CHECK(space != std::string::npos && line.find(' ', space + 1) == std::string::npos,
                     "{}: merge {} {:?} is not two tokens", where, rank, line);
        left = line.substr(0, space), right = line.substr(space + 1);
      } else {
        BOTTLE_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                     "{}: merge {} is not a pair of tokens", where, rank);
        left = m[0].get<std::string>(), right = m[1].get<std::string>();
      }
      const auto a = vocab_.find(left), b = vocab_.find(right), ab = vocab_.find(left + right);
      BOTTLE_CHECK(a != vocab_.end() && b != vocab_.end() && ab != vocab_.end(),
                   "{}: merge {} ({:?} + {:?}) uses a token outside the vocabulary", where, rank,
                   left, right);
      // The first of two equal merges wins, as in the library.
      merges_.try_emplace(pair_key(a->second, b->second), BpeMerge{rank, ab->second});
      ++rank;
    }
  }

  void read_added_tokens(const json& added, const std::string& where) {
    BOTTLE_CHECK(added.is_array(), "{}: not an array", where);
    for (const json& t : added) {
      BOTTLE_CHECK(t.is_object() && t.contains("id") && t.contains("content") &&
                       t["id"].is_number_integer() && t["content"].is_string(),
                   "{}: an added token needs an integer \"id\" and a string \"content\"", where);
      const std::string content = t["content"].get<std::string>();
      const int64_t id = t["id"].get<int64_t>();
      BOTTLE_CHECK(id >= 0 && id < (int64_t(1) << 31) && !content.empty(),
                   "{}: added token {:?} has id {}", where, content, id);
      for (const char* key : {"single_word", "lstrip", "rstrip"})
        BOTTLE_CHECK(!flag(t, key, false), "{}: added token {:?} sets {}: not implemented", where,
                     content, key);
      const bool special = flag(t, "special", false);
      BOTTLE_CHECK(special || !flag(t, "normalized", true),
                   "{}: non-special added token {:?} is matched on normalized text: not "
                   "implemented",
                   where, content);
      set_token(int32_t(id), content, where, /*added=*/true);
      if (!special)
        matched_added_.emplace_back(content, int32_t(id));
      else
        special_.push_back(int32_t(id));
      added_tokens_.push_back(t);
    }
  }

  void read_normalizer(const json& normalizer, const std::string& where) {
    for (const json& step : steps_of(normalizer, "normalizers", where)) {
      const std::string type = type_of(step, where);
      if (type == "Prepend") {
        normalizer_.push_back({NormalizerStep::prepend, "", step.at("prepend").get<std::string>()});
      } else if (type == "Replace") {
        normalizer_.push_back({NormalizerStep::replace, string_pattern(step, where),
                               step.at("content").get<std::string>()});
      } else {
        fail("{}: the {} normalizer is not implemented (bottle implements Prepend and Replace)",
             where, type);
      }
    }
  }

  void read_pre_tokenizer(const json& pre, const std::string& where) {
    for (const json& step : steps_of(pre, "pretokenizers", where)) {
      const std::string type = type_of(step, where);
      PreTokenizerStep s{};
      if (type == "Split") {
        const json& p = step.at("pattern");
        BOTTLE_CHECK(p.is_object() && p.contains("Regex") && p["Regex"].is_string(),
                     "{}: Split with a string pattern is not implemented (only Regex)", where);
        BOTTLE_CHECK(step.value("behavior", "") == "Isolated" && !flag(step, "invert", false),
                     "{}: Split with behavior {:?}{} is not implemented (only Isolated)", where,
                     step.value("behavior", ""), flag(step, "invert", false) ? ", inverted" : "");
        s.kind = PreTokenizerStep::split;
        s.regex.emplace(p["Regex"].get<std::string>(), where + ": Split");
      } else if (type == "ByteLevel") {
        s.kind = PreTokenizerStep::byte_level;
        s.add_prefix_space = flag(step, "add_prefix_space", true);
        if (flag(step, "use_regex", true)) s.regex.emplace(std::string(kGpt2Pattern), where);
      } else if (type == "Metaspace") {
        s.kind = PreTokenizerStep::metaspace;
        BOTTLE_CHECK(step.value("replacement", std::string(kMetaspace)) == kMetaspace,
                     "{}: Metaspace with a replacement other than U+2581 is not implemented",
                     where);
        const std::string scheme =
            step.contains("prepend_scheme")
                ? step["prepend_scheme"].get<std::string>()
                : (flag(step, "add_prefix_space", true) ? "always" : "never");
        BOTTLE_CHECK(scheme == "always" || scheme == "first" || scheme == "never",
                     "{}: Metaspace prepend_scheme {:?} is unknown", where, scheme);
        s.prepend = scheme != "never";
        s.prepend_first_only = scheme == "first";
        s.split_on_replacement = flag(step, "split", true);
      } else {
        fail(
            "{}: the {} pre-tokenizer is not implemented (bottle implements Split with a regex, "
            "ByteLevel and Metaspace)",
            where, type);
      }
      pre_.push_back(std::move(s));
    }
  }

  void read_decoder(const json& decoder, const std::string& where) {
    for (const json& step : steps_of(decoder, "decoders", where)) {
      const std::string type = type_of(step, where);
      DecoderStep d{};
      if (type == "Replace") {
        d = {DecoderStep::replace, string_pattern(step, where),
             step.at("content").get<std::string>()};
      } else if (type == "ByteFallback") {
        d.kind = DecoderStep::byte_fallback;
      } else if (type == "Fuse") {
        d.kind = DecoderStep::fuse;
      } else if (type == "Strip") {
        d.kind = DecoderStep::strip;
        d.content = step.at("content").get<std::string>();
        d.start = step.at("start").get<size_t>();
        d.stop = step.at("stop").get<size_t>();
      } else if (type == "ByteLevel") {
        d.kind = DecoderStep::byte_level;
      } else if (type == "Metaspace") {
        d.kind = DecoderStep::metaspace;
        const std::string scheme =
            step.contains("prepend_scheme")
                ? step["prepend_scheme"].get<std::string>()
                : (flag(step, "add_prefix_space", true) ? "always" : "never");
        d.prepend = scheme != "never";
      } else {
        fail(
            "{}: the {} decoder is not implemented (bottle implements ByteLevel, Metaspace, "
            "Replace, ByteFallback, Fuse and Strip)",
            where, type);
      }
      decoder_.push_back(std::move(d));
    }
  }

  void set_token(int32_t id, const std::string& token, const std::string& where,
                 bool added = false) {
    // The table of ids is dense: an id of 2,147,483,647 would ask for gigabytes of it.
    BOTTLE_CHECK(id >= 0 && id < kMaxTokenizerIds,
                 "{}: token {:?} has id {}, outside [0, {}) (the ids a tokenizer may use)", where,
                 token, id, kMaxTokenizerIds);
    if (size_t(id) >= id_to_token_.size()) id_to_token_.resize(size_t(id) + 1);
    std::string& slot = id_to_token_[size_t(id)];
    BOTTLE_CHECK(slot.empty() || slot == token, "{}: id {} is both {:?} and {:?}", where, id, slot,
                 token);
    slot = token;
    if (!added) {
      BOTTLE_CHECK(vocab_.emplace(token, id).second || vocab_[token] == id,
                   "{}: token {:?} has two ids", where, token);
    } else {
      vocab_.emplace(token, id);
    }
  }

  // BOS and EOS: as tokenizer_config.json names them, else the usual names among the
  // special tokens.
  void find_special_tokens(const SpecialTokenNames& names) {
    auto lookup = [&](const std::optional<std::string>& name,
                      std::initializer_list<std::string_view> usual) -> std::optional<int32_t> {
      if (name) {
        const auto it = vocab_.find(*name);
        BOTTLE_CHECK(it != vocab_.end(),
                     "{}: tokenizer_config.json names {:?}, which is not in "
                     "its vocabulary",
                     path_.string(), *name);
        return it->second;
      }
      for (std::string_view u : usual)
        for (int32_t id : special_)
          if (id_to_token_[size_t(id)] == u) return id;
      return std::nullopt;
    };
    bos_ = lookup(names.bos, {"<s>", "<|begin_of_text|>", "<|startoftext|>", "<bos>", "[BOS]"});
    eos_ = lookup(names.eos, {"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[EOS]"});
    if (!unk_ && names.unk) unk_ = lookup(names.unk, {});
  }

  static uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }

  // Normalize, pre-tokenize and BPE one stretch of text between added tokens.
  void encode_segment(std::string_view segment, bool at_start, std::vector<int32_t>& out) const {
    if (segment.empty()) return;
    std::string normalized(segment);
    for (const NormalizerStep& step : normalizer_) {
      if (step.kind == NormalizerStep::prepend) {
        if (!normalized.empty()) normalized.insert(0, step.content);
      } else {
        replace_all(normalized, step.pattern, step.content);
      }
    }
    // Pre-tokens as owned strings: a step may rewrite them (Metaspace, a prefix space).
    std::vector<std::string> pieces{std::move(normalized)}, next;
    std::vector<std::string_view> views;
    for (const PreTokenizerStep& step : pre_) {
      next.clear();
      for (std::string& piece : pieces) {
        if (step.kind == PreTokenizerStep::metaspace) {
          replace_all(piece, " ", kMetaspace);
          if (step.prepend && (!step.prepend_first_only || at_start) &&
              !piece.starts_with(kMetaspace))
            piece.insert(0, kMetaspace);
          if (!step.split_on_replacement) {
            next.push_back(std::move(piece));
            continue;
          }
          // Split before every ▁ (MergedWithNext).
          size_t begin = 0;
          for (size_t at = piece.find(kMetaspace, 1); at != std::string::npos;
               at = piece.find(kMetaspace, at + 1)) {
            next.push_back(piece.substr(begin, at - begin));
            begin = at;
          }
          next.push_back(piece.substr(begin));
          continue;
        }
        if (step.kind == PreTokenizerStep::byte_level && step.add_prefix_space &&
            !piece.starts_with(' '))
          piece.insert(0, " ");
        if (!step.regex) {
          next.push_back(std::move(piece));
          continue;
        }
        views.clear();
        step.regex->split(piece, /*keep_gaps=*/true, views);
        for (std::string_view v : views) next.emplace_back(v);
      }
      pieces.swap(next);
      at_start = false;
    }
    for (const std::string& piece : pieces)
      if (!piece.empty()) encode_piece(piece, out);
  }

  void encode_piece(const std::string& piece, std::vector<int32_t>& out) const {
    // Byte-level pre-tokens repeat (words); a per-thread cache skips their merging.
    // The owner is the tokenizer's serial number, not its address: a tokenizer made where a
    // destroyed one lived must not read that one's entries.
    struct Cache {
      uint64_t owner = 0;
      std::unordered_map<std::string, std::vector<int32_t>> ids;
    };
    thread_local Cache cache;
    const bool cacheable = byte_level_ && piece.size() <= 64;
    if (cacheable) {
      if (cache.owner != serial_) cache.owner = serial_, cache.ids.clear();
      if (const auto it = cache.ids.find(piece); it != cache.ids.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t first = out.size();
    merge_piece(piece, out);
    if (cacheable) {
      if (cache.ids.size() >= (size_t(1) << 16)) cache.ids.clear();
      cache.ids.emplace(piece, std::vector<int32_t>(out.begin() + first, out.end()));
    }
  }

  void merge_piece(const std::string& piece, std::vector<int32_t>& out) const {
    std::vector<BpeSymbol> symbols;
    if (byte_level_) {
      std::string mapped;
      if (ignore_merges_) {
        for (unsigned char b : piece) mapped += byte_level_chars()[b];
        if (const auto it = vocab_.find(mapped); it != vocab_.end()) {
          out.push_back(it->second);
          return;
        }
      }
      for (unsigned char b : piece) {
        if (byte_ids_[b] >= 0)
          symbols.push_back({byte_ids_[b], 0, 0});
        else if (unk_)
          push_unk(symbols);
        // else the library drops a character it has no token for; so does bottle.
      }
    } else {
      if (ignore_merges_)
        if (const auto it = vocab_.find(piece); it != vocab_.end()) {
          out.push_back(it->second);
          return;
        }
      for (size_t i = 0; i < piece.size();) {
        const size_t len =
            std::min(utf8_length(static_cast<unsigned char>(piece[i])), piece.size() - i);
        const auto it = vocab_.find(piece.substr(i, len));
        if (it != vocab_.end()) {
          symbols.push_back({it->second, 0, 0});
        } else if (byte_fallback_ &&
                   std::all_of(piece.begin() + i, piece.begin() + i + len, [&](char c) {
                     return byte_ids_[static_cast<unsigned char>(c)] >= 0;
                   })) {
          for (size_t k = i; k < i + len; ++k)
            symbols.push_back({byte_ids_[static_cast<unsigned char>(piece[k])], 0, 0});
        } else if (unk_) {
          push_unk(symbols);
        }
        i += len;
      }
    }
    bpe_merge(symbols, [&](const BpeSymbol& a, const BpeSymbol& b) -> std::optional<BpeMerge> {
      const auto it = merges_.find(pair_key(a.id, b.id));
      if (it == merges_.end()) return std::nullopt;
      return it->second;
    });
    for (const BpeSymbol& s : symbols) out.push_back(s.id);
  }

  void push_unk(std::vector<BpeSymbol>& symbols) const {
    if (fuse_unk_ && !symbols.empty() && symbols.back().id == *unk_) return;
    symbols.push_back({*unk_, 0, 0});
  }

  static void apply(const DecoderStep& step, std::vector<std::string>& tokens) {
    switch (step.kind) {
      case DecoderStep::replace:
        for (std::string& t : tokens) replace_all(t, step.pattern, step.content);
        break;
      case DecoderStep::fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case DecoderStep::strip:
        for (std::string& t : tokens) {
          size_t begin = 0, end = t.size();
          for (size_t k = 0;
               k < step.start && t.compare(begin, step.content.size(), step.content) == 0 &&
               begin < end;
               ++k)
            begin += step.content.size();
          for (size_t k = 0;
               k < step.stop && end >= begin + step.content.size() &&
               t.compare(end - step.content.size(), step.content.size(), step.content) == 0;
               ++k)
            end -= step.content.size();
          t = t.substr(begin, end - begin);
        }
        break;
      case DecoderStep::byte_fallback: {
        // Runs of <0xXX> tokens become their bytes when those are valid UTF-8, else one
        // U+FFFD per byte.
        std::vector<std::string> result;
        std::string bytes;
        size_t run = 0;
        auto flush = [&] {
          if (run == 0) return;
          if (utf8_valid(bytes))
            result.push_back(bytes);
          else
            for (size_t k = 0; k < run; ++k) result.emplace_back("\xEF\xBF\xBD");
          bytes.clear();
          run = 0;
        };
        for (std::string& t : tokens) {
          const int hi = t.size() == 6 && t.starts_with("<0x") && t.back() == '>' ? hex(t[3]) : -1;
          const int lo = hi >= 0 ? hex(t[4]) : -1;
          if (lo >= 0) {
            const int value = hi * 16 + lo;
            bytes += char(value);
            ++run;
          } else {
            flush();
            result.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(result);
        break;
      }
      case DecoderStep::byte_level: {
        // Each token's characters back to bytes; a token with a character outside the byte
        // alphabet (an added token) is taken as its own UTF-8.
        static const std::unordered_map<std::string, unsigned char> byte_of = [] {
          std::unordered_map<std::string, unsigned char> m;
          for (int b = 0; b < 256; ++b)
            m.emplace(byte_level_chars()[b], static_cast<unsigned char>(b));
          return m;
        }();
        std::string bytes;
        for (const std::string& t : tokens) {
          std::string own;
          bool mapped = true;
          for (size_t i = 0; i < t.size() && mapped;) {
            const size_t len =
                std::min(utf8_length(static_cast<unsigned char>(t[i])), t.size() - i);
            const auto it = byte_of.find(t.substr(i, len));
            if (it == byte_of.end())
              mapped = false;
            else
              own += char(it->second);
            i += len;
          }
          bytes += mapped ? own : t;
        }
        tokens.assign(1, utf8_replace_invalid(bytes));
        break;
      }
      case DecoderStep::metaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          // The first token loses its ▁ characters (the prefix the encoder added); the others
          // turn them into spaces.
          replace_all(tokens[i], kMetaspace, i == 0 && step.prepend ? "" : " ");
        }
        break;
    }
  }

  fs::path path_;
  std::string raw_;                                 // the file, saved verbatim
  std::unordered_map<std::string, int32_t> vocab_;  // token string → id (added tokens too)
  std::vector<std::string> id_to_token_;            // id → token string ("" for a hole)
  std::unordered_map<uint64_t, BpeMerge> merges_;   // (left id, right id) → rank, merged id
  std::vector<std::pair<std::string, int32_t>> matched_added_;  // non-special added tokens
  std::vector<int32_t> special_;
  std::vector<json> added_tokens_;
  std::vector<NormalizerStep> normalizer_;
  std::vector<PreTokenizerStep> pre_;
  std::vector<DecoderStep> decoder_;
  std::array<int32_t, 256> byte_ids_{};  // byte → the id of its byte-level char or <0xXX>
  bool byte_level_ = false, byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  std::optional<int32_t> bos_, eos_, unk_;
  // Unique for the process's lifetime (from 1): what the per-thread pre-token cache is keyed by.
  const uint64_t serial_ = [] {
    static std::atomic<uint64_t> next{1};
    return next++;
  }();
};

}  // namespace

std::unique_ptr<Tokenizer> make_hf_bpe_tokenizer(const fs::path& path,
                                                 const SpecialTokenNames& names) {
  return std::make_unique<HfBpeTokenizer>(path, names);
}

}  // namespace bottle
