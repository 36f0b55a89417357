#include "sample/sampling_params_codec.h"

#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "grammar/grammar_codec.h"

namespace vesper::sample {
namespace {

void write_strings(ByteWriter& w, const std::vector<std::string>& v) {
  w.u64(v.size());
  for (const std::string& s : v) w.str(s);
}

Status read_strings(ByteReader& r, std::vector<std::string>& v) {
  auto n = r.count();
  if (!n) return n.error();
  v.resize(*n);
  for (std::string& s : v) VESPER_TRY(r.str(s));
  return {};
}

// Reads a value into `field`; an integer that does not fit the field's type is an error (not a
// silent truncation).
template <class Field, class Read>
Status read_into(Field& field, Read value) {
  if (!value) return value.error();
  if constexpr (std::is_integral_v<Field> && !std::is_same_v<Field, bool>) {
    using Value = std::decay_t<decltype(*value)>;
    if (*value < static_cast<Value>(std::numeric_limits<Field>::min()) ||
        *value > static_cast<Value>(std::numeric_limits<Field>::max()))
      return make_error("a value out of range in the sampling parameters");
  }
  field = static_cast<Field>(*value);
  return {};
}

#define VESPER_READ_INTO(field, expr) VESPER_TRY(read_into(field, (expr)))

}  // namespace

void write_sampling_params(ByteWriter& w, const SamplingParams& p) {
  w.f32(p.temperature);
  w.i64(p.top_k);
  w.f32(p.top_p);
  w.f32(p.min_p);
  w.f32(p.repetition_penalty);
  w.f32(p.presence_penalty);
  w.f32(p.frequency_penalty);
  w.boolean(p.seed.has_value());
  if (p.seed) w.u64(*p.seed);
  w.i64(p.n);
  w.i64(p.max_tokens);
  w.i64(p.min_tokens);
  write_strings(w, p.stop);
  w.ints<int32_t>(p.stop_token_ids);
  w.boolean(p.ignore_eos);
  w.i64(p.logprobs);
  w.boolean(p.include_stop_str_in_output);
  w.u64(p.logit_bias.size());
  for (const auto& [token, bias] : p.logit_bias) {
    w.i64(token);
    w.f32(bias);
  }
  w.ints<int32_t>(p.allowed_token_ids);
  write_strings(w, p.bad_words);
  w.u64(p.bad_words_token_ids.size());
  for (const auto& word : p.bad_words_token_ids) w.ints<int32_t>(word);
  w.boolean(p.grammar != nullptr);
  if (p.grammar) grammar::write_grammar(w, p.grammar->grammar());
  w.boolean(p.skip_special_tokens);
  w.boolean(p.return_tokens_as_token_ids);
  w.boolean(p.skip_reading_prefix_cache);
  w.str(p.cache_salt);
  w.boolean(p.kv_dense);
}

Status read_sampling_params(ByteReader& r, SamplingParams& p, const GrammarCompiler& compile) {
  VESPER_READ_INTO(p.temperature, r.f32());
  VESPER_READ_INTO(p.top_k, r.i64());
  VESPER_READ_INTO(p.top_p, r.f32());
  VESPER_READ_INTO(p.min_p, r.f32());
  VESPER_READ_INTO(p.repetition_penalty, r.f32());
  VESPER_READ_INTO(p.presence_penalty, r.f32());
  VESPER_READ_INTO(p.frequency_penalty, r.f32());
  bool has_seed = false;
  VESPER_READ_INTO(has_seed, r.boolean());
  p.seed.reset();
  if (has_seed) {
    uint64_t seed = 0;
    VESPER_READ_INTO(seed, r.u64());
    p.seed = seed;
  }
  VESPER_READ_INTO(p.n, r.i64());
  VESPER_READ_INTO(p.max_tokens, r.i64());
  VESPER_READ_INTO(p.min_tokens, r.i64());
  VESPER_TRY(read_strings(r, p.stop));
  VESPER_TRY(r.ints(p.stop_token_ids));
  VESPER_READ_INTO(p.ignore_eos, r.boolean());
  VESPER_READ_INTO(p.logprobs, r.i64());
  VESPER_READ_INTO(p.include_stop_str_in_output, r.boolean());
  auto num_bias = r.count();
  if (!num_bias) return num_bias.error();
  p.logit_bias.resize(*num_bias);
  for (auto& [token, bias] : p.logit_bias) {
    VESPER_READ_INTO(token, r.i64());
    VESPER_READ_INTO(bias, r.f32());
  }
  VESPER_TRY(r.ints(p.allowed_token_ids));
  VESPER_TRY(read_strings(r, p.bad_words));
  auto num_words = r.count();
  if (!num_words) return num_words.error();
  p.bad_words_token_ids.resize(*num_words);
  for (auto& word : p.bad_words_token_ids) VESPER_TRY(r.ints(word));
  bool has_grammar = false;
  VESPER_READ_INTO(has_grammar, r.boolean());
  p.grammar.reset();
  if (has_grammar) {
    VESPER_ASSIGN_OR_RETURN(grammar::Grammar g, grammar::read_grammar(r));
    if (!compile) return make_error("sampling parameters with a grammar, and no grammar compiler");
    p.grammar = compile(std::move(g));
  }
  VESPER_READ_INTO(p.skip_special_tokens, r.boolean());
  VESPER_READ_INTO(p.return_tokens_as_token_ids, r.boolean());
  VESPER_READ_INTO(p.skip_reading_prefix_cache, r.boolean());
  VESPER_TRY(r.str(p.cache_salt));
  VESPER_READ_INTO(p.kv_dense, r.boolean());
  return p.validate();
}

bool same_sampling_params(const SamplingParams& a, const SamplingParams& b) {
  ByteWriter x, y;
  write_sampling_params(x, a);
  write_sampling_params(y, b);
  return x.bytes() == y.bytes();
}

}  // namespace vesper::sample
