// The error the engine raises internally. It never leaves the engine: Template::parse and
// Template::render catch it and return a Result error (see template.h).
#pragma once

#include <exception>
#include <string>
#include <utility>

namespace vesper::tokenizer::jinja {

class TemplateError : public std::exception {
 public:
  enum class Kind {
    kSyntax,   // the template text does not parse
    kRuntime,  // evaluation failed (type errors, undefined calls, limits)
    kRaised,   // the template called raise_exception(message)
  };

  TemplateError(Kind kind, std::string message, int line = 0, int column = 0)
      : kind_(kind), message_(std::move(message)), line_(line), column_(column) {}

  Kind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  int line() const { return line_; }
  int column() const { return column_; }
  void set_location(int line, int column) {
    line_ = line;
    column_ = column;
  }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  Kind kind_;
  std::string message_;
  int line_;
  int column_;
};

[[noreturn]] inline void fail(std::string message) {
  throw TemplateError(TemplateError::Kind::kRuntime, std::move(message));
}

}  // namespace vesper::tokenizer::jinja
