#include "engine/grammar_vocabulary.h"

namespace vesper::engine {

std::shared_ptr<const grammar::TokenVocabulary> grammar_vocabulary(
    const tokenizer::Tokenizer& tok) {
  std::vector<std::string> pieces(static_cast<size_t>(tok.n_vocab()));
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    if (tok.is_control(id) || tok.is_unknown(id) || tok.is_unused(id)) continue;
    pieces[static_cast<size_t>(id)] = tok.token_to_piece(id, /*render_special=*/false);
  }
  return std::make_shared<const grammar::TokenVocabulary>(std::move(pieces), tok.eog_ids());
}

}  // namespace vesper::engine
