// PyFields: typed reads of a Python object's attributes (a SamplingParams, a LoRARequest) or of
// one value, for the binding's conversions. Each read checks the Python type and throws
// TypeError, or ValueError for a value out of range, with a message naming the field as the user
// wrote it ("SamplingParams.top_k must be an int, got str"): the Python counterpart of the
// server's JsonFields. None reads as absent (std::nullopt), as vLLM's optional fields are.
//
// Call with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace vesper::python {

namespace py = pybind11;

// The Python type's name of `value` ("str", "NoneType"), for messages.
std::string type_name(py::handle value);

// Value readers: `name` is the field's full name in messages.
int64_t to_int(py::handle value, const std::string& name);   // an int (not a bool)
double to_float(py::handle value, const std::string& name);  // an int or a float
bool to_bool(py::handle value, const std::string& name);
std::string to_str(py::handle value, const std::string& name);
// A list or tuple of ints (token ids when `n_vocab` > 0: each in [0, n_vocab)).
std::vector<int32_t> to_int_list(py::handle value, const std::string& name, int32_t n_vocab = 0);
// A str (one item) or a list or tuple of str.
std::vector<std::string> to_str_list(py::handle value, const std::string& name);
// A JSON-like value (dict with str keys, list, tuple, str, int, float, bool, None) as JSON, with
// dict keys in insertion order (a JSON schema's properties come out in the order written).
nlohmann::ordered_json to_json(py::handle value, const std::string& name);

class PyFields {
 public:
  // `owner` prefixes field names in messages ("SamplingParams").
  PyFields(py::handle object, std::string owner) : object_(object), owner_(std::move(owner)) {}

  std::string name(const char* attr) const { return owner_ + "." + attr; }
  // The attribute, or None when the object lacks it.
  py::object get(const char* attr) const;

  std::optional<int64_t> integer(const char* attr) const;
  std::optional<double> number(const char* attr) const;
  std::optional<bool> boolean(const char* attr) const;
  std::optional<std::string> string(const char* attr) const;

 private:
  py::handle object_;
  std::string owner_;
};

}  // namespace vesper::python
