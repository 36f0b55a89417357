#include "sample/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

namespace vesper::sample {

int32_t argmax(std::span<const float> logits) {
  // The first index of the largest value (NaNs never win; a NaN at index 0 keeps index 0, as a
  // scan with `>` does). Two passes: the maximum over 8 independent lanes, which the compiler
  // turns into vector max instructions, then the first index holding it. Greedy decoding runs this
  // over the whole vocabulary for every sequence and step, and a one-pass scan with its
  // index-carrying dependency was several percent of a batched decode step.
  const size_t n = logits.size();
  if (n == 0 || std::isnan(logits[0])) return 0;
  float lanes[8];
  std::fill(lanes, lanes + 8, logits[0]);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] = logits[i + l] > lanes[l] ? logits[i + l] : lanes[l];
  float best = lanes[0];
  for (int l = 1; l < 8; ++l) best = lanes[l] > best ? lanes[l] : best;
  for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (size_t j = 0; j < n; ++j)
    if (logits[j] == best) return static_cast<int32_t>(j);
  return 0;  // unreachable: best is one of the logits
}

namespace {

// Weights are summed a block of kBlock at a time, in a fixed order (each block's floats pairwise,
// the blocks in turn), so that the sums do not depend on a long chain of dependent additions (on
// a 32,000-token vocabulary two such chains were most of a sampled row) and stay the same for the
// same weights.
constexpr size_t kBlock = 8;

double block_sum(const float* p) {
  const double a = static_cast<double>(p[0]) + p[1], b = static_cast<double>(p[2]) + p[3];
  const double c = static_cast<double>(p[4]) + p[5], d = static_cast<double>(p[6]) + p[7];
  return (a + b) + (c + d);
}

double weight_sum(const float* p, size_t n) {
  double total = 0.0;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) total += block_sum(p + i);
  for (; i < n; ++i) total += p[i];
  return total;
}

// top-p reads the weights' total; nothing else in kept_distribution does.
bool top_p_needs_total(const SamplingParams& params) {
  return params.top_p < 1.0f;
}

}  // namespace

float exp_nonpositive(float x) {
  // The selects are bit masks, not branches: a comparison's result as all-ones or zero bits (the
  // vectorizer if-converts no floating-point `?:` while operations may trap).
  const uint32_t in_range = 0u - static_cast<uint32_t>(x >= -87.0f);  // NaN: out of range
  const float clamped = std::bit_cast<float>((std::bit_cast<uint32_t>(x) & in_range) |
                                             (std::bit_cast<uint32_t>(-87.0f) & ~in_range));
  // n = round(x / ln 2) (x <= 0: truncating x / ln 2 - 1/2 rounds to nearest), r = x - n ln 2 in
  // two steps (ln 2's high part is exact in float), |r| <= ln 2 / 2.
  const auto n = static_cast<int32_t>(clamped * 1.44269504088896341f - 0.5f);
  const auto fn = static_cast<float>(n);
  const float r = clamped - fn * 0.693359375f + fn * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(n + 127) << 23);
  // Below -87, under float's normal range (and -inf, NaN): 0.
  return std::bit_cast<float>(std::bit_cast<uint32_t>(p * scale) & in_range);
}

std::mt19937_64 make_rng(const SamplingParams& params) {
  return std::mt19937_64(params.seed.has_value() ? *params.seed : std::random_device{}());
}

