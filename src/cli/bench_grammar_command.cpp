// `vesper bench grammar MODEL SCHEMA.json ...`: what structured output costs apart from the
// model: per JSON schema, the compile time (schema -> GBNF -> grammar -> bound to the model's
// vocabulary) and the time per generated token of the grammar's work in the sampler (the state
// after the token, its allowed-token mask, the mask applied to a vocabulary-sized row). Tokens
// come from random walks through the grammar (uniform among the allowed tokens, seeded), several
// walks sharing one compiled grammar as concurrent requests with one schema do: the first walks
// compute masks, later ones mostly find them cached.
//
// With --forward-ms F each token is followed by F ms of sleep, standing in for the forward pass
// between two sampling steps; with --prefetch the next state's mask is handed to a
// grammar::MaskPrefetcher as the engine's runner does, so the step's own time is what is left
// of the mask work after it overlapped the "forward pass". (A sleep leaves the cores free; a
// real forward pass keeps them busy, so this is the overlap's best case.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cli/bench_commands.h"
#include "client/metrics.h"
#include "engine/grammar_vocabulary.h"
#include "gguf/gguf.h"
#include "grammar/compiled_grammar.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/mask_prefetcher.h"
#include "hf/model_file.h"
#include "tokenizer/tokenizer.h"

namespace vesper::cli {
namespace {

using client::percentile;

struct BenchGrammarOptions {
  std::string model_path;
  std::vector<std::string> schemas;
  int64_t walks = 32;
  int64_t tokens = 128;
  uint64_t seed = 0;
  double forward_ms = 0;
  bool prefetch = false;
  bool json = false;
};

using Clock = std::chrono::steady_clock;
double micros_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

struct SchemaResult {
  std::string name;
  double compile_ms = 0;
  std::vector<double> token_us;  // per generated token
  size_t states = 0, masks = 0;
};

Result<SchemaResult> bench_schema(const std::string& path,
                                  const std::shared_ptr<const grammar::TokenVocabulary>& vocab,
                                  const BenchGrammarOptions& o) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(path + ": cannot read");
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(in, nullptr, false);
  if (schema.is_discarded()) return make_error(path + ": not valid JSON");
  SchemaResult r;
  r.name = path.substr(path.find_last_of('/') + 1);
  const Clock::time_point t0 = Clock::now();
  auto gbnf = grammar::json_schema_to_gbnf(schema);
  if (!gbnf) return make_error(path + ": " + gbnf.error().message);
  auto g = grammar::parse_gbnf(*gbnf);
  if (!g) return make_error(path + ": " + g.error().message);
  const auto shared = std::make_shared<const grammar::CompiledGrammar>(std::move(g).value(), vocab);
  const grammar::CompiledGrammar& compiled = *shared;
  r.compile_ms = micros_since(t0) / 1000.0;
  std::unique_ptr<grammar::MaskPrefetcher> prefetcher;
  if (o.prefetch) prefetcher = std::make_unique<grammar::MaskPrefetcher>();

  std::vector<float> row(static_cast<size_t>(vocab->size()));
  std::vector<int32_t> allowed;
  for (int64_t w = 0; w < o.walks; ++w) {
    std::mt19937_64 rng(o.seed * 1000003 + static_cast<uint64_t>(w));
    grammar::GrammarCursor cursor;
    std::vector<int32_t> output;
    for (int64_t t = 0; t < o.tokens; ++t) {
      const Clock::time_point s = Clock::now();
      // What the sampler does for a constrained row.
      const grammar::StateId state = compiled.state_after(cursor, output);
      std::fill(row.begin(), row.end(), 0.0f);
      compiled.apply(state, row);
      r.token_us.push_back(micros_since(s));
      allowed.clear();
      for (int32_t id = 0; id < vocab->size(); ++id)
        if (row[static_cast<size_t>(id)] == 0.0f) allowed.push_back(id);
      if (allowed.empty()) break;
      const int32_t next = allowed[rng() % allowed.size()];
      if (vocab->is_eog(next)) break;
      output.push_back(next);
      if (prefetcher) {  // what the runner does after sampling, on the step loop
        const Clock::time_point p = Clock::now();
        prefetcher->request(shared, compiled.state_after(cursor, output));
        r.token_us.back() += micros_since(p);
      }
      if (o.forward_ms > 0)
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.forward_ms));
    }
  }
  r.states = compiled.num_states();
  r.masks = compiled.num_masks();
  return r;
}

