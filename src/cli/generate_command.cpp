// `vesper generate MODEL (--prompt TEXT ... | --prompts-file FILE)`: runs every prompt through the
// engine as one continuous batch and prints the results in input order: the continuation text
// (streamed as it comes for a single prompt), or with --json one object per prompt.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/progress_bar.h"
#include "engine/engine.h"
#include "engine/grammar_vocabulary.h"
#include "grammar/compiled_grammar.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "hf/model_file.h"

namespace vesper::cli {
namespace {

struct GenerateOptions {
  EngineFlags engine;
  std::vector<std::string> prompts;
  std::string prompts_file;
  sample::SamplingParams params;
  int64_t seed = -1;
  bool json = false;
  // Structured output for every prompt (llama.cpp's flags): GBNF text or file, JSON schema text
  // or file.
  std::string grammar, grammar_file, json_schema, json_schema_file;
};

// The grammar the structured-output flags ask for (none when none). Errors name the flag.
Result<std::optional<grammar::Grammar>> output_grammar(const GenerateOptions& o) {
  auto read = [](const std::string& path, const char* flag) -> Result<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return make_error(std::string(flag) + ": cannot read " + path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  std::string gbnf;
  const char* flag = nullptr;
  if (!o.grammar.empty() || !o.grammar_file.empty()) {
    gbnf = o.grammar;
    flag = "--grammar";
    if (!o.grammar_file.empty()) {
      flag = "--grammar-file";
      VESPER_ASSIGN_OR_RETURN(gbnf, read(o.grammar_file, flag));
    }
  } else if (!o.json_schema.empty() || !o.json_schema_file.empty()) {
    std::string text = o.json_schema;
    flag = "--json-schema";
    if (!o.json_schema_file.empty()) {
      flag = "--json-schema-file";
      VESPER_ASSIGN_OR_RETURN(text, read(o.json_schema_file, flag));
    }
    // Ordered: objects come out with their properties in the order the schema lists them.
    const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(text, nullptr, false);
    if (schema.is_discarded()) return make_error(std::string(flag) + ": not valid JSON");
    auto converted = grammar::json_schema_to_gbnf(schema);
    if (!converted) return make_error(std::string(flag) + ": " + converted.error().message);
    gbnf = std::move(converted).value();
  } else {
    return std::optional<grammar::Grammar>();
  }
  auto g = grammar::parse_gbnf(gbnf);
  if (!g) return make_error(std::string(flag) + ": " + g.error().message);
  return std::optional<grammar::Grammar>(std::move(g).value());
}

struct PromptJob {
  std::string prompt;
  sample::SamplingParams params;
  int32_t priority = 0;
  std::string model = {};  // an adapter's name (--lora-modules), or empty / the base model's
  // A JSONL line's "prompt_token_ids" (vLLM's TokensPrompt): the prompt as token ids, used as
  // they are (no BOS added); `prompt` is then empty.
  std::optional<std::vector<int32_t>> prompt_token_ids = {};
};

// Per-prompt fields of a JSONL prompts file override the command-line sampling flags.
Result<PromptJob> parse_job_line(const std::string& line, const sample::SamplingParams& defaults,
                                 size_t line_no, const std::string& path) {
  const std::string where = path + ":" + std::to_string(line_no) + ": ";
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return make_error(where + "not a JSON object");
  PromptJob job;
  job.params = defaults;
  try {
    if (j.contains("prompt") == j.contains("prompt_token_ids"))
      return make_error(where +
                        "one of \"prompt\" (a string) and \"prompt_token_ids\" (token ids) is "
                        "required");
    if (j.contains("prompt")) {
      if (!j["prompt"].is_string()) return make_error(where + "field \"prompt\" must be a string");
      job.prompt = j["prompt"].get<std::string>();
    } else {
      job.prompt_token_ids = j["prompt_token_ids"].get<std::vector<int32_t>>();
      if (job.prompt_token_ids->empty())
        return make_error(where + "field \"prompt_token_ids\" is empty");
    }
    for (const auto& [key, value] : j.items()) {
      auto& p = job.params;
      if (key == "prompt" || key == "prompt_token_ids")
        continue;
      else if (key == "max_tokens")
        p.max_tokens = value.get<int64_t>();
      else if (key == "min_tokens")
        p.min_tokens = value.get<int64_t>();
      else if (key == "temperature")
        p.temperature = value.get<float>();
      else if (key == "top_p")
        p.top_p = value.get<float>();
      else if (key == "top_k")
        p.top_k = value.get<int32_t>();
      else if (key == "min_p")
        p.min_p = value.get<float>();
      else if (key == "repetition_penalty")
        p.repetition_penalty = value.get<float>();
      else if (key == "presence_penalty")
        p.presence_penalty = value.get<float>();
      else if (key == "frequency_penalty")
        p.frequency_penalty = value.get<float>();
      else if (key == "seed")
        p.seed = value.get<uint64_t>();
      else if (key == "n")
        p.n = value.get<int32_t>();
      else if (key == "ignore_eos")
        p.ignore_eos = value.get<bool>();
      else if (key == "logprobs")
        p.logprobs = value.get<int32_t>();
      else if (key == "stop")
        p.stop = value.is_string() ? std::vector<std::string>{value.get<std::string>()}
                                   : value.get<std::vector<std::string>>();
      else if (key == "stop_token_ids")
        p.stop_token_ids = value.get<std::vector<int32_t>>();
      else if (key == "priority")
        job.priority = value.get<int32_t>();
      else if (key == "model")
        job.model = value.get<std::string>();
      else
        return make_error(where + "unknown field \"" + key + "\"");
    }
  } catch (const nlohmann::json::exception& e) {
    return make_error(where + "a field has the wrong type: " + e.what());
  }
  if (auto st = job.params.validate(); !st) return make_error(where + st.error().message);
  return job;
}

Result<std::vector<PromptJob>> collect_jobs(const GenerateOptions& o) {
  std::vector<PromptJob> jobs;
  for (const auto& p : o.prompts) jobs.push_back({p, o.params, 0});
  if (!o.prompts_file.empty()) {
    std::ifstream f(o.prompts_file);
    if (!f) return make_error(o.prompts_file + ": cannot open the prompts file");
    std::string line;
    for (size_t n = 1; std::getline(f, line); ++n) {
      if (line.empty()) continue;
      size_t first = line.find_first_not_of(" \t\r");
      if (first != std::string::npos && line[first] == '{') {
        VESPER_ASSIGN_OR_RETURN(PromptJob job, parse_job_line(line, o.params, n, o.prompts_file));
        jobs.push_back(std::move(job));
      } else {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        jobs.push_back({line, o.params, 0});
      }
    }
  }
  if (jobs.empty())
    return make_error("no prompt given: pass --prompt TEXT (repeatable) or --prompts-file FILE");
  return jobs;
}

nlohmann::json result_json(const PromptJob& job, const engine::RequestOutput& r) {
  const auto& first = r.outputs.at(0);
  nlohmann::json j = {{"prompt", job.prompt},
                      {"text", first.text},
                      {"prompt_token_ids", r.prompt_token_ids},
                      {"token_ids", first.token_ids},
                      {"finish_reason", first.finish_reason.value_or("")}};
  if (job.params.logprobs >= 0) {
    // vLLM's offline form: per generated token, the sampled token's and the top ones'
    // log-probabilities (token id to logprob).
    nlohmann::json lps = nlohmann::json::array();
    for (const sample::LogprobEntry& e : first.logprobs) {
      nlohmann::json top = nlohmann::json::object();
      top[std::to_string(e.token)] = e.logprob;
      for (const sample::TokenLogprob& t : e.top) top[std::to_string(t.token)] = t.logprob;
      lps.push_back(std::move(top));
    }
    j["logprobs"] = std::move(lps);
  }
  if (r.outputs.size() > 1) {
    nlohmann::json outs = nlohmann::json::array();
    for (const auto& c : r.outputs)
      outs.push_back({{"index", c.index},
                      {"text", c.text},
                      {"token_ids", c.token_ids},
                      {"finish_reason", c.finish_reason.value_or("")}});
    j["outputs"] = outs;
  }
  return j;
}

int run_generate(GenerateOptions& o) {
  if (o.seed >= 0) o.params.seed = static_cast<uint64_t>(o.seed);
  if (auto st = o.params.validate(); !st) return fail(st.error().message);
  auto jobs = collect_jobs(o);
  if (!jobs) return fail(jobs.error().message);
  auto constraint = output_grammar(o);
  if (!constraint) return fail(constraint.error().message);
  auto config = to_engine_config(o.engine);
  if (!config) return fail(config.error().message);
  if (const std::optional<int> rc = run_if_follower(*config)) return *rc;
  auto engine = engine::Engine::create(*config);
  if (!engine) return fail(engine.error().message);
  engine::Engine& e = **engine;
  if (*constraint) {
    const auto compiled = std::make_shared<const grammar::CompiledGrammar>(
        std::move(**constraint), engine::grammar_vocabulary(e.tokenizer()));
    for (PromptJob& job : *jobs) job.params.grammar = compiled;
  }

  const size_t n = jobs->size();
  // A prompt's "model": an adapter's name, or the base model's (its file name, as `serve` calls
  // it).
  const std::string base = hf::model_name(o.engine.model_path);
  for (size_t i = 0; i < n; ++i) {
    const PromptJob& job = (*jobs)[i];
    auto ids = job.prompt_token_ids ? *job.prompt_token_ids
                                    : e.tokenizer().encode(job.prompt, /*add_special=*/true,
                                                           /*parse_special=*/false);
    const std::string lora_name = job.model == base ? std::string() : job.model;
    if (auto st =
            e.add_request({std::to_string(i), std::move(ids), job.params, job.priority, lora_name});
        !st)
      return fail("prompt " + std::to_string(i + 1) + ": " + st.error().message);
  }
  // Results are printed in input order: each as soon as it and all before it are done.
  std::vector<std::optional<engine::RequestOutput>> done(n);
  size_t next_to_print = 0, finished = 0;
  int64_t tokens = 0;
  const bool stream = !o.json && n == 1;
  ProgressBar progress("generate", static_cast<int64_t>(n));
  while (e.has_unfinished() || next_to_print < n) {
    for (auto& out : e.step()) {
      const size_t i = std::stoul(out.request_id);
      for (const auto& c : out.outputs) tokens += static_cast<int64_t>(c.delta_token_ids.size());
      if (stream && !out.outputs[0].delta_text.empty()) {
        std::fwrite(out.outputs[0].delta_text.data(), 1, out.outputs[0].delta_text.size(), stdout);
        std::fflush(stdout);
      }
      if (out.finished) {
        done[i] = std::move(out);
        ++finished;
      }
    }
    for (; next_to_print < n && done[next_to_print]; ++next_to_print) {
      const auto& r = *done[next_to_print];
      if (o.json) {
        std::printf("%s\n", result_json((*jobs)[next_to_print], r)
                                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                                .c_str());
      } else if (stream) {
        std::printf("\n");
      } else {
        for (const auto& c : r.outputs) std::printf("%s\n", c.text.c_str());
      }
      std::fflush(stdout);
    }
    progress.update(static_cast<int64_t>(finished), tokens);
  }
  return 0;
}

}  // namespace

CommandRunner add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  o->params.max_tokens = 16;
  CLI::App* cmd =
      app.add_subcommand("generate", "Generate text for prompts offline, as one continuous batch");
  add_engine_flags(cmd, o->engine);
  cmd->add_option("-p,--prompt", o->prompts, "Prompt text; repeat for several prompts");
  cmd->add_option(
      "--prompts-file", o->prompts_file,
      "File of prompts: one per line, or JSONL objects with \"prompt\" (or \"prompt_token_ids\": "
      "the prompt as token ids, no BOS added) and per-prompt sampling fields (max_tokens, model, "
      "temperature, top_p, top_k, min_p, seed, n, stop, stop_token_ids, ignore_eos, logprobs, "
      "penalties, priority)");
  auto& p = o->params;
  cmd->add_option("-n,--max-tokens", p.max_tokens, "Tokens to generate per prompt")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--min-tokens", p.min_tokens,
                  "Generate at least this many tokens before EOS may end it")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", p.temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str();
  cmd->add_option("--top-p", p.top_p,
                  "Nucleus sampling: keep the smallest set of tokens with this mass")
      ->capture_default_str();
  cmd->add_option("--top-k", p.top_k, "Keep the k most likely tokens; -1 = off")
      ->capture_default_str();
  cmd->add_option("--min-p", p.min_p, "Drop tokens below min_p x the top probability")
      ->capture_default_str();
  cmd->add_option("--repetition-penalty", p.repetition_penalty,
                  "Penalty for tokens in the prompt or output (1 = off)")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", p.presence_penalty, "Penalty for tokens already generated")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", p.frequency_penalty,
                  "Penalty per occurrence in the output")
      ->capture_default_str();
  cmd->add_option("--n", p.n, "Parallel samples per prompt (sharing the prompt's KV blocks)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--stop", p.stop, "Stop string; repeatable");
  cmd->add_flag("--ignore-eos", p.ignore_eos, "Keep generating after end-of-sequence tokens");
  cmd->add_option("--seed", o->seed, "Random seed for sampling (default: random)");
  auto* grammar = cmd->add_option("--grammar", o->grammar,
                                  "Constrain every output to this GBNF grammar (llama.cpp's "
                                  "format; rule 'root')");
  auto* grammar_file =
      cmd->add_option("--grammar-file", o->grammar_file, "--grammar, read from a file")
          ->check(CLI::ExistingFile);
  auto* json_schema = cmd->add_option("--json-schema", o->json_schema,
                                      "Constrain every output to JSON valid under this JSON "
                                      "schema, e.g. '{\"type\": \"object\"}'");
  auto* json_schema_file =
      cmd->add_option("--json-schema-file", o->json_schema_file, "--json-schema, read from a file")
          ->check(CLI::ExistingFile);
  for (CLI::Option* a : {grammar, grammar_file, json_schema, json_schema_file})
    for (CLI::Option* b : {grammar, grammar_file, json_schema, json_schema_file})
      if (a != b) a->excludes(b);
  cmd->add_flag(
      "--json", o->json,
      "Print one JSON object per prompt: prompt, text, prompt_token_ids, token_ids, finish_reason "
      "(and outputs[] when --n > 1)");
  return [o] { return run_generate(*o); };
}

}  // namespace vesper::cli
