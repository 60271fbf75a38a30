#pragma once
#include <string>

namespace bottle {
// `bottle --version`: the version, the commit it was built from, how it was built, the
// backends and communicators compiled in, and the CPU it runs on — what a bug report needs.
std::string version_text();
}  // namespace bottle
