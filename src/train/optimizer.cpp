#include "train/optimizer.h"

#include <string_view>

namespace bottle {

ParamRole param_role(const ParamSpec& spec) {
  if (spec.name == "model.embed_tokens.weight") return ParamRole::embedding;
  if (spec.name == "lm_head.weight") return ParamRole::lm_head;
  const Shape& shape = spec.full_shape.rank ? spec.full_shape : spec.shape;
  if (shape.rank == 2 && std::string_view(spec.name).starts_with("model.layers.")) {
    return ParamRole::matrix;
  }
  BOTTLE_ASSERT(shape.rank == 1, "param_role: {} {} is neither a block's matrix nor 1-D", spec.name,
                shape.str());
  return ParamRole::vector;
}

const char* param_role_name(ParamRole role) {
  static constexpr const char* names[] = {"matrix", "embedding", "lm_head", "vector"};
  return names[int(role)];
}

void take_held(Backend& be, const FlatSource& source, Tensor whole) {
  for (const ShardPiece& piece : source.owned)
    be.copy(source.data.view(piece.local, {piece.count}), whole.view(piece.begin, {piece.count}));
}

}  // namespace bottle
