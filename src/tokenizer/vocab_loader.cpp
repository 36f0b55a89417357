// Loading a Vocab from tokenizer.ggml.* metadata, following llama.cpp's llama_vocab::impl::load:
// the per-model defaults, the keys that override them, and the rules that recognise special
// tokens by their text.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <utility>

#include "tokenizer/bpe_presets.h"
#include "tokenizer/encode.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace vesper::tokenizer {
namespace {

constexpr std::string_view kKeyModel = "tokenizer.ggml.model";
constexpr std::string_view kKeyPre = "tokenizer.ggml.pre";
constexpr std::string_view kKeyTokens = "tokenizer.ggml.tokens";
constexpr std::string_view kKeyScores = "tokenizer.ggml.scores";
constexpr std::string_view kKeyTokenType = "tokenizer.ggml.token_type";
constexpr std::string_view kKeyMerges = "tokenizer.ggml.merges";
// Vesper's own key (hf_tokenizer.cpp writes it): ids that end generation besides those known
// by text, as a generation_config.json list of EOS ids gives them.
constexpr std::string_view kKeyEogIds = "tokenizer.ggml.eog_token_ids";

uint32_t attr_from_token_type(int64_t type) {
  switch (type) {
    case kTypeNormal:
      return kAttrNormal;
    case kTypeUnknown:
      return kAttrUnknown;
    case kTypeControl:
      return kAttrControl;
    case kTypeUserDefined:
      return kAttrUserDefined;
    case kTypeUnused:
      return kAttrUnused;
    case kTypeByte:
      return kAttrByte;
    default:
      return kAttrUndefined;
  }
}

Error key_error(const gguf::GgufFile& file, std::string_view key, const std::string& what) {
  return make_error(file.path() + ": metadata key \"" + std::string(key) + "\" " + what);
}

// Writes "\xE2\x96\x81"-style escapes for non-printable bytes, for error messages.
std::string printable(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F) {
      out.push_back(c);
    } else {
      static const char kHex[] = "0123456789ABCDEF";
      out += "\\x";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  return out;
}

// Parses "<0xHH>" (case-insensitive hex); -1 when `text` is not of that form.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = text[i];
    int digit = 0;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

// Byte-level BPE text back to bytes (llama.cpp's llama_decode_text, including its marker for
// characters outside the byte alphabet).
std::string decode_byte_level(const std::string& text) {
  std::string out;
  for (uint32_t cpt : decode_utf8_lenient(text)) {
    const int byte = bpe_char_to_byte(cpt);
    if (byte >= 0) {
      out.push_back(static_cast<char>(byte));
      continue;
    }
    std::string utf8;
    append_utf8(cpt, &utf8);
    static const char kHex[] = "0123456789abcdef";
    out += "[UNK_BYTE_0x";
    for (char c : utf8) {
      out.push_back(kHex[static_cast<unsigned char>(c) >> 4]);
      out.push_back(kHex[static_cast<unsigned char>(c) & 15]);
    }
    out += text + "]";
  }
  return out;
}

// llama.cpp's token_to_piece(special = true) for one token.
std::string render_piece(const Vocab& v, int32_t id) {
  const TokenData& t = v.tokens[id];
  if (t.attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return t.text;
  if (t.attr & kAttrNormal) {
    if (v.type == VocabType::kBpe) return decode_byte_level(t.text);
    std::string piece = t.text;
    replace_all(&piece, "\xE2\x96\x81", " ");
    return piece;
  }
  if (t.attr & kAttrByte) {
    const int byte = parse_byte_token(t.text);
    if (byte >= 0) return std::string(1, static_cast<char>(byte));
    return t.text;
  }
  return {};  // unused or undefined tokens render as nothing
}

// Reads a special-token id key. A missing key keeps `*id`; a value outside the vocabulary is
// ignored (llama.cpp warns and keeps the default; real files use 0xFFFFFFFF for "none").
Status read_special_id(const gguf::GgufFile& file, std::string_view key, int32_t n_vocab,
                       int32_t* id) {
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> value, file.get_int(key));
  if (value && *value >= 0 && *value < n_vocab) *id = static_cast<int32_t>(*value);
  return {};
}

Status read_bool(const gguf::GgufFile& file, std::string_view key, bool* flag) {
  VESPER_ASSIGN_OR_RETURN(std::optional<bool> value, file.get_bool(key));
  if (value) *flag = *value;
  return {};
}

// "\xEF\xBD\x9C" is U+FF5C (fullwidth vertical line), "\xE2\x96\x81" U+2581 (SentencePiece space).
#define VESPER_FW_BAR "\xEF\xBD\x9C"
#define VESPER_SP_SPACE "\xE2\x96\x81"

// Texts that llama.cpp recognises as special tokens when the metadata does not name them. The
// first text (in list order) present in the vocabulary wins.
const std::vector<std::string_view> kEotTexts = {"<|eot_id|>",
                                                 "<|im_end|>",
                                                 "<|end|>",
                                                 "<end_of_turn>",
                                                 "<|endoftext|>",
                                                 "<|end_of_text|>",
                                                 "<EOT>",
                                                 "_<EOT>",
                                                 "<" VESPER_FW_BAR "end" VESPER_SP_SPACE
                                                 "of" VESPER_SP_SPACE "sentence" VESPER_FW_BAR ">",
                                                 "<end_of_utterance>"};
const std::vector<std::string_view> kEomTexts = {"<|eom_id|>"};
const std::vector<std::string_view> kFimPreTexts = {
    "<|fim_prefix|>",  "<fim-prefix>",
    "<fim_prefix>",    "<" VESPER_FW_BAR "fim" VESPER_SP_SPACE "begin" VESPER_FW_BAR ">",
    "<PRE>",           VESPER_SP_SPACE "<PRE>",
    "<|code_prefix|>", "<|prefix|>"};
const std::vector<std::string_view> kFimSufTexts = {
    "<|fim_suffix|>",  "<fim-suffix>",
    "<fim_suffix>",    "<" VESPER_FW_BAR "fim" VESPER_SP_SPACE "hole" VESPER_FW_BAR ">",
    "<SUF>",           VESPER_SP_SPACE "<SUF>",
    "<|code_suffix|>", "<|suffix|>"};
const std::vector<std::string_view> kFimMidTexts = {
    "<|fim_middle|>",  "<fim-middle>",
    "<fim_middle>",    "<" VESPER_FW_BAR "fim" VESPER_SP_SPACE "end" VESPER_FW_BAR ">",
    "<MID>",           VESPER_SP_SPACE "<MID>",
    "<|code_middle|>", "<|middle|>"};
const std::vector<std::string_view> kFimPadTexts = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                                    "<PAD>"};
const std::vector<std::string_view> kFimRepTexts = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                                    "<REPO>", "<reponame>"};
const std::vector<std::string_view> kFimSepTexts = {"<|file_sep|>"};
// End-of-generation texts.
const std::vector<std::string_view> kEogTexts = {"<|eot_id|>",
                                                 "<|im_end|>",
                                                 "<|end|>",
                                                 "<|return|>",
                                                 "<|call|>",
                                                 "<end_of_turn>",
                                                 "<|endoftext|>",
                                                 "<|eom_id|>",
                                                 "<EOT>",
                                                 "_<EOT>",
                                                 "<|end_of_text|>",
                                                 "<end_of_utterance>",
                                                 "<" VESPER_FW_BAR "end" VESPER_SP_SPACE
                                                 "of" VESPER_SP_SPACE "sentence" VESPER_FW_BAR ">"};

