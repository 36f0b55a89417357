// The JSON schema converter's scalars: strings (lengths, pattern, format) and numbers (integer
// and number ranges from minimum/maximum and their exclusive forms, written digit by digit).
// Converter methods declared in json_schema_converter.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/json_schema_converter.h"
#include "grammar/length_bounded.h"
#include "grammar/regex.h"

namespace vesper::grammar::json_schema_detail {
namespace {

// Integers (and the integer part of numbers) have at most 16 digits, as in llama.cpp.
constexpr int64_t kMaxMagnitude = 9'999'999'999'999'999;
// The GBNF parser's cap on a repetition count (minLength, maxItems...).
constexpr uint64_t kMaxCount = 10000;

// Decimal strings of equal length with lo <= hi: the GBNF of every string between them.
std::string digit_range(std::string_view lo, std::string_view hi) {
  if (lo.empty()) return "";
  auto all = [](std::string_view s, char c) {
    return std::all_of(s.begin(), s.end(), [c](char x) { return x == c; });
  };
  auto any_digits = [](size_t n) {
    return n == 0   ? std::string()
           : n == 1 ? std::string("[0-9]")
                    : "[0-9]{" + std::to_string(n) + "}";
  };
  auto digits = [](char a, char b) {
    return a == b ? "\"" + std::string(1, a) + "\""
                  : "[" + std::string(1, a) + "-" + std::string(1, b) + "]";
  };
  const size_t rest = lo.size() - 1;
  if (lo[0] == hi[0])
    return join({digits(lo[0], lo[0]), digit_range(lo.substr(1), hi.substr(1))}, " ");
  // The first digit's range splits into: lo[0] with the rest from lo's tail, the digits strictly
  // between with any rest, hi[0] with the rest up to hi's tail (merged when a tail is full).
  char mid_lo = static_cast<char>(lo[0] + 1), mid_hi = static_cast<char>(hi[0] - 1);
  std::vector<std::string> alts;
  if (all(lo.substr(1), '0'))
    mid_lo = lo[0];
  else
    alts.push_back(
        join({digits(lo[0], lo[0]), digit_range(lo.substr(1), std::string(rest, '9'))}, " "));
  const bool hi_full = all(hi.substr(1), '9');
  if (hi_full) mid_hi = hi[0];
  if (mid_lo <= mid_hi) alts.push_back(join({digits(mid_lo, mid_hi), any_digits(rest)}, " "));
  if (!hi_full)
    alts.push_back(
        join({digits(hi[0], hi[0]), digit_range(std::string(rest, '0'), hi.substr(1))}, " "));
  return alternatives(std::move(alts));
}

int64_t pow10(size_t n) {
  int64_t v = 1;
  while (n-- > 0) v *= 10;
  return v;
}

// The decimal strings (no leading zeros) of the integers in [a, b], 0 <= a <= b.
std::string uint_range(int64_t a, int64_t b) {
  const std::string sa = std::to_string(a), sb = std::to_string(b);
  std::vector<std::string> alts;
  for (size_t len = sa.size(); len <= sb.size(); ++len) {
    const int64_t lo = len == sa.size() ? a : pow10(len - 1);
    const int64_t hi = len == sb.size() ? b : pow10(len) - 1;
    alts.push_back(digit_range(std::to_string(lo), std::to_string(hi)));
  }
  return alternatives(std::move(alts));
}

}  // namespace

// --- strings ---

Result<std::optional<uint64_t>> Converter::count_keyword(const Json& s, const char* keyword,
                                                         const std::string& path) {
  auto it = s.find(keyword);
  if (it == s.end()) return std::optional<uint64_t>();
  uint64_t v = 0;
  if (it->is_number_unsigned()) {
    v = it->get<uint64_t>();
  } else if (it->is_number_integer() && it->get<int64_t>() >= 0) {
    v = static_cast<uint64_t>(it->get<int64_t>());  // built in code rather than parsed
  } else if (it->is_number_float() && integral(it->get<double>()) && it->get<double>() >= 0) {
    v = it->get<double>() > 1e18 ? UINT64_MAX : static_cast<uint64_t>(it->get<double>());
  } else {
    return error(path, "'" + std::string(keyword) + "' must be a non-negative integer");
  }
  if (v > kMaxCount)
    return error(path, "'" + std::string(keyword) + "' " + compact(*it) + " is above " +
                           std::to_string(kMaxCount) + ", the largest supported");
  return std::optional<uint64_t>(v);
}

Result<std::string> Converter::string_expr(const Json& s, const std::string& path) {
  const char* const others[] = {"format", "minLength", "maxLength"};
  if (auto it = s.find("pattern"); it != s.end()) {
    for (const char* k : others)
      if (s.contains(k))
        return error(path, "'" + std::string(k) + "' alongside 'pattern' is not supported");
    if (!it->is_string()) return error(path, "'pattern' must be a string");
    RegexOptions options;
    options.search = true;
    options.json_string = true;
    auto expr = regex_to_gbnf_expression(it->get<std::string>(), options);
    if (!expr.ok()) return make_error(path + ".pattern: " + expr.error().message);
    return kQuote + " ( " + *expr + " ) " + kQuote;
  }
  VESPER_ASSIGN_OR_RETURN(std::optional<uint64_t> min, count_keyword(s, "minLength", path));
  VESPER_ASSIGN_OR_RETURN(std::optional<uint64_t> max, count_keyword(s, "maxLength", path));
  if (min && max && *min > *max)
    return error(path, "'minLength' " + std::to_string(*min) + " is above 'maxLength' " +
                           std::to_string(*max));
  if (auto it = s.find("format"); it != s.end()) {
    const std::string format = it->is_string() ? it->get<std::string>() : compact(*it);
    if (std::find(std::begin(kFormats), std::end(kFormats), format) == std::end(kFormats))
      return error(path, "'format' \"" + format + "\" is not supported");
    VESPER_ASSIGN_OR_RETURN(std::string contents, format_in_lengths(format, min, max, path));
    return kQuote + " " + contents + " " + kQuote;
  }
  if (!min.value_or(0) && !max) return use("string");
  return kQuote + " " + use("char") + repeat_suffix(min.value_or(0), max) + " " + kQuote;
}

Result<std::string> Converter::format_in_lengths(const std::string& format,
                                                 std::optional<uint64_t> min,
                                                 std::optional<uint64_t> max,
                                                 const std::string& path) {
  if (!min && !max) return use(format);
  const uint64_t lo = min.value_or(0), hi = max.value_or(UINT64_MAX);
  const std::string bounds = std::to_string(lo) + "-" + (max ? std::to_string(hi) : "up");
  const std::string key = format + "-" + bounds;
  if (auto it = bounded_formats_.find(key); it != bounded_formats_.end()) return it->second;
  // The format's rules as a grammar of their own: its bytes are the string's characters (every
  // format is ASCII without quotes or backslashes, spelled raw).
  std::vector<const SharedRule*> own;
  std::vector<std::string_view> pending = {format};
  while (!pending.empty()) {
    const std::string_view name = pending.back();
    pending.pop_back();
    for (const SharedRule& r : shared_rules()) {
      if (r.name != name) continue;
      if (std::find(own.begin(), own.end(), &r) != own.end()) break;
      own.push_back(&r);
      for (const char* dep : r.deps) pending.push_back(dep);
      break;
    }
  }
  std::string text = "root ::= " + format + "\n";
  for (const SharedRule* r : own) text += std::string(r->name) + " ::= " + r->body + "\n";
  Result<Grammar> g = parse_gbnf(text);
  VESPER_CHECK(g.ok(), "format %s: %s", format.c_str(), g.ok() ? "" : g.error().message.c_str());
  const auto [shortest, longest] = string_length_range(*g);
  if (lo <= shortest && hi >= longest) return bounded_formats_[key] = use(format);
  auto expansion = length_bounded_gbnf(
      *g, lo, hi, [&] { return unique_name(key + "-" + std::to_string(++bounded_rules_)); },
      [&](uint32_t r) -> std::optional<std::string> {
        // Rules 1.. are the shared rules, in the order the text defines them.
        if (r == 0 || r > own.size()) return std::nullopt;
        return use(g->rules[r].name);
      });
  if (!expansion) {
    std::string keywords;
    if (min) keywords = "'minLength' " + std::to_string(*min);
    if (max) keywords += (min ? " and 'maxLength' " : "'maxLength' ") + std::to_string(*max);
    return error(path, "'format' \"" + format + "\" with " + keywords + " leaves no string (\"" +
                           format + "\" strings have " + std::to_string(shortest) +
                           (shortest == longest ? "" : " to " + std::to_string(longest)) +
                           " characters)");
  }
  for (auto& rule : expansion->rules) rules_.push_back(std::move(rule));
  bounded_formats_.emplace(key, expansion->expression);
  return expansion->expression;
}

// --- numbers ---

Result<std::optional<Converter::RawBound>> Converter::tighter_bound(const Json& s,
                                                                    const std::string& path,
                                                                    bool lower) {
  const char* inclusive_kw = lower ? "minimum" : "maximum";
  const char* exclusive_kw = lower ? "exclusiveMinimum" : "exclusiveMaximum";
  std::optional<RawBound> out;
  auto inc = s.find(inclusive_kw);
  auto exc = s.find(exclusive_kw);
  if (inc != s.end()) {
    if (!inc->is_number())
      return error(path, "'" + std::string(inclusive_kw) + "' must be a number");
    out = RawBound{&*inc, false, inclusive_kw};
  }
  if (exc != s.end()) {
    if (exc->is_boolean()) {  // draft 4: a flag on minimum/maximum
      if (out && exc->get<bool>()) out->exclusive = true;
    } else if (exc->is_number()) {
      const double e = exc->get<double>();
      if (!out || (lower ? e >= out->value->get<double>() : e <= out->value->get<double>()))
        out = RawBound{&*exc, true, exclusive_kw};
    } else {
      return error(path, "'" + std::string(exclusive_kw) + "' must be a number");
    }
  }
  return out;
}

int64_t Converter::clamp_integer(const Json& v, bool lower) {
  constexpr int64_t kBeyond = kMaxMagnitude + 1;
  if (v.is_number_unsigned())
    return v.get<uint64_t>() > uint64_t{kBeyond} ? kBeyond : v.get<int64_t>();
  if (v.is_number_integer()) return std::clamp<int64_t>(v.get<int64_t>(), -kBeyond, kBeyond);
  double x = v.get<double>();
  x = lower ? std::ceil(x) : std::floor(x);
  if (x >= static_cast<double>(kBeyond)) return kBeyond;
  if (x <= -static_cast<double>(kBeyond)) return -kBeyond;
  return static_cast<int64_t>(x);
}

std::string Converter::int_range(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  if (hi >= 0) alts.push_back(uint_range(std::max<int64_t>(lo, 0), hi));
  if (lo <= 0 && std::max<int64_t>(0, -hi) <= -lo)
    alts.push_back("\"-\" " + uint_range(std::max<int64_t>(0, -hi), -lo));
  return alternatives(std::move(alts));
}

std::optional<std::string> Converter::magnitude_range(Bound lower, std::optional<Bound> upper) {
  const int64_t any_lo = lower.exclusive ? lower.value + 1 : lower.value;
  const int64_t any_hi = upper ? std::min(upper->value - 1, kMaxMagnitude) : kMaxMagnitude;
  std::vector<std::string> alts;
  if (any_lo <= any_hi)
    alts.push_back(uint_range(any_lo, any_hi) + R"gbnf( ( "." [0-9]{1,16} )?)gbnf");
  // Just above an exclusive lower bound: a fraction that is not zero.
  if (lower.exclusive && lower.value <= kMaxMagnitude && (!upper || lower.value < upper->value))
    alts.push_back(gbnf_literal(std::to_string(lower.value)) + " " + use("fraction-nonzero"));
  // At an inclusive upper bound: only zeros after the point.
  if (upper && !upper->exclusive && upper->value <= kMaxMagnitude &&
      (upper->value > lower.value || (upper->value == lower.value && !lower.exclusive)))
    alts.push_back(gbnf_literal(std::to_string(upper->value)) + R"gbnf( ( "." "0"{1,16} )?)gbnf");
  if (alts.empty()) return std::nullopt;
  return alternatives(std::move(alts));
}

Result<std::string> Converter::number_expr(const Json& s, const std::string& path, bool integer) {
  VESPER_ASSIGN_OR_RETURN(std::optional<RawBound> lower, tighter_bound(s, path, true));
  VESPER_ASSIGN_OR_RETURN(std::optional<RawBound> upper, tighter_bound(s, path, false));
  if (!lower && !upper) return use(integer ? "integer" : "number");
  std::string keywords;
  for (const auto& b : {lower, upper})
    if (b) keywords += std::string(keywords.empty() ? "'" : " and '") + b->keyword + "'";
  if (integer) {
    int64_t lo = -kMaxMagnitude, hi = kMaxMagnitude;
    if (lower) {
      lo = clamp_integer(*lower->value, true);
      if (lower->exclusive && integral(lower->value->get<double>())) ++lo;
      lo = std::max(lo, -kMaxMagnitude);
    }
    if (upper) {
      hi = clamp_integer(*upper->value, false);
      if (upper->exclusive && integral(upper->value->get<double>())) --hi;
      hi = std::min(hi, kMaxMagnitude);
    }
    if (lo > hi) return error(path, keywords + " leave no integer of at most 16 digits");
    return int_range(lo, hi);
  }
  for (const auto& b : {lower, upper})
    if (b && !integral(b->value->get<double>()))
      return error(path, "'" + std::string(b->keyword) + "' " + compact(*b->value) +
                             " on a number is not supported (only integer bounds)");
  std::optional<Bound> lo, hi;
  if (lower) lo = Bound{clamp_integer(*lower->value, true), lower->exclusive};
  if (upper) hi = Bound{clamp_integer(*upper->value, false), upper->exclusive};
  if (lo && lo->value < -kMaxMagnitude) lo.reset();  // below every 16-digit number
  if (hi && hi->value > kMaxMagnitude) hi.reset();
  std::vector<std::string> alts;
  // Non-negative texts: the value is the magnitude.
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    Bound m_lo{0, false};
    if (lo && lo->value >= 0) m_lo = *lo;
    if (auto e = magnitude_range(m_lo, hi)) alts.push_back(*e);
  }
  // Texts with a minus sign: the value is minus the magnitude (-0 is 0).
  if (!lo || lo->value < 0 || (lo->value == 0 && !lo->exclusive)) {
    std::optional<Bound> m_hi;
    if (lo) m_hi = Bound{-lo->value, lo->exclusive};
    Bound m_lo{0, false};
    if (hi && hi->value <= 0) m_lo = Bound{-hi->value, hi->exclusive};
    if (auto e = magnitude_range(m_lo, m_hi)) alts.push_back("\"-\" " + *e);
  }
  if (alts.empty()) return error(path, keywords + " leave no number");
  return alternatives(std::move(alts));
}

}  // namespace vesper::grammar::json_schema_detail
