// llama_kl: perplexity and KL divergence of real llama.cpp (the prebuilt CPU libraries shipped in
// the npm package @node-llama-cpp/linux-x64) with a given K/V cache type, against a saved base run
// (e.g. the f32 cache), by exactly the method of `vesper perplexity` (src/cli/perplexity_command.cpp),
// so that the two engines' figures can be set side by side. node-llama-cpp ships no llama-perplexity.
//
// Method (llama-perplexity's, as Vesper implements it): the text is tokenized once
// (llama_tokenize with add_special=true, parse_special=false: BOS where the model adds one);
// chunk c is tokens [c * ctx, (c + 1) * ctx), its first token replaced by BOS when the token list
// starts with BOS; each chunk is evaluated alone (the KV cache cleared before it) in passes of
// --batch-size tokens (only tokens 0 .. ctx-2 are fed), and the second half is scored: for
// j in [ctx / 2, ctx - 1), -log p(token j + 1 | tokens 0..j). PPL = exp(mean), its error
// PPL * (standard error of the mean NLL).
//
// --kl-divergence-base FILE alone writes the scored tokens' full log-probability rows (f32,
// log-softmax of the logits computed in double) to FILE; with --kl-divergence it reads them back
// and compares: per token KL(base || this run) = sum_v p_base(v) (log p_base(v) - log p(v)),
// clamped at 0, reported as mean (with standard error), median, 99th percentile and max (the
// sorted values' element floor(q * n)), and how often both runs' argmax (first maximum) agree.
// The chunks come from the file's own token ids, so both runs score the same tokens.
//
// The base file has Vesper's format ("VSPKLD1\0", int64 ctx, n_vocab, n_chunks; the chunks'
// int32 token ids; then one f32 row of n_vocab log-probabilities per scored token), so a base
// written by either program can be read by the other (e.g. Vesper against llama.cpp's f32 base).
//
// Build: bench/llamacpp/setup.sh. Usage: see usage() below.

#include "cpu_backend.h"
#include "ggml.h"
#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace {

void usage(const char* argv0) {
  std::fprintf(
      stderr,
      "usage: %s MODEL.gguf -f TEXT [--ctx N] [options] --kl-divergence-base OUT.bin   (base run)\n"
      "       %s MODEL.gguf [--ctx N] [options] --kl-divergence BASE.bin            (compare)\n"
      "       %s MODEL.gguf [--ctx N] [options] --kl-divergence-base BASE.bin --kl-divergence\n"
      "\n"
      "Perplexity of llama.cpp on TEXT (non-overlapping chunks of N tokens, each starting with BOS,\n"
      "the second half of each scored: `vesper perplexity`'s and llama-perplexity's method), and the\n"
      "KL divergence of its token distributions from a saved base run (same file format as\n"
      "`vesper perplexity --kl-divergence-base`). Without either KL option it only prints the PPL.\n"
      "\n"
      "options:\n"
      "  -f, --file TEXT          the text to score (UTF-8); not needed when comparing (the token\n"
      "                           ids come from the base file)\n"
      "  -c, --ctx N              tokens per chunk (default 512); must match the base file's\n"
      "  --chunks K               score at most K chunks (default: all)\n"
      "  -b, --batch-size B       tokens per llama_decode pass, also n_ubatch (default 512)\n"
      "  -t, --threads T          CPU threads (default 2), with a persistent ggml threadpool\n"
      "  -ctk, --cache-type-k T   K cache type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1,\n"
      "                           iq4_nl (default f16, llama.cpp's)\n"
      "  -ctv, --cache-type-v T   V cache type, the same choices (default f16)\n"
      "  -fa, --flash-attn on|off flash attention (default on, for every cache type, so that runs\n"
      "                           differ only in the cache type; a quantized V cache needs it)\n"
      "  --kl-divergence-base F   alone: save the scored tokens' log-probabilities to F (the base);\n"
      "                           with --kl-divergence: the base file to compare against\n"
      "  --kl-divergence [F]      compare against the base file F (or --kl-divergence-base's)\n"
      "  --cpu-variant NAME       force libggml-cpu-NAME.so (default: the best this CPU runs)\n"
      "  --verbose                llama.cpp's log\n",
      argv0, argv0, argv0);
}

