// `vesper bench throughput MODEL --num-prompts N --input-len I --output-len O | --dataset F.jsonl`:
// offline throughput as vLLM's benchmark_throughput measures it: all requests are queued at
// once and run to completion; requests/s, output tokens/s and total tokens/s over the run.
//
// Prefix-caching workloads:
//  - `--prefix-len P --num-prefixes K`: every random prompt starts with one of K shared random
//    prefixes of P tokens (a system prompt, a few-shot block, a document), then I own tokens.
//  - `--num-turns T`: N conversations of T turns each; turn k+1's prompt is turn k's prompt,
//    its answer and I new tokens (a chat whose history grows). A conversation's next turn is
//    queued when its previous turn finishes; conversations run concurrently.
// Time to first token (queueing included, from when the request was added) is reported too.
#include <algorithm>
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
  int64_t prefix_len = 0;
  int64_t num_prefixes = 1;
  int64_t num_turns = 1;
  uint64_t seed = 0;
  bool json = false;
};

struct BenchRequest {
  std::vector<int32_t> prompt;
  int64_t output_len;
};

// Token ids drawn uniformly from the vocabulary, avoiding control tokens so that every prompt
// is ordinary text (vLLM's "random" dataset).
class RandomTokens {
 public:
  RandomTokens(const tokenizer::Tokenizer& tok, uint64_t seed) : rng_(seed) {
    for (int32_t id = 0; id < tok.n_vocab(); ++id)
      if ((tok.token_attr(id) & tokenizer::kAttrControl) == 0) usable_.push_back(id);
  }
  void append(std::vector<int32_t>& out, int64_t n) {
    for (int64_t k = 0; k < n; ++k) out.push_back(usable_[rng_() % usable_.size()]);
  }

 private:
  std::mt19937_64 rng_;
  std::vector<int32_t> usable_;
};

// Random prompts; with --prefix-len, each starts with one of --num-prefixes shared prefixes.
std::vector<BenchRequest> random_requests(const engine::Engine& e, const ThroughputOptions& o) {
  const auto& tok = e.tokenizer();
  RandomTokens random(tok, o.seed);
  std::vector<std::vector<int32_t>> prefixes(o.prefix_len > 0 ? o.num_prefixes : 1);
  for (auto& p : prefixes) {
    if (auto bos = tok.bos_id(); bos && tok.add_bos()) p.push_back(*bos);
    random.append(p, o.prefix_len);
  }
  std::vector<BenchRequest> reqs;
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    BenchRequest r;
    r.prompt = prefixes[i % static_cast<int64_t>(prefixes.size())];
    // --input-len counts the BOS token of a plain prompt, as before; a prefix comes on top.
    const int64_t target =
        o.prefix_len > 0 ? static_cast<int64_t>(r.prompt.size()) + o.input_len : o.input_len;
    random.append(r.prompt, std::max<int64_t>(0, target - static_cast<int64_t>(r.prompt.size())));
    r.output_len = o.output_len;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// Time to first token of each request, in seconds (mean, median, p99).
struct TtftSummary {
  double mean = 0, median = 0, p99 = 0;
};

TtftSummary summarize(std::vector<double> v) {
  TtftSummary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  s.median = v[v.size() / 2];
  s.p99 = v[std::min(v.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(v.size())))];
  return s;
}

