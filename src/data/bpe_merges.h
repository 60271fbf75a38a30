#pragma once
// Byte-pair merging of one pre-token, shared by tokenizer.json BPE and tiktoken: repeatedly
// merge the adjacent pair of lowest rank, the leftmost one among equals, until no pair has a
// rank. A heap with lazy invalidation keeps a long pre-token (a run of 5,000 digits, or a
// whole document under a SentencePiece-style tokenizer, which has no pre-tokenizer) at
// O(n log n) instead of the O(n²) of rescanning.
#include <array>
#include <cstdint>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <vector>

namespace bottle {

// One symbol of a word being merged: its token id and the bytes [begin, end) of the
// pre-token it covers (tiktoken ranks a pair by those bytes).
struct BpeSymbol {
  int32_t id;
  uint32_t begin, end;
};

struct BpeMerge {
  uint32_t rank;  // lower merges first
  int32_t id;     // the merged symbol's token id
};

// Merges `symbols` in place. `merge_of(left, right)` gives the merge of two adjacent symbols
// or nullopt when that pair has none.
template <typename MergeOf>
void bpe_merge(std::vector<BpeSymbol>& symbols, const MergeOf& merge_of) {
  const size_t n = symbols.size();
  if (n < 2) return;
  std::vector<int32_t> next(n), prev(n);  // linked list over live symbols; -1 ends it
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? int32_t(i + 1) : -1;
    prev[i] = int32_t(i) - 1;
  }
  struct Candidate {
    uint32_t rank;
    int32_t left, right;        // positions
    int32_t left_id, right_id;  // the ids when queued: a changed symbol makes it stale
    int32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    if (const std::optional<BpeMerge> m = merge_of(symbols[left], symbols[right]))
      queue.push({m->rank, left, right, symbols[left].id, symbols[right].id, m->id});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i), int32_t(i + 1));
  std::vector<bool> dead(n, false);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    if (dead[c.left] || dead[c.right] || next[c.left] != c.right ||
        symbols[c.left].id != c.left_id || symbols[c.right].id != c.right_id)
      continue;
    symbols[c.left] = {c.merged, symbols[c.left].begin, symbols[c.right].end};
    dead[c.right] = true;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    push(prev[c.left], c.left);
    push(c.left, next[c.left]);
  }
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i)
    if (!dead[i]) symbols[kept++] = symbols[i];
  symbols.resize(kept);
}

// GPT-2's map from bytes to printable characters (HF's ByteLevel): the UTF-8 string of the
// character that stands for each byte in a byte-level vocabulary.
const std::array<std::string, 256>& byte_level_chars();

}  // namespace bottle
