// llama_bench_driver: llama.cpp's side of bench/compare-llamacpp. It measures what
// `vesper bench latency` measures, the way llama-bench and llama-batched-bench do, with the
// prebuilt CPU libraries of node-llama-cpp (built by setup.sh):
//
//   ppN        one N-token prompt of random tokens in one llama_decode (n_batch = n_ubatch >= N),
//              as llama-bench's pp test: prompt tokens/s
//   tgN        one sequence: one untimed token at position 0, then N timed llama_decode calls of
//              one token each (positions 1..N): generated tokens/s. llama-bench also times the
//              token at position 0; it is left out here because Vesper's engine prefills it.
//   tgN_seqsS  S sequences in one context (seq_ids 0..S-1, one KV stream each, as
//              llama-batched-bench without -kvu), advanced together: one llama_batch of S tokens
//              per step, logits for every token; one untimed step at position 0, then N timed
//              steps: total generated tokens/s
//
// Tokens are random (llama-bench's choice: the figures must not depend on the text), and the
// KV cache is cleared before each run. Each test runs once untimed (warm-up: page faults on the
// mmap'd weights, graph allocation), then --repetitions times; the median is reported. A
// persistent ggml threadpool is attached to every context, as llama-bench does. Flash attention
// and the F16 K/V cache are llama.cpp's defaults (llama-bench's too).
//
// Usage: see usage() below.

#include "cpu_backend.h"
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

void usage(const char* argv0) {
  std::fprintf(
      stderr,
      "usage: %s MODEL.gguf [options]\n"
      "\n"
      "llama.cpp prompt-processing and generation speed, as `vesper bench latency` measures "
      "Vesper's.\n"
      "\n"
      "options:\n"
      "  -t, --threads T        CPU threads (default 1), with a persistent ggml threadpool\n"
      "  -p, --n-prompt N       prompt tokens of the pp test; 0 skips it (default 512)\n"
      "  -n, --n-gen N          decode steps of the tg tests; 0 skips them (default 128)\n"
      "  --decode-seqs S[,S..]  also measure S sequences decoding together (e.g. 8,32)\n"
      "  -r, --repetitions R    timed runs per test; the median is reported (default 5)\n"
      "  --seed N               seed of the random tokens (default 0)\n"
      "  --flash-attn on|off|auto   (default auto, llama.cpp's default)\n"
      "  -ctk, --cache-type-k T  KV cache type of keys: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,\n"
      "                         q5_1, iq4_nl (default f16, llama.cpp's)\n"
      "  -ctv, --cache-type-v T  the same for values\n"
      "  -d, --n-depth D        the tg tests start after a random D-token prompt per sequence,\n"
      "                         prefilled untimed (llama-bench's -d)\n"
      "  --cpu-variant NAME     force a libggml-cpu-NAME.so (default: the best this CPU runs)\n"
      "  --json                 print one JSON object: {\"pp512_tokens_per_s\": ..., "
      "\"tg128_tokens_per_s\": ...,\n"
      "                         \"tg128_seqs8_tokens_per_s\": ..., \"samples\": {...}, "
      "\"cpu_variant\": ...}\n"
      "  --verbose              llama.cpp's log and the CPU variants' scores\n",
      argv0);
}

bool g_verbose = false;

