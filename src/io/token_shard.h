#pragma once
// llm.c token shards: 256 little-endian int32 header ([0] magic, [1] version, [2] count),
// then the tokens (uint16 for magic 20240520 / version 1, uint32 for 20240801 / version 7).
#include <array>
#include <cstdint>
#include <istream>
#include <span>
#include <string>
#include <vector>

namespace bottle {

inline constexpr int32_t kShardMagicU16 = 20240520, kShardVersionU16 = 1;
inline constexpr int32_t kShardMagicU32 = 20240801, kShardVersionU32 = 7;

// The token count of a shard from its header, checking magic, version and file size;
// errors name the file.
uint64_t token_shard_size(const std::string& path);
// Loads a whole shard with the same checks.
std::vector<int32_t> read_token_shard(const std::string& path);
// The same from a stream holding `size` bytes, named `path` in errors (what a fuzzer drives).
std::vector<int32_t> read_token_shard(std::istream& in, uint64_t size, const std::string& path);
// Writes uint16 tokens when every id fits, uint32 otherwise.
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens);

// The token width, in bytes, of shards for a vocabulary of `vocab_size` ids: 2 (uint16) when
// every id fits, else 4. Chosen by the vocabulary, not by the ids a shard happens to hold, so
// that every shard of one data set has the same format (llm.c's fineweb.py does the same).
inline int shard_token_width(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }
// The header of a shard of `count` tokens `width` (2 or 4) bytes wide.
std::array<int32_t, 256> token_shard_header(uint64_t count, int width);
// Writes `tokens` `width` (2 or 4) bytes each, whatever ids they hold; errors name the file and
// a token outside uint16 for width 2 (int32 ids always fit width 4, as the old writer wrote them).
void write_token_shard(const std::string& path, std::span<const int32_t> tokens, int width);

}  // namespace bottle