#undef VESPER_FW_BAR
#undef VESPER_SP_SPACE

std::string lowercase_ascii(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

class Loader {
 public:
  explicit Loader(const gguf::GgufFile& file) : file_(file) {}

  Result<std::shared_ptr<const Vocab>> load() {
    auto v = std::make_shared<Vocab>();
    v_ = v.get();
    v_->path = file_.path();
    VESPER_TRY(read_model());
    VESPER_TRY(read_tokens());
    VESPER_TRY(read_merges());
    VESPER_TRY(read_special_ids());
    detect_special_tokens();
    apply_model_token_rules();
    build_special_index();
    build_byte_tokens();
    build_pieces();
    VESPER_TRY(build_pre_tokenizer());
    find_newline();
    return std::shared_ptr<const Vocab>(std::move(v));
  }

 private:
  Status read_model() {
    if (file_.assembled() && file_.find(kKeyModel) == nullptr)
      return make_error(file_.path() + ": no tokenizer: the checkpoint has no tokenizer.json");
    VESPER_ASSIGN_OR_RETURN(v_->model, file_.require_string(kKeyModel));
    VESPER_ASSIGN_OR_RETURN(std::optional<std::string> pre, file_.get_string(kKeyPre));
    v_->pre = pre.value_or("");
    // Default special ids and flags per model, as llama.cpp sets them before reading keys.
    if (v_->model == "llama") {
      v_->type = VocabType::kSpm;
      v_->bos = 1;
      v_->eos = 2;
      v_->unk = 0;
      v_->add_space_prefix = true;
      v_->clean_spaces = false;
      v_->add_bos = true;
      v_->add_eos = false;
    } else if (v_->model == "gpt2") {
      v_->type = VocabType::kBpe;
      v_->bos = 11;  // llama.cpp's legacy defaults (Falcon's <|endoftext|>)
      v_->eos = 11;
      std::optional<BpePreset> preset = find_bpe_preset(v_->pre);
      if (!preset) {
        std::string names;
        for (std::string_view name : bpe_preset_names()) {
          if (!names.empty()) names += ", ";
          names += name;
        }
        return key_error(file_, kKeyPre,
                         "names unknown pre-tokenizer \"" + printable(v_->pre) +
                             "\" for a gpt2 (BPE) vocabulary; supported: " + names);
      }
      preset_ = std::move(*preset);
      v_->clean_spaces = preset_.clean_spaces;
      v_->ignore_merges = preset_.ignore_merges;
      v_->add_bos = preset_.add_bos;
      v_->add_sep = preset_.add_sep;
      if (preset_.no_default_bos) v_->bos = kNoToken;
    } else if (v_->model == "bert") {
      v_->type = VocabType::kWpm;
      v_->bos = 101;
      v_->unk = 100;
      v_->sep = 102;
      v_->pad = 0;
      v_->mask = 103;
      v_->clean_spaces = true;
      v_->add_bos = true;
      v_->add_eos = false;
      v_->add_sep = true;
    } else {
      return key_error(file_, kKeyModel,
                       "names unsupported tokenizer model \"" + printable(v_->model) +
                           "\"; supported: \"llama\" (SPM), \"gpt2\" (BPE), \"bert\" (WPM)");
    }
    VESPER_TRY(read_bool(file_, "tokenizer.ggml.add_space_prefix", &v_->add_space_prefix));
    VESPER_TRY(
        read_bool(file_, "tokenizer.ggml.remove_extra_whitespaces", &v_->remove_extra_whitespaces));
    return {};
  }

  Status read_tokens() {
    VESPER_ASSIGN_OR_RETURN(const gguf::Array* tokens,
                            file_.get_array(kKeyTokens, gguf::ValueType::kString));
    if (tokens == nullptr)
      return make_error(file_.path() + ": missing metadata key \"" + std::string(kKeyTokens) +
                        "\" (the token texts; this file has no tokenizer)");
    const size_t n = tokens->items.size();
    if (n == 0) return key_error(file_, kKeyTokens, "is empty");
    if (n > static_cast<size_t>(INT32_MAX))
      return key_error(file_, kKeyTokens, "has too many entries");

    // Scores: float32 or int32, one per token.
    const gguf::Array* scores = nullptr;
    if (const gguf::Value* value = file_.find(kKeyScores)) {
      scores = value->as_array();
      if (scores == nullptr || (scores->element_type != gguf::ValueType::kFloat32 &&
                                scores->element_type != gguf::ValueType::kInt32)) {
        return key_error(
            file_, kKeyScores,
            "has type " + std::string(gguf::value_type_name(value->type)) +
                (scores ? " of " + std::string(gguf::value_type_name(scores->element_type)) : "") +
                ", expected an array of float32 or int32");
      }
      if (scores->items.size() != n)
        return key_error(file_, kKeyScores,
                         "has " + std::to_string(scores->items.size()) + " entries, expected " +
                             std::to_string(n) + " (one per entry of \"" + std::string(kKeyTokens) +
                             "\")");
    }
    VESPER_ASSIGN_OR_RETURN(const gguf::Array* types,
                            file_.get_array(kKeyTokenType, gguf::ValueType::kInt32));
    if (types != nullptr && types->items.size() != n)
      return key_error(file_, kKeyTokenType,
                       "has " + std::to_string(types->items.size()) + " entries, expected " +
                           std::to_string(n) + " (one per entry of \"" + std::string(kKeyTokens) +
                           "\")");

    v_->tokens.resize(n);
    v_->token_to_id.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      TokenData& t = v_->tokens[i];
      t.text = *tokens->items[i].as_string();
      if (t.text.empty()) t.text = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp
      if (scores != nullptr)
        t.score = static_cast<float>(scores->items[i].as_double().value_or(0.0));
      t.attr = types ? attr_from_token_type(types->items[i].as_int().value_or(kTypeUndefined))
                     : kAttrNormal;
      const auto [it, inserted] = v_->token_to_id.emplace(t.text, static_cast<int32_t>(i));
      if (!inserted)
        return key_error(file_, kKeyTokens,
                         "holds token \"" + printable(t.text) + "\" twice (ids " +
                             std::to_string(it->second) + " and " + std::to_string(i) + ")");
      v_->max_token_len = std::max(v_->max_token_len, t.text.size());
    }
    return {};
  }

  Status read_merges() {
    if (v_->type == VocabType::kWpm) return {};
    VESPER_ASSIGN_OR_RETURN(const gguf::Array* merges,
                            file_.get_array(kKeyMerges, gguf::ValueType::kString));
    if (merges == nullptr && v_->type == VocabType::kBpe)
      return make_error(file_.path() + ": missing metadata key \"" + std::string(kKeyMerges) +
                        "\" (required by a gpt2 (BPE) vocabulary)");
    // A "llama" vocabulary with merges (even none) merges by rank, as Hugging Face's BPE does.
    // llama.cpp's converter never writes merges for "llama": no "llama" vocabulary of
    // ../shared/tokenizer-vectors/ (llama-spm, phi-3) or ../shared/models/*.gguf has the key
    // (a test checks the vectors), so they keep llama.cpp's score order.
    if (merges == nullptr) return {};
    v_->spm_merges_by_rank = v_->type == VocabType::kSpm;
    v_->bpe_ranks.reserve(merges->items.size());
    for (size_t i = 0; i < merges->items.size(); ++i) {
      const std::string& merge = *merges->items[i].as_string();
      // "left right"; the separator is the first space after the first byte (llama.cpp).
      const size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string::npos;
      if (space == std::string::npos || space + 1 >= merge.size())
        return key_error(file_, kKeyMerges,
                         "entry " + std::to_string(i) + " \"" + printable(merge) +
                             "\" is not two tokens separated by a space");
      // The first occurrence keeps the lower rank, as llama.cpp's emplace does.
      v_->bpe_ranks.emplace(merge, static_cast<int32_t>(i));
    }
    return {};
  }

  Status read_special_ids() {
    const int32_t n = v_->n_vocab();
    // Defaults that fall outside this vocabulary mean "none".
    for (int32_t* id : {&v_->bos, &v_->eos, &v_->unk, &v_->sep, &v_->pad, &v_->mask})
      if (*id >= n) *id = kNoToken;
    const std::pair<std::string_view, int32_t*> keys[] = {
        {"tokenizer.ggml.bos_token_id", &v_->bos},
        {"tokenizer.ggml.eos_token_id", &v_->eos},
        {"tokenizer.ggml.eot_token_id", &v_->eot},
        {"tokenizer.ggml.eom_token_id", &v_->eom},
        {"tokenizer.ggml.unknown_token_id", &v_->unk},
        {"tokenizer.ggml.seperator_token_id", &v_->sep},  // sic: the GGUF key is misspelled
        {"tokenizer.ggml.padding_token_id", &v_->pad},
        {"tokenizer.ggml.mask_token_id", &v_->mask},
        {"tokenizer.ggml.fim_pre_token_id", &v_->fim_pre},
        {"tokenizer.ggml.fim_suf_token_id", &v_->fim_suf},
        {"tokenizer.ggml.fim_mid_token_id", &v_->fim_mid},
        {"tokenizer.ggml.fim_pad_token_id", &v_->fim_pad},
        {"tokenizer.ggml.fim_rep_token_id", &v_->fim_rep},
        {"tokenizer.ggml.fim_sep_token_id", &v_->fim_sep},
        {"tokenizer.ggml.prefix_token_id", &v_->fim_pre},  // deprecated names
        {"tokenizer.ggml.suffix_token_id", &v_->fim_suf},
        {"tokenizer.ggml.middle_token_id", &v_->fim_mid},
    };
    for (const auto& [key, id] : keys) VESPER_TRY(read_special_id(file_, key, n, id));
    if (const gguf::Value* value = file_.find(kKeyEogIds)) {
      const gguf::Array* ids = value->as_array();
      const bool integers =
          ids != nullptr && std::all_of(ids->items.begin(), ids->items.end(),
                                        [](const gguf::Value& id) { return id.is_integer(); });
      if (!integers) return key_error(file_, kKeyEogIds, "is not an array of token ids");
      for (const gguf::Value& id : ids->items) {
        const std::optional<int64_t> i = id.as_int();
        if (i && *i >= 0 && *i < n) extra_eog_.push_back(static_cast<int32_t>(*i));
      }
    }

    VESPER_TRY(read_bool(file_, "tokenizer.ggml.add_bos_token", &v_->add_bos));
    VESPER_TRY(read_bool(file_, "tokenizer.ggml.add_eos_token", &v_->add_eos));
    VESPER_TRY(read_bool(file_, "tokenizer.ggml.add_sep_token", &v_->add_sep));
    const std::pair<bool, std::pair<std::string_view, int32_t>> checks[] = {
        {v_->add_bos, {"tokenizer.ggml.add_bos_token", v_->bos}},
        {v_->add_eos, {"tokenizer.ggml.add_eos_token", v_->eos}},
        {v_->add_sep, {"tokenizer.ggml.add_sep_token", v_->sep}},
    };
    for (const auto& [add, what] : checks) {
      if (add && what.second == kNoToken)
        return key_error(file_, what.first,
                         "asks to add a special token that the vocabulary does not define "
                         "(no valid id for it)");
    }

    VESPER_TRY(read_bool(file_, "tokenizer.ggml.normalizer.lowercase", &v_->lowercase));
    v_->strip_accents = v_->lowercase;
    VESPER_TRY(read_bool(file_, "tokenizer.ggml.normalizer.strip_accents", &v_->strip_accents));
    return {};
  }

  void mark_control(int32_t id) { v_->tokens[id].attr |= kAttrControl; }

  void detect_one(int32_t* id, const std::vector<std::string_view>& texts) {
    if (*id != kNoToken) return;
    for (std::string_view text : texts) {
      const int32_t found = v_->find(text);
      if (found == kNoToken) continue;
      *id = found;
      mark_control(found);
      return;
    }
  }

  void detect_special_tokens() {
    detect_one(&v_->eot, kEotTexts);
    detect_one(&v_->eom, kEomTexts);
    detect_one(&v_->fim_pre, kFimPreTexts);
    detect_one(&v_->fim_suf, kFimSufTexts);
    detect_one(&v_->fim_mid, kFimMidTexts);
    detect_one(&v_->fim_pad, kFimPadTexts);
    detect_one(&v_->fim_rep, kFimRepTexts);
    detect_one(&v_->fim_sep, kFimSepTexts);

    // Control tokens named "...unused..." are unused.
    for (TokenData& t : v_->tokens)
      if ((t.attr & kAttrControl) && t.text.find("unused") != std::string::npos)
        t.attr |= kAttrUnused;

    // End of generation: FIM pad/repo/sep, the texts llama.cpp lists, and EOS/EOT/EOM.
    std::vector<int32_t> eog;
    for (int32_t id : {v_->fim_pad, v_->fim_rep, v_->fim_sep})
      if (id != kNoToken) eog.push_back(id);
    for (std::string_view text : kEogTexts) {
      const int32_t id = v_->find(text);
      if (id == kNoToken) continue;
      eog.push_back(id);
      mark_control(id);
    }
    for (int32_t id : {v_->eos, v_->eot, v_->eom})
      if (id != kNoToken) eog.push_back(id);
    std::sort(eog.begin(), eog.end());
    eog.erase(std::unique(eog.begin(), eog.end()), eog.end());

    // gpt-oss (o200k_harmony): <|end|> ends a message, not the generation, when <|return|> and
    // <|call|> exist; and these structural tokens always render.
    const int32_t ret = v_->find("<|return|>");
    const int32_t call = v_->find("<|call|>");
    const int32_t end = v_->find("<|end|>");
    if (ret != kNoToken && call != kNoToken && end != kNoToken) {
      eog.erase(std::remove(eog.begin(), eog.end(), end), eog.end());
      v_->tokens[end].attr = kAttrUserDefined;
      if (v_->eot == end) v_->eot = kNoToken;
    }
    for (std::string_view text : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
      const int32_t id = v_->find(text);
      if (id != kNoToken) v_->tokens[id].attr = kAttrUserDefined;
    }
    if (!extra_eog_.empty()) {  // listed explicitly: they end generation whatever the rules say
      eog.insert(eog.end(), extra_eog_.begin(), extra_eog_.end());
      std::sort(eog.begin(), eog.end());
      eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
    }
    v_->eog_ids = std::move(eog);
  }

  // Per-model attribute rules that llama.cpp keys on general.name / tokenizer.ggml.pre.
  void apply_model_token_rules() {
    std::string name;
    if (const gguf::Value* value = file_.find("general.name"))
      if (const std::string* s = value->as_string()) name = lowercase_ascii(*s);
    std::string arch;
    if (const gguf::Value* value = file_.find("general.architecture"))
      if (const std::string* s = value->as_string()) arch = *s;
    const auto set = [&](std::string_view text, uint32_t attr, bool on) {
      const int32_t id = v_->find(text);
      if (id == kNoToken) return;
      if (on) {
        v_->tokens[id].attr |= attr;
      } else {
        v_->tokens[id].attr &= ~attr;
      }
    };
    const auto contains = [](std::string_view s, std::initializer_list<std::string_view> subs) {
      for (std::string_view sub : subs)
        if (s.find(sub) != std::string_view::npos) return true;
      return false;
    };
    if (contains(v_->pre, {"jina-v2-de", "jina-v2-es", "jina-v2-code"}) ||
        contains(arch, {"nomic-bert-moe", "jina-bert-v3"})) {
      set("<mask>", kAttrLstrip, true);
    } else if (contains(name, {"phi-3", "phi3"})) {
      // Phi-3's added tokens swallow the whitespace after them.
      for (TokenData& t : v_->tokens)
        if (t.attr & (kAttrControl | kAttrUserDefined | kAttrUnknown)) t.attr |= kAttrRstrip;
      set("</s>", kAttrRstrip, true);
      for (std::string_view text : {"<unk>", "<s>", "<|endoftext|>"}) set(text, kAttrRstrip, false);
    } else if (contains(name, {"modern-bert"})) {
      set("[MASK]", kAttrLstrip, true);
    }
  }

  void build_special_index() {
    for (int32_t id = 0; id < v_->n_vocab(); ++id)
      if (v_->tokens[id].attr & (kAttrControl | kAttrUserDefined | kAttrUnknown))
        v_->special_tokens.push_back(id);
    std::stable_sort(v_->special_tokens.begin(), v_->special_tokens.end(),
                     [&](int32_t a, int32_t b) {
                       return v_->tokens[a].text.size() > v_->tokens[b].text.size();
                     });
    for (size_t i = 0; i < v_->special_tokens.size(); ++i)
      v_->special_trie.insert(v_->tokens[v_->special_tokens[i]].text, static_cast<int32_t>(i));
  }

  void build_byte_tokens() {
    static const char kHex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      int32_t id = kNoToken;
      if (v_->type == VocabType::kBpe) {
        id = v_->find(byte_to_bpe_char(static_cast<uint8_t>(b)));
      } else {
        const char text[] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
        id = v_->find(std::string_view(text, sizeof(text)));
        if (id == kNoToken) id = v_->find(std::string(1, static_cast<char>(b)));
      }
      v_->byte_tokens[b] = id;
    }
  }

  void build_pieces() {
    v_->piece_offsets.reserve(v_->tokens.size() + 1);
    v_->piece_offsets.push_back(0);
    for (int32_t id = 0; id < v_->n_vocab(); ++id) {
      v_->pieces += render_piece(*v_, id);
      v_->piece_offsets.push_back(static_cast<uint32_t>(v_->pieces.size()));
    }
  }

  Status build_pre_tokenizer() {
    if (v_->type != VocabType::kBpe) return {};
    Result<RegexSplitter> splitter = RegexSplitter::compile(preset_.patterns);
    if (!splitter.ok())
      return key_error(file_, kKeyPre, "\"" + v_->pre + "\": " + splitter.error().message);
    v_->pre_tokenizer = std::move(splitter).value();
    return {};
  }

  void find_newline() {
    switch (v_->type) {
      case VocabType::kSpm:
        v_->nl = v_->byte_tokens['\n'] != kNoToken ? v_->byte_tokens['\n'] : v_->pad;
        break;
      case VocabType::kWpm:
        v_->nl = v_->pad;
        break;
      case VocabType::kBpe: {
        // The first token of "\n", as the finished vocabulary encodes it.
        const std::vector<int32_t> ids = encode_text(*v_, "\n", false, false);
        v_->nl = ids.empty() ? v_->pad : ids[0];
        break;
      }
    }
  }

  const gguf::GgufFile& file_;
  Vocab* v_ = nullptr;
  BpePreset preset_;
  std::vector<int32_t> extra_eog_;  // from kKeyEogIds
};

}  // namespace