// JSONL: {"prompt": "...", "output_len": N} per line (output_len defaults to --output-len).
Result<std::vector<BenchRequest>> dataset_requests(const engine::Engine& e,
                                                   const ThroughputOptions& o) {
  std::ifstream f(o.dataset);
  if (!f) return make_error(o.dataset + ": cannot open the dataset");
  std::vector<BenchRequest> reqs;
  std::string line;
  for (size_t n = 1; std::getline(f, line) && static_cast<int64_t>(reqs.size()) < o.num_prompts;
       ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      return make_error(o.dataset + ":" + std::to_string(n) +
                        ": expected {\"prompt\": string, \"output_len\": integer}");
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
  if (const std::optional<int> rc = run_if_follower(*config)) return *rc;
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
  const int64_t total_requests = static_cast<int64_t>(reqs.size()) * o.num_turns;
  std::vector<int64_t> turn(reqs.size(), 0);  // per conversation: turns queued so far
  RandomTokens turn_tokens(e.tokenizer(), o.seed ^ 0x5eedull);  // new user messages of later turns
  auto submit = [&](size_t conv) -> Status {
    sample::SamplingParams p;
    p.temperature = 1.0f;
    p.seed = o.seed + conv * 1000003 + static_cast<uint64_t>(turn[conv]);
    p.ignore_eos = true;  // exact output lengths, as vLLM's benchmark does
    p.max_tokens = reqs[conv].output_len;
    prompt_tokens += static_cast<int64_t>(reqs[conv].prompt.size());
    const std::string id = std::to_string(conv) + ":" + std::to_string(turn[conv]++);
    if (auto st = e.add_request({id, reqs[conv].prompt, p}); !st)
      return make_error("request " + id + ": " + st.error().message);
    return {};
  };
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < reqs.size(); ++i)
    if (auto st = submit(i); !st) return fail(st.error().message);
  ProgressBar progress("bench throughput", total_requests);
  int64_t finished = 0;
  std::vector<double> ttfts;
  while (e.has_unfinished()) {
    for (const auto& out : e.step()) {
      for (const auto& c : out.outputs)
        output_tokens += static_cast<int64_t>(c.delta_token_ids.size());
      if (!out.finished) continue;
      ++finished;
      ttfts.push_back(out.metrics.first_token_time - out.metrics.arrival_time);
      const size_t conv = std::stoul(out.request_id.substr(0, out.request_id.find(':')));
      if (turn[conv] >= o.num_turns) continue;
      // The next turn: the history so far (prompt and answer) and a new user message.
      auto& prompt = reqs[conv].prompt;
      const auto& answer = out.outputs[0].token_ids;
      prompt.insert(prompt.end(), answer.begin(), answer.end());
      turn_tokens.append(prompt, o.input_len);
      if (auto st = submit(conv); !st) return fail(st.error().message);
    }
    progress.update(finished, output_tokens);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const engine::EngineStats st = e.stats();
  const TtftSummary ttft = summarize(ttfts);
  const double hit_rate = st.prefix_cache_queries ? static_cast<double>(st.prefix_cache_hits) /
                                                        static_cast<double>(st.prefix_cache_queries)
                                                  : 0.0;
  const double rps = static_cast<double>(total_requests) / secs;
  const double out_tps = static_cast<double>(output_tokens) / secs;
  const double total_tps = static_cast<double>(prompt_tokens + output_tokens) / secs;
  // Speculative decoding: the share of proposals kept, and the tokens a verified sequence gained
  // per target pass (its kept proposals and the target's own token).
  const double acceptance = st.spec_num_draft_tokens
                                ? static_cast<double>(st.spec_num_accepted_tokens) /
                                      static_cast<double>(st.spec_num_draft_tokens)
                                : 0.0;
  const double per_pass = st.spec_num_drafts
                              ? 1.0 + static_cast<double>(st.spec_num_accepted_tokens) /
                                          static_cast<double>(st.spec_num_drafts)
                              : 1.0;
  if (o.json) {
    nlohmann::json j = {{"requests_per_s", rps},
                        {"output_tokens_per_s", out_tps},
                        {"total_tokens_per_s", total_tps},
                        {"num_requests", total_requests},
                        {"mean_ttft_ms", ttft.mean * 1e3},
                        {"median_ttft_ms", ttft.median * 1e3},
                        {"p99_ttft_ms", ttft.p99 * 1e3},
                        {"prefill_tokens_computed", st.prefill_tokens_computed},
                        {"prefix_cache_hit_rate", hit_rate},
                        {"prefix_caching", o.engine.enable_prefix_caching},
                        {"prompt_tokens", prompt_tokens},
                        {"output_tokens", output_tokens},
                        {"elapsed_s", secs},
                        {"num_steps", st.num_steps},
                        {"num_preemptions", st.num_preemptions},
                        {"max_num_batched_tokens", e.scheduler_config().max_num_batched_tokens},
                        {"max_num_seqs", e.scheduler_config().max_num_seqs},
                        {"kv_cache", kv_cache_json(e.memory_plan())},
                        {"step_phases", step_phases_json(st)}};
    if (o.engine.speculating())
      j["speculative"] = {{"acceptance_rate", acceptance},
                          {"draft_tokens", st.spec_num_draft_tokens},
                          {"accepted_tokens", st.spec_num_accepted_tokens},
                          {"verifications", st.spec_num_drafts},
                          {"tokens_per_target_pass", per_pass}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    const auto& sc = e.scheduler_config();
    std::printf(
        "scheduler: max-num-batched-tokens %lld, max-num-seqs %lld, max-model-len %lld, chunked "
        "prefill %s, "
        "KV blocks %lld x %lld tokens (%s, %lld bytes/token)\n",
        static_cast<long long>(sc.max_num_batched_tokens), static_cast<long long>(sc.max_num_seqs),
        static_cast<long long>(sc.max_model_len), sc.enable_chunked_prefill ? "on" : "off",
        static_cast<long long>(e.memory_plan().num_blocks),
        static_cast<long long>(e.memory_plan().block_size), e.memory_plan().kv_dtype.c_str(),
        static_cast<long long>(e.memory_plan().bytes_per_token));
    std::printf(
        "requests: %lld, prompt tokens: %lld, output tokens: %lld, steps: %lld, preemptions: "
        "%lld\n",
        static_cast<long long>(total_requests), static_cast<long long>(prompt_tokens),
        static_cast<long long>(output_tokens), static_cast<long long>(st.num_steps),
        static_cast<long long>(st.num_preemptions));
    std::printf(
        "prefix cache: %s, hit rate %.1f%%, prefill tokens computed %lld of %lld prompt tokens\n",
        o.engine.enable_prefix_caching ? "on" : "off", 100.0 * hit_rate,
        static_cast<long long>(st.prefill_tokens_computed), static_cast<long long>(prompt_tokens));
    std::printf("TTFT (from queueing): mean %.1f ms, median %.1f ms, p99 %.1f ms\n",
                ttft.mean * 1e3, ttft.median * 1e3, ttft.p99 * 1e3);
    std::printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s (%.2f s)\n",
                rps, total_tps, out_tps, secs);
    std::string phases;
    for (int i = 0; i < engine::kNumStepPhases; ++i) {
      const auto phase = static_cast<engine::StepPhase>(i);
      char part[64];
      std::snprintf(
          part, sizeof part, "%s%s %.3f", i ? ", " : "",
          std::string(engine::step_phase_name(phase)).c_str(),
          st.num_steps ? 1e3 * st.phase_seconds[phase] / static_cast<double>(st.num_steps) : 0.0);
      phases += part;
    }
    std::printf("step phases (ms per step): %s\n", phases.c_str());
    if (o.engine.speculating())
      std::printf(
          "speculative: acceptance rate %.3f (%lld of %lld proposals), %.2f tokens per target "
          "pass\n",
          acceptance, static_cast<long long>(st.spec_num_accepted_tokens),
          static_cast<long long>(st.spec_num_draft_tokens), per_pass);
  }
  return 0;
}

}  // namespace

