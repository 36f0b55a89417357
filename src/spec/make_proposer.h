// The proposer a SpeculativeConfig asks for, loaded and checked against the target.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/result.h"
#include "model/model.h"
#include "spec/proposer.h"
#include "spec/speculative_config.h"
#include "tokenizer/tokenizer.h"

namespace vesper::spec {

// Null without speculative decoding. Medusa heads sized per step (--num-speculative-tokens auto)
// propose chains of at most one token per head: `config` is adjusted to say so. Errors name the
// file or flag at fault.
Result<std::unique_ptr<Proposer>> make_proposer(SpeculativeConfig& config,
                                                backend::Backend& backend,
                                                const model::Model& target,
                                                const tokenizer::Tokenizer& target_vocab);

}  // namespace vesper::spec
