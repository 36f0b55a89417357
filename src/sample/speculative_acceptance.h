// Verifying speculative tokens: the acceptance rules the proposers of spec/ rely on. Given the
// target model's rows for a sequence's last committed token and each of its k proposals (k + 1
// rows: row i predicts what follows proposal i - 1), decide how many proposals the sequence
// keeps and which token comes after them. Every rule's output follows the target alone:
//  - rejection_sampler (Leviathan et al. 2023, Chen et al. 2023; vLLM's default): keep proposal x
//    with probability min(1, p(x) / q(x)); at the first rejection draw the next token from
//    norm(max(0, p - q)); with every proposal kept, draw a bonus token from the last row's p. p is
//    exactly the distribution plain sampling draws from (logits processors with the history so
//    far, temperature, top-k, top-p, min-p), q the proposer's (one-hot for n-gram proposals), so
//    the output distribution equals sampling without speculation. Greedy requests (temperature 0)
//    have a one-hot p: a proposal is kept while it equals the target's argmax, and the token after
//    is the target's argmax, so greedy output is token for token the target's own.
//  - typical_acceptance_sampler (Medusa, vLLM's TypicalAcceptanceSampler): keep x while
//    p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p))); at the first miss draw from p.
//    Faster acceptance, approximately the target's distribution (exact for greedy requests).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "sample/logits_processors.h"
#include "sample/sampling_params.h"

namespace vesper::sample {

enum class AcceptanceMethod { kRejectionSampler, kTypicalAcceptance };

// "rejection_sampler" or "typical_acceptance_sampler" (vLLM's names).
Result<AcceptanceMethod> parse_acceptance_method(std::string_view name);
std::string_view acceptance_method_name(AcceptanceMethod method);

struct AcceptanceConfig {
  AcceptanceMethod method = AcceptanceMethod::kRejectionSampler;
  // Typical acceptance (vLLM's --typical-acceptance-sampler-posterior-threshold / -alpha).
  float posterior_threshold = 0.09f;
  float posterior_alpha = 0.3f;
};

struct Verification {
  int64_t num_accepted = 0;  // proposals kept, from the first
  int32_t next_token = 0;    // the token after them (drawn from the target)
};

// A tree's verification: the proposals kept, from the root down, and the token after them.
struct TreeVerification {
  std::vector<int32_t> path;  // proposal indices, each the child of the one before
  int32_t next_token = 0;
};

class SpeculativeVerifier {
 public:
  explicit SpeculativeVerifier(int32_t n_vocab);

  // `rows`: the target's k + 1 raw logits rows; `proposals`: the k proposed tokens;
  // `draft_probs`: the proposer's distribution for each proposal (k rows of n_vocab), or empty for
  // one-hot proposals (n-gram lookup). `history` is the sequence's committed history (prompt and
  // output so far): row i is processed with the first i proposals appended to the output, as
  // plain sampling would see them. `eog_ids` are the vocabulary's end-of-generation tokens (for
  // min_tokens).
  Verification verify(const SamplingParams& params, const AcceptanceConfig& config,
                      std::mt19937_64& rng, const TokenHistory& history,
                      std::span<const std::span<const float>> rows,
                      std::span<const int32_t> proposals,
                      std::span<const std::span<const float>> draft_probs,
                      std::span<const int32_t> eog_ids);

  // Proposals shaped as a tree (Medusa's candidates): `parents[j]` is proposal j's parent
  // (-1: the last committed token), parents before children; rows[0] is the last committed
  // token's row, rows[1 + j] proposal j's. One-hot proposals (each candidate a deterministic
  // choice). From the root, each node's children are tried in order: greedy keeps the child equal
  // to the target's argmax; rejection_sampler keeps child c with probability p'(c), where p' is p
  // with the children already rejected removed and renormalised (SpecInfer's multi-candidate
  // rule with one-hot q: the token that follows has exactly p's distribution), and without a kept
  // child draws the next token from p'; typical acceptance keeps the first child over its
  // threshold, else draws from p.
  TreeVerification verify_tree(const SamplingParams& params, const AcceptanceConfig& config,
                               std::mt19937_64& rng, const TokenHistory& history,
                               std::span<const std::span<const float>> rows,
                               std::span<const int32_t> proposals, std::span<const int32_t> parents,
                               std::span<const int32_t> eog_ids);

 private:
  // p for row `row` with `accepted` proposals appended to the output: fills p_ (normalised, over
  // the whole vocabulary) and returns nothing; the draw helpers read it.
  void target_distribution(const SamplingParams& params, const TokenHistory& history,
                           std::span<const float> row, std::span<const int32_t> accepted,
                           std::span<const int32_t> eog_ids);
  int32_t draw_from(const std::vector<double>& weights, double total, std::mt19937_64& rng) const;
  // Typical acceptance's bar for p_ (min(threshold, alpha * exp(-entropy))).
  double typical_threshold(const AcceptanceConfig& config) const;

  SamplingScratch scratch_;
  std::vector<float> row_;
  std::vector<int32_t> output_;  // the committed output followed by the proposals kept so far
  std::vector<int32_t> kept_;    // verify_tree: the kept proposals' tokens
  std::vector<double> p_, residual_;
};

}  // namespace vesper::sample