void SpecialTrie::insert(std::string_view text, int32_t value) {
  int32_t node = 0;
  for (char c : text) {
    const auto byte = static_cast<uint8_t>(c);
    auto& children = nodes_[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}),
                               [](const auto& a, const auto& b) { return a.first < b.first; });
    if (it != children.end() && it->first == byte) {
      node = it->second;
      continue;
    }
    const auto next = static_cast<int32_t>(nodes_.size());
    children.insert(it, {byte, next});
    nodes_.emplace_back();
    node = next;
  }
  if (nodes_[node].value < 0) nodes_[node].value = value;
}

int32_t SpecialTrie::child(int32_t node, uint8_t byte) const {
  const auto& children = nodes_[node].children;
  auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}),
                             [](const auto& a, const auto& b) { return a.first < b.first; });
  return (it != children.end() && it->first == byte) ? it->second : -1;
}

void replace_all(std::string* s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s->size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s->find(from, pos);
    if (hit == std::string::npos) break;
    out.append(*s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(*s, pos, std::string::npos);
  s->swap(out);
}

std::string_view Vocab::piece(int32_t id, bool render_special) const {
  if (!render_special && (tokens[id].attr & (kAttrUnknown | kAttrControl))) return {};
  return std::string_view(pieces).substr(piece_offsets[id],
                                         piece_offsets[id + 1] - piece_offsets[id]);
}

Result<std::shared_ptr<const Vocab>> load_vocab(const gguf::GgufFile& file) {
  return Loader(file).load();
}

bool is_eog_text(std::string_view text) {
  return std::find(kEogTexts.begin(), kEogTexts.end(), text) != kEogTexts.end();
}

}  // namespace vesper::tokenizer
