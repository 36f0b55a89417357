// `vesper bench latency MODEL [--n-prompt 512] [--n-gen 128] [--decode-seqs 8,32] [--repetitions
// R]`: the kernel-level speeds that llama-bench reports, measured through the Engine so that they
// are what a user gets: prompt processing (ppN: one N-token prompt prefilled in one step) and
// single-stream generation (tgN: N decode steps of one sequence, EOS ignored), plus batched
// decoding (N sequences advanced together, total generated tokens/s) for the comparison with
// llama.cpp in bench/compare-llamacpp. Each figure is the median of the repetitions, after one
// untimed warm-up run of each test (page faults on the mmap'd weights, first-call allocations;
// the decode tests' warm-up is 8 steps), once the KV cache is resident.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/bench_commands.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "dist/communicator.h"
#include "engine/engine.h"

namespace vesper::cli {
namespace {

struct LatencyOptions {
  EngineFlags engine;
  int64_t n_prompt = 512;
  int64_t n_gen = 128;
  std::vector<int64_t> decode_seqs;
  int64_t repetitions = 5;
  uint64_t seed = 0;
  std::string prompt;   // --prompt: the tg tests start from this text instead of one random token
  int64_t n_depth = 0;  // -d: the tg tests start after a random prompt of this many tokens
  bool shared_prompt = false;  // --shared-prompt: the tg tests' sequences share one prompt
  bool json = false;
  bool budget_set = false;  // --max-num-batched-tokens given on the command line
  bool seqs_set = false;    // --max-num-seqs given on the command line
};

using Clock = std::chrono::steady_clock;

// Random prompt tokens, as llama-bench uses: uniform over the vocabulary minus control tokens
// (so that no token ends or restructures the text), starting with BOS when the model adds one.
class TokenSource {
 public:
  TokenSource(const tokenizer::Tokenizer& tok, uint64_t seed) : rng_(seed) {
    for (int32_t id = 0; id < tok.n_vocab(); ++id)
      if ((tok.token_attr(id) & tokenizer::kAttrControl) == 0) usable_.push_back(id);
    if (auto bos = tok.bos_id(); bos && tok.add_bos()) bos_ = *bos;
  }
  std::vector<int32_t> prompt(int64_t n) {
    std::vector<int32_t> p;
    if (bos_ >= 0) p.push_back(bos_);
    while (static_cast<int64_t>(p.size()) < n) p.push_back(usable_[rng_() % usable_.size()]);
    return p;
  }