bool g_verbose = false;
std::string g_last_error;  // llama.cpp's last error line, for our own error messages

void log_cb(enum ggml_log_level level, const char* text, void* /*user*/) {
  if (level == GGML_LOG_LEVEL_ERROR && text) {
    g_last_error = text;
    while (!g_last_error.empty() && (g_last_error.back() == '\n' || g_last_error.back() == '\r'))
      g_last_error.pop_back();
  }
  if (g_verbose || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

[[noreturn]] void die(const char* fmt, ...) {
  std::fputs("llama_kl: error: ", stderr);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
  std::exit(1);
}

struct TypeName {
  const char* name;
  ggml_type type;
};
constexpr TypeName kCacheTypes[] = {
    {"f32", GGML_TYPE_F32},   {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16},
    {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1},
    {"q5_0", GGML_TYPE_Q5_0}, {"q5_1", GGML_TYPE_Q5_1}, {"iq4_nl", GGML_TYPE_IQ4_NL}};

ggml_type parse_cache_type(const std::string& flag, const std::string& v) {
  for (const auto& t : kCacheTypes)
    if (v == t.name) return t.type;
  die("%s: unknown cache type \"%s\" (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl)",
      flag.c_str(), v.c_str());
}

const char* cache_type_name(ggml_type t) {
  for (const auto& c : kCacheTypes)
    if (c.type == t) return c.name;
  return "?";
}

int64_t parse_int(const std::string& flag, const char* s, int64_t min) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s, &end, 10);
  if (!*s || *end || errno || v < min || v > 100000000)
    die("%s: expected an integer >= %lld, got \"%s\"", flag.c_str(), static_cast<long long>(min), s);
  return v;
}

struct Options {
  std::string model_path;
  std::string text_file;
  int64_t ctx = 512;
  int64_t chunks = -1;  // -1: all
  int64_t batch_size = 512;
  int threads = 2;
  ggml_type type_k = GGML_TYPE_F16;
  ggml_type type_v = GGML_TYPE_F16;
  bool flash_attn = true;
  std::string kl_base;
  std::string kl_base_flag = "--kl-divergence-base";  // the flag that named kl_base, for errors
  bool kl_divergence = false;
  std::string cpu_variant;
};

Options parse(int argc, char** argv) {
  Options o;
  std::string kl_value;  // the optional value of --kl-divergence, resolved at the end
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) die("%s needs a value (see --help)", a.c_str());
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      usage(argv[0]);
      std::exit(0);
    } else if (a == "-f" || a == "--file") {
      o.text_file = value();
    } else if (a == "-c" || a == "--ctx") {
      o.ctx = parse_int(a, value(), 4);
    } else if (a == "--chunks") {
      o.chunks = parse_int(a, value(), 1);
    } else if (a == "-b" || a == "--batch-size") {
      o.batch_size = parse_int(a, value(), 1);
    } else if (a == "-t" || a == "--threads") {
      o.threads = static_cast<int>(parse_int(a, value(), 1));
    } else if (a == "-ctk" || a == "--cache-type-k") {
      o.type_k = parse_cache_type(a, value());
    } else if (a == "-ctv" || a == "--cache-type-v") {
      o.type_v = parse_cache_type(a, value());
    } else if (a == "-fa" || a == "--flash-attn") {
      const std::string v = value();
      if (v == "on")
        o.flash_attn = true;
      else if (v == "off")
        o.flash_attn = false;
      else
        die("%s must be on or off, got \"%s\"", a.c_str(), v.c_str());
    } else if (a == "--kl-divergence-base") {
      o.kl_base = value();
    } else if (a == "--kl-divergence") {
      o.kl_divergence = true;
      // Optional value: the next argument when it is not an option.
      if (i + 1 < argc && argv[i + 1][0] != '-') kl_value = argv[++i];
    } else if (a == "--cpu-variant") {
      o.cpu_variant = value();
    } else if (a == "--verbose" || a == "-v") {
      g_verbose = true;
    } else if (!a.empty() && a[0] == '-') {
      die("unknown option %s (see --help)", a.c_str());
    } else if (o.model_path.empty()) {
      o.model_path = a;
    } else {
      die("unexpected argument %s (one model only)", a.c_str());
    }
  }
  if (!kl_value.empty()) {
    if (o.kl_base.empty()) {
      o.kl_base = kl_value;
      o.kl_base_flag = "--kl-divergence";
    } else if (o.model_path.empty()) {
      // `--kl-divergence-base F --kl-divergence MODEL`: the value was the model.
      o.model_path = kl_value;
    } else if (kl_value != o.kl_base) {
      die("--kl-divergence %s and --kl-divergence-base %s name different base files",
          kl_value.c_str(), o.kl_base.c_str());
    }
  }
  if (o.model_path.empty()) {
    usage(argv[0]);
    die("no model given");
  }
  if (o.kl_divergence && o.kl_base.empty())
    die("--kl-divergence needs a base file (--kl-divergence BASE.bin, or --kl-divergence-base "
        "BASE.bin)");
  if (!o.kl_divergence && o.text_file.empty())
    die("-f TEXT is required (or --kl-divergence with its base file)");
  if (!o.flash_attn && ggml_is_quantized(o.type_v))
    die("-ctv %s (a quantized V cache) needs flash attention: drop --flash-attn off",
        cache_type_name(o.type_v));
  return o;
}

