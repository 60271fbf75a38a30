// What a configuration key says of a value (as TOML, in --help-config and in messages) and
// the range and choice checks before a value is stored (train/config_key.h).
#include "train/config_key.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "data/utf8.h"

namespace bottle::config_keys {

namespace {

std::string format_number(double v, bool single) {
  std::string s = single ? fmt::format("{}", float(v)) : fmt::format("{}", v);
  if (s == "inf" || s == "-inf" || s == "nan" || s == "-nan") return s;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

bool in_range(const Range& r, double v) {
  if (std::isnan(v)) return !r.lo && !r.hi;
  if (r.lo && !(r.lo->inclusive ? v >= r.lo->value : v > r.lo->value)) return false;
  if (r.hi && !(r.hi->inclusive ? v <= r.hi->value : v < r.hi->value)) return false;
  return true;
}

}  // namespace

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (u < 0x20 || u == 0x7f)
          out += fmt::format("\\u{:04X}", unsigned(u));
        else
          out += ch;
    }
  }
  return out + "\"";
}

std::string format_value(const ConfigKey& key, const Value& v) {
  if (std::holds_alternative<std::monostate>(v)) return "unset";
  if (const auto* i = std::get_if<int64_t>(&v)) return fmt::format("{}", *i);
  if (const auto* d = std::get_if<double>(&v)) return format_number(*d, key.single);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  // One path is written as a string, as the key was before it took several.
  if (const auto* paths = std::get_if<std::vector<std::string>>(&v)) {
    if (paths->size() <= 1) return toml_string(paths->empty() ? std::string() : paths->front());
    std::string out = "[";
    for (size_t i = 0; i < paths->size(); ++i) out += (i ? ", " : "") + toml_string((*paths)[i]);
    return out + "]";
  }
  if (const auto* numbers = std::get_if<std::vector<double>>(&v)) {
    std::string out = "[";
    for (size_t i = 0; i < numbers->size(); ++i)
      out += (i ? ", " : "") + format_number((*numbers)[i], false);
    return out + "]";
  }
  return toml_string(std::get<std::string>(v));
}

std::string describe_range(const Range& r) {
  auto num = [](double v) { return fmt::format("{}", v); };
  if (r.lo && r.hi)
    return fmt::format("in {}{}, {}{}", r.lo->inclusive ? '[' : '(', num(r.lo->value),
                       num(r.hi->value), r.hi->inclusive ? ']' : ')');
  if (r.lo) return fmt::format("{} {}", r.lo->inclusive ? ">=" : ">", num(r.lo->value));
  if (r.hi) return fmt::format("{} {}", r.hi->inclusive ? "<=" : "<", num(r.hi->value));
  return "any";
}

const char* type_noun(KeyType t) {
  switch (t) {
    case KeyType::integer:
      return "an integer";
    case KeyType::number:
      return "a number";
    case KeyType::boolean:
      return "a boolean";
    case KeyType::bytes:
      return "a byte size (an integer, or a string such as \"20GiB\")";
    case KeyType::paths:
      return "a string or an array of strings";
    case KeyType::numbers:
      return "an array of numbers";
    default:
      return "a string";
  }
}

const char* type_word(KeyType t) {
  switch (t) {
    case KeyType::integer:
      return "integer";
    case KeyType::number:
      return "number";
    case KeyType::boolean:
      return "boolean";
    case KeyType::string:
      return "string";
    case KeyType::bytes:
      return "bytes";
    case KeyType::paths:
      return "paths";
    case KeyType::numbers:
      return "numbers";
    default:
      return "choice";
  }
}

std::string quoted_choices(const ConfigKey& key) {
  std::string out;
  for (size_t i = 0; i < key.choices.size(); ++i)
    out += (i ? ", \"" : "\"") + key.choices[i] + "\"";
  return out;
}

// Range and choice checks, then stores the value. `source`: the file or "--set".
void assign(TrainConfig& config, const ConfigKey& key, const Value& value,
            const std::string& source) {
  switch (key.type) {
    case KeyType::integer: {
      const int64_t v = std::get<int64_t>(value);
      if (!in_range(key.range, double(v)))
        fail("{}: key '{}' must be {}, got {}", source, key.path, describe_range(key.range), v);
      if (v < key.int_min || v > key.int_max)
        fail("{}: key '{}' is too large, got {}", source, key.path, v);
      break;
    }
    case KeyType::number: {
      const double v = std::get<double>(value);
      if (!in_range(key.range, v) || !std::isfinite(v))
        fail("{}: key '{}' must be {}, got {}", source, key.path,
             key.range.lo || key.range.hi ? describe_range(key.range) : std::string("finite"), v);
      if (key.single && !std::isfinite(float(v)))
        fail("{}: key '{}' is too large for a float, got {}", source, key.path, v);
      break;
    }
    case KeyType::bytes: {
      // 0 once meant "no limit" and was replaced silently; an absent key says that now.
      const int64_t v = std::get<int64_t>(value);
      if (v <= 0)
        fail("{}: key '{}' must be a positive byte size (omit the key for no limit), got {}",
             source, key.path, v);
      break;
    }
    case KeyType::paths:
      for (const std::string& s : std::get<std::vector<std::string>>(value)) {
        if (const std::string why = text_value_problem(s); !why.empty())
          fail(
              "{}: key '{}' holds {}; paths and names must be UTF-8 text without control "
              "characters",
              source, key.path, why);
        if (s.empty()) fail("{}: key '{}' lists an empty path", source, key.path);
      }
      break;
    case KeyType::numbers:
      for (const double v : std::get<std::vector<double>>(value))
        if (!in_range(key.range, v) || !std::isfinite(v))
          fail("{}: key '{}' must hold numbers {}, got {}", source, key.path,
               describe_range(key.range), v);
      break;
    case KeyType::string:
      // Paths and names travel into JSON (trainer_state.json), gnuplot's script and one-line
      // messages: a byte that is not UTF-8 or a control character would fail there, after the
      // whole run; refused here, where it enters.
      if (const std::string why = text_value_problem(std::get<std::string>(value)); !why.empty())
        fail(
            "{}: key '{}' holds {}; paths and names must be UTF-8 text without control "
            "characters",
            source, key.path, why);
      break;
    case KeyType::choice: {
      const auto& s = std::get<std::string>(value);
      if (std::find(key.choices.begin(), key.choices.end(), s) == key.choices.end())
        fail("{}: key '{}' must be one of {}; got {}", source, key.path, quoted_choices(key),
             toml_string(s));
      break;
    }
    default:
      break;
  }
  key.set(config, value);
}

}  // namespace bottle::config_keys
