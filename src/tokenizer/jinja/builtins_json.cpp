// The |tojson filter's serializer: Python's json.dumps over template values, with HF's
// defaults (see to_json in builtins.h). Kept apart from the filter itself, which only reads
// the arguments (builtins_filters_text.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/text.h"

namespace vesper::tokenizer::jinja {

namespace {

void json_string(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (const uint32_t cp : text::decode(s)) {
    switch (cp) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default: {
        char buf[16];
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
          if (cp >= 0x10000) {
            const uint32_t v = cp - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                          0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
          }
          *out += buf;
        } else {
          text::append_codepoint(cp, out);
        }
      }
    }
  }
  out->push_back('"');
}

struct JsonWriter {
  int indent;
  bool sort_keys;
  bool ensure_ascii;
  std::string_view item_sep;
  std::string_view key_sep;
  std::string out;

  void newline(int level) {
    if (indent < 0) return;
    out.push_back('\n');
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
  }

  std::string key_string(const Value& k) {
    switch (k.kind()) {
      case ValueKind::kString:
        return k.as_string();
      case ValueKind::kInt:
        return std::to_string(k.as_int());
      case ValueKind::kFloat:
        return format_python_float(k.as_float());
      case ValueKind::kBool:
        return k.as_bool() ? "true" : "false";
      case ValueKind::kNone:
        return "null";
      default:
        fail("keys must be str, int, float, bool or None, not " + k.type_name());
    }
  }

  void write(const Value& v, int level) {
    if (level > 256) fail("tojson: value nests too deeply (circular reference?)");
    switch (v.kind()) {
      case ValueKind::kNone:
        out += "null";
        return;
      case ValueKind::kBool:
        out += v.as_bool() ? "true" : "false";
        return;
      case ValueKind::kInt:
        out += std::to_string(v.as_int());
        return;
      case ValueKind::kFloat: {
        const double d = v.as_float();
        if (std::isnan(d))
          out += "NaN";
        else if (std::isinf(d))
          out += d > 0 ? "Infinity" : "-Infinity";
        else
          out += format_python_float(d);
        return;
      }
      case ValueKind::kString:
        json_string(v.as_string(), ensure_ascii, &out);
        return;
      case ValueKind::kList: {
        const auto& items = v.as_list();
        if (items.empty()) {
          out += "[]";
          return;
        }
        out.push_back('[');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) out += item_sep;
          newline(level + 1);
          write(items[i], level + 1);
        }
        newline(level);
        out.push_back(']');
        return;
      }
      case ValueKind::kDict: {
        if (v.is_namespace()) fail("Object of type Namespace is not JSON serializable");
        std::vector<std::pair<std::string, const Value*>> entries;
        for (const auto& [k, val] : v.as_dict().entries) entries.emplace_back(key_string(k), &val);
        if (sort_keys) {
          std::stable_sort(entries.begin(), entries.end(),
                           [](const auto& x, const auto& y) { return x.first < y.first; });
        }
        if (entries.empty()) {
          out += "{}";
          return;
        }
        out.push_back('{');
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i > 0) out += item_sep;
          newline(level + 1);
          json_string(entries[i].first, ensure_ascii, &out);
          out += key_sep;
          write(*entries[i].second, level + 1);
        }
        newline(level);
        out.push_back('}');
        return;
      }
      case ValueKind::kUndefined:
        fail("Object of type Undefined is not JSON serializable");
      case ValueKind::kFunction:
        fail("Object of type function is not JSON serializable");
    }
  }
};

}  // namespace

std::string to_json(const Value& value, int indent, bool sort_keys, bool ensure_ascii,
                    std::string_view item_separator, std::string_view key_separator) {
  JsonWriter w{indent, sort_keys, ensure_ascii, item_separator, key_separator, {}};
  w.write(value, 0);
  return std::move(w.out);
}

}  // namespace vesper::tokenizer::jinja