int run_bench_grammar(const BenchGrammarOptions& o) {
  auto file = hf::open_model_file(o.model_path);
  if (!file) return fail(file.error().message);
  auto tok = tokenizer::Tokenizer::from_gguf(*file);
  if (!tok) return fail(tok.error().message);
  const auto vocab = engine::grammar_vocabulary(*tok);
  std::vector<SchemaResult> results;
  for (const std::string& path : o.schemas) {
    auto r = bench_schema(path, vocab, o);
    if (!r) return fail(r.error().message);
    results.push_back(std::move(r).value());
  }
  std::vector<double> compile_ms, all_tokens;
  nlohmann::json out = nlohmann::json::array();
  if (!o.json)
    std::printf("%-28s %10s %8s %10s %10s %10s %8s %8s\n", "schema", "compile ms", "tokens",
                "p50 us/tok", "p99 us/tok", "mean us", "states", "masks");
  for (const SchemaResult& r : results) {
    compile_ms.push_back(r.compile_ms);
    all_tokens.insert(all_tokens.end(), r.token_us.begin(), r.token_us.end());
    double sum = 0;
    for (double x : r.token_us) sum += x;
    const double mean = r.token_us.empty() ? 0 : sum / static_cast<double>(r.token_us.size());
    if (o.json) {
      out.push_back({{"schema", r.name},
                     {"compile_ms", r.compile_ms},
                     {"tokens", r.token_us.size()},
                     {"token_us_p50", percentile(r.token_us, 50)},
                     {"token_us_p99", percentile(r.token_us, 99)},
                     {"token_us_mean", mean},
                     {"states", r.states},
                     {"masks", r.masks}});
    } else {
      std::printf("%-28s %10.2f %8zu %10.1f %10.1f %10.1f %8zu %8zu\n", r.name.c_str(),
                  r.compile_ms, r.token_us.size(), percentile(r.token_us, 50),
                  percentile(r.token_us, 99), mean, r.states, r.masks);
    }
  }
  double sum = 0;
  for (double x : all_tokens) sum += x;
  const double mean = all_tokens.empty() ? 0 : sum / static_cast<double>(all_tokens.size());
  if (o.json) {
    std::printf("%s\n", nlohmann::json{{"schemas", out},
                                       {"compile_ms_p50", percentile(compile_ms, 50)},
                                       {"compile_ms_max", percentile(compile_ms, 100)},
                                       {"token_us_p50", percentile(all_tokens, 50)},
                                       {"token_us_p99", percentile(all_tokens, 99)},
                                       {"token_us_mean", mean}}
                            .dump()
                            .c_str());
  } else {
    std::printf(
        "%zu schemas: compile p50 %.2f ms, max %.2f ms; per token p50 %.1f us, p99 %.1f us, "
        "mean %.1f us (%zu tokens, %lld walks of up to %lld per schema)\n",
        results.size(), percentile(compile_ms, 50), percentile(compile_ms, 100),
        percentile(all_tokens, 50), percentile(all_tokens, 99), mean, all_tokens.size(),
        static_cast<long long>(o.walks), static_cast<long long>(o.tokens));
  }
  return 0;
}

}  // namespace

CommandRunner add_bench_grammar_command(CLI::App& bench) {
  auto o = std::make_shared<BenchGrammarOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "grammar",
      "Structured output's cost apart from the model: per JSON schema, compile time and the "
      "grammar's time per generated token (random walks through the grammar)");
  cmd->add_option("model", o->model_path,
                  "Model, GGUF file or checkpoint directory (its vocabulary is what grammars mask)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("schemas", o->schemas, "JSON schema files")->required()->check(CLI::ExistingFile);
  cmd->add_option("--walks", o->walks, "Random walks per schema, sharing its compiled grammar")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--tokens", o->tokens, "Tokens per walk at most")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", o->seed, "Seed of the walks")->capture_default_str();
  cmd->add_option("--forward-ms", o->forward_ms,
                  "Sleep this long after each token, standing in for the forward pass")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--prefetch", o->prefetch,
                "Hand each next state's mask to a prefetching thread, as the engine does, so it "
                "overlaps the --forward-ms wait");
  cmd->add_flag("--json", o->json, "Print the results as one JSON object");
  return [o] { return run_bench_grammar(*o); };
}

}  // namespace vesper::cli