 private:
  std::mt19937_64 rng_;
  std::vector<int32_t> usable_;
  int32_t bos_ = -1;
};

sample::SamplingParams greedy_params(int64_t max_tokens) {
  sample::SamplingParams p;
  p.temperature = 0.0f;  // argmax: the cheapest sampler, so the figures are the forward pass
  p.ignore_eos = true;   // exact lengths, as llama-bench's tg test
  p.max_tokens = max_tokens;
  return p;
}

// Prefills one n_prompt-token prompt in one engine step and returns prompt tokens/s. The
// request asks for one token, so it ends with that step.
Result<double> run_prefill(engine::Engine& e, TokenSource& tokens, int64_t n_prompt, int64_t run) {
  const std::string id = "pp" + std::to_string(run);
  if (auto st = e.add_request({id, tokens.prompt(n_prompt), greedy_params(1)}); !st)
    return make_error("--n-prompt " + std::to_string(n_prompt) + ": " + st.error().message);
  const engine::EngineStats before = e.stats();
  const int64_t preemptions = before.num_preemptions;
  // Until the sequence sampled its one token and left the scheduler: one step, or (async
  // scheduling) the step that planned it and the one that took its result; a pipeline's P virtual
  // engines take turns (up to P - 1 steps before its set's), and a plan's result comes P steps
  // after it.
  const int64_t sets = e.scheduler_config().virtual_engines;
  const auto start = Clock::now();
  e.step();
  for (int64_t calls = 1; calls < 1 + 2 * sets && e.phase(id) != engine::Engine::Phase::kUnknown;
       ++calls)
    e.step();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  // Prefilled in one step: one plan computed the whole prompt. Its output may come a step later
  // (asynchronous output processing).
  const bool prefilled =
      e.phase(id) == engine::Engine::Phase::kUnknown && e.stats().num_steps == before.num_steps + 1;
  while (prefilled && e.has_unfinished()) e.step();
  if (!prefilled) {
    e.abort(id);
    return make_error(
        "the " + std::to_string(n_prompt) +
        "-token prompt was not prefilled in one step; raise --max-num-batched-tokens or "
        "--kv-cache-memory");
  }
  if (e.stats().num_preemptions != preemptions)
    return make_error("the prompt was preempted (KV cache too small); raise --kv-cache-memory");
  return static_cast<double>(n_prompt) / secs;
}

// Starts n_seqs sequences from `prompt` (or a random prompt of `depth` tokens, at least one, each
// its own; prefilled together in an untimed first step; with `shared`, `prompt` is first prefilled
// by a request of its own, untimed, and the sequences find it in the prefix cache, computing only
// its last partial block), takes one untimed decode step, then
// times the decode steps that generate n_gen more tokens each: n_gen steps, or fewer with
// speculative decoding. The untimed decode step holds the work that follows a prompt once: a KIVI
// cache quantizes the prompt's groups older than the residual window there (for a 1,024-token
// prompt, more than the n_gen steps' attention reads). Returns generated tokens/s over all
// sequences; counts the steps, and leaves the engine's counters as the timed steps began in
// `timed_from` (speculation's figures are of the timed steps).
Result<double> run_decode(engine::Engine& e, TokenSource& tokens,
                          const std::vector<int32_t>& prompt, bool shared, int64_t depth,
                          int64_t n_seqs, int64_t n_gen, int64_t run, int64_t& timed_steps,
                          engine::EngineStats& timed_from) {
  const std::string prefix = "tg" + std::to_string(run) + "-";
  if (shared) {
    if (auto st = e.add_request({prefix + "prompt", prompt, greedy_params(1)}); !st)
      return make_error("--shared-prompt: " + st.error().message);
    while (e.has_unfinished()) e.step();
  }
  for (int64_t s = 0; s < n_seqs; ++s)
    if (auto st =
            e.add_request({prefix + std::to_string(s),
                           prompt.empty() ? tokens.prompt(std::max<int64_t>(depth, 1)) : prompt,
                           greedy_params(n_gen + 2)});
        !st)
      return make_error((depth > 0 ? "--n-depth " + std::to_string(depth) + " / " : "") +
                        "--n-gen " + std::to_string(n_gen) + ": " + st.error().message);
  const engine::EngineStats at_start = e.stats();
  const int64_t preemptions = at_start.num_preemptions;
  // Outputs may come a step after their tokens (asynchronous output processing), and a plan's
  // results a step after it was made (async scheduling): what the steps committed is read from
  // the scheduler and the passes run, what was delivered is checked at the end.
  int64_t delivered = 0;
  auto deliver = [&](const std::vector<engine::RequestOutput>& outs) {
    for (const auto& out : outs)
      for (const auto& c : out.outputs) delivered += static_cast<int64_t>(c.delta_token_ids.size());
  };
  // One step, or one per virtual engine (each plan takes its set's sequences; a set without any
  // plans nothing).
  const int64_t sets = std::min(e.scheduler_config().virtual_engines, n_seqs);
  for (int64_t i = 0; i < e.scheduler_config().virtual_engines; ++i) deliver(e.step());
  bool started = e.stats().num_steps == at_start.num_steps + sets;
  for (int64_t s = 0; s < n_seqs; ++s)
    started = started && e.phase(prefix + std::to_string(s)) == engine::Engine::Phase::kDecoding;
  if (!started) {
    for (int64_t s = 0; s < n_seqs; ++s) e.abort(prefix + std::to_string(s));
    return make_error(std::to_string(n_seqs) +
                      " sequences did not start in one step; raise --max-num-seqs or "
                      "--max-num-batched-tokens");
  }
  // Untimed: until the prompts' pass and one decode pass (one token each, or more when
  // speculating) have run.
  while (e.stats().num_passes < at_start.num_passes + 2 * sets && e.has_unfinished())
    deliver(e.step());
  int64_t committed = 0;
  e.scheduler().for_each_sequence(
      [&](const sched::Sequence& seq) { committed += seq.num_output_tokens(); });
  timed_from = e.stats();
  const auto start = Clock::now();
  while (e.has_unfinished()) deliver(e.step());
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  const int64_t generated = n_seqs * (n_gen + 2) - committed;
  // Target passes (a multi-step plan runs several).
  const int64_t steps = e.stats().num_passes - timed_from.num_passes;
  const bool speculative = e.stats().spec_num_drafts > 0;
  // Each pass samples one token per sequence (of its set) without speculation: the prompts'
  // pass, then n_gen + 1.
  const int64_t passes = e.stats().num_passes - at_start.num_passes;
  if (e.stats().num_preemptions != preemptions || (!speculative && passes != sets * (n_gen + 2)) ||
      delivered != n_seqs * (n_gen + 2))
    return make_error("decoding " + std::to_string(n_seqs) + " sequences took " +
                      std::to_string(passes) + " passes instead of " +
                      std::to_string(sets * (n_gen + 2)) +
                      " (preempted: KV cache too small); raise --kv-cache-memory");
  timed_steps += steps;
  return static_cast<double>(generated) / secs;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Test {
  std::string name;  // llama-bench's: pp512, tg128; batched decoding: tg128_seqs8
  int64_t n_prompt = 0;
  int64_t n_seqs = 0;  // decode tests
  std::vector<double> samples;
  // Speculative decoding over the timed runs: proposals verified and accepted, and target
  // passes (steps) against tokens generated per sequence.
  int64_t draft_tokens = 0, accepted_tokens = 0, steps = 0, generated_per_seq = 0;
  // Tensor parallelism: what rank 0's collectives moved over the timed runs, and their passes.
  dist::Communicator::Traffic traffic = {};
  int64_t passes = 0;

  double acceptance_rate() const {
    return draft_tokens ? static_cast<double>(accepted_tokens) / draft_tokens : 0;
  }
  // Tokens each sequence gained per pass of the target model (1 without speculation).
  double tokens_per_pass() const {
    return steps ? static_cast<double>(generated_per_seq) / steps : 0;
  }
  // Tokens proposed per sequence per target pass: the k in use, averaged (with
  // --num-speculative-tokens auto, the k the engine picked; 0 on the steps it did not speculate).
  double proposals_per_pass() const {
    return steps ? static_cast<double>(draft_tokens) / static_cast<double>(steps) /
                       static_cast<double>(std::max<int64_t>(n_seqs, 1))
                 : 0;
  }
};

int run_latency(LatencyOptions& o) {
  if (o.n_prompt == 0 && o.n_gen == 0)
    return fail("--n-prompt and --n-gen are both 0: nothing to measure");
  if (!o.decode_seqs.empty() && o.n_gen == 0) return fail("--decode-seqs needs --n-gen > 0");
  int64_t max_seqs = 1;
  for (int64_t n : o.decode_seqs) max_seqs = std::max(max_seqs, n);
  // The prompt must be one batch (as llama-bench's pp test with n_batch = n_ubatch >= n_prompt),
  // so the default token budget grows with --n-prompt; an explicit smaller one is an error.
  // Likewise the tg tests' prompts (-d tokens each, all sequences at once).
  if (o.n_depth > 0 && !o.prompt.empty()) return fail("--n-depth and --prompt exclude each other");
  if (o.shared_prompt && o.n_depth == 0 && o.prompt.empty())
    return fail("--shared-prompt needs --n-depth or --prompt (the prompt the sequences share)");
  if (o.shared_prompt && !o.engine.enable_prefix_caching)
    return fail("--shared-prompt needs prefix caching: drop --no-enable-prefix-caching");
  // A shared prompt is prefilled once, by a request of its own.
  const int64_t tg_tokens = (o.shared_prompt ? 1 : max_seqs) * std::max<int64_t>(o.n_depth, 1);
  if (o.budget_set && o.engine.max_num_batched_tokens < std::max(o.n_prompt, tg_tokens))
    return fail("--max-num-batched-tokens " + std::to_string(o.engine.max_num_batched_tokens) +
                " is below --n-prompt / --decode-seqs x --n-depth (" +
                std::to_string(std::max(o.n_prompt, tg_tokens)) +
                "): the prompt must be prefilled in one step");
  o.engine.max_num_batched_tokens =
      std::max({o.engine.max_num_batched_tokens, o.n_prompt, tg_tokens});
  if (o.seqs_set && o.engine.max_num_seqs < max_seqs)
    return fail("--max-num-seqs " + std::to_string(o.engine.max_num_seqs) +
                " is below --decode-seqs " + std::to_string(max_seqs));
  o.engine.max_num_seqs = std::max(o.engine.max_num_seqs, max_seqs);
  auto config = to_engine_config(o.engine);
  if (!config) return fail(config.error().message);
  if (const std::optional<int> rc = run_if_follower(*config)) return *rc;
  auto created = engine::Engine::create(*config);
  if (!created) return fail(created.error().message);
  engine::Engine& e = **created;
  // No test times a block's first write (a page fault and the page's clearing, which some hosts
  // make slow): llama-bench's context has its KV buffer cleared, and so touched, when created.
  e.wait_kv_resident();
  TokenSource tokens(e.tokenizer(), o.seed);
  // --shared-prompt with --n-depth: one random prompt for every run (after the first, its blocks
  // are usually still in the prefix cache).
  const std::vector<int32_t> prompt = !o.prompt.empty()
                                          ? e.tokenizer().encode(o.prompt, true, false)
                                      : o.shared_prompt ? tokens.prompt(o.n_depth)
                                                        : std::vector<int32_t>{};

  // Rank 0's collectives so far (nothing in one process).
  auto traffic_now = [group = config->parallel.group] {
    return group != nullptr ? group->traffic() : dist::Communicator::Traffic{};
  };
  std::vector<Test> tests;
  if (o.n_prompt > 0) tests.push_back({"pp" + std::to_string(o.n_prompt), o.n_prompt, 0, {}});
  if (o.n_gen > 0) {
    // llama-bench's "@ dD" suffix, spelled _dD.
    const std::string depth = o.n_depth > 0 ? "_d" + std::to_string(o.n_depth) : "";
    tests.push_back({"tg" + std::to_string(o.n_gen) + depth, 0, 1, {}});
    for (int64_t n : o.decode_seqs)
      tests.push_back(
          {"tg" + std::to_string(o.n_gen) + "_seqs" + std::to_string(n) + depth, 0, n, {}});
  }
  int64_t run = 0;
  for (Test& t : tests) {
    // Run 0 is the warm-up; runs 1..R are timed. A decode test's warm-up is a few steps: they
    // touch every weight as N steps would, at a fraction of the time.
    for (int64_t r = 0; r <= o.repetitions; ++r) {
      const int64_t n_gen = r == 0 ? std::min<int64_t>(o.n_gen, 8) : o.n_gen;
      engine::EngineStats before = e.stats();
      const dist::Communicator::Traffic traffic_before = traffic_now();
      int64_t steps = 0;
      auto rate = t.n_prompt > 0 ? run_prefill(e, tokens, t.n_prompt, run++)
                                 : run_decode(e, tokens, prompt, o.shared_prompt, o.n_depth,
                                              t.n_seqs, n_gen, run++, steps, before);
      if (!rate) return fail(t.name + ": " + rate.error().message);
      if (!std::isfinite(*rate) || *rate <= 0) return fail(t.name + ": the timer measured no time");
      if (r > 0) {
        t.samples.push_back(*rate);
        const engine::EngineStats after = e.stats();
        t.draft_tokens += after.spec_num_draft_tokens - before.spec_num_draft_tokens;
        t.accepted_tokens += after.spec_num_accepted_tokens - before.spec_num_accepted_tokens;
        t.steps += steps;
        t.generated_per_seq += n_gen;
        const dist::Communicator::Traffic traffic_after = traffic_now();
        t.traffic.calls += traffic_after.calls - traffic_before.calls;
        t.traffic.bytes += traffic_after.bytes - traffic_before.bytes;
        t.traffic.seconds += traffic_after.seconds - traffic_before.seconds;
        t.passes += after.num_passes - before.num_passes;
      }
    }
    if (!o.json) std::fprintf(stderr, "bench latency: %s done\n", t.name.c_str());
  }

  const int threads = o.engine.threads > 0 ? o.engine.threads : ThreadPool::hardware_threads();
  const bool speculating = o.engine.speculating();
  if (o.json) {
    nlohmann::json j = {{"model", o.engine.model_path},
                        {"threads", threads},
                        {"repetitions", o.repetitions},
                        {"kv_cache", kv_cache_json(e.memory_plan())}};
    // Prompt tokens looked up in the prefix cache and found there, over every run (warm-ups
    // included): a shared prompt is found once per sequence.
    j["prefix_cache"] = {{"queries", e.stats().prefix_cache_queries},
                         {"hits", e.stats().prefix_cache_hits}};
    for (const Test& t : tests) {
      j[t.name + "_tokens_per_s"] = median(t.samples);
      j["samples"][t.name] = t.samples;
      if (config->parallel.group != nullptr && t.passes > 0) {
        const double passes = static_cast<double>(t.passes);
        j["tensor_parallel"][t.name] = {
            {"collectives_per_pass", static_cast<double>(t.traffic.calls) / passes},
            {"bytes_per_pass", static_cast<double>(t.traffic.bytes) / passes},
            {"collective_seconds_per_pass", t.traffic.seconds / passes}};
      }
      if (speculating && t.n_prompt == 0)
        j["speculative"][t.name] = {{"acceptance_rate", t.acceptance_rate()},
                                    {"tokens_per_target_pass", t.tokens_per_pass()},
                                    {"proposals_per_pass", t.proposals_per_pass()},
                                    {"draft_tokens", t.draft_tokens},
                                    {"accepted_tokens", t.accepted_tokens}};
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model: %s, threads: %d, median of %lld repetitions\n", o.engine.model_path.c_str(),
              threads, static_cast<long long>(o.repetitions));
  std::printf("| %-16s | %5s | %14s | %21s |\n", "test", "seqs", "tokens/s", "min .. max");
  std::printf("| %-16s | %5s | %14s | %21s |\n", "---", "---", "---", "---");
  for (const Test& t : tests) {
    const auto [lo, hi] = std::minmax_element(t.samples.begin(), t.samples.end());
    std::printf("| %-16s | %5lld | %14.2f | %9.2f .. %9.2f |\n", t.name.c_str(),
                static_cast<long long>(std::max<int64_t>(t.n_seqs, 1)), median(t.samples), *lo,
                *hi);
  }
  for (const Test& t : tests)
    if (config->parallel.group != nullptr && t.passes > 0) {
      const double passes = static_cast<double>(t.passes);
      std::printf("%s: rank 0's collectives per pass: %.1f, %.3f MB moved, %.3f ms\n",
                  t.name.c_str(), static_cast<double>(t.traffic.calls) / passes,
                  static_cast<double>(t.traffic.bytes) / passes / 1e6,
                  t.traffic.seconds / passes * 1e3);
    }
  for (const Test& t : tests)
    if (speculating && t.n_prompt == 0)
      std::printf(
          "%s speculative: %.2f proposals per sequence per pass, acceptance rate %.3f (%lld of "
          "%lld proposals), %.2f tokens per target pass\n",
          t.name.c_str(), t.proposals_per_pass(), t.acceptance_rate(),
          static_cast<long long>(t.accepted_tokens), static_cast<long long>(t.draft_tokens),
          t.tokens_per_pass());
  return 0;
}

}  // namespace

CommandRunner add_bench_latency_command(CLI::App& bench) {
  auto o = std::make_shared<LatencyOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "latency",
      "Prompt processing and generation speed (llama-bench's pp/tg tests) through the engine");
  cmd->footer(
      "Tests (each: an untimed warm-up run, 8 steps for tg tests, then the median of --repetitions "
      "runs):\n"
      "  ppN            one N-token random prompt (--n-prompt) prefilled in one engine step: "
      "prompt tokens/s\n"
      "  tgN            one sequence, N decode steps (--n-gen) after a 1-token prompt, EOS "
      "ignored:\n"
      "                 generated tokens/s over the decode steps only (the first decode step "
      "after the\n"
      "                 prompt is not timed: it holds one-off work, such as KIVI quantizing the "
      "prompt)\n"
      "  tgN_seqsS      S sequences (--decode-seqs) decoding together, one token each per step:\n"
      "                 total generated tokens/s\n"
      "  tgN_dD         with -d D: the tg tests after a random D-token prompt per sequence "
      "(tgN_seqsS_dD)\n"
      "With speculative decoding (--speculative-model) each tg test also reports its acceptance "
      "rate and the\n"
      "tokens each sequence gains per target pass.\n"
      "--json prints {\"pp512_tokens_per_s\": ..., \"tg128_tokens_per_s\": ..., "
      "\"tg128_seqs8_tokens_per_s\": ...,\n"
      "\"samples\": {test: [tokens/s per repetition]}, ...}. --n-prompt 0 or --n-gen 0 skips those "
      "tests.");
  add_engine_flags(cmd, o->engine);
  cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt tokens of the pp test (0: skip it)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("-n,--n-gen", o->n_gen, "Decode steps of the tg tests (0: skip them)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("-d,--n-depth", o->n_depth,
                  "The tg tests start after a random prompt of this many tokens, prefilled "
                  "untimed (llama-bench's -d): decoding at that context length")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--shared-prompt", o->shared_prompt,
                "The tg tests' sequences share one prompt (of --n-depth random tokens, or "
                "--prompt), prefilled once, untimed, and found in the prefix cache "
                "(llama-batched-bench's -pps): decoding many sequences at a long context without "
                "prefilling each");
  cmd->add_option("--decode-seqs", o->decode_seqs,
                  "Also measure batched decoding with this many sequences at once (comma-separated "
                  "list, e.g. 8,32)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  cmd->add_option("-r,--repetitions", o->repetitions,
                  "Timed runs of each test (the median is reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", o->seed, "Seed for the random prompt tokens")->capture_default_str();
  cmd->add_option(
      "--prompt", o->prompt,
      "Start the tg tests from this text instead of one random token (speculative decoding "
      "needs real text to propose from)");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  CLI::Option* budget = cmd->get_option("--max-num-batched-tokens");
  CLI::Option* seqs = cmd->get_option("--max-num-seqs");
  return [o, budget, seqs] {
    o->budget_set = budget->count() > 0;
    o->seqs_set = seqs->count() > 0;
    return run_latency(*o);
  };
}

}  // namespace vesper::cli
