#pragma once
// One key of the training configuration's schema (train/train_config.h): its TOML type, its
// range or choices, its default's note, and how it reads and writes its member of TrainConfig.
// The keys themselves are the table in train_config.cpp; the loader (config_loader.cpp) parses,
// checks, lists and writes them through what is declared here. Private to src/train.
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "train/train_config.h"

namespace bottle::config_keys {

// monostate: an optional key without a value (omitted from the TOML). The vectors: a list of
// paths (one, written as a plain string, or several) and a list of numbers.
using Value = std::variant<std::monostate, int64_t, double, bool, std::string,
                           std::vector<std::string>, std::vector<double>>;

// paths: a string, or an array of strings (several sources); numbers: an array of numbers,
// unset when empty.
enum class KeyType { integer, number, boolean, string, choice, bytes, paths, numbers };

struct Bound {
  double value;
  bool inclusive;
};
struct Range {
  std::optional<Bound> lo, hi;
};
inline Range greater(double v) { return {Bound{v, false}, std::nullopt}; }
inline Range at_least(double v) { return {Bound{v, true}, std::nullopt}; }
inline Range closed(double a, double b) { return {Bound{a, true}, Bound{b, true}}; }
inline Range half_open(double a, double b) { return {Bound{a, true}, Bound{b, false}}; }

struct ConfigKey {
  std::string path;  // "section.key"
  KeyType type = KeyType::integer;
  Range range;
  std::vector<std::string> choices;  // KeyType::choice
  int64_t int_min = 0, int_max = 0;  // what the C++ field holds (KeyType::integer)
  bool single = false;               // a float field: printed at float precision
  bool optional = false;             // may have no value
  std::string doc;
  std::string default_note;  // shown instead of the default value when not empty
  std::function<Value(const TrainConfig&)> get;
  std::function<void(TrainConfig&, const Value&)> set;
};

// The schema, in the order of --help-config and of the TOML written back: build_schema is the
// table (train_config.cpp); schema() builds it once and aborts on a key listed twice or a
// Setting without its key.
std::vector<ConfigKey> build_schema();
const std::vector<ConfigKey>& schema();

// What a key says of a value, and the checks before storing one (config_key.cpp).
std::string format_value(const ConfigKey& key, const Value& v);  // as TOML; "unset"
std::string toml_string(const std::string& s);                   // a quoted TOML string
std::string describe_range(const Range& r);                      // "> 0", "in [0, 1)"
const char* type_noun(KeyType t);                                // "an integer"
const char* type_word(KeyType t);                                // "integer"
std::string quoted_choices(const ConfigKey& key);                // "\"a\", \"b\""
// Range and choice checks, then stores the value. `source`: the file or "--set".
void assign(TrainConfig& config, const ConfigKey& key, const Value& value,
            const std::string& source);

// `field` is a generic lambda returning a reference to the member: [](auto& c) -> auto& {...}.
template <typename F>
using FieldType = std::remove_cvref_t<decltype(std::declval<F>()(std::declval<TrainConfig&>()))>;

template <typename T>
inline constexpr bool kIsOptional = false;
template <typename T>
inline constexpr bool kIsOptional<std::optional<T>> = true;

// What a key is besides its member: the schema's builders below fill it in.
struct KeySpec {
  KeyType type = KeyType::integer;
  Range range = {};
  std::string doc = {};
  std::string default_note = {};
  bool unset_when_zero = false;           // an integer member that holds 0 for "no value"
  std::vector<std::string> choices = {};  // an enum member's TOML names, in enumerator order
};

// The one key over a member of TrainConfig: the member's C++ type decides how the key reads
// and writes it (an integer of any width with its limits, a float or double, a bool, an
// optional bool that may be unset, a string, an enum spelled choices[int(value)]).
template <typename F>
ConfigKey field_key(std::string path, F field, KeySpec spec) {
  using T = FieldType<F>;
  ConfigKey k;
  k.path = std::move(path);
  k.type = spec.type;
  k.range = spec.range;
  k.choices = std::move(spec.choices);
  k.optional = spec.unset_when_zero;
  k.doc = std::move(spec.doc);
  k.default_note = std::move(spec.default_note);
  if constexpr (kIsOptional<T>) {
    k.optional = true;
    k.get = [field](const TrainConfig& c) -> Value {
      if (!field(c).has_value()) return std::monostate{};
      return *field(c);
    };
    k.set = [field](TrainConfig& c, const Value& v) {
      field(c) = std::get<typename T::value_type>(v);
    };
  } else if constexpr (std::is_enum_v<T>) {
    k.get = [field, names = k.choices](const TrainConfig& c) -> Value {
      return names[size_t(field(c))];
    };
    k.set = [field, names = k.choices](TrainConfig& c, const Value& v) {
      const auto& s = std::get<std::string>(v);
      for (size_t i = 0; i < names.size(); ++i)
        if (s == names[i]) field(c) = T(i);
    };
  } else if constexpr (std::is_same_v<T, std::vector<double>>) {
    k.optional = true;
    k.get = [field](const TrainConfig& c) -> Value {
      if (field(c).empty()) return std::monostate{};
      return field(c);
    };
    k.set = [field](TrainConfig& c, const Value& v) { field(c) = std::get<T>(v); };
  } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::string> ||
                       std::is_same_v<T, std::vector<std::string>>) {
    k.get = [field](const TrainConfig& c) -> Value { return T(field(c)); };
    k.set = [field](TrainConfig& c, const Value& v) { field(c) = std::get<T>(v); };
  } else if constexpr (std::is_integral_v<T>) {
    if (spec.type == KeyType::integer) {
      k.int_min = std::numeric_limits<T>::min();
      k.int_max = std::numeric_limits<T>::max();
    }
    k.get = [field, unset_at_zero = spec.unset_when_zero](const TrainConfig& c) -> Value {
      if (unset_at_zero && field(c) == 0) return std::monostate{};
      return int64_t(field(c));
    };
    k.set = [field](TrainConfig& c, const Value& v) { field(c) = T(std::get<int64_t>(v)); };
  } else {
    static_assert(std::is_floating_point_v<T>, "a configuration key of an unknown type");
    k.single = std::is_same_v<T, float>;
    k.get = [field](const TrainConfig& c) -> Value { return double(field(c)); };
    k.set = [field](TrainConfig& c, const Value& v) { field(c) = T(std::get<double>(v)); };
  }
  return k;
}

