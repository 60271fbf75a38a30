#pragma once
// llm.c token shards: 256 little-endian int32 header ([0] magic, [1] version, [2] count),
// then the tokens (uint16 for magic 20240520 / version 1, uint32 for 20240801 / version 7).
#include <cstdint>
#include <istream>
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

}  // namespace bottle
