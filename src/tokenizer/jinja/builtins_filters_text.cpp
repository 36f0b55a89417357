// Filters that make or reshape text: case (lower, upper, title, capitalize), layout (center,
// indent, trim, truncate), replace, wordcount, printf-style format, and the ones that turn any
// value into a string (string, pprint, tojson, safe, escape). Like Jinja's, they stringify
// whatever they get (`1.5|indent` works).
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/text.h"

namespace vesper::tokenizer::jinja::builtins {

namespace {

Value f_capitalize(Interpreter&, const Value& v, CallArgs&) {
  return text::capitalize(v.to_str());
}

Value f_center(Interpreter& in, const Value& v, CallArgs& a) {
  const std::string s = v.to_str();
  const int64_t width = int_arg(a, 0, "width", 80);
  const int64_t len = static_cast<int64_t>(text::length(s));
  if (width <= len) return s;
  in.check_size(static_cast<size_t>(width));
  const int64_t marg = width - len;
  const int64_t left = marg / 2 + (marg & width & 1);
  return std::string(static_cast<size_t>(left), ' ') + s +
         std::string(static_cast<size_t>(marg - left), ' ');
}

Value f_escape(Interpreter&, const Value& v, CallArgs&) {
  return v.is_markup() ? v : Value::markup(text::html_escape(v.to_str()));
}

Value f_format(Interpreter& in, const Value& v, CallArgs& a) {
  std::string s = printf_format(v.to_str(), a.positional);
  in.check_size(s.size());
  return s;
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  const Value* w = a.get(0, "width");
  std::string indentation = "    ";
  if (w != nullptr && w->is_string())
    indentation = w->as_string();
  else if (!absent(w))
    indentation =
        std::string(static_cast<size_t>(std::max<int64_t>(0, to_int64(*w, "indent width"))), ' ');
  const bool first = bool_arg(a, 1, "first", false);
  const bool blank = bool_arg(a, 2, "blank", false);
  const std::string s = v.to_str() + "\n";
  const auto lines = text::splitlines(s);
  in.check_size(s.size() + lines.size() * indentation.size());
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (blank || !lines[i].empty()) out += indentation;
    }
    out += lines[i];
  }
  if (first) out = indentation + out;
  return out;
}

Value f_lower(Interpreter&, const Value& v, CallArgs&) {
  return text::lower(v.to_str());
}
Value f_upper(Interpreter&, const Value& v, CallArgs&) {
  return text::upper(v.to_str());
}

Value f_pprint(Interpreter&, const Value& v, CallArgs&) {
  return v.repr();
}

Value f_safe(Interpreter&, const Value& v, CallArgs&) {
  return Value::markup(v.to_str());
}

Value f_string(Interpreter&, const Value& v, CallArgs&) {
  return v.is_markup() ? v : Value(v.to_str());
}

Value f_title(Interpreter&, const Value& v, CallArgs&) {
  return text::jinja_title(v.to_str());
}

Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  const Value* indent_v = a.get(0, "indent");
  const int indent =
      absent(indent_v)
          ? -1
          : static_cast<int>(std::clamp<int64_t>(to_int64(*indent_v, "indent"), 0, 64));
  const bool ensure_ascii = bool_arg(a, 1, "ensure_ascii", false);
  const bool sort_keys = bool_arg(a, 3, "sort_keys", false);
  std::string item_sep = indent < 0 ? ", " : ",";
  std::string key_sep = ": ";
  const Value* seps = a.get(2, "separators");
  if (!absent(seps)) {
    if (!seps->is_list() || seps->as_list().size() != 2)
      fail("tojson(): separators must be a pair");
    item_sep = seps->as_list()[0].to_str();
    key_sep = seps->as_list()[1].to_str();
  }
  std::string out = to_json(v, indent, sort_keys, ensure_ascii, item_sep, key_sep);
  in.check_size(out.size());
  return out;
}

Value f_trim(Interpreter&, const Value& v, CallArgs& a) {
  const Value* chars = a.get(0, "chars");
  if (absent(chars)) return text::strip(v.to_str(), nullptr, true, true);
  const std::string c = chars->to_str();
  return text::strip(v.to_str(), &c, true, true);
}

Value f_truncate(Interpreter&, const Value& v, CallArgs& a) {
  const std::string s = v.to_str();
  const int64_t length = int_arg(a, 0, "length", 255);
  const bool killwords = bool_arg(a, 1, "killwords", false);
  const std::string end = str_arg(a, 2, "end", "...");
  const int64_t leeway = int_arg(a, 3, "leeway", 5);
  const auto cps = text::decode(s);
  const int64_t n = static_cast<int64_t>(cps.size());
  if (n <= length + leeway) return s;
  const int64_t keep = std::max<int64_t>(0, length - static_cast<int64_t>(text::length(end)));
  std::string head = text::encode(cps.data(), cps.data() + keep);
  if (killwords) return head + end;
  const size_t space = head.rfind(' ');
  if (space != std::string::npos) head.resize(space);
  return head + end;
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (const uint32_t cp : text::decode(v.to_str())) {
    const bool w = text::is_alpha(cp) || text::is_digit(cp) || cp == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return n;
}

}  // namespace

// Also str.replace (builtins_methods.cpp).
Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  const std::string s = v.to_str();
  const std::string from = require_arg(a, 0, "old", "replace").to_str();
  const std::string to = require_arg(a, 1, "new", "replace").to_str();
  const int64_t count = int_arg(a, 2, "count", -1);
  const int64_t n = from.empty() ? static_cast<int64_t>(text::length(s)) + 1 : text::count(s, from);
  const int64_t done = count < 0 ? n : std::min(n, count);
  if (to.size() > from.size())
    in.check_size(s.size() + static_cast<size_t>(done) * (to.size() - from.size()));
  return text::replace(s, from, to, count);
}

std::span<const NamedFilter> text_filters() {
  // clang-format off
  static constexpr NamedFilter kTable[] = {
      // case
      {"lower", f_lower}, {"upper", f_upper}, {"title", f_title}, {"capitalize", f_capitalize},
      // layout and content
      {"center", f_center}, {"indent", f_indent}, {"trim", f_trim}, {"truncate", f_truncate},
      {"replace", f_replace}, {"wordcount", f_wordcount}, {"format", f_format},
      // any value to a string
      {"string", f_string}, {"pprint", f_pprint}, {"tojson", f_tojson},
      {"safe", f_safe}, {"e", f_escape}, {"escape", f_escape}, {"forceescape", f_escape},
  };
  // clang-format on
  return kTable;
}

}  // namespace vesper::tokenizer::jinja::builtins
