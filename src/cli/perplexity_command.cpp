// `vesper perplexity MODEL -f TEXT`: the model's perplexity on a text, llama-perplexity's method,
// and the KL divergence of its token distributions from a saved base run, to measure what a KV
// cache type (or a quantization) costs in accuracy.
//
// Method (llama-perplexity's): the text is tokenized once (with BOS where the model adds one);
// chunk c is tokens [c * ctx, (c + 1) * ctx), its first token replaced by BOS when the model uses
// one; each chunk is evaluated alone (fresh KV) and the second half is scored: for
// j in [ctx / 2, ctx - 1), -log p(token j + 1 | tokens 0..j). PPL = exp(mean), and its
// standard error from the spread of the per-token values.
//
// --kl-divergence-base FILE alone writes the scored tokens' full log-probability rows to FILE;
// with --kl-divergence it reads them back instead and compares: per token
// KL(base || this run) = sum_v p_base(v) (log p_base(v) - log p(v)), reported as mean (with
// standard error), median, 99th percentile and max, with how often both pick the same top token.
// The chunks come from the file's own token ids, so the two runs score the same tokens.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend_factory.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "engine/follower.h"
#include "engine/kv_sparsity_config.h"
#include "model/forward_batch.h"
#include "model/model.h"
#include "sample/logprobs.h"
#include "tokenizer/tokenizer.h"

