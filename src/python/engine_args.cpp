#include "python/engine_args.h"

#include <algorithm>
#include <cstdio>
#include <regex>

#include "cli/engine_flags.h"
#include "python/py_fields.h"

namespace vesper::python {
namespace {

// The engine's flags, registered as `vesper generate` registers them; no --help, which as a
// keyword would only print usage.
struct FlagParser {
  CLI::App app{"vesper engine arguments"};
  cli::EngineFlags flags;
  FlagParser() {
    app.set_help_flag();
    cli::add_engine_flags(&app, flags);
  }
};

std::string dashed(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

// A CLI or config message with each "--some-flag" written as the keyword "some_flag".
std::string with_keyword_names(const std::string& message) {
  static const std::regex kFlag("--([a-z0-9][a-z0-9-]*)");
  std::string out;
  auto it = std::sregex_iterator(message.begin(), message.end(), kFlag);
  size_t last = 0;
  for (; it != std::sregex_iterator(); ++it) {
    std::string name = (*it)[1].str();
    std::replace(name.begin(), name.end(), '-', '_');
    out += message.substr(last, static_cast<size_t>(it->position()) - last) + name;
    last = static_cast<size_t>(it->position() + it->length());
  }
  return out + message.substr(last);
}

// One value as the flag's text. `type` is CLI11's type name ("INT", "FLOAT", "TEXT", ...).
std::string value_text(py::handle v, const std::string& type, const std::string& name) {
  if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0)
    return std::to_string(to_int(v, name));
  if (type.rfind("FLOAT", 0) == 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", to_float(v, name));
    return buf;
  }
  // Text flags: a size may be given in bytes (kv_cache_memory=2**30), and a JSON-valued flag as
  // the dict or list it stands for.
  if (PyUnicode_Check(v.ptr())) return to_str(v, name);
  if (PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr())) return std::to_string(to_int(v, name));
  if (py::isinstance<py::dict>(v) || py::isinstance<py::list>(v)) return to_json(v, name).dump();
  throw py::type_error(name + " must be a str, got " + type_name(v));
}

}  // namespace

engine::EngineConfig engine_config_from_kwargs(const std::string& model, const py::dict& kwargs) {
  FlagParser p;
  std::vector<std::string> args = {model};
  for (auto [k, v] : kwargs) {
    const std::string key = to_str(k, "an engine argument's name");
    const std::string flag = "--" + dashed(key);
    CLI::Option* opt = p.app.get_option_no_throw(flag);
    if (opt == nullptr || key.find('-') != std::string::npos)
      throw py::type_error("unexpected engine argument '" + key +
                           "'; see vesper.ENGINE_ARGS for the accepted ones");
    if (v.is_none()) continue;
    if (opt->get_expected_max() == 0) {  // a flag: it takes no value
      if (to_bool(v, key)) {
        args.push_back(flag);
      } else if (p.app.get_option_no_throw("--no-" + dashed(key)) != nullptr) {
        args.push_back("--no-" + dashed(key));  // e.g. async_scheduling=False: off, not auto
      } else {
        args.push_back(flag + "=false");
      }
      continue;
    }
    const std::string type = opt->get_type_name();
    const bool repeatable = opt->get_expected_max() > 1;
    if (!repeatable || PyUnicode_Check(v.ptr()) || py::isinstance<py::dict>(v)) {
      if (py::isinstance<py::tuple>(v) ||
          (!repeatable && py::isinstance<py::list>(v) && type.rfind("TEXT", 0) != 0))
        throw py::type_error(key + " takes one value, got " + type_name(v));
      args.push_back(flag);
      args.push_back(value_text(v, type, key));
      continue;
    }
    if (!py::isinstance<py::list>(v) && !py::isinstance<py::tuple>(v))
      throw py::type_error(key + " must be a list, got " + type_name(v));
    const py::sequence items = py::reinterpret_borrow<py::sequence>(v);
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string where = key + "[" + std::to_string(i) + "]";
      args.push_back(flag);
      if (opt->get_type_size() > 1) {  // lora_scaled: (path, scale) pairs
        if (!py::isinstance<py::tuple>(items[i]) && !py::isinstance<py::list>(items[i]))
          throw py::type_error(where + " must be a (path, scale) pair, got " + type_name(items[i]));
        const py::sequence pair = py::reinterpret_borrow<py::sequence>(items[i]);
        if (static_cast<int>(pair.size()) != opt->get_type_size())
          throw py::value_error(where + " must be a (path, scale) pair");
        args.push_back(to_str(pair[0], where + "[0]"));
        args.push_back(value_text(pair[1], "FLOAT", where + "[1]"));
      } else {
        args.push_back(value_text(items[i], "TEXT", where));
      }
    }
  }
  std::reverse(args.begin(), args.end());  // CLI11's parse(vector) takes the arguments reversed
  try {
    p.app.parse(std::move(args));
  } catch (const CLI::ParseError& e) {
    throw py::value_error(with_keyword_names(e.what()));
  }
  auto config = cli::to_engine_config(p.flags);
  if (!config) throw py::value_error(with_keyword_names(config.error().message));
  return std::move(config).value();
}

std::unique_ptr<engine::Engine> create_engine(const std::string& model, const py::dict& kwargs) {
  const engine::EngineConfig config = engine_config_from_kwargs(model, kwargs);
  Result<std::unique_ptr<engine::Engine>> created = make_error("");
  {
    // Loading maps the model and plans memory, which can take seconds: other threads run.
    py::gil_scoped_release nogil;
    created = engine::Engine::create(config);
  }
  if (!created) throw py::value_error(created.error().message);
  return std::move(created).value();
}

std::vector<std::string> engine_arg_names() {
  FlagParser p;
  std::vector<std::string> names;
  for (const CLI::Option* opt : p.app.get_options()) {
    const std::string& lname = opt->get_lnames().empty() ? std::string() : opt->get_lnames()[0];
    if (lname.empty()) continue;  // the model, a positional argument
    std::string key = lname;
    std::replace(key.begin(), key.end(), '-', '_');
    names.push_back(key);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace vesper::python