void log_cb(enum ggml_log_level level, const char* text, void* /*user*/) {
  if (g_verbose || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

[[noreturn]] void die(const char* fmt, ...) {
  std::fputs("llama_bench_driver: error: ", stderr);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
  std::exit(1);
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Options {
  std::string model_path;
  int threads = 1;
  int n_prompt = 512;
  int n_gen = 128;
  std::vector<int> decode_seqs;
  int repetitions = 5;
  unsigned seed = 0;
  llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO;
  ggml_type type_k = GGML_TYPE_F16;
  ggml_type type_v = GGML_TYPE_F16;
  int n_depth = 0;
  std::string cpu_variant;
  bool json = false;
};

ggml_type parse_cache_type(const std::string& flag, const std::string& v) {
  const std::pair<const char*, ggml_type> types[] = {
      {"f32", GGML_TYPE_F32},   {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16},
      {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1},
      {"q5_0", GGML_TYPE_Q5_0}, {"q5_1", GGML_TYPE_Q5_1}, {"iq4_nl", GGML_TYPE_IQ4_NL}};
  for (const auto& [name, type] : types)
    if (v == name) return type;
  die("%s: unknown cache type \"%s\"", flag.c_str(), v.c_str());
  return GGML_TYPE_F16;
}

int parse_int(const std::string& flag, const char* s, int min) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (!*s || *end || v < min || v > 1000000)
    die("%s: expected an integer >= %d, got \"%s\"", flag.c_str(), min, s);
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) die("%s needs a value", a.c_str());
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      usage(argv[0]);
      std::exit(0);
    } else if (a == "-t" || a == "--threads") {
      o.threads = parse_int(a, value(), 1);
    } else if (a == "-p" || a == "--n-prompt") {
      o.n_prompt = parse_int(a, value(), 0);
    } else if (a == "-n" || a == "--n-gen") {
      o.n_gen = parse_int(a, value(), 0);
    } else if (a == "--decode-seqs") {
      std::string list = value();
      for (size_t pos = 0; pos <= list.size();) {
        size_t comma = list.find(',', pos);
        if (comma == std::string::npos) comma = list.size();
        o.decode_seqs.push_back(parse_int(a, list.substr(pos, comma - pos).c_str(), 1));
        pos = comma + 1;
      }
    } else if (a == "-r" || a == "--repetitions") {
      o.repetitions = parse_int(a, value(), 1);
    } else if (a == "--seed") {
      o.seed = static_cast<unsigned>(parse_int(a, value(), 0));
    } else if (a == "--flash-attn" || a == "-fa") {
      const std::string v = value();
      if (v == "on")
        o.flash_attn = LLAMA_FLASH_ATTN_TYPE_ENABLED;
      else if (v == "off")
        o.flash_attn = LLAMA_FLASH_ATTN_TYPE_DISABLED;
      else if (v == "auto")
        o.flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO;
      else
        die("--flash-attn must be on, off or auto, got \"%s\"", v.c_str());
    } else if (a == "-ctk" || a == "--cache-type-k") {
      o.type_k = parse_cache_type(a, value());
    } else if (a == "-ctv" || a == "--cache-type-v") {
      o.type_v = parse_cache_type(a, value());
    } else if (a == "-d" || a == "--n-depth") {
      o.n_depth = parse_int(a, value(), 0);
    } else if (a == "--cpu-variant") {
      o.cpu_variant = value();
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--verbose") {
      g_verbose = true;
    } else if (!a.empty() && a[0] == '-') {
      die("unknown option %s (see --help)", a.c_str());
    } else if (o.model_path.empty()) {
      o.model_path = a;
    } else {
      die("unexpected argument %s (one model only)", a.c_str());
    }
  }
  if (o.model_path.empty()) {
    usage(argv[0]);
    die("no model given");
  }
  if (o.n_prompt == 0 && o.n_gen == 0) die("--n-prompt and --n-gen are both 0: nothing to measure");
  if (!o.decode_seqs.empty() && o.n_gen == 0) die("--decode-seqs needs --n-gen > 0");
  return o;
}

