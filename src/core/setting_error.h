#pragma once
// A user error about a setting (the TP degree, the TP mode, a recomputation policy, ...), found
// by code that takes typed values and does not know how a user spells them. The configuration
// lives in src/train, which maps each Setting to its key ("parallel.tp") and says where the
// value came from (docs/design.md §14); code below it names settings only through mention().
#include <fmt/format.h>

#include <functional>
#include <string>

#include "core/error.h"

namespace bottle {

// Every setting code below src/train can find wrong or refer to in such a message.
enum class Setting {
  tp,         // TP degree
  pp,         // pipeline stages
  dp,         // DP degree
  tp_mode,    // the TP mode (its layout)
  recompute,  // the activation recomputation policy
  vocab_size,
  hidden_size,
  intermediate_size,
  num_heads,
  num_kv_heads,
  num_layers,
  bottleneck,  // the bottleneck kind
};

// The setting `setting`, as it appears inside a SettingError's sentence (a marker that the
// renderer replaces by the setting's name).
std::string mention(Setting setting);

class SettingError : public Error {
 public:
  // `setting`: the one that is wrong. `sentence`: the whole message, every setting in it
  // written with mention(); what() names them in plain words ("the TP degree").
  SettingError(Setting setting, std::string sentence);

  Setting setting() const { return setting_; }
  // The sentence with each mention replaced by name(mentioned, mentioned == setting()).
  std::string render(const std::function<std::string(Setting, bool wrong)>& name) const;

 private:
  Setting setting_;
  std::string sentence_;
};

// The plain-word name of a setting, for messages read without src/train's key names.
const char* setting_noun(Setting setting);

template <typename... Args>
[[noreturn]] void fail_setting(Setting setting, fmt::format_string<Args...> format,
                               Args&&... args) {
  throw SettingError(setting, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace bottle