size_t kept_distribution(const SamplingParams& params, std::span<const float> logits,
                         SamplingScratch& scratch) {
  const int32_t n_vocab = static_cast<int32_t>(logits.size());
  if (params.greedy()) {
    scratch.candidates.resize(1);
    scratch.probs.resize(1);
    scratch.candidates[0] = argmax(logits);
    scratch.probs[0] = 1.0f;
    return 1;
  }
  scratch.candidates.resize(n_vocab);
  std::iota(scratch.candidates.begin(), scratch.candidates.end(), 0);
  size_t keep = scratch.candidates.size();
  const bool top_k_cuts = params.top_k > 0 && static_cast<size_t>(params.top_k) < keep;
  double max_logit = logits[0];
  if (top_k_cuts || params.top_p < 1.0f || params.min_p > 0.0f) {
    // Sort candidates by logit, descending; ties by id, so the order is deterministic.
    auto by_logit = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    if (top_k_cuts) {
      keep = static_cast<size_t>(params.top_k);
      std::partial_sort(scratch.candidates.begin(), scratch.candidates.begin() + keep,
                        scratch.candidates.end(), by_logit);
    } else {
      std::sort(scratch.candidates.begin(), scratch.candidates.end(), by_logit);
    }
    scratch.candidates.resize(keep);
    max_logit = logits[scratch.candidates[0]];
  } else {
    // Nothing cuts the distribution: the whole vocabulary in id order, unsorted (a sort of the
    // vocabulary for every sampled token was a tenth of a batched serving run).
    max_logit = logits[argmax(logits)];
  }

  // Softmax over the kept candidates at the temperature (double sums for stability).
  scratch.probs.resize(keep);
  float* probs = scratch.probs.data();
  // Every token masked (e.g. allowed_token_ids that min_tokens or bad_words all ban): an equal
  // weight each, rather than the NaNs of -inf - -inf.
  const bool all_masked = max_logit == -INFINITY;
  const auto max_f = static_cast<float>(max_logit);
  const float inv_temperature = 1.0f / params.temperature;
  if (all_masked) {
    std::fill(probs, probs + keep, 1.0f);
  } else if (keep == logits.size() && !(top_k_cuts || params.top_p < 1.0f || params.min_p > 0.0f)) {
    // The whole vocabulary in id order: a loop the compiler vectorizes.
    const float* l = logits.data();
    for (size_t i = 0; i < keep; ++i) probs[i] = exp_nonpositive((l[i] - max_f) * inv_temperature);
  } else {
    for (size_t i = 0; i < keep; ++i)
      probs[i] = exp_nonpositive((logits[scratch.candidates[i]] - max_f) * inv_temperature);
  }
  const double total = top_p_needs_total(params) ? weight_sum(probs, keep) : 0.0;
  // top-p: the smallest prefix whose mass reaches top_p (at least one token).
  if (params.top_p < 1.0f) {
    double mass = 0.0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      mass += scratch.probs[i] / total;
      if (mass >= params.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
  }
  // min-p: drop tokens whose probability is below min_p times the top probability.
  if (params.min_p > 0.0f) {
    const float threshold = params.min_p * scratch.probs[0];
    size_t cut = 1;
    while (cut < keep && scratch.probs[cut] >= threshold) ++cut;
    keep = cut;
  }
  return keep;
}

int32_t draw_token(const SamplingParams& params, std::span<float> logits, std::mt19937_64& rng,
                   SamplingScratch& scratch) {
  if (params.greedy()) return argmax(logits);
  const size_t keep = kept_distribution(params, logits, scratch);
  const float* probs = scratch.probs.data();
  const double kept_total = weight_sum(probs, keep);
  std::uniform_real_distribution<double> uniform(0.0, kept_total);
  const double r = uniform(rng);
  // The first candidate whose cumulative weight passes r, walked a block of kBlock at a time (a
  // block's weight summed as weight_sum sums it), then within the block.
  double acc = 0.0;
  size_t i = 0;
  for (; i + kBlock <= keep; i += kBlock) {
    const double block = block_sum(probs + i);
    if (r < acc + block) break;
    acc += block;
  }
  for (; i < keep; ++i) {
    acc += probs[i];
    if (r < acc) return scratch.candidates[i];
  }
  return scratch.candidates[keep - 1];
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(make_rng(params)), scratch_(0) {}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> prompt,
                        std::span<const int32_t> output) {
  const auto n_vocab = static_cast<int32_t>(logits.size());
  if (static_cast<int32_t>(scratch_.counts.size()) != n_vocab) scratch_ = SamplingScratch(n_vocab);
  apply_logits_processors(params_, TokenHistory{prompt, output}, {}, logits, scratch_);
  return draw_token(params_, logits, rng_, scratch_);
}

BatchSampler::BatchSampler(int32_t n_vocab, ThreadPool* pool) : pool_(pool) {
  const int threads = pool_ != nullptr ? pool_->num_threads() : 1;
  scratch_.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) scratch_.emplace_back(n_vocab);
}

int32_t BatchSampler::sample_row(const Row& row, std::span<const int32_t> eog_ids,
                                 Scratch& scratch) {
  const SamplingParams& p = *row.params;
  std::span<float> logits = row.processed;
  if (logits.empty()) logits = std::span<float>(scratch.row.data(), row.logits.size());
  std::copy(row.logits.begin(), row.logits.end(), logits.begin());
  apply_logits_processors(p, row.history, eog_ids, logits, scratch.sampling);
  const int32_t token = draw_token(p, logits, *row.rng, scratch.sampling);
  if (row.logprob != nullptr && p.logprobs >= 0)
    *row.logprob = compute_logprobs(row.logits, token, p.logprobs, scratch.logprobs);
  return token;
}

int32_t BatchSampler::sample_one(const Row& row, std::span<const int32_t> eog_ids) {
  return sample_row(row, eog_ids, scratch_[0]);
}

void BatchSampler::sample(std::span<const Row> rows, std::span<const int32_t> eog_ids,
                          std::span<int32_t> tokens) {
  // Spread only a batch worth a job's hand-off (a few microseconds).
  size_t work = 0;
  for (const Row& r : rows) work += r.logits.size();
  if (pool_ == nullptr || pool_->num_threads() == 1 || rows.size() < 2 || work < 32768) {
    for (size_t i = 0; i < rows.size(); ++i) tokens[i] = sample_row(rows[i], eog_ids, scratch_[0]);
    return;
  }
  pool_->run([&](int thread, int threads) {
    // Rows by index, round-robin: a step's rows are alike in cost, and no row's result depends on
    // which thread draws it.
    for (size_t i = static_cast<size_t>(thread); i < rows.size(); i += static_cast<size_t>(threads))
      tokens[i] = sample_row(rows[i], eog_ids, scratch_[static_cast<size_t>(thread)]);
  });
}

}  // namespace vesper::sample
