#include "parallel/tp_layout.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "parallel/tp_layouts.h"

namespace bottle {
namespace {

// "\"a\"", "\"a\" or \"b\"", "\"a\", \"b\" or \"c\"".
std::string quoted_alternatives(const std::vector<const char*>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += fmt::format("{}\"{}\"", i == 0 ? "" : (i + 1 == names.size() ? " or " : ", "), names[i]);
  return out;
}

// The modes that fit the model, its default first.
std::vector<const char*> fitting_modes(const ModelShape& model) {
  const TpLayout& preferred = default_tp_layout(model);
  std::vector<const char*> names{preferred.name()};
  for (const TpLayout* layout : tp_layouts())
    if (layout != &preferred && layout->fits(model.bottleneck)) names.push_back(layout->name());
  return names;
}

}  // namespace

void require_divides(int t, int64_t value, Setting what) {
  if (value % t != 0)
    fail_setting(Setting::tp, "{} ({}) must divide {} ({})", mention(Setting::tp), t, mention(what),
                 value);
}

void validate_layout(const TpLayout& layout, const ModelShape& model, int t) {
  if (!layout.fits(model.bottleneck))
    fail_setting(Setting::tp_mode, "{} is \"{}\", which {} ({} is \"{}\"); use {}",
                 mention(Setting::tp_mode), layout.name(), layout.requirement(),
                 mention(Setting::bottleneck), bottleneck_kind_name(model.bottleneck),
                 quoted_alternatives(fitting_modes(model)));
  layout.check_divisible(model, t);
}

void validate_recompute(Recompute policy, const TpLayout& layout, const ModelShape& model) {
  if (layout.supports(policy, model)) return;
  // What to use instead: the other policies this layout applies, beyond keeping everything.
  std::vector<const char*> instead;
  for (size_t i = 0; i < kRecomputeNames.size(); ++i)
    if (Recompute(i) != Recompute::none && layout.supports(Recompute(i), model))
      instead.push_back(kRecomputeNames[i]);
  std::vector<const char*> able;
  for (const TpLayout* other : tp_layouts())
    if (other->fits(model.bottleneck) && other->supports(policy, model))
      able.push_back(other->name());
  if (able.empty())  // no layout of this model: what the policy keeps, the model does not have
    fail_setting(Setting::recompute, "{} = \"{}\" keeps {}, but {} is \"{}\"; use {}",
                 mention(Setting::recompute), recompute_name(policy), recompute_keeps(policy),
                 mention(Setting::bottleneck), bottleneck_kind_name(model.bottleneck),
                 quoted_alternatives(instead));
  const std::string_view preferred = default_tp_layout(model).name();
  const bool default_able =
      std::any_of(able.begin(), able.end(), [&](const char* n) { return n == preferred; });
  fail_setting(Setting::recompute, "{} = \"{}\" needs {} = {}{}: under \"{}\" {}; use {}",
               mention(Setting::recompute), recompute_name(policy), mention(Setting::tp_mode),
               quoted_alternatives(able),
               default_able ? fmt::format(" (the default for a {} model, on one rank too)",
                                          model.low_rank() ? "bottleneck" : "full-rank")
                            : std::string(),
               layout.name(), layout.why_not(policy), quoted_alternatives(instead));
}

}  // namespace bottle