namespace vesper::cli {
namespace {

struct PerplexityOptions {
  EngineFlags engine;  // model path, threads, block size, KV cache types
  std::string text_file;
  int64_t ctx = 512;
  int64_t chunks = -1;  // -1: all
  int64_t batch_size = 512;
  std::string kl_base;
  bool kl_divergence = false;
};

// The base file: a header, the token ids of the chunks, then for each chunk's scored rows in
// order, n_vocab f32 log-probabilities.
constexpr char kKlMagic[8] = {'V', 'S', 'P', 'K', 'L', 'D', '1', '\0'};
struct KlHeader {
  char magic[8];
  int64_t ctx;
  int64_t n_vocab;
  int64_t n_chunks;
};

// log-softmax of one row of logits (the normaliser the logprobs of the API use).
void log_softmax(const float* logits, int64_t n, std::vector<float>& out) {
  const double log_z = sample::log_normalizer({logits, static_cast<size_t>(n)});
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
  // Standard error of the mean.
  double error() const {
    if (n < 2) return 0;
    const double m = mean();
    const double var = std::max(0.0, sum2 / static_cast<double>(n) - m * m);
    return std::sqrt(var / static_cast<double>(n - 1));
  }
};

int run_perplexity(const PerplexityOptions& o) {
  if (o.ctx < 4) return fail("--ctx must be at least 4, got " + std::to_string(o.ctx));
  if (o.batch_size < 1) return fail("--batch-size must be positive");
  if (o.kl_divergence && o.kl_base.empty())
    return fail("--kl-divergence needs --kl-divergence-base FILE (the saved base run)");
  auto dtypes = parse_kv_dtypes(o.engine);
  if (!dtypes) return fail(dtypes.error().message);
  if (Status s = check_calculate_kv_scales(o.engine, *dtypes); !s) return fail(s.error().message);

  engine::EngineConfig config;  // what a tensor-parallel job's ranks share
  config.model_path = o.engine.model_path;
  config.threads = o.engine.threads;
  auto parallel = parallel_config(o.engine);
  if (!parallel) return fail(parallel.error().message);
  config.parallel = *parallel;
  if (Status s = engine::check_parallel_config(config); !s) return fail(s.error().message);
  if (const std::optional<int> rc = run_if_follower(config)) return *rc;
  auto created = backend::create_backend(engine::backend_options(config));
  if (!created) return fail(created.error().message);
  backend::Backend& backend = **created;
  auto model = engine::load_model_part(config, backend);
  if (!model) return fail(model.error().message);
  model::Model& m = **model;
  auto tok = tokenizer::Tokenizer::from_gguf(m.file());
  if (!tok) return fail(tok.error().message);
  const int64_t n_vocab = m.config().n_vocab;
  if (o.ctx > m.config().context_length && m.config().context_length > 0)
    std::fprintf(stderr, "perplexity: note: --ctx %lld exceeds the model's training context %lld\n",
                 static_cast<long long>(o.ctx), static_cast<long long>(m.config().context_length));

  // The tokens of the chunks: from the text, or (comparing) from the base file.
  std::vector<int32_t> tokens;
  int64_t n_chunks = 0;
  std::ifstream base_in;
  std::ofstream base_out;
  if (o.kl_divergence) {
    base_in.open(o.kl_base, std::ios::binary);
    if (!base_in) return fail("--kl-divergence-base " + o.kl_base + ": cannot open");
    KlHeader h{};
    base_in.read(reinterpret_cast<char*>(&h), sizeof(h));
    if (!base_in || std::memcmp(h.magic, kKlMagic, sizeof(kKlMagic)) != 0)
      return fail("--kl-divergence-base " + o.kl_base + ": not a vesper KL base file");
    if (h.n_vocab != n_vocab)
      return fail("--kl-divergence-base " + o.kl_base + ": saved with a vocabulary of " +
                  std::to_string(h.n_vocab) + " tokens, the model has " + std::to_string(n_vocab));
    if (h.ctx != o.ctx)
      return fail("--kl-divergence-base " + o.kl_base + ": saved with --ctx " +
                  std::to_string(h.ctx) + ", this run has --ctx " + std::to_string(o.ctx));
    // The file must hold exactly what its header promises (so a corrupt count is an error, not
    // an allocation of its size): the chunks' ids, then a row per scored token.
    std::error_code ec;
    const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(o.kl_base, ec));
    const int64_t scored_per_chunk = o.ctx - 1 - o.ctx / 2;
    const bool sane = h.n_chunks >= 1 && h.n_chunks <= file_bytes / o.ctx;
    if (ec || !sane ||
        file_bytes != static_cast<int64_t>(sizeof(h)) + h.n_chunks * o.ctx * 4 +
                          h.n_chunks * scored_per_chunk * n_vocab * 4)
      return fail("--kl-divergence-base " + o.kl_base +
                  ": corrupt or truncated (its size does not match its header)");
    n_chunks = o.chunks > 0 ? std::min(o.chunks, h.n_chunks) : h.n_chunks;
    tokens.resize(static_cast<size_t>(h.n_chunks * o.ctx));
    base_in.read(reinterpret_cast<char*>(tokens.data()),
                 static_cast<std::streamsize>(tokens.size() * sizeof(int32_t)));
    if (!base_in) return fail("--kl-divergence-base " + o.kl_base + ": truncated");
    for (int32_t t : tokens)
      if (t < 0 || t >= n_vocab)
        return fail("--kl-divergence-base " + o.kl_base + ": token id out of range");
  } else {
    std::ifstream in(o.text_file, std::ios::binary);
    if (!in) return fail("-f " + o.text_file + ": cannot open");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    tokens = tok->encode(text, /*add_special=*/true, /*parse_special=*/false);
    const int64_t available = static_cast<int64_t>(tokens.size()) / o.ctx;
    if (available < 1)
      return fail("-f " + o.text_file + ": " + std::to_string(tokens.size()) +
                  " tokens, fewer than one chunk of --ctx " + std::to_string(o.ctx));
    n_chunks = o.chunks > 0 ? std::min(o.chunks, available) : available;
    tokens.resize(static_cast<size_t>(n_chunks * o.ctx));
    if (!o.kl_base.empty()) {
      base_out.open(o.kl_base, std::ios::binary | std::ios::trunc);
      if (!base_out) return fail("--kl-divergence-base " + o.kl_base + ": cannot write");
      KlHeader h{};
      std::memcpy(h.magic, kKlMagic, sizeof(kKlMagic));
      h.ctx = o.ctx;
      h.n_vocab = n_vocab;
      h.n_chunks = n_chunks;
      base_out.write(reinterpret_cast<const char*>(&h), sizeof(h));
      base_out.write(reinterpret_cast<const char*>(tokens.data()),
                     static_cast<std::streamsize>(tokens.size() * sizeof(int32_t)));
    }
  }
  const std::optional<int32_t> bos = tok->bos_id();
  const bool first_is_bos = bos && !tokens.empty() && tokens[0] == *bos;

