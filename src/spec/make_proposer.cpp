#include "spec/make_proposer.h"

#include <algorithm>
#include <string>

#include "spec/draft_model_proposer.h"
#include "spec/medusa_proposer.h"
#include "spec/ngram_proposer.h"

namespace vesper::spec {

Result<std::unique_ptr<Proposer>> make_proposer(SpeculativeConfig& config,
                                                backend::Backend& backend,
                                                const model::Model& target,
                                                const tokenizer::Tokenizer& target_vocab) {
  if (!config.enabled()) return std::unique_ptr<Proposer>();
  if (config.num_speculative_tokens < 1)
    return make_error(
        "--num-speculative-tokens must be at least 1 with speculative decoding, got " +
        std::to_string(config.num_speculative_tokens));
  switch (config.method) {
    case SpeculativeConfig::Method::kNgram:
      if (config.ngram.min_n < 1 || config.ngram.max_n < config.ngram.min_n)
        return make_error("--ngram-prompt-lookup-min " + std::to_string(config.ngram.min_n) +
                          " and --ngram-prompt-lookup-max " + std::to_string(config.ngram.max_n) +
                          ": need 1 <= min <= max");
      return std::unique_ptr<Proposer>(std::make_unique<NgramProposer>(config.ngram));
    case SpeculativeConfig::Method::kDraftModel: {
      VESPER_ASSIGN_OR_RETURN(auto draft,
                              DraftModelProposer::load(config.model, backend, target_vocab));
      return std::unique_ptr<Proposer>(std::move(draft));
    }
    case SpeculativeConfig::Method::kMedusa: {
      // Sized per step, the proposals are chains (the policy models a chain's acceptance).
      if (config.auto_num_speculative_tokens) config.medusa_tree = false;
      const model::ModelConfig& mc = target.config();
      VESPER_ASSIGN_OR_RETURN(
          auto medusa, MedusaProposer::load(config.model, backend, mc.n_embd, mc.n_vocab,
                                            target.weights().output.type, config.medusa_tree));
      // Auto-sized chains: at most one proposal per head.
      if (config.auto_num_speculative_tokens)
        config.num_speculative_tokens =
            std::min(config.num_speculative_tokens, medusa->heads().num_heads());
      return std::unique_ptr<Proposer>(std::move(medusa));
    }
    case SpeculativeConfig::Method::kNone:
      break;
  }
  return std::unique_ptr<Proposer>();
}

}  // namespace vesper::spec
