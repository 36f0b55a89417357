// The name tables behind has_filter / apply_filter / has_test / apply_test (builtins.h): the
// filters gathered from the three filter files and the tests from builtins_is_tests.cpp,
// each built once into a map. Only lookup lives here; each filter and test lives in its file.
#include <functional>
#include <initializer_list>
#include <map>
#include <span>
#include <string>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/error.h"

namespace vesper::tokenizer::jinja {

namespace {

using FilterTable = std::map<std::string, builtins::FilterFn, std::less<>>;
using TestTable = std::map<std::string, builtins::TestFn, std::less<>>;

const FilterTable& filters() {
  static const FilterTable table = [] {
    FilterTable t;
    for (const auto part :
         {builtins::text_filters(), builtins::collection_filters(), builtins::value_filters()}) {
      for (const auto& [name, fn] : part) t.emplace(name, fn);
    }
    return t;
  }();
  return table;
}

const TestTable& tests() {
  static const TestTable table = [] {
    TestTable t;
    for (const auto& [name, fn] : builtins::is_tests()) t.emplace(name, fn);
    return t;
  }();
  return table;
}

}  // namespace

bool has_filter(std::string_view name) {
  return filters().count(name) != 0;
}
bool has_test(std::string_view name) {
  return tests().count(name) != 0;
}

Value apply_filter(Interpreter& in, std::string_view name, const Value& input, CallArgs& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) fail("no filter named '" + std::string(name) + "'");
  return it->second(in, input, args);
}

bool apply_test(Interpreter& in, std::string_view name, const Value& input, CallArgs& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) fail("no test named '" + std::string(name) + "'");
  return it->second(in, input, args);
}

}  // namespace vesper::tokenizer::jinja