  // One sequence's KV for a chunk, reused by every chunk (each starts at position 0).
  // KIVI: a block is one group, and every group stays as residual rows (attention quantizes the
  // groups each query reads quantized, as the engine's stored groups would read).
  backend::KvCacheSpec spec = m.kv_spec(o.engine.block_size, *dtypes);
  if (spec.kivi()) {
    spec.block_size = o.engine.kivi_group_size;
    spec.kivi_residual_length = o.engine.kivi_residual_length;
  }
  const model::KvTableLayout layout(spec);
  const int64_t blocks = layout.entries_for(o.ctx);
  // --kv-window, --kv-sparsity quest: every scored row reads as a generated token would
  // (dense_from 0): its sinks and its window (the blocks stay: a chunk's rows are computed
  // together), or its Quest budget (a block's key bounds, once the block lies before a row's own,
  // are those of all its rows, as in decoding).
  if (Status s = check_kv_sparsity_flags(o.engine); !s) return fail(s.error().message);
  engine::CacheConfig sparse;
  sparse.kv_window = o.engine.kv_window;
  sparse.kv_sink_tokens = o.engine.kv_sink_tokens;
  sparse.kv_sparse_budget = o.engine.kv_sparse_budget;
  auto window = engine::kv_sparsity_config(sparse, spec.block_size, spec.dtypes);
  if (!window) return fail(window.error().message);
  spec.key_bounds = window->quest();
  const backend::KvHandle kv = m.create_kv(spec, blocks, backend::MemoryKind::kDevice);
  // Calibrated fp8 scales: fixed by the first chunk's rows, then kept for every chunk.
  if (o.engine.calculate_kv_scales) m.calibrate_kv_scales(kv);
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  const int64_t pass_rows = std::min(o.batch_size, o.ctx);
  m.reserve(model::StepCapacity{pass_rows, pass_rows, 1, blocks});
  std::fprintf(stderr,
               "perplexity: %lld chunks of %lld tokens, scoring the second half of each; KV cache "
               "%s (%lld bytes/token%s)%s\n",
               static_cast<long long>(n_chunks), static_cast<long long>(o.ctx),
               dtypes->describe().c_str(), static_cast<long long>(spec.bytes_per_token()),
               spec.kivi() ? (", group " + std::to_string(spec.block_size) + ", residual " +
                              std::to_string(spec.kivi_residual_length))
                                 .c_str()
                           : "",
               window->windowed() ? (", attending " + std::to_string(window->sink_tokens) +
                                     " sink tokens + a window of " + std::to_string(window->window))
                                        .c_str()
               : window->quest() ? (", reading a Quest budget of " +
                                    std::to_string(window->block_budget) + " tokens")
                                       .c_str()
                                 : "");

