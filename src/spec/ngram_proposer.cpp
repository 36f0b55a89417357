#include "spec/ngram_proposer.h"

#include <algorithm>
#include <string>

namespace vesper::spec {

void propose_ngram(std::span<const int32_t> tokens, const NgramConfig& config, int64_t k,
                   std::vector<int32_t>& out) {
  out.clear();
  const auto len = static_cast<int64_t>(tokens.size());
  if (k <= 0) return;
  for (int64_t n = std::min<int64_t>(config.max_n, len - 1);
       n >= std::max<int32_t>(config.min_n, 1); --n) {
    const std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(len - n));
    // The most recent earlier occurrence: start positions from the latest one that leaves at
    // least one token after it, backwards.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t take = std::min(k, len - from);
      out.assign(tokens.begin() + from, tokens.begin() + from + take);
      return;
    }
  }
}

std::string NgramProposer::describe() const {
  return "n-gram prompt lookup (n " + std::to_string(config_.min_n) + ".." +
         std::to_string(config_.max_n) + ")";
}

void NgramProposer::propose(std::span<const ProposalRequest> requests,
                            const sched::SequenceMirror& mirror, const backend::Tensor&,
                            std::vector<Proposal>& out) {
  out.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    out[i].parents.clear();
    const sched::SequenceMirror::Entry* e = mirror.find(requests[i].id);
    if (e == nullptr) {
      out[i].tokens.clear();
      continue;
    }
    propose_ngram(e->tokens, config_, requests[i].k, out[i].tokens);
  }
}

}  // namespace vesper::spec
