#include "python/py_fields.h"

#include <cmath>

#include "server/json_body.h"

namespace vesper::python {

std::string type_name(py::handle value) {
  return Py_TYPE(value.ptr())->tp_name;
}

int64_t to_int(py::handle value, const std::string& name) {
  // bool is an int in Python, but True as a token id or a length is a mistake worth naming.
  if (PyBool_Check(value.ptr()) || !PyLong_Check(value.ptr()))
    throw py::type_error(name + " must be an int, got " + type_name(value));
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow != 0) throw py::value_error(name + " is out of range (a 64-bit integer)");
  return v;
}

double to_float(py::handle value, const std::string& name) {
  if (PyBool_Check(value.ptr()) || !(PyLong_Check(value.ptr()) || PyFloat_Check(value.ptr())))
    throw py::type_error(name + " must be a number, got " + type_name(value));
  const double v = PyFloat_AsDouble(value.ptr());
  if (v == -1.0 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

bool to_bool(py::handle value, const std::string& name) {
  if (!PyBool_Check(value.ptr()))
    throw py::type_error(name + " must be a bool, got " + type_name(value));
  return value.ptr() == Py_True;
}

std::string to_str(py::handle value, const std::string& name) {
  if (!PyUnicode_Check(value.ptr()))
    throw py::type_error(name + " must be a str, got " + type_name(value));
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(value.ptr(), &size);
  if (data == nullptr) {
    PyErr_Clear();  // lone surrogates cannot be UTF-8
    throw py::value_error(name + " is not valid Unicode text (it holds a lone surrogate)");
  }
  return std::string(data, static_cast<size_t>(size));
}

std::vector<int32_t> to_int_list(py::handle value, const std::string& name, int32_t n_vocab) {
  if (!py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value))
    throw py::type_error(name + " must be a list of ints, got " + type_name(value));
  std::vector<int32_t> out;
  const py::sequence seq = py::reinterpret_borrow<py::sequence>(value);
  out.reserve(seq.size());
  for (size_t i = 0; i < seq.size(); ++i) {
    const std::string where = name + "[" + std::to_string(i) + "]";
    const int64_t v = to_int(seq[i], where);
    const int64_t hi = n_vocab > 0 ? n_vocab - 1 : INT32_MAX;
    if (v < 0 || v > hi)
      throw py::value_error(where + " must be a token id in the vocabulary (0.." +
                            std::to_string(hi) + "), got " + std::to_string(v));
    out.push_back(static_cast<int32_t>(v));
  }
  return out;
}

std::vector<std::string> to_str_list(py::handle value, const std::string& name) {
  if (PyUnicode_Check(value.ptr())) return {to_str(value, name)};
  if (!py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value))
    throw py::type_error(name + " must be a str or a list of str, got " + type_name(value));
  std::vector<std::string> out;
  const py::sequence seq = py::reinterpret_borrow<py::sequence>(value);
  for (size_t i = 0; i < seq.size(); ++i)
    out.push_back(to_str(seq[i], name + "[" + std::to_string(i) + "]"));
  return out;
}

namespace {

nlohmann::ordered_json to_json_at(py::handle value, const std::string& name, int depth) {
  using nlohmann::ordered_json;
  // The same bound the server puts on request bodies: the schema compilers and the chat
  // template recurse over the value.
  if (depth > server::kMaxJsonDepth)
    throw py::value_error(name + " is nested deeper than " + std::to_string(server::kMaxJsonDepth) +
                          " levels");
  if (value.is_none()) return nullptr;
  if (PyBool_Check(value.ptr())) return value.ptr() == Py_True;
  if (PyLong_Check(value.ptr())) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (overflow != 0) throw py::value_error(name + " holds an integer beyond 64 bits");
    return v;
  }
  if (PyFloat_Check(value.ptr())) {
    const double v = PyFloat_AsDouble(value.ptr());
    if (!std::isfinite(v)) throw py::value_error(name + " holds a number that is not finite");
    return v;
  }
  if (PyUnicode_Check(value.ptr())) return to_str(value, name);
  if (py::isinstance<py::dict>(value)) {
    ordered_json out = ordered_json::object();
    for (auto [k, v] : py::reinterpret_borrow<py::dict>(value)) {
      if (!PyUnicode_Check(k.ptr()))
        throw py::type_error(name + " has a key of type " + type_name(k) + "; keys must be str");
      const std::string key = to_str(k, name);
      out[key] = to_json_at(v, name + "[\"" + key + "\"]", depth + 1);
    }
    return out;
  }
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    ordered_json out = ordered_json::array();
    const py::sequence seq = py::reinterpret_borrow<py::sequence>(value);
    for (size_t i = 0; i < seq.size(); ++i)
      out.push_back(to_json_at(seq[i], name + "[" + std::to_string(i) + "]", depth + 1));
    return out;
  }
  throw py::type_error(name + " must hold only dict, list, str, int, float, bool and None, got " +
                       type_name(value));
}

}  // namespace

nlohmann::ordered_json to_json(py::handle value, const std::string& name) {
  return to_json_at(value, name, 0);
}

py::object PyFields::get(const char* attr) const {
  return py::getattr(object_, attr, py::none());
}

std::optional<int64_t> PyFields::integer(const char* attr) const {
  const py::object v = get(attr);
  if (v.is_none()) return std::nullopt;
  return to_int(v, name(attr));
}

std::optional<double> PyFields::number(const char* attr) const {
  const py::object v = get(attr);
  if (v.is_none()) return std::nullopt;
  return to_float(v, name(attr));
}

std::optional<bool> PyFields::boolean(const char* attr) const {
  const py::object v = get(attr);
  if (v.is_none()) return std::nullopt;
  return to_bool(v, name(attr));
}

std::optional<std::string> PyFields::string(const char* attr) const {
  const py::object v = get(attr);
  if (v.is_none()) return std::nullopt;
  return to_str(v, name(attr));
}

}  // namespace vesper::python