// The base file (Vesper's format): a header, the token ids of the chunks, then for each chunk's
// scored rows in order, n_vocab f32 log-probabilities.
constexpr char kKlMagic[8] = {'V', 'S', 'P', 'K', 'L', 'D', '1', '\0'};
struct KlHeader {
  char magic[8];
  int64_t ctx;
  int64_t n_vocab;
  int64_t n_chunks;
};
static_assert(sizeof(KlHeader) == 32, "the base file's header is 32 bytes");

// log-softmax of one row of logits, as Vesper's sample::log_normalizer: max in float, the sum of
// exp(l - max) in double, log p = logit - (max + log(sum)) rounded to f32.
void log_softmax(const float* logits, int64_t n, std::vector<float>& out) {
  float max_logit = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i] - max_logit));
  const double log_z = static_cast<double>(max_logit) + std::log(sum);
  out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(logits[i] - log_z);
}

struct MeanStats {
  double sum = 0, sum2 = 0;
  int64_t n = 0;
  void add(double x) {
    sum += x;
    sum2 += x * x;
    ++n;
  }
  double mean() const { return n > 0 ? sum / static_cast<double>(n) : 0; }
  // Standard error of the mean (Vesper's definition).
  double error() const {
    if (n < 2) return 0;
    const double m = mean();
    const double var = std::max(0.0, sum2 / static_cast<double>(n) - m * m);
    return std::sqrt(var / static_cast<double>(n - 1));
  }
};

int64_t file_size(const std::string& path) {
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_size);
}

