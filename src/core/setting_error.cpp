#include "core/setting_error.h"

namespace bottle {
namespace {

// A mention is kMark, the setting's index as a letter, kMark: control characters that no
// message text contains.
constexpr char kMark = '\x1f';

std::string render_sentence(const std::string& sentence,
                            const std::function<std::string(Setting)>& name) {
  std::string out;
  for (size_t i = 0; i < sentence.size(); ++i) {
    if (sentence[i] == kMark && i + 2 < sentence.size() && sentence[i + 2] == kMark) {
      out += name(Setting(sentence[i + 1] - 'a'));
      i += 2;
    } else {
      out += sentence[i];
    }
  }
  return out;
}

}  // namespace

std::string mention(Setting setting) { return {kMark, char('a' + int(setting)), kMark}; }

const char* setting_noun(Setting setting) {
  switch (setting) {
    case Setting::tp:
      return "the TP degree";
    case Setting::pp:
      return "the number of pipeline stages";
    case Setting::dp:
      return "the DP degree";
    case Setting::tp_mode:
      return "the TP mode";
    case Setting::recompute:
      return "the recomputation policy";
    case Setting::vocab_size:
      return "the vocabulary size";
    case Setting::hidden_size:
      return "the hidden size";
    case Setting::intermediate_size:
      return "the MLP width";
    case Setting::num_heads:
      return "the number of attention heads";
    case Setting::num_kv_heads:
      return "the number of key/value heads";
    case Setting::num_layers:
      return "the number of layers";
    case Setting::bottleneck:
      return "the bottleneck kind";
  }
  return "a setting";
}

SettingError::SettingError(Setting setting, std::string sentence)
    : Error(render_sentence(sentence, [](Setting s) { return std::string(setting_noun(s)); })),
      setting_(setting),
      sentence_(std::move(sentence)) {}

std::string SettingError::render(
    const std::function<std::string(Setting, bool wrong)>& name) const {
  return render_sentence(sentence_, [&](Setting s) { return name(s, s == setting_); });
}

}  // namespace bottle
