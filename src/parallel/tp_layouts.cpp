#include "parallel/tp_layouts.h"

namespace bottle {

// The registry: one line per mode, in the order parallel.tp_mode lists them. MODE(x) is the
// mode whose file tp_x.cpp defines its layout as `const TpLayout& x_tp_layout()`; the layout's
// name() is the mode's name.
#define BOTTLE_TP_MODES(MODE) \
  MODE(full)                  \
  MODE(vanilla)               \
  MODE(btp)

#define BOTTLE_DECLARE_TP_LAYOUT(mode) const TpLayout& mode##_tp_layout();
BOTTLE_TP_MODES(BOTTLE_DECLARE_TP_LAYOUT)
#undef BOTTLE_DECLARE_TP_LAYOUT

const std::vector<const TpLayout*>& tp_layouts() {
#define BOTTLE_LIST_TP_LAYOUT(mode) &mode##_tp_layout(),
  static const std::vector<const TpLayout*> layouts{BOTTLE_TP_MODES(BOTTLE_LIST_TP_LAYOUT)};
#undef BOTTLE_LIST_TP_LAYOUT
  return layouts;
}

#undef BOTTLE_TP_MODES

std::vector<const char*> tp_layout_names() {
  std::vector<const char*> names;
  for (const TpLayout* layout : tp_layouts()) names.push_back(layout->name());
  return names;
}

const TpLayout* find_tp_layout(std::string_view name) {
  for (const TpLayout* layout : tp_layouts())
    if (name == layout->name()) return layout;
  return nullptr;
}

const TpLayout& tp_layout(std::string_view name) {
  if (const TpLayout* layout = find_tp_layout(name)) return *layout;
  std::string choices;
  for (const char* known : tp_layout_names())
    choices += fmt::format("{}\"{}\"", choices.empty() ? "" : ", ", known);
  fail_setting(Setting::tp_mode, "{} must be one of {}; got \"{}\"", mention(Setting::tp_mode),
               choices, name);
}

const TpLayout& default_tp_layout(const ModelShape& model) {
  return tp_layout(model.low_rank() ? "btp" : "full");
}

}  // namespace bottle