// One test's context: sized for it alone, with the shared threadpool attached.
llama_context* make_context(llama_model* model, const Options& o, int n_seqs, int n_tokens_per_seq,
                            int n_batch, ggml_threadpool* pool) {
  llama_context_params c = llama_context_default_params();
  const uint32_t per_seq =
      (static_cast<uint32_t>(n_tokens_per_seq) + 255) / 256 * 256;  // llama.cpp pads to 256
  c.n_seq_max = static_cast<uint32_t>(n_seqs);
  c.kv_unified = false;  // one KV stream per sequence: attention reads only its own tokens
  c.n_ctx = per_seq * static_cast<uint32_t>(n_seqs);
  c.n_batch = static_cast<uint32_t>(std::max(n_batch, 512));
  c.n_ubatch = c.n_batch;  // the whole prompt in one ubatch, as Vesper prefills it in one step
  c.n_threads = o.threads;
  c.n_threads_batch = o.threads;
  c.flash_attn_type = o.flash_attn;
  c.type_k = o.type_k;
  c.type_v = o.type_v;
  c.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, c);
  if (!ctx) die("cannot create a llama context for %d sequences (run with --verbose)", n_seqs);
  if (pool) llama_attach_threadpool(ctx, pool, nullptr);
  return ctx;
}

class RandomTokens {
 public:
  RandomTokens(const llama_vocab* vocab, unsigned seed) : vocab_(vocab), rng_(seed) {}
  llama_token first() { return llama_vocab_get_add_bos(vocab_) ? llama_vocab_bos(vocab_) : next(); }
  llama_token next() {
    return static_cast<llama_token>(rng_() % static_cast<unsigned>(llama_vocab_n_tokens(vocab_)));
  }

 private:
  const llama_vocab* vocab_;
  std::mt19937 rng_;
};

double run_prompt(llama_context* ctx, RandomTokens& tokens, int n_prompt) {
  llama_memory_clear(llama_get_memory(ctx), true);
  std::vector<llama_token> t(n_prompt);
  t[0] = tokens.first();
  for (int i = 1; i < n_prompt; ++i) t[i] = tokens.next();
  const auto t0 = Clock::now();
  if (llama_decode(ctx, llama_batch_get_one(t.data(), n_prompt)) != 0)
    die("llama_decode of the prompt failed");
  llama_synchronize(ctx);
  return n_prompt / seconds_since(t0);
}

// n_seqs sequences, one token each per step; step 0 (positions 0..depth, a random prompt of
// depth + 1 tokens per sequence) is untimed.
double run_decode(llama_context* ctx, RandomTokens& tokens, int n_seqs, int n_gen, int depth) {
  llama_memory_clear(llama_get_memory(ctx), true);
  llama_batch batch = llama_batch_init(std::max(n_seqs * (depth + 1), n_seqs), 0, 1);
  if (depth > 0) {
    batch.n_tokens = 0;
    for (int s = 0; s < n_seqs; ++s)
      for (int pos = 0; pos < depth; ++pos) {
        const int i = batch.n_tokens++;
        batch.token[i] = pos == 0 ? tokens.first() : tokens.next();
        batch.pos[i] = pos;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = s;
        batch.logits[i] = false;
      }
    if (llama_decode(ctx, batch) != 0) die("llama_decode of the -d prompts failed");
  }
  Clock::time_point t0;
  for (int pos = depth; pos <= depth + n_gen; ++pos) {
    if (pos == depth + 1) t0 = Clock::now();
    batch.n_tokens = n_seqs;
    for (int s = 0; s < n_seqs; ++s) {
      batch.token[s] = pos == 0 ? tokens.first() : tokens.next();
      batch.pos[s] = pos;
      batch.n_seq_id[s] = 1;
      batch.seq_id[s][0] = s;
      batch.logits[s] = true;  // every sequence samples its next token
    }
    if (llama_decode(ctx, batch) != 0)
      die("llama_decode failed at position %d (%d sequences)", pos, n_seqs);
    llama_synchronize(ctx);
  }
  const double secs = seconds_since(t0);
  llama_batch_free(batch);
  return static_cast<double>(n_seqs) * n_gen / secs;
}

