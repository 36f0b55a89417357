#include "python/sampling.h"

#include "python/py_fields.h"
#include "server/json_fields.h"

namespace vesper::python {
namespace {

constexpr const char* kOwner = "SamplingParams";

float to_f32(const PyFields& f, const char* attr, float fallback) {
  return static_cast<float>(f.number(attr).value_or(fallback));
}

int32_t to_i32(const PyFields& f, const char* attr, int32_t fallback) {
  const std::optional<int64_t> v = f.integer(attr);
  if (!v) return fallback;
  if (*v < INT32_MIN || *v > INT32_MAX)
    throw py::value_error(f.name(attr) + " is out of range, got " + std::to_string(*v));
  return static_cast<int32_t>(*v);
}

// vLLM's logit_bias: {token id: bias}.
void read_logit_bias(const PyFields& f, sample::SamplingParams& p) {
  const py::object v = f.get("logit_bias");
  if (v.is_none()) return;
  if (!py::isinstance<py::dict>(v))
    throw py::type_error(f.name("logit_bias") + " must be a dict of token id to bias, got " +
                         type_name(v));
  for (auto [k, bias] : py::reinterpret_borrow<py::dict>(v)) {
    const std::string where = f.name("logit_bias") + "[" + std::string(py::repr(k)) + "]";
    const int64_t id = to_int(k, f.name("logit_bias") + " key");
    if (id < 0 || id > INT32_MAX)
      throw py::value_error(where + ": the key must be a token id, got " + std::to_string(id));
    p.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(to_float(bias, where)));
  }
}

// structured_outputs (or the older guided_decoding): the same object as the HTTP API's
// "structured_outputs", read by the server's own parser.
std::optional<server::OutputConstraint> read_constraint(const PyFields& f) {
  const py::object so = f.get("structured_outputs");
  const py::object gd = f.get("guided_decoding");
  if (!so.is_none() && !gd.is_none())
    throw py::value_error(
        "SamplingParams.structured_outputs and SamplingParams.guided_decoding both constrain the "
        "output; set one of them");
  const bool guided = so.is_none();
  const py::object spec = guided ? gd : so;
  if (spec.is_none()) return std::nullopt;
  const std::string owner =
      std::string(kOwner) + (guided ? ".guided_decoding" : ".structured_outputs");
  const PyFields s(spec, owner);
  nlohmann::ordered_json object = nlohmann::ordered_json::object();
  for (const char* key : {"json", "regex", "choice", "grammar"}) {
    const py::object v = s.get(key);
    if (!v.is_none()) object[key] = to_json(v, s.name(key));
  }
  if (s.boolean("json_object").value_or(false)) object["json_object"] = true;
  for (const char* unsupported : {"structural_tag"})
    if (!s.get(unsupported).is_none())
      throw py::value_error(s.name(unsupported) + " is not supported");
  const nlohmann::ordered_json ordered = {{"structured_outputs", object}};
  const nlohmann::json body = nlohmann::json::parse(ordered.dump());
  std::optional<server::OutputConstraint> out;
  if (auto err = server::parse_output_constraint(server::JsonFields(body), &ordered, out)) {
    std::string message = err->message;
    if (guided)  // the parser names the HTTP field; the user set guided_decoding
      for (size_t at = 0; (at = message.find("structured_outputs", at)) != std::string::npos;)
        message.replace(at, 18, "guided_decoding");
    throw py::value_error(std::string(kOwner) + ": " + message);
  }
  if (out) out->field = owner;
  return out;
}

}  // namespace

ConvertedParams convert_sampling_params(py::handle params) {
  if (params.is_none()) throw py::type_error("sampling_params must be a SamplingParams, got None");
  const PyFields f(params, kOwner);
  ConvertedParams c;
  sample::SamplingParams& p = c.params;
  p.n = to_i32(f, "n", 1);
  if (const auto best_of = f.integer("best_of"); best_of && *best_of != p.n)
    throw py::value_error("SamplingParams.best_of other than n is not supported (best_of " +
                          std::to_string(*best_of) + ", n " + std::to_string(p.n) + ")");
  p.presence_penalty = to_f32(f, "presence_penalty", 0.0f);
  p.frequency_penalty = to_f32(f, "frequency_penalty", 0.0f);
  p.repetition_penalty = to_f32(f, "repetition_penalty", 1.0f);
  p.temperature = to_f32(f, "temperature", 1.0f);
  p.top_p = to_f32(f, "top_p", 1.0f);
  p.top_k = to_i32(f, "top_k", 0);
  p.min_p = to_f32(f, "min_p", 0.0f);
  // Any Python int seeds (vLLM's); negative ones wrap, as the HTTP API's do.
  if (const auto seed = f.integer("seed")) p.seed = static_cast<uint64_t>(*seed);
  if (const py::object stop = f.get("stop"); !stop.is_none())
    p.stop = to_str_list(stop, f.name("stop"));
  if (const py::object ids = f.get("stop_token_ids"); !ids.is_none())
    p.stop_token_ids = to_int_list(ids, f.name("stop_token_ids"));
  if (const py::object words = f.get("bad_words"); !words.is_none())
    p.bad_words = to_str_list(words, f.name("bad_words"));
  p.ignore_eos = f.boolean("ignore_eos").value_or(false);
  const std::optional<int64_t> max_tokens = f.integer("max_tokens");
  c.max_tokens_given = max_tokens.has_value();
  p.max_tokens = max_tokens.value_or(0);
  p.min_tokens = f.integer("min_tokens").value_or(0);
  if (!c.max_tokens_given && p.min_tokens > 0) p.max_tokens = p.min_tokens;  // checked per prompt
  // None: no log-probabilities (-1); the range is validate()'s.
  p.logprobs = to_i32(f, "logprobs", -1);
  if (!f.get("prompt_logprobs").is_none())
    throw py::value_error(
        "SamplingParams.prompt_logprobs is not supported: the engine computes no prompt "
        "log-probabilities");
  p.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  p.include_stop_str_in_output = f.boolean("include_stop_str_in_output").value_or(false);
  read_logit_bias(f, p);
  if (const py::object allowed = f.get("allowed_token_ids"); !allowed.is_none()) {
    p.allowed_token_ids = to_int_list(allowed, f.name("allowed_token_ids"));
    if (p.allowed_token_ids.empty())
      throw py::value_error(
          "SamplingParams.allowed_token_ids must not be empty (None allows every token)");
  }
  p.skip_reading_prefix_cache = f.boolean("skip_reading_prefix_cache").value_or(false);
  if (const auto salt = f.string("cache_salt")) {
    if (salt->empty()) throw py::value_error("SamplingParams.cache_salt must not be empty");
    p.cache_salt = *salt;
  }
  if (const auto sparsity = f.string("kv_sparsity")) {
    if (*sparsity != "none" && *sparsity != "auto")
      throw py::value_error(
          "SamplingParams.kv_sparsity must be \"none\" (attend densely) or "
          "\"auto\" (the engine's KV sparsity), got \"" +
          *sparsity + "\"");
    p.kv_dense = *sparsity == "none";
  }
  c.constraint = read_constraint(f);
  if (auto st = p.validate(); !st)
    throw py::value_error(std::string(kOwner) + ": " + st.error().message);
  return c;
}

}  // namespace vesper::python