// The spellings of the schema's table, one per kind of key.
template <typename F>
ConfigKey integer_key(std::string path, F field, Range range, std::string doc,
                      std::string default_note = {}) {
  static_assert(std::is_integral_v<FieldType<F>>);
  return field_key(std::move(path), field,
                   {.type = KeyType::integer,
                    .range = range,
                    .doc = std::move(doc),
                    .default_note = std::move(default_note)});
}

// An integer that is unset when 0 (model.rank, model.ranks.*): given values must be > 0.
template <typename F>
ConfigKey unset_when_zero_key(std::string path, F field, std::string doc,
                              std::string default_note) {
  return field_key(std::move(path), field,
                   {.type = KeyType::integer,
                    .range = greater(0),
                    .doc = std::move(doc),
                    .default_note = std::move(default_note),
                    .unset_when_zero = true});
}

template <typename F>
ConfigKey number_key(std::string path, F field, Range range, std::string doc) {
  static_assert(std::is_floating_point_v<FieldType<F>>);
  return field_key(std::move(path), field,
                   {.type = KeyType::number, .range = range, .doc = std::move(doc)});
}

template <typename F>
ConfigKey bool_key(std::string path, F field, std::string doc) {
  return field_key(std::move(path), field, {.type = KeyType::boolean, .doc = std::move(doc)});
}

template <typename F>
ConfigKey optional_bool_key(std::string path, F field, std::string doc, std::string default_note) {
  static_assert(kIsOptional<FieldType<F>>);
  return field_key(
      std::move(path), field,
      {.type = KeyType::boolean, .doc = std::move(doc), .default_note = std::move(default_note)});
}

template <typename F>
ConfigKey string_key(std::string path, F field, std::string doc) {
  return field_key(std::move(path), field, {.type = KeyType::string, .doc = std::move(doc)});
}

// One path or several: a TOML string, or an array of strings; "" is none.
template <typename F>
ConfigKey paths_key(std::string path, F field, std::string doc) {
  static_assert(std::is_same_v<FieldType<F>, std::vector<std::string>>);
  return field_key(std::move(path), field, {.type = KeyType::paths, .doc = std::move(doc)});
}

// A list of numbers in `range`, each: a TOML array; unset when empty.
template <typename F>
ConfigKey numbers_key(std::string path, F field, Range range, std::string doc,
                      std::string default_note) {
  static_assert(std::is_same_v<FieldType<F>, std::vector<double>>);
  return field_key(std::move(path), field,
                   {.type = KeyType::numbers,
                    .range = range,
                    .doc = std::move(doc),
                    .default_note = std::move(default_note)});
}

// A byte count: a TOML integer, or a string with a unit ("20GiB"); unset when 0.
template <typename F>
ConfigKey bytes_key(std::string path, F field, std::string doc, std::string default_note) {
  return field_key(std::move(path), field,
                   {.type = KeyType::bytes,
                    .doc = std::move(doc),
                    .default_note = std::move(default_note),
                    .unset_when_zero = true});
}

// An enum stored in `field`, spelled names[int(value)] in TOML.
template <typename F, size_t N>
ConfigKey choice_key(std::string path, F field, const std::array<const char*, N>& names,
                     std::string doc, std::string default_note = {}) {
  static_assert(std::is_enum_v<FieldType<F>>);
  return field_key(std::move(path), field,
                   {.type = KeyType::choice,
                    .doc = std::move(doc),
                    .default_note = std::move(default_note),
                    .choices = std::vector<std::string>(names.begin(), names.end())});
}

// The same with the names given at run time (a registry's, such as the pipeline schedules').
template <typename F>
ConfigKey choice_key(std::string path, F field, std::vector<std::string> names, std::string doc,
                     std::string default_note = {}) {
  static_assert(std::is_enum_v<FieldType<F>>);
  return field_key(std::move(path), field,
                   {.type = KeyType::choice,
                    .doc = std::move(doc),
                    .default_note = std::move(default_note),
                    .choices = std::move(names)});
}

}  // namespace bottle::config_keys
