// `vesper bench throughput MODEL --num-prompts N --input-len I --output-len O | --dataset F.jsonl`:
// offline throughput as vLLM's benchmark_throughput measures it: all requests are queued at
// once and run to completion; requests/s, output tokens/s and total tokens/s over the run.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/bench_commands.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/progress_bar.h"
#include "engine/engine.h"

namespace vesper::cli {
namespace {

struct ThroughputOptions {
  EngineFlags engine;
  int64_t num_prompts = 100;
  int64_t input_len = 128;
  int64_t output_len = 128;
  std::string dataset;
  uint64_t seed = 0;
  bool json = false;
};

struct BenchRequest {
  std::vector<int32_t> prompt;
  int64_t output_len;
};

// Random token prompts (vLLM's "random" dataset): ids drawn uniformly from the vocabulary,
// avoiding control tokens so that every prompt is ordinary text.
std::vector<BenchRequest> random_requests(const engine::Engine& e, const ThroughputOptions& o) {
  std::mt19937_64 rng(o.seed);
  const auto& tok = e.tokenizer();
  std::vector<int32_t> usable;
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    if ((tok.token_attr(id) & tokenizer::kAttrControl) == 0) usable.push_back(id);
  std::vector<BenchRequest> reqs;
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    BenchRequest r;
    if (auto bos = tok.bos_id(); bos && tok.add_bos()) r.prompt.push_back(*bos);
    while (static_cast<int64_t>(r.prompt.size()) < o.input_len) r.prompt.push_back(usable[rng() % usable.size()]);
    r.output_len = o.output_len;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// JSONL: {"prompt": "...", "output_len": N} per line (output_len defaults to --output-len).
Result<std::vector<BenchRequest>> dataset_requests(const engine::Engine& e, const ThroughputOptions& o) {
  std::ifstream f(o.dataset);
  if (!f) return make_error(o.dataset + ": cannot open the dataset");
  std::vector<BenchRequest> reqs;
  std::string line;
  for (size_t n = 1; std::getline(f, line) && static_cast<int64_t>(reqs.size()) < o.num_prompts; ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      return make_error(o.dataset + ":" + std::to_string(n) + ": expected {\"prompt\": string, \"output_len\": integer}");
    BenchRequest r;
    r.prompt = e.tokenizer().encode(j["prompt"].get<std::string>(), true, false);
    r.output_len = j.value("output_len", o.output_len);
    reqs.push_back(std::move(r));
  }
  if (reqs.empty()) return make_error(o.dataset + ": no requests in the dataset");
  return reqs;
}

int run_throughput(const ThroughputOptions& o) {
  auto config = to_engine_config(o.engine);
  if (!config) return fail(config.error().message);
  auto created = engine::Engine::create(*config);
  if (!created) return fail(created.error().message);
  engine::Engine& e = **created;
  std::vector<BenchRequest> reqs;
  if (o.dataset.empty()) {
    reqs = random_requests(e, o);
  } else {
    auto r = dataset_requests(e, o);
    if (!r) return fail(r.error().message);
    reqs = std::move(*r);
  }
  int64_t prompt_tokens = 0, output_tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < reqs.size(); ++i) {
    sample::SamplingParams p;
    p.temperature = 1.0f;
    p.seed = o.seed + i;
    p.ignore_eos = true;  // exact output lengths, as vLLM's benchmark does
    p.max_tokens = reqs[i].output_len;
    prompt_tokens += static_cast<int64_t>(reqs[i].prompt.size());
    if (auto st = e.add_request(std::to_string(i), reqs[i].prompt, p); !st)
      return fail("request " + std::to_string(i) + ": " + st.error().message);
  }
  ProgressBar progress("bench throughput", static_cast<int64_t>(reqs.size()));
  int64_t finished = 0;
  while (e.has_unfinished()) {
    for (const auto& out : e.step()) {
      for (const auto& c : out.outputs) output_tokens += static_cast<int64_t>(c.delta_token_ids.size());
      if (out.finished) ++finished;
    }
    progress.update(finished, output_tokens);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const engine::EngineStats st = e.stats();
  const double rps = static_cast<double>(reqs.size()) / secs;
  const double out_tps = static_cast<double>(output_tokens) / secs;
  const double total_tps = static_cast<double>(prompt_tokens + output_tokens) / secs;
  if (o.json) {
    nlohmann::json j = {{"requests_per_s", rps},
                        {"output_tokens_per_s", out_tps},
                        {"total_tokens_per_s", total_tps},
                        {"num_requests", reqs.size()},
                        {"prompt_tokens", prompt_tokens},
                        {"output_tokens", output_tokens},
                        {"elapsed_s", secs},
                        {"num_steps", st.num_steps},
                        {"num_preemptions", st.num_preemptions},
                        {"max_num_batched_tokens", e.scheduler_config().max_num_batched_tokens},
                        {"max_num_seqs", e.scheduler_config().max_num_seqs}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    const auto& sc = e.scheduler_config();
    std::printf("scheduler: max-num-batched-tokens %lld, max-num-seqs %lld, max-model-len %lld, chunked prefill %s, "
                "KV blocks %lld x %lld tokens\n",
                static_cast<long long>(sc.max_num_batched_tokens), static_cast<long long>(sc.max_num_seqs),
                static_cast<long long>(sc.max_model_len), sc.enable_chunked_prefill ? "on" : "off",
                static_cast<long long>(e.memory_plan().num_blocks), static_cast<long long>(e.memory_plan().block_size));
    std::printf("requests: %zu, prompt tokens: %lld, output tokens: %lld, steps: %lld, preemptions: %lld\n",
                reqs.size(), static_cast<long long>(prompt_tokens), static_cast<long long>(output_tokens),
                static_cast<long long>(st.num_steps), static_cast<long long>(st.num_preemptions));
    std::printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s (%.2f s)\n", rps, total_tps,
                out_tps, secs);
  }
  return 0;
}

}  // namespace

CommandRunner add_bench_throughput_command(CLI::App& bench) {
  auto o = std::make_shared<ThroughputOptions>();
  CLI::App* cmd = bench.add_subcommand("throughput", "Offline throughput of the engine (all requests queued at once)");
  add_engine_flags(cmd, o->engine);
  cmd->add_option("--num-prompts", o->num_prompts, "Requests to run")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--input-len", o->input_len, "Prompt tokens per request (random prompts)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--output-len", o->output_len, "Generated tokens per request (EOS ignored)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--dataset", o->dataset, "JSONL file of {\"prompt\": ..., \"output_len\": ...} instead of random prompts");
  cmd->add_option("--seed", o->seed, "Seed for random prompts and sampling")->capture_default_str();
  cmd->add_flag("--json", o->json, "Print {\"requests_per_s\", \"output_tokens_per_s\", \"total_tokens_per_s\", ...}");
  return [o] { return run_throughput(*o); };
}

}  // namespace vesper::cli
