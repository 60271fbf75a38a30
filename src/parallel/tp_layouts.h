#pragma once
// The TP modes by name (docs/design.md §4, §17): each mode's layout is defined in its own file
// and registered in tp_layouts.cpp, one line per mode; parallel.tp_mode's choices are these
// names, in this order.
#include <string_view>
#include <vector>

#include "nn/model_shape.h"
#include "parallel/tp_layout.h"

namespace bottle {

// The registered layouts, in the order their names are listed.
const std::vector<const TpLayout*>& tp_layouts();
std::vector<const char*> tp_layout_names();
// The layout named `name`; null when no mode has that name.
const TpLayout* find_tp_layout(std::string_view name);
// The same, failing (SettingError naming the TP mode) when no mode has that name.
const TpLayout& tp_layout(std::string_view name);

// parallel.tp_mode's one default: Megatron TP (full) for a full-rank model, bottleneck-aware
// TP (btp) for a bottleneck model.
const TpLayout& default_tp_layout(const ModelShape& model);

}  // namespace bottle