// The attention head dimension of keys ("key_length") or values ("value_length"): the GGUF's
// <arch>.attention.<which> when present, else n_embd / n_head.
int64_t head_dim(const llama_model* model, const char* which) {
  char arch[128] = {0}, val[64] = {0};
  if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) > 0) {
    const std::string key = std::string(arch) + ".attention." + which;
    if (llama_model_meta_val_str(model, key.c_str(), val, sizeof val) > 0) {
      char* end = nullptr;
      const long long v = std::strtoll(val, &end, 10);
      if (*val && !*end && v > 0) return v;
    }
  }
  const int32_t n_head = llama_model_n_head(model);
  return n_head > 0 ? llama_model_n_embd(model) / n_head : 0;
}

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
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int64_t n_vocab = llama_vocab_n_tokens(vocab);
  const int64_t n_ctx_train = llama_model_n_ctx_train(model);
  if (n_ctx_train > 0 && o.ctx > n_ctx_train)
    std::fprintf(stderr, "llama_kl: note: --ctx %lld exceeds the model's training context %lld\n",
                 static_cast<long long>(o.ctx), static_cast<long long>(n_ctx_train));

  // The tokens of the chunks: from the text, or (comparing) from the base file.
  std::vector<llama_token> tokens;
  int64_t n_chunks = 0;
  std::ifstream base_in;
  std::ofstream base_out;
  const char* base_flag = o.kl_base_flag.c_str();
  if (o.kl_divergence) {
    base_in.open(o.kl_base, std::ios::binary);
    if (!base_in) die("%s %s: cannot open", base_flag, o.kl_base.c_str());
    KlHeader h{};
    base_in.read(reinterpret_cast<char*>(&h), sizeof(h));
    if (!base_in || std::memcmp(h.magic, kKlMagic, sizeof(kKlMagic)) != 0)
      die("%s %s: not a KL base file (llama_kl / vesper perplexity format)", base_flag,
          o.kl_base.c_str());
    if (h.n_vocab != n_vocab)
      die("%s %s: saved with a vocabulary of %lld tokens, the model has %lld", base_flag,
          o.kl_base.c_str(), static_cast<long long>(h.n_vocab), static_cast<long long>(n_vocab));
    if (h.ctx != o.ctx)
      die("%s %s: saved with --ctx %lld, this run has --ctx %lld", base_flag, o.kl_base.c_str(),
          static_cast<long long>(h.ctx), static_cast<long long>(o.ctx));
    const int64_t bytes = file_size(o.kl_base);
    const int64_t scored_per_chunk = o.ctx - 1 - o.ctx / 2;
    const bool sane = h.n_chunks >= 1 && bytes > 0 && h.n_chunks <= bytes / o.ctx;
    if (!sane || bytes != static_cast<int64_t>(sizeof(h)) + h.n_chunks * o.ctx * 4 +
                              h.n_chunks * scored_per_chunk * n_vocab * 4)
      die("%s %s: corrupt or truncated (its size does not match its header)", base_flag,
          o.kl_base.c_str());
    n_chunks = o.chunks > 0 ? std::min(o.chunks, h.n_chunks) : h.n_chunks;
    tokens.resize(static_cast<size_t>(h.n_chunks * o.ctx));
    base_in.read(reinterpret_cast<char*>(tokens.data()),
                 static_cast<std::streamsize>(tokens.size() * sizeof(llama_token)));
    if (!base_in) die("%s %s: truncated", base_flag, o.kl_base.c_str());
    for (llama_token t : tokens)
      if (t < 0 || t >= n_vocab) die("%s %s: token id out of range", base_flag, o.kl_base.c_str());
    if (!o.text_file.empty())
      std::fprintf(stderr, "llama_kl: note: -f %s is not read: the token ids come from %s\n",
                   o.text_file.c_str(), o.kl_base.c_str());
  } else {
    std::ifstream in(o.text_file, std::ios::binary);
    if (!in) die("-f %s: cannot open", o.text_file.c_str());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    int n = -llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), nullptr, 0,
                            /*add_special=*/true, /*parse_special=*/false);
    if (n < 0) n = 0;
    tokens.resize(static_cast<size_t>(n));
    if (n > 0 && llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                                n, true, false) != n)
      die("-f %s: tokenization failed", o.text_file.c_str());
    const int64_t available = static_cast<int64_t>(tokens.size()) / o.ctx;
    if (available < 1)
      die("-f %s: %zu tokens, fewer than one chunk of --ctx %lld", o.text_file.c_str(),
          tokens.size(), static_cast<long long>(o.ctx));
    n_chunks = o.chunks > 0 ? std::min(o.chunks, available) : available;
    tokens.resize(static_cast<size_t>(n_chunks * o.ctx));
    if (!o.kl_base.empty()) {
      base_out.open(o.kl_base, std::ios::binary | std::ios::trunc);
      if (!base_out) die("%s %s: cannot write", base_flag, o.kl_base.c_str());
      KlHeader h{};
      std::memcpy(h.magic, kKlMagic, sizeof(kKlMagic));
      h.ctx = o.ctx;
      h.n_vocab = n_vocab;
      h.n_chunks = n_chunks;
      base_out.write(reinterpret_cast<const char*>(&h), sizeof(h));
      base_out.write(reinterpret_cast<const char*>(tokens.data()),
                     static_cast<std::streamsize>(tokens.size() * sizeof(llama_token)));
    }
  }
  const llama_token bos = llama_vocab_bos(vocab);
  const bool first_is_bos = bos != LLAMA_TOKEN_NULL && !tokens.empty() && tokens[0] == bos;

  // One sequence, one context for every chunk (cleared before each).
  const int64_t pass_rows = std::min(o.batch_size, o.ctx);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(o.ctx);
  cp.n_seq_max = 1;
  cp.n_batch = static_cast<uint32_t>(pass_rows);
  cp.n_ubatch = static_cast<uint32_t>(pass_rows);
  cp.n_threads = o.threads;
  cp.n_threads_batch = o.threads;
  cp.flash_attn_type = o.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = o.type_k;
  cp.type_v = o.type_v;
  cp.no_perf = true;
  // llama.cpp checks that a quantized type's block divides the head dimension only with flash
  // attention; without it, a K row of a head that is not whole blocks is read wrongly (stories260K,
  // head dim 8, -ctk q8_0 -fa off: PPL 47 instead of 4.4). Refuse it either way.
  const int64_t head_k = head_dim(model, "key_length"), head_v = head_dim(model, "value_length");
  if (ggml_is_quantized(o.type_k) && head_k % ggml_blck_size(o.type_k) != 0)
    die("-ctk %s: its blocks of %lld values do not divide the model's key head dimension %lld",
        cache_type_name(o.type_k), static_cast<long long>(ggml_blck_size(o.type_k)),
        static_cast<long long>(head_k));
  if (ggml_is_quantized(o.type_v) && head_v % ggml_blck_size(o.type_v) != 0)
    die("-ctv %s: its blocks of %lld values do not divide the model's value head dimension %lld",
        cache_type_name(o.type_v), static_cast<long long>(ggml_blck_size(o.type_v)),
        static_cast<long long>(head_v));
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx)
    die("cannot create a llama context with -ctk %s -ctv %s --flash-attn %s: %s",
        cache_type_name(o.type_k), cache_type_name(o.type_v), o.flash_attn ? "on" : "off",
        g_last_error.empty() ? "(run with --verbose for llama.cpp's log)" : g_last_error.c_str());
  auto pool = std::make_unique<llamacpp_ref::Threadpool>(o.threads);
  if (!pool->get()) die("ggml_threadpool_new failed for %d threads", o.threads);
  llama_attach_threadpool(ctx, pool->get(), nullptr);

  const char* fa = o.flash_attn ? "on" : "off";
  std::fprintf(stderr,
               "llama_kl: %lld chunks of %lld tokens, scoring the second half of each; KV cache "
               "k %s v %s, flash attention %s, %d threads, cpu variant %s\n",
               static_cast<long long>(n_chunks), static_cast<long long>(o.ctx),
               cache_type_name(o.type_k), cache_type_name(o.type_v), fa, o.threads,
               cpu.variant.c_str());

  const int64_t first = o.ctx / 2;
  MeanStats nll, kl_stats, base_nll;
  std::vector<double> kls;
  int64_t same_top = 0;
  std::vector<float> logp, base_logp(static_cast<size_t>(n_vocab));
  llama_batch batch = llama_batch_init(static_cast<int32_t>(pass_rows), 0, 1);
  for (int64_t c = 0; c < n_chunks; ++c) {
    std::vector<llama_token> chunk(tokens.begin() + c * o.ctx, tokens.begin() + (c + 1) * o.ctx);
    if (first_is_bos) chunk[0] = bos;
    llama_memory_clear(llama_get_memory(ctx), true);
    for (int64_t start = 0; start < o.ctx - 1; start += pass_rows) {
      const int64_t rows = std::min(pass_rows, o.ctx - 1 - start);
      // Logits for the rows of this pass that are scored (positions first .. ctx - 2).
      const int64_t scored_from = std::max(start, first);
      batch.n_tokens = static_cast<int32_t>(rows);
      for (int64_t r = 0; r < rows; ++r) {
        batch.token[r] = chunk[static_cast<size_t>(start + r)];
        batch.pos[r] = static_cast<llama_pos>(start + r);
        batch.n_seq_id[r] = 1;
        batch.seq_id[r][0] = 0;
        batch.logits[r] = start + r >= scored_from;
      }
      if (llama_decode(ctx, batch) != 0)
        die("llama_decode failed (chunk %lld, tokens %lld..%lld)", static_cast<long long>(c),
            static_cast<long long>(start), static_cast<long long>(start + rows - 1));
      for (int64_t pos = scored_from; pos < start + rows; ++pos) {
        const float* logits = llama_get_logits_ith(ctx, static_cast<int32_t>(pos - start));
        if (!logits) die("llama_get_logits_ith returned null");
        const llama_token next = chunk[static_cast<size_t>(pos + 1)];
        log_softmax(logits, n_vocab, logp);
        nll.add(-static_cast<double>(logp[next]));
        if (base_out.is_open()) {
          base_out.write(reinterpret_cast<const char*>(logp.data()),
                         static_cast<std::streamsize>(n_vocab * sizeof(float)));
        } else if (base_in.is_open()) {
          base_in.read(reinterpret_cast<char*>(base_logp.data()),
                       static_cast<std::streamsize>(n_vocab * sizeof(float)));
          if (!base_in) die("%s %s: truncated", base_flag, o.kl_base.c_str());
          double kl = 0;
          for (int64_t v = 0; v < n_vocab; ++v) {
            const double lb = base_logp[v];
            kl += std::exp(lb) * (lb - static_cast<double>(logp[v]));
          }
          kl = std::max(kl, 0.0);  // rounding can make a zero divergence slightly negative
          kl_stats.add(kl);
          kls.push_back(kl);
          base_nll.add(-static_cast<double>(base_logp[next]));
          const auto top = std::max_element(logp.begin(), logp.end()) - logp.begin();
          const auto base_top =
              std::max_element(base_logp.begin(), base_logp.end()) - base_logp.begin();
          same_top += top == base_top;
        }
      }
    }
    std::fprintf(stderr, "[%lld] ppl %.4f\n", static_cast<long long>(c + 1), std::exp(nll.mean()));
  }
  llama_batch_free(batch);

  char kv[64];
  std::snprintf(kv, sizeof kv, "k %s v %s", cache_type_name(o.type_k), cache_type_name(o.type_v));
  const double ppl = std::exp(nll.mean());
  std::printf("Final estimate: PPL = %.4f +/- %.5f (%lld tokens scored, ctx %lld, KV cache %s, "
              "flash attention %s)\n",
              ppl, ppl * nll.error(), static_cast<long long>(nll.n), static_cast<long long>(o.ctx),
              kv, fa);
  if (base_in.is_open() && !kls.empty()) {
    std::sort(kls.begin(), kls.end());
    auto quantile = [&](double q) {
      return kls[std::min(kls.size() - 1, static_cast<size_t>(q * static_cast<double>(kls.size())))];
    };
    const double base_ppl = std::exp(base_nll.mean());
    std::printf("Base PPL = %.4f; PPL ratio = %.5f\n", base_ppl, ppl / base_ppl);
    // %g rather than Vesper's %.6f: an f16 cache's divergences are ~1e-6 and below.
    std::printf("Mean KLD = %.6g +/- %.6g; median %.6g; 99th percentile %.6g; max %.6g\n",
                kl_stats.mean(), kl_stats.error(), quantile(0.5), quantile(0.99), kls.back());
    std::printf("Same top token: %.3f%% (%lld of %lld)\n",
                100.0 * static_cast<double>(same_top) / static_cast<double>(kls.size()),
                static_cast<long long>(same_top), static_cast<long long>(kls.size()));
  }
  if (base_out.is_open()) {
    base_out.close();
    if (!base_out) die("%s %s: write failed", base_flag, o.kl_base.c_str());
    std::printf("Saved the base log-probabilities to %s\n", o.kl_base.c_str());
  }

  llama_free(ctx);
  pool.reset();  // after the context that used it
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
