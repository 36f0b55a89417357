#include "tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/text.h"

namespace vesper::tokenizer::jinja {

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string source, const LexerOptions& options)
      : src_(std::move(source)), options_(options) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    const size_t n = src_.size();
    size_t pos = 0;
    bool line_starting = true;
    bool strip_next = false;
    while (pos < n) {
      if (strip_next) {
        const size_t start = pos;
        while (pos < n && is_ws(src_[pos])) ++pos;
        if (pos > start) line_starting = src_[pos - 1] == '\n';
        strip_next = false;
        if (pos >= n) break;
      }
      const size_t tag = find_tag_start(pos);
      std::string text = src_.substr(pos, (tag == std::string::npos ? n : tag) - pos);
      if (tag == std::string::npos) {
        emit_text(std::move(text), pos);
        break;
      }
      const char kind = src_[tag + 1];
      const char mod = tag + 2 < n ? src_[tag + 2] : '\0';
      if (mod == '-') {
        size_t e = text.size();
        while (e > 0 && is_ws(text[e - 1])) --e;
        text.resize(e);
      } else if (mod != '+' && kind != '{' && options_.lstrip_blocks) {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool all_ws = l_pos < text.size();
          for (size_t i = l_pos; i < text.size(); ++i) all_ws = all_ws && is_ws(text[i]);
          if (all_ws) text.resize(l_pos);
        }
      }
      emit_text(std::move(text), pos);
      const size_t open_len = (mod == '-' || mod == '+') ? 3 : 2;

      if (kind == '#') {
        const size_t end = src_.find("#}", tag + open_len);
        if (end == std::string::npos) syntax_error("unterminated comment", tag);
        pos = end + 2;
        finish_tag(src_[end - 1], true, &pos, &strip_next);
        line_starting = src_[pos - 1] == '\n';
        continue;
      }
      if (kind == '%') {
        size_t body_start;
        if (match_raw_begin(tag, &body_start)) {
          pos = lex_raw(tag, body_start);
          line_starting = src_[pos - 1] == '\n';
          continue;
        }
      }
      const bool is_block = kind == '%';
      push(is_block ? TokenType::kBlockBegin : TokenType::kVariableBegin, "", tag);
      pos = lex_tag_body(tag + open_len, is_block, tag, &strip_next);
      line_starting = src_[pos - 1] == '\n';
    }
    push(TokenType::kEof, "", n);
    return std::move(tokens_);
  }

 private:
  size_t find_tag_start(size_t from) const {
    size_t p = from;
    while ((p = src_.find('{', p)) != std::string::npos) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) {
        return p;
      }
      ++p;
    }
    return std::string::npos;
  }

  // Whitespace control after a tag ends at *pos (just past the closing delimiter); `mod` is
  // the character before the delimiter.
  void finish_tag(char mod, bool trims, size_t* pos, bool* strip_next) const {
    if (mod == '-') {
      *strip_next = true;
    } else if (mod != '+' && trims && options_.trim_blocks && *pos < src_.size() &&
               src_[*pos] == '\n') {
      ++*pos;
    }
  }

  // Lexes expression tokens from `p` to the closing delimiter; returns the offset after it.
  size_t lex_tag_body(size_t p, bool is_block, size_t tag_start, bool* strip_next) {
    const size_t n = src_.size();
    int depth = 0;
    while (true) {
      while (p < n && is_ws(src_[p])) ++p;
      if (p >= n) syntax_error(is_block ? "unterminated block tag '{%'" : "unterminated '{{'", tag_start);
      if (depth == 0) {
        const char* close = is_block ? "%}" : "}}";
        size_t close_at = std::string::npos;
        char mod = '\0';
        if ((src_[p] == '-' || (is_block && src_[p] == '+')) && src_.compare(p + 1, 2, close) == 0) {
          mod = src_[p];
          close_at = p + 1;
        } else if (src_.compare(p, 2, close) == 0) {
          close_at = p;
        }
        if (close_at != std::string::npos) {
          push(is_block ? TokenType::kBlockEnd : TokenType::kVariableEnd, "", p);
          size_t pos = close_at + 2;
          finish_tag(mod, is_block, &pos, strip_next);
          return pos;
        }
      }
      const char c = src_[p];
      const bool after_dot =
          tokens_.back().type == TokenType::kOperator && tokens_.back().value == ".";
      if (is_name_start(c)) {
        size_t e = p;
        while (e < n && is_name_char(src_[e])) ++e;
        push(TokenType::kName, src_.substr(p, e - p), p);
        p = e;
      } else if (is_digit(c)) {
        p = lex_number(p, after_dot);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* const kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* two : kTwo) {
          if (src_.compare(p, 2, two) == 0) op = two;
        }
        if (op.empty()) {
          if (std::string_view("+-*/%~<>=.,:|()[]{}").find(c) == std::string_view::npos) {
            syntax_error(std::string("unexpected character '") + c + "'", p);
          }
          op = std::string(1, c);
          if (c == '(' || c == '[' || c == '{') ++depth;
          if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        }
        push(TokenType::kOperator, op, p);
        p += op.size();
      }
    }
  }

  size_t lex_number(size_t p, bool after_dot) {
    const size_t n = src_.size();
    size_t e = p;
    auto digits = [&](size_t q) {
      while (q < n && (is_digit(src_[q]) || (src_[q] == '_' && q + 1 < n && is_digit(src_[q + 1])))) ++q;
      return q;
    };
    e = digits(e);
    bool is_float = false;
    if (!after_dot && e + 1 < n && src_[e] == '.' && is_digit(src_[e + 1])) {
      is_float = true;
      e = digits(e + 1);
    }
    if (!after_dot && e < n && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < n && is_digit(src_[q])) {
        is_float = true;
        e = digits(q);
      }
    }
    std::string spelled;
    for (size_t i = p; i < e; ++i) {
      if (src_[i] != '_') spelled.push_back(src_[i]);
    }
    Token& tok = push(is_float ? TokenType::kFloat : TokenType::kInteger, spelled, p);
    if (is_float) {
      tok.float_value = std::strtod(spelled.c_str(), nullptr);
    } else {
      errno = 0;
      const long long v = std::strtoll(spelled.c_str(), nullptr, 10);
      if (errno == ERANGE) syntax_error("integer literal too large: " + spelled, p);
      tok.int_value = v;
    }
    return e;
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // A string literal decoded like Python's "unicode-escape" (what Jinja2 does).
  size_t lex_string(size_t p) {
    const size_t n = src_.size();
    const char quote = src_[p];
    std::string value;
    size_t q = p + 1;
    while (true) {
      if (q >= n) syntax_error("unterminated string literal", p);
      const char c = src_[q];
      if (c == quote) break;
      if (c != '\\') {
        value.push_back(c);
        ++q;
        continue;
      }
      if (q + 1 >= n) syntax_error("unterminated string literal", p);
      const char e = src_[q + 1];
      q += 2;
      switch (e) {
        case '\n': break;
        case '\\': value.push_back('\\'); break;
        case '\'': value.push_back('\''); break;
        case '"': value.push_back('"'); break;
        case 'a': value.push_back('\a'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'n': value.push_back('\n'); break;
        case 'r': value.push_back('\r'); break;
        case 't': value.push_back('\t'); break;
        case 'v': value.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          const int digits = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          uint32_t cp = 0;
          for (int i = 0; i < digits; ++i) {
            const int h = q < n ? hex_value(src_[q]) : -1;
            if (h < 0) syntax_error(std::string("truncated \\") + e + " escape in string literal", p);
            cp = cp * 16 + static_cast<uint32_t>(h);
            ++q;
          }
          if (cp > 0x10FFFF) syntax_error("invalid \\U escape in string literal", p);
          text::append_codepoint(cp, &value);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && q < n && src_[q] >= '0' && src_[q] <= '7'; ++i, ++q) {
              cp = cp * 8 + static_cast<uint32_t>(src_[q] - '0');
            }
            text::append_codepoint(cp, &value);
          } else {
            value.push_back('\\');
            value.push_back(e);
          }
      }
    }
    push(TokenType::kString, std::move(value), p);
    return q + 1;
  }

  // {%[-+]? raw [-]?%} at `tag`; sets *body_start past it.
  bool match_raw_begin(size_t tag, size_t* body_start) {
    size_t p = tag + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (p < src_.size() && is_ws(src_[p])) ++p;
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      return false;
    }
    *body_start = p;
    return true;
  }

  // Emits the raw body as text; returns the offset after {% endraw %}.
  size_t lex_raw(size_t tag, size_t body_start) {
    size_t search = body_start;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) syntax_error("missing '{% endraw %}' for '{% raw %}'", tag);
      size_t p = open + 2;
      const bool minus = p < src_.size() && src_[p] == '-';
      const bool plus = p < src_.size() && src_[p] == '+';
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
      while (p < src_.size() && is_ws(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      p += 6;
      while (p < src_.size() && is_ws(src_[p])) ++p;
      char mod = '\0';
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) mod = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) syntax_error("malformed '{% endraw %}'", open);
      std::string body = src_.substr(body_start, open - body_start);
      if (minus) {
        while (!body.empty() && is_ws(body.back())) body.pop_back();
      } else if (!plus && options_.lstrip_blocks) {
        // {% endraw %} takes lstrip_blocks like any block tag.
        const size_t nl = body.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        const bool line_start = l_pos > 0 || (body_start > 0 && src_[body_start - 1] == '\n');
        bool all_ws = l_pos < body.size();
        for (size_t i = l_pos; i < body.size(); ++i) all_ws = all_ws && is_ws(body[i]);
        if (line_start && all_ws) body.resize(l_pos);
      }
      emit_text(std::move(body), body_start);
      size_t pos = p + 2;
      if (mod == '-') {
        while (pos < src_.size() && is_ws(src_[pos])) ++pos;
      } else if (mod != '+' && options_.trim_blocks && pos < src_.size() && src_[pos] == '\n') {
        ++pos;
      }
      return pos;
    }
  }

  void emit_text(std::string text, size_t offset) {
    if (!text.empty()) push(TokenType::kText, std::move(text), offset);
  }

  Token& push(TokenType type, std::string value, size_t offset) {
    Token tok;
    tok.type = type;
    tok.value = std::move(value);
    locate(offset, &tok.line, &tok.column);
    tokens_.push_back(std::move(tok));
    return tokens_.back();
  }

  void locate(size_t offset, int* line, int* column) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t index = static_cast<size_t>(it - line_starts_.begin()) - 1;
    *line = static_cast<int>(index) + 1;
    *column = static_cast<int>(offset - line_starts_[index]) + 1;
  }

  [[noreturn]] void syntax_error(const std::string& message, size_t offset) const {
    int line;
    int column;
    locate(offset, &line, &column);
    throw TemplateError(TemplateError::Kind::kSyntax, message, line, column);
  }

  std::string src_;
  LexerOptions options_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options) {
  std::string src = normalize_newlines(source);
  if (!options.keep_trailing_newline && !src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src), options).run();
}

}  // namespace vesper::tokenizer::jinja
