#pragma once
#include <string>
#include <vector>

namespace bottle {
// A shard file, a directory (its *.bin files) or a glob → the sorted list of files; an
// error naming the pattern when nothing matches.
std::vector<std::string> resolve_data_files(const std::string& pattern);
}  // namespace bottle