  const int64_t first = o.ctx / 2;
  MeanStats nll, kl_stats, base_nll;
  std::vector<double> kls;
  int64_t same_top = 0;
  std::vector<float> logp, base_logp(static_cast<size_t>(n_vocab));
  model::ForwardBatch batch;
  for (int64_t c = 0; c < n_chunks; ++c) {
    std::vector<int32_t> chunk(tokens.begin() + c * o.ctx, tokens.begin() + (c + 1) * o.ctx);
    if (first_is_bos) chunk[0] = *bos;
    for (int64_t start = 0; start < o.ctx - 1; start += pass_rows) {
      const int64_t rows = std::min(pass_rows, o.ctx - 1 - start);
      // Logits for the rows of this pass that are scored (positions first .. ctx - 2).
      const int64_t scored_from = std::max(start, first);
      const int64_t n_scored = std::max<int64_t>(0, start + rows - scored_from);
      batch.clear();
      batch.add_sequence(std::span<const int32_t>(chunk).subspan(static_cast<size_t>(start),
                                                                 static_cast<size_t>(rows)),
                         static_cast<int32_t>(start), table, layout, n_scored, -1, {}, *window);
      const std::span<const float> logits = m.forward(batch, kv);
      for (int64_t r = 0; r < n_scored; ++r) {
        const int64_t pos = scored_from + r;
        const int32_t next = chunk[static_cast<size_t>(pos + 1)];
        log_softmax(logits.data() + r * n_vocab, n_vocab, logp);
        nll.add(-static_cast<double>(logp[next]));
        if (base_out.is_open()) {
          base_out.write(reinterpret_cast<const char*>(logp.data()),
                         static_cast<std::streamsize>(n_vocab * sizeof(float)));
        } else if (base_in.is_open()) {
          base_in.read(reinterpret_cast<char*>(base_logp.data()),
                       static_cast<std::streamsize>(n_vocab * sizeof(float)));
          if (!base_in) return fail("--kl-divergence-base " + o.kl_base + ": truncated");
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
  backend.release_kv(kv);

  const double ppl = std::exp(nll.mean());
  std::printf("Final estimate: PPL = %.4f +/- %.5f (%lld tokens scored, ctx %lld, KV cache %s)\n",
              ppl, ppl * nll.error(), static_cast<long long>(nll.n), static_cast<long long>(o.ctx),
              dtypes->describe().c_str());
  if (base_in.is_open() && !kls.empty()) {
    std::sort(kls.begin(), kls.end());
    auto quantile = [&](double q) {
      return kls[std::min(kls.size() - 1,
                          static_cast<size_t>(q * static_cast<double>(kls.size())))];
    };
    const double base_ppl = std::exp(base_nll.mean());
    std::printf("Base PPL = %.4f; PPL ratio = %.5f\n", base_ppl, ppl / base_ppl);
    std::printf("Mean KLD = %.6f +/- %.6f; median %.6f; 99th percentile %.6f; max %.6f\n",
                kl_stats.mean(), kl_stats.error(), quantile(0.5), quantile(0.99), kls.back());
    std::printf("Same top token: %.3f%% (%lld of %lld)\n",
                100.0 * static_cast<double>(same_top) / static_cast<double>(kls.size()),
                static_cast<long long>(same_top), static_cast<long long>(kls.size()));
  }
  if (base_out.is_open()) {
    base_out.close();
    if (!base_out) return fail("--kl-divergence-base " + o.kl_base + ": write failed");
    std::printf("Saved the base log-probabilities to %s\n", o.kl_base.c_str());
  }
  return 0;
}

}  // namespace

CommandRunner add_perplexity_command(CLI::App& app) {
  auto o = std::make_shared<PerplexityOptions>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity",
      "Measure a model's perplexity on a text (llama-perplexity's method: non-overlapping chunks "
      "of --ctx tokens, the second half of each scored), and the KL divergence of its token "
      "distributions from a saved base run: the accuracy cost of a KV cache type");
  cmd->add_option("model", o->engine.model_path,
                  "Model: a GGUF file or a Hugging Face checkpoint directory")
      ->required();
  cmd->add_option("-f,--file", o->text_file, "The text to score (UTF-8)");
  cmd->add_option("-c,--ctx", o->ctx, "Tokens per chunk")->capture_default_str();
  cmd->add_option("--chunks", o->chunks, "Score at most this many chunks (default: all)");
  cmd->add_option("-b,--batch-size", o->batch_size, "Tokens per forward pass")
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->engine.threads, "Compute threads (default: all cores)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--block-size", o->engine.block_size, "Tokens per KV cache block")
      ->capture_default_str()
      ->check(CLI::IsMember({8, 16, 32, 64, 128}));
  add_kv_cache_dtype_flags(cmd, o->engine);
  add_parallel_flags(cmd, o->engine);
  cmd->add_option("--kl-divergence-base", o->kl_base,
                  "Alone: save this run's log-probabilities of the scored tokens to FILE (the "
                  "base, e.g. with --kv-cache-dtype f32). With --kl-divergence: read them and "
                  "compare this run against them");
  cmd->add_flag("--kl-divergence", o->kl_divergence,
                "Compare against --kl-divergence-base FILE: mean KL divergence, its 99th "
                "percentile and max, and top-token agreement (the text comes from the file)");
  return [o]() {
    if (!o->kl_divergence && o->text_file.empty())
      return fail("perplexity: -f TEXT is required (or --kl-divergence with its base file)");
    return run_perplexity(*o);
  };
}

}  // namespace vesper::cli
