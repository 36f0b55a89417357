// Python's two string formatting languages: `format % args` (printf style; the |format filter
// and the % operator) and str.format(*args, **kwargs) with format specs (the str.format
// method). One file because both share the padding and number conversion below.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/text.h"

namespace vesper::tokenizer::jinja::builtins {

namespace {

std::string pad(std::string s, size_t width, char align, const std::string& fill) {
  const size_t len = text::length(s);
  if (len >= width) return s;
  const size_t total = width - len;
  size_t left = 0;
  if (align == '>') left = total;
  if (align == '^') left = total / 2;
  std::string out;
  for (size_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (size_t i = 0; i < total - left; ++i) out += fill;
  return out;
}

std::string format_number_c(const char* spec, const Value& v, char conv) {
  char buf[512];
  if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o' || conv == 'c') {
    const long long n = static_cast<long long>(to_int64(v, "%d format"));
    std::string f = std::string(spec) + (conv == 'i' ? 'd' : conv);
    if (conv == 'c') {
      std::string out;
      text::append_codepoint(static_cast<uint32_t>(n), &out);
      return out;
    }
    std::string fl = f;
    fl.insert(fl.size() - 1, "ll");
    std::snprintf(buf, sizeof(buf), fl.c_str(), n);
    return buf;
  }
  if (!v.is_number() && !v.is_bool()) fail("a number is required, not " + v.type_name());
  std::string f = std::string(spec) + conv;
  std::snprintf(buf, sizeof(buf), f.c_str(), v.to_double());
  return buf;
}

// One replacement field of str.format with its spec ("<10", ".2f", "d", ...).
std::string apply_format_spec(const Value& v, std::string_view spec) {
  if (spec.empty()) return v.to_str();
  size_t i = 0;
  std::string fill = " ";
  char align = '\0';
  if (spec.size() >= 2 && std::string_view("<>^").find(spec[1]) != std::string_view::npos) {
    fill = std::string(1, spec[0]);
    align = spec[1];
    i = 2;
  } else if (std::string_view("<>^").find(spec[0]) != std::string_view::npos) {
    align = spec[0];
    i = 1;
  }
  std::string flags;
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) flags += spec[i++];
  if (i < spec.size() && spec[i] == '0') {
    flags += '0';
    ++i;
  }
  size_t width = 0;
  while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i])))
    width = width * 10 + static_cast<size_t>(spec[i++] - '0');
  int precision = -1;
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    precision = 0;
    while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i])))
      precision = precision * 10 + (spec[i++] - '0');
  }
  char type = i < spec.size() ? spec[i++] : '\0';
  if (i != spec.size()) fail("invalid format specifier '" + std::string(spec) + "'");
  std::string body;
  const bool numeric = v.is_number() || v.is_bool();
  if (type == '\0' && numeric && precision >= 0) type = 'g';
  if (type == '\0' || type == 's') {
    body = v.to_str();
    if (precision >= 0) {
      const auto cps = text::decode(body);
      if (static_cast<size_t>(precision) < cps.size())
        body = text::encode(cps.data(), cps.data() + precision);
    }
  } else if (type == '%') {
    Value scaled(v.to_double() * 100.0);
    body = format_number_c(("%" + flags.substr(0, flags.find('0')) + "." +
                            std::to_string(precision < 0 ? 6 : precision))
                               .c_str(),
                           scaled, 'f') +
           "%";
  } else {
    std::string c = "%" + flags.substr(0, flags.find('0'));
    if (precision >= 0 && std::string_view("eEfFgG").find(type) != std::string_view::npos)
      c += "." + std::to_string(precision);
    body = format_number_c(c.c_str(), v, type == 'n' ? 'd' : type);
  }
  if (align == '\0') {
    align = numeric && type != 's' ? '>' : '<';
    if (flags.find('0') != std::string::npos && numeric) fill = "0";
  }
  return pad(body, width, align, fill);
}

}  // namespace

// Python's `format % args`.
std::string printf_format(const std::string& format, const ValueList& args) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '%') {
      out.push_back('%');
      ++i;
      continue;
    }
    size_t j = i + 1;
    std::string spec = "%";
    while (j < format.size() && std::string_view("-+ 0#").find(format[j]) != std::string_view::npos)
      spec += format[j++];
    while (j < format.size() && std::isdigit(static_cast<unsigned char>(format[j])))
      spec += format[j++];
    if (j < format.size() && format[j] == '.') {
      spec += format[j++];
      while (j < format.size() && std::isdigit(static_cast<unsigned char>(format[j])))
        spec += format[j++];
    }
    if (j >= format.size()) fail("incomplete format");
    const char conv = format[j];
    if (next >= args.size()) fail("not enough arguments for format string");
    const Value& arg = args[next++];
    if (conv == 's' || conv == 'r' || conv == 'a') {
      std::string s = conv == 's' ? arg.to_str() : arg.repr();
      // width and precision for strings, by code point
      std::string width_s;
      std::string prec_s;
      bool left = false;
      size_t k = 1;
      while (k < spec.size() && std::string_view("-+ 0#").find(spec[k]) != std::string_view::npos)
        left |= spec[k++] == '-';
      while (k < spec.size() && std::isdigit(static_cast<unsigned char>(spec[k])))
        width_s += spec[k++];
      if (k < spec.size() && spec[k] == '.') {
        ++k;
        while (k < spec.size()) prec_s += spec[k++];
        const auto cps = text::decode(s);
        const size_t prec = static_cast<size_t>(std::atoi(prec_s.c_str()));
        if (prec < cps.size()) s = text::encode(cps.data(), cps.data() + prec);
      }
      if (!width_s.empty())
        s = pad(s, static_cast<size_t>(std::atoi(width_s.c_str())), left ? '<' : '>', " ");
      out += s;
    } else if (std::string_view("diouxXeEfFgGc").find(conv) != std::string_view::npos) {
      out += format_number_c(spec.c_str(), arg, conv);
    } else {
      fail(std::string("unsupported format character '") + conv + "'");
    }
    i = j;
  }
  if (next < args.size()) fail("not all arguments converted during string formatting");
  return out;
}

// Python's str.format(*args, **kwargs) for {}, {0}, {name} fields with optional specs.
std::string python_format(const std::string& format, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') ++i;
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) fail("single '{' encountered in format string");
    std::string field = format.substr(i + 1, close - i - 1);
    std::string spec;
    const size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    if (!field.empty() && field.back() == 'r' && field.size() >= 2 &&
        field[field.size() - 2] == '!')
      field.resize(field.size() - 2);
    const Value* v;
    if (field.empty()) {
      v = auto_index < a.positional.size() ? &a.positional[auto_index] : nullptr;
      ++auto_index;
    } else if (std::all_of(field.begin(), field.end(),
                           [](char d) { return std::isdigit(static_cast<unsigned char>(d)); })) {
      const size_t idx = static_cast<size_t>(std::atoi(field.c_str()));
      v = idx < a.positional.size() ? &a.positional[idx] : nullptr;
    } else {
      v = a.get_keyword(field);
    }
    if (v == nullptr) fail("format(): no argument for field '{" + field + "}'");
    out += apply_format_spec(*v, spec);
    i = close;
  }
  return out;
}

}  // namespace vesper::tokenizer::jinja::builtins