struct Test {
  std::string name;
  int n_prompt = 0;  // pp test
  int n_seqs = 0;    // tg tests
  std::vector<double> samples;
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (FILE* f = std::fopen(o.model_path.c_str(), "rb"))
    std::fclose(f);
  else
    die("cannot open model file %s", o.model_path.c_str());

  llama_log_set(log_cb, nullptr);
  const llamacpp_ref::CpuBackend cpu = llamacpp_ref::load_cpu_backend(o.cpu_variant, g_verbose);
  if (cpu.variant.empty()) die("%s", cpu.error.c_str());
  llama_backend_init();

  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(o.model_path.c_str(), mp);
  if (!model)
    die("failed to load model %s (run with --verbose for llama.cpp's log)", o.model_path.c_str());
  RandomTokens tokens(llama_model_get_vocab(model), o.seed);

  auto pool = std::make_unique<llamacpp_ref::Threadpool>(o.threads);
  if (!pool->get()) die("ggml_threadpool_new failed for %d threads", o.threads);

  std::vector<Test> tests;
  if (o.n_prompt > 0) tests.push_back({"pp" + std::to_string(o.n_prompt), o.n_prompt, 0, {}});
  if (o.n_gen > 0) {
    const std::string depth = o.n_depth > 0 ? "_d" + std::to_string(o.n_depth) : "";
    tests.push_back({"tg" + std::to_string(o.n_gen) + depth, 0, 1, {}});
    for (int s : o.decode_seqs)
      tests.push_back(
          {"tg" + std::to_string(o.n_gen) + "_seqs" + std::to_string(s) + depth, 0, s, {}});
  }
  for (Test& t : tests) {
    llama_context* ctx = t.n_prompt > 0
                             ? make_context(model, o, 1, t.n_prompt, t.n_prompt, pool->get())
                             : make_context(model, o, t.n_seqs, o.n_depth + o.n_gen + 1,
                                            t.n_seqs * std::max(o.n_depth, 1), pool->get());
    for (int r = 0; r <= o.repetitions; ++r) {  // r == 0: warm-up
      // The warm-up of a decode test is short: a few steps page the weights in as well as N.
      const double rate = t.n_prompt > 0
                              ? run_prompt(ctx, tokens, t.n_prompt)
                              : run_decode(ctx, tokens, t.n_seqs,
                                           r == 0 ? std::min(o.n_gen, 8) : o.n_gen, o.n_depth);
      if (r > 0) t.samples.push_back(rate);
    }
    llama_free(ctx);
    if (!o.json) std::fprintf(stderr, "llama_bench_driver: %s done\n", t.name.c_str());
  }

  if (o.json) {
    std::printf("{\"model\": \"%s\", \"threads\": %d, \"repetitions\": %d, \"cpu_variant\": \"%s\"",
                o.model_path.c_str(), o.threads, o.repetitions, cpu.variant.c_str());
    for (const Test& t : tests)
      std::printf(", \"%s_tokens_per_s\": %.3f", t.name.c_str(), median(t.samples));
    std::printf(", \"samples\": {");
    for (size_t i = 0; i < tests.size(); ++i) {
      std::printf("%s\"%s\": [", i ? ", " : "", tests[i].name.c_str());
      for (size_t k = 0; k < tests[i].samples.size(); ++k)
        std::printf("%s%.3f", k ? ", " : "", tests[i].samples[k]);
      std::printf("]");
    }
    std::printf("}}\n");
  } else {
    std::printf("model: %s, threads: %d, cpu variant: %s, median of %d repetitions\n",
                o.model_path.c_str(), o.threads, cpu.variant.c_str(), o.repetitions);
    std::printf("| %-16s | %5s | %14s |\n| --- | --- | --- |\n", "test", "seqs", "tokens/s");
    for (const Test& t : tests)
      std::printf("| %-16s | %5d | %14.2f |\n", t.name.c_str(), std::max(t.n_seqs, 1),
                  median(t.samples));
  }
  pool.reset();  // after the contexts that used it
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