CommandRunner add_bench_throughput_command(CLI::App& bench) {
  auto o = std::make_shared<ThroughputOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "throughput", "Offline throughput of the engine (all requests queued at once)");
  add_engine_flags(cmd, o->engine);
  cmd->add_option("--num-prompts", o->num_prompts, "Requests to run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--input-len", o->input_len, "Prompt tokens per request (random prompts)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--output-len", o->output_len, "Generated tokens per request (EOS ignored)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dataset", o->dataset,
                  "JSONL file of {\"prompt\": ..., \"output_len\": ...} instead of random prompts");
  cmd->add_option(
         "--prefix-len", o->prefix_len,
         "Shared-prefix workload: random prompts start with one of --num-prefixes prefixes of this "
         "many tokens, followed by --input-len tokens of their own")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--num-prefixes", o->num_prefixes, "Distinct shared prefixes (with --prefix-len)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--num-turns", o->num_turns,
                  "Multi-turn chat workload: each of --num-prompts conversations runs this many "
                  "turns; a turn's "
                  "prompt is the previous prompt, its answer and --input-len new tokens")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", o->seed, "Seed for random prompts and sampling")->capture_default_str();
  cmd->add_flag("--json", o->json,
                "Print {\"requests_per_s\", \"output_tokens_per_s\", \"total_tokens_per_s\", ...}");
  return [o] { return run_throughput(*o); };
}

}  // namespace vesper::cli
