// Hugging Face tokenizer.json (and its companion files) -> tokenizer.ggml.* metadata. The choices
// follow llama.cpp's convert_hf_to_gguf.py and gguf-py's SpecialVocab, except where README.md
// ("Hugging Face checkpoints") says otherwise.
#include "tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "core/json_file.h"
#include "tokenizer/bpe_presets.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace vesper::tokenizer {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Metadata = std::vector<std::pair<std::string, gguf::Value>>;

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
// More tokens than any real vocabulary; bounds what ids and config.json's vocab_size may ask for.
constexpr int64_t kMaxTokens = int64_t{1} << 24;
// The score of SentencePiece-style pieces that no merge produces: below every -rank.
constexpr float kUnmergedScore = -1e9f;

// Text for messages: quoted, control bytes escaped (nothing else, so regexes read as written),
// long texts cut.
std::string quote(std::string_view s) {
  constexpr size_t kMax = 160;
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u < 0x20 || u == 0x7F) {
      static const char kHex[] = "0123456789ABCDEF";
      out += "\\x";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    } else {
      out.push_back(s[i]);
    }
  }
  if (s.size() > kMax) out += "...";
  return out + "\"";
}

std::string indexed(const std::string& field, size_t i) {
  return field + "[" + std::to_string(i) + "]";
}

bool is_byte_piece(std::string_view text) {
  const auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
  return text.size() == 6 && text.substr(0, 3) == "<0x" && hex(text[3]) && hex(text[4]) &&
         text[5] == '>';
}

// A string member; `fallback` when missing or null, an error when of another type.
Result<std::string> string_member(const JsonFile& f, const json& obj, const std::string& key,
                                  const std::string& field, std::string fallback) {
  const json* v = json_member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_string()) return f.error(field, "is not a string");
  return v->get<std::string>();
}

Result<bool> bool_member(const JsonFile& f, const json& obj, const std::string& key,
                         const std::string& field, bool fallback) {
  const json* v = json_member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return f.error(field, "is not true or false");
  return v->get<bool>();
}

// A regex in one spelling, so that tokenizer.json's Split regexes compare equal to the presets:
// `(?i:'s|'t|...)` spelled out as llama.cpp (and bpe_presets.cpp) write it, and every non-ASCII
// character and every \x{...} escape as \x{HEX}.
std::string canonical_regex(std::string_view regex) {
  std::string s(regex);
  replace_all(&s, "(?i:'s|'t|'re|'ve|'m|'ll|'d)",
              "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])");
  const auto escape = [](uint32_t cpt, std::string* out) {
    static const char kHex[] = "0123456789ABCDEF";
    std::string digits;
    do {
      digits.insert(digits.begin(), kHex[cpt & 15]);
      cpt >>= 4;
    } while (cpt != 0);
    *out += "\\x{" + digits + "}";
  };
  const auto hex_value = [](uint32_t c) -> int {
    if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
    return -1;
  };
  const std::vector<uint32_t> cpts = decode_utf8_lenient(s);
  std::string out;
  for (size_t i = 0; i < cpts.size(); ++i) {
    if (cpts[i] == '\\' && i + 1 < cpts.size()) {
      if (cpts[i + 1] == 'x' && i + 2 < cpts.size() && cpts[i + 2] == '{') {
        uint32_t value = 0;
        size_t j = i + 3;
        for (; j < cpts.size() && hex_value(cpts[j]) >= 0 && value <= 0x10FFFF; ++j)
          value = value * 16 + static_cast<uint32_t>(hex_value(cpts[j]));
        if (j < cpts.size() && cpts[j] == '}' && j > i + 3 && value <= 0x10FFFF) {
          escape(value, &out);
          i = j;
          continue;
        }
      }
      out.push_back('\\');  // any other escape stays as written
      append_utf8(cpts[i + 1], &out);
      ++i;
    } else if (cpts[i] < 0x80) {
      out.push_back(static_cast<char>(cpts[i]));
    } else {
      escape(cpts[i], &out);
    }
  }
  return out;
}

struct TokenEntry {
  std::string text;
  bool present = false;
  bool added = false;    // listed in added_tokens
  bool special = false;  // an added token with "special": true
};

class HfTokenizerReader {
 public:
  explicit HfTokenizerReader(fs::path dir) : dir_(std::move(dir)) {}

  Result<Metadata> read() {
    VESPER_ASSIGN_OR_RETURN(tok_, read_json_file(dir_ / "tokenizer.json", true));
    VESPER_ASSIGN_OR_RETURN(tok_config_, read_json_file(dir_ / "tokenizer_config.json", false));
    VESPER_ASSIGN_OR_RETURN(special_map_, read_json_file(dir_ / "special_tokens_map.json", false));
    VESPER_ASSIGN_OR_RETURN(gen_config_, read_json_file(dir_ / "generation_config.json", false));
    VESPER_ASSIGN_OR_RETURN(config_, read_json_file(dir_ / "config.json", false));
    VESPER_TRY(read_model_type());
    if (byte_level_) {
      VESPER_TRY(read_byte_level_pre_tokenizer());
    } else {
      VESPER_TRY(read_sentencepiece_normalization());
    }
    VESPER_TRY(read_tokens());
    VESPER_TRY(read_merges());
    VESPER_TRY(read_special_tokens());
    VESPER_TRY(read_add_special());
    VESPER_TRY(read_chat_templates());
    return metadata();
  }

 private:
  // --- model, normalizer and pre-tokenizer ---------------------------------------------------

  Status read_model_type() {
    model_ = json_member(tok_.doc, "model");
    if (model_ == nullptr || !model_->is_object())
      return tok_.error("model", "is missing or not an object");
    // Files from before the "type" tag name no type; a vocab with merges is BPE.
    const std::string fallback = json_member(*model_, "merges") ? "BPE" : "";
    VESPER_ASSIGN_OR_RETURN(const std::string type,
                            string_member(tok_, *model_, "type", "model.type", fallback));
    if (type != "BPE")
      return tok_.error("model.type",
                        "is " + quote(type) +
                            ": only \"BPE\" tokenizers are supported (SentencePiece-style with "
                            "byte_fallback, as llama-2 and mistral; or byte-level, as gpt2, "
                            "llama-3 and qwen2)");
    if (const json* dropout = json_member(*model_, "dropout");
        dropout != nullptr && (!dropout->is_number() || dropout->get<double>() != 0.0))
      return tok_.error("model.dropout", "is set: BPE dropout (random merges) is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const std::string field = std::string("model.") + key;
      VESPER_ASSIGN_OR_RETURN(const std::string affix,
                              string_member(tok_, *model_, key, field, ""));
      if (!affix.empty())
        return tok_.error(field, "is " + quote(affix) + ": subword affixes are not supported");
    }
    VESPER_ASSIGN_OR_RETURN(
        ignore_merges_, bool_member(tok_, *model_, "ignore_merges", "model.ignore_merges", false));
    VESPER_ASSIGN_OR_RETURN(
        byte_fallback_, bool_member(tok_, *model_, "byte_fallback", "model.byte_fallback", false));

    // The family: a ByteLevel pre-tokenizer (alone or in a Sequence) makes it byte-level BPE.
    pre_ = json_member(tok_.doc, "pre_tokenizer");
    if (pre_ != nullptr) {
      VESPER_ASSIGN_OR_RETURN(const std::string pre_type,
                              string_member(tok_, *pre_, "type", "pre_tokenizer.type", ""));
      if (pre_type == "ByteLevel") {
        byte_level_ = true;
      } else if (pre_type == "Sequence") {
        const json* items = json_member(*pre_, "pretokenizers");
        if (items == nullptr || !items->is_array())
          return tok_.error("pre_tokenizer.pretokenizers", "is missing or not an array");
        for (const json& item : *items)
          if (const json* t = json_member(item, "type"); t != nullptr && *t == "ByteLevel")
            byte_level_ = true;
      }
    }
    return {};
  }

  // Byte-level BPE: [Split(regex, Isolated)...] then ByteLevel, whose regexes must be a preset's.
  Status read_byte_level_pre_tokenizer() {
    if (const json* normalizer = json_member(tok_.doc, "normalizer")) {
      // NFC is accepted and not applied, as llama.cpp does: it changes nothing for text that is
      // already NFC, which is nearly all text.
      VESPER_ASSIGN_OR_RETURN(const std::string type,
                              string_member(tok_, *normalizer, "type", "normalizer.type", ""));
      if (type != "NFC")
        return tok_.error(
            "normalizer.type",
            "is " + quote(type) + ": a byte-level BPE tokenizer may have no normalizer or NFC");
    }
    std::vector<std::pair<const json*, std::string>> items;
    if (const json* list = json_member(*pre_, "pretokenizers")) {
      for (size_t i = 0; i < list->size(); ++i)
        items.emplace_back(&(*list)[i], indexed("pre_tokenizer.pretokenizers", i));
    } else {
      items.emplace_back(pre_, "pre_tokenizer");
    }
    std::vector<std::string> patterns;
    std::vector<std::string> split_fields;
    bool seen_byte_level = false;
    for (const auto& [item, field] : items) {
      VESPER_ASSIGN_OR_RETURN(const std::string type,
                              string_member(tok_, *item, "type", field + ".type", ""));
      if (type == "Split") {
        if (seen_byte_level)
          return tok_.error(field, "is a Split after ByteLevel, which is not supported");
        const json* pattern = json_member(*item, "pattern");
        const json* regex = pattern ? json_member(*pattern, "Regex") : nullptr;
        if (regex == nullptr || !regex->is_string())
          return tok_.error(field + ".pattern",
                            "is not a {\"Regex\": ...} pattern (string patterns are not "
                            "supported)");
        VESPER_ASSIGN_OR_RETURN(const std::string behavior,
                                string_member(tok_, *item, "behavior", field + ".behavior", ""));
        if (behavior != "Isolated")
          return tok_.error(field + ".behavior",
                            "is " + quote(behavior) + ": only \"Isolated\" is supported");
        VESPER_ASSIGN_OR_RETURN(const bool invert,
                                bool_member(tok_, *item, "invert", field + ".invert", false));
        if (invert) return tok_.error(field + ".invert", "is true, which is not supported");
        patterns.push_back(regex->get<std::string>());
        split_fields.push_back(field + ".pattern.Regex");
      } else if (type == "ByteLevel") {
        // Hugging Face's defaults when a key is absent.
        VESPER_ASSIGN_OR_RETURN(
            const bool add_prefix_space,
            bool_member(tok_, *item, "add_prefix_space", field + ".add_prefix_space", true));
        if (add_prefix_space)
          return tok_.error(field + ".add_prefix_space",
                            "is true (a space put before the text), which is not supported");
        VESPER_ASSIGN_OR_RETURN(const bool use_regex,
                                bool_member(tok_, *item, "use_regex", field + ".use_regex", true));
        if (use_regex) patterns.push_back(find_bpe_preset("gpt-2")->patterns.at(0));
        seen_byte_level = true;
      } else {
        return tok_.error(field + ".type",
                          "is " + quote(type) +
                              ": a byte-level BPE pre-tokenizer may hold only Split (regex) and "
                              "ByteLevel");
      }
    }
    return pick_bpe_preset(patterns, split_fields);
  }

  // The preset whose regexes are `patterns`. Several names share regexes and differ in flags;
  // the flags tokenizer.json and tokenizer_config.json state decide, then the family names
  // llama.cpp's converter writes for gpt2, llama-3 and qwen2.
  Status pick_bpe_preset(const std::vector<std::string>& patterns,
                         const std::vector<std::string>& split_fields) {
    std::vector<std::string> wanted;
    for (const std::string& p : patterns) wanted.push_back(canonical_regex(p));
    std::optional<bool> clean_spaces;
    if (const json* v = json_member(tok_config_.doc, "clean_up_tokenization_spaces");
        v != nullptr && v->is_boolean())
      clean_spaces = v->get<bool>();
    const std::vector<std::string_view> preferred = {"gpt-2", "llama-bpe", "qwen2"};
    const std::vector<std::string_view> names = bpe_preset_names();
    size_t best_cost = std::numeric_limits<size_t>::max();
    for (size_t i = 0; i < names.size(); ++i) {
      const std::optional<BpePreset> preset = find_bpe_preset(names[i]);
      std::vector<std::string> regexes;
      for (const std::string& p : preset->patterns) regexes.push_back(canonical_regex(p));
      if (regexes != wanted) continue;
      const auto rank = std::find(preferred.begin(), preferred.end(), names[i]) - preferred.begin();
      const size_t cost = (preset->ignore_merges != ignore_merges_ ? 1u << 24 : 0) +
                          (clean_spaces && preset->clean_spaces != *clean_spaces ? 1u << 23 : 0) +
                          (preset->add_sep ? 1u << 22 : 0) + static_cast<size_t>(rank) * 1024 + i;
      if (cost < best_cost) {
        best_cost = cost;
        pre_name_ = std::string(names[i]);
      }
    }
    if (!pre_name_.empty()) return {};
    if (patterns.empty())
      return tok_.error("pre_tokenizer",
                        "splits nothing (ByteLevel with use_regex false and no Split), which "
                        "matches no known pre-tokenizer");
    std::string quoted;
    for (const std::string& p : patterns) quoted += (quoted.empty() ? "" : ", then ") + quote(p);
    const std::string field =
        split_fields.size() == 1 ? split_fields[0] : std::string("pre_tokenizer");
    return tok_.error(field, "regex " + quoted +
                                 " matches no pre-tokenizer Vesper knows (the regexes of "
                                 "tokenizer.ggml.pre presets such as gpt-2, llama-bpe, qwen2)");
  }

  // SentencePiece-style BPE: spaces become U+2581 by the normalizer (Prepend + Replace) or a
  // Metaspace pre-tokenizer.
  Status read_sentencepiece_normalization() {
    bool replaces_spaces = false;
    if (const json* normalizer = json_member(tok_.doc, "normalizer")) {
      std::vector<std::pair<const json*, std::string>> items;
      VESPER_ASSIGN_OR_RETURN(const std::string type,
                              string_member(tok_, *normalizer, "type", "normalizer.type", ""));
      if (type == "Sequence") {
        const json* list = json_member(*normalizer, "normalizers");
        if (list == nullptr || !list->is_array())
          return tok_.error("normalizer.normalizers", "is missing or not an array");
        for (size_t i = 0; i < list->size(); ++i)
          items.emplace_back(&(*list)[i], indexed("normalizer.normalizers", i));
      } else {
        items.emplace_back(normalizer, "normalizer");
      }
      for (const auto& [item, field] : items) {
        VESPER_ASSIGN_OR_RETURN(const std::string t,
                                string_member(tok_, *item, "type", field + ".type", ""));
        if (t == "Prepend") {
          VESPER_ASSIGN_OR_RETURN(const std::string prepend,
                                  string_member(tok_, *item, "prepend", field + ".prepend", ""));
          if (prepend != kSpace)
            return tok_.error(field + ".prepend",
                              "is " + quote(prepend) + ": only \"\xE2\x96\x81\" is supported");
          add_space_prefix_ = true;
        } else if (t == "Replace") {
          const json* pattern = json_member(*item, "pattern");
          const json* from = pattern ? json_member(*pattern, "String") : nullptr;
          VESPER_ASSIGN_OR_RETURN(const std::string content,
                                  string_member(tok_, *item, "content", field + ".content", ""));
          if (from == nullptr || *from != " " || content != kSpace)
            return tok_.error(field,
                              "is a Replace other than \" \" -> \"\xE2\x96\x81\", which is not "
                              "supported");
          replaces_spaces = true;
        } else {
          return tok_.error(
              field + ".type",
              "is " + quote(t) +
                  ": a SentencePiece-style tokenizer may only prepend \"\xE2\x96\x81\" "
                  "and replace spaces with it");
        }
      }
    }
    if (pre_ != nullptr) {
      VESPER_ASSIGN_OR_RETURN(const std::string type,
                              string_member(tok_, *pre_, "type", "pre_tokenizer.type", ""));
      if (type != "Metaspace")
        return tok_.error("pre_tokenizer.type",
                          "is " + quote(type) +
                              ": a SentencePiece-style tokenizer may have no pre-tokenizer, a "
                              "Metaspace, or (byte-level BPE) ByteLevel");
      VESPER_ASSIGN_OR_RETURN(const std::string replacement,
                              string_member(tok_, *pre_, "replacement", "pre_tokenizer.replacement",
                                            std::string(kSpace)));
      if (replacement != kSpace)
        return tok_.error("pre_tokenizer.replacement",
                          "is " + quote(replacement) + ": only \"\xE2\x96\x81\" is supported");
      // prepend_scheme (tokenizers >= 0.15) or the older add_prefix_space. "first" also maps to
      // a space prefix, though Hugging Face then adds none after special tokens (README.md).
      if (const json* scheme = json_member(*pre_, "prepend_scheme")) {
        if (*scheme == "always" || *scheme == "first") {
          add_space_prefix_ = true;
        } else if (*scheme != "never") {
          return tok_.error(
              "pre_tokenizer.prepend_scheme",
              "is " + scheme->dump() + ": expected \"always\", \"first\" or \"never\"");
        }
      } else {
        VESPER_ASSIGN_OR_RETURN(
            const bool add,
            bool_member(tok_, *pre_, "add_prefix_space", "pre_tokenizer.add_prefix_space", true));
        add_space_prefix_ = add_space_prefix_ || add;
      }
      // Metaspace cuts the text before every U+2581 unless "split" is false (absent: true, as
      // Hugging Face reads files older than the key).
      VESPER_ASSIGN_OR_RETURN(split_at_space_,
                              bool_member(tok_, *pre_, "split", "pre_tokenizer.split", true));
      replaces_spaces = true;
    }
    if (!replaces_spaces)
      return tok_.error("normalizer",
                        "does not replace spaces with \"\xE2\x96\x81\" (expected a Replace "
                        "normalizer or a Metaspace pre-tokenizer for a SentencePiece-style BPE)");
    if (!byte_fallback_)
      return tok_.error("model.byte_fallback",
                        "is not true: a SentencePiece-style BPE tokenizer needs byte fallback");
    if (ignore_merges_)
      return tok_.error("model.ignore_merges",
                        "is true, which a SentencePiece-style BPE tokenizer does not support");
    return {};
  }

  // --- tokens ----------------------------------------------------------------------------------

  Status set_entry(int64_t id, const std::string& text, const std::string& field) {
    if (id < 0 || id >= kMaxTokens)
      return tok_.error(field, "gives " + quote(text) + " the id " + std::to_string(id) +
                                   ", outside [0, " + std::to_string(kMaxTokens) + ")");
    if (static_cast<size_t>(id) >= entries_.size()) entries_.resize(static_cast<size_t>(id) + 1);
    TokenEntry& e = entries_[static_cast<size_t>(id)];
    if (e.present && e.text != text)
      return tok_.error(field, "gives id " + std::to_string(id) + " to " + quote(text) +
                                   ", which already belongs to " + quote(e.text));
    e.present = true;
    e.text = text;
    return {};
  }

  Status read_tokens() {
    const json* vocab = json_member(*model_, "vocab");
    if (vocab == nullptr || !vocab->is_object())
      return tok_.error("model.vocab", "is missing or not an object of piece -> id");
    for (const auto& [text, id_json] : vocab->items()) {
      const std::optional<int64_t> id = json_int(id_json);
      if (!id)
        return tok_.error("model.vocab", "gives " + quote(text) + " an id that is not an integer");
      VESPER_TRY(set_entry(*id, text, "model.vocab"));
      vocab_ids_.emplace(text, static_cast<int32_t>(*id));
    }
    if (const json* added = json_member(tok_.doc, "added_tokens")) {
      if (!added->is_array()) return tok_.error("added_tokens", "is not an array");
      for (size_t i = 0; i < added->size(); ++i) {
        const json& t = (*added)[i];
        const std::string field = indexed("added_tokens", i);
        const json* id = json_member(t, "id");
        const json* content = json_member(t, "content");
        if (id == nullptr || !json_int(*id) || content == nullptr || !content->is_string())
          return tok_.error(field, "needs an integer \"id\" and a string \"content\"");
        VESPER_ASSIGN_OR_RETURN(const bool special,
                                bool_member(tok_, t, "special", field + ".special", false));
        const int64_t n = *json_int(*id);
        VESPER_TRY(set_entry(n, content->get<std::string>(), field));
        entries_[static_cast<size_t>(n)].added = true;
        entries_[static_cast<size_t>(n)].special = special;
      }
    }
    if (entries_.empty()) return tok_.error("model.vocab", "is empty");
    // config.json's vocab_size counts the embedding rows; llama.cpp pads the vocabulary to it.
    if (const json* size = json_member(config_.doc, "vocab_size")) {
      const std::optional<int64_t> n = json_int(*size);
      if (!n || *n < 0 || *n > kMaxTokens)
        return config_.error("vocab_size", "is " + size->dump() + ", not a vocabulary size");
      if (static_cast<size_t>(*n) > entries_.size()) entries_.resize(static_cast<size_t>(*n));
    }
    const json* unk = json_member(*model_, "unk_token");
    const std::string unk_text = unk && unk->is_string() ? unk->get<std::string>() : std::string();

    tokens_.resize(entries_.size());
    types_.resize(entries_.size());
    for (size_t id = 0; id < entries_.size(); ++id) {
      const TokenEntry& e = entries_[id];
      std::string text = e.text;
      int32_t type = kTypeNormal;
      if (!e.present) {
        text = "[PAD" + std::to_string(id) + "]";  // as convert_hf_to_gguf.py fills holes
        type = kTypeUnused;
      } else if (!unk_text.empty() && text == unk_text) {
        type = kTypeUnknown;
      } else if (e.added) {
        type = e.special ? kTypeControl : kTypeUserDefined;
        // llama.cpp matches user-defined tokens in the raw text, where spaces are still spaces.
        if (!e.special && !byte_level_) replace_all(&text, kSpace, " ");
      } else if (!byte_level_ && is_byte_piece(text)) {
        type = kTypeByte;
      }
      if (!text.empty()) {
        const auto [it, inserted] = token_ids_.emplace(text, static_cast<int32_t>(id));
        if (!inserted)
          return tok_.error(e.present ? "model.vocab" : "model.vocab (a hole in the ids)",
                            "holds " + quote(text) + " twice (ids " + std::to_string(it->second) +
                                " and " + std::to_string(id) + ")");
      }
      tokens_[id] = std::move(text);
      types_[id] = type;
    }
    return {};
  }

  // --- merges --------------------------------------------------------------------------------

  Status read_merges() {
    const json* merges = json_member(*model_, "merges");
    if (merges != nullptr && !merges->is_array())
      return tok_.error("model.merges", "is not an array");
    std::unordered_map<std::string, int32_t>
        first_rank;  // piece -> rank of the first merge making it
    const size_t n = merges ? merges->size() : 0;
    for (size_t i = 0; i < n; ++i) {
      const json& m = (*merges)[i];
      const std::string field = indexed("model.merges", i);
      std::string left;
      std::string right;
      if (m.is_string()) {
        // "left right", split at the one space (Hugging Face rejects any other count).
        const std::string& s = m.get_ref<const std::string&>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          return tok_.error(field, quote(s) + " is not two pieces separated by one space");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        return tok_.error(field, "is neither \"left right\" nor [\"left\", \"right\"]");
      }
      for (const std::string* piece : {&left, &right}) {
        if (!vocab_ids_.count(*piece))
          return tok_.error(field, "names " + quote(*piece) + ", which is not in model.vocab");
        if (piece->empty() || piece->find(' ') != std::string::npos)
          return tok_.error(field, "names " + quote(*piece) +
                                       ", which a GGUF merge (\"left right\") cannot hold");
      }
      const std::string merged = left + right;
      if (!vocab_ids_.count(merged))
        return tok_.error(field, "merges " + quote(left) + " and " + quote(right) + " into " +
                                     quote(merged) + ", which is not in model.vocab");
      // Metaspace with split cuts the text before every U+2581, so no merge can join a piece
      // to a right neighbour that starts with one: dropping those merges is the same thing.
      if (split_at_space_ && right.compare(0, kSpace.size(), kSpace) == 0) continue;
      first_rank.emplace(merged, static_cast<int32_t>(merges_.size()));
      merges_.push_back(left + " " + right);
    }
    if (byte_level_) return {};
    // SentencePiece-style: scores from the merges for llama.cpp, which ignores merges for a
    // "llama" vocabulary and merges by the score of the result. A converted SentencePiece model
    // lists its merges by the score of their result, so -rank keeps that order.
    scores_.assign(tokens_.size(), 0.0f);
    for (size_t id = 0; id < tokens_.size(); ++id) {
      if (types_[id] != kTypeNormal) continue;
      const auto it = first_rank.find(tokens_[id]);
      scores_[id] = it == first_rank.end() ? kUnmergedScore : -static_cast<float>(it->second);
    }
    return {};
  }

  // --- special tokens ------------------------------------------------------------------------

  // tokenizer_config.json and special_tokens_map.json name a special token by its text, as a
  // string or an AddedToken object {"content": ...}.
  Result<std::optional<int32_t>> special_by_text(const JsonFile& f, const std::string& name) {
    const json* v = json_member(f.doc, name);
    if (v == nullptr) return std::optional<int32_t>();
    const json* content = v->is_object() ? json_member(*v, "content") : v;
    if (content == nullptr || !content->is_string())
      return f.error(name, "is neither a string nor an object with a string \"content\"");
    const std::string& text = content->get_ref<const std::string&>();
    const auto it = token_ids_.find(text);
    if (it == token_ids_.end())
      return f.error(name, "is " + quote(text) + ", which is not a token of tokenizer.json");
    return std::optional<int32_t>(it->second);
  }

  // generation_config.json and config.json give ids: an integer or a list of them. Negative
  // values mean none.
  Result<std::vector<int32_t>> ids_in(const JsonFile& f, const std::string& name) {
    std::vector<int32_t> ids;
    const json* v = json_member(f.doc, name);
    if (v == nullptr) return ids;
    std::vector<const json*> items;
    if (v->is_array()) {
      for (const json& item : *v) items.push_back(&item);
    } else {
      items.push_back(v);
    }
    for (const json* item : items) {
      const std::optional<int64_t> id = json_int(*item);
      if (!id) return f.error(name, "is " + v->dump() + ", not an id or a list of ids");
      if (*id < 0) continue;
      if (*id >= static_cast<int64_t>(tokens_.size()))
        return f.error(name, "holds id " + std::to_string(*id) + ", outside the " +
                                 std::to_string(tokens_.size()) + " tokens of tokenizer.json");
      if (std::find(ids.begin(), ids.end(), *id) == ids.end())
        ids.push_back(static_cast<int32_t>(*id));
    }
    return ids;
  }

  Status read_special_tokens() {
    struct Special {
      const char* name;     // tokenizer_config.json / special_tokens_map.json
      const char* id_name;  // generation_config.json / config.json
      int32_t* id;
    };
    const Special specials[] = {
        {"bos_token", "bos_token_id", &bos_},
        {"eos_token", "eos_token_id", &eos_},
        {"unk_token", nullptr, &unk_},
        {"pad_token", "pad_token_id", &pad_},
    };
    for (const Special& s : specials) {
      for (const JsonFile* f : {&tok_config_, &special_map_}) {
        VESPER_ASSIGN_OR_RETURN(const std::optional<int32_t> id, special_by_text(*f, s.name));
        if (id) {
          *s.id = *id;
          break;
        }
      }
      if (*s.id != kNoToken || s.id_name == nullptr) continue;
      for (const JsonFile* f : {&gen_config_, &config_}) {
        VESPER_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, ids_in(*f, s.id_name));
        if (!ids.empty()) {
          *s.id = ids[0];
          break;
        }
      }
    }
    if (unk_ == kNoToken) {
      if (const json* unk = json_member(*model_, "unk_token"); unk != nullptr && unk->is_string()) {
        const auto it = token_ids_.find(unk->get<std::string>());
        if (it == token_ids_.end())
          return tok_.error("model.unk_token",
                            "is " + quote(unk->get<std::string>()) + ", which is not a token");
        unk_ = it->second;
      }
    }
    // A list of EOS ids (llama-3.1: <|end_of_text|>, <|eom_id|>, <|eot_id|>): generation stops
    // at each of them.
    for (const JsonFile* f : {&gen_config_, &config_}) {
      VESPER_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ids_in(*f, "eos_token_id"));
      if (ids.empty()) continue;
      if (ids.size() > 1) eog_ids_ = std::move(ids);
      break;
    }
    return {};
  }

  // add_bos / add_eos: tokenizer_config.json's add_bos_token / add_eos_token, else what the
  // post-processor's TemplateProcessing puts around a single text.
  Status read_add_special() {
    std::optional<bool> add_bos;
    std::optional<bool> add_eos;
    for (const auto& [key, flag] :
         {std::pair{"add_bos_token", &add_bos}, std::pair{"add_eos_token", &add_eos}}) {
      if (const json* v = json_member(tok_config_.doc, key)) {
        if (!v->is_boolean()) return tok_config_.error(key, "is not true or false");
        *flag = v->get<bool>();
      }
    }
    if (!add_bos || !add_eos) {
      int32_t template_bos = kNoToken;
      int32_t template_eos = kNoToken;
      VESPER_TRY(read_post_processor(&template_bos, &template_eos));
      if (!add_bos) {
        add_bos = template_bos != kNoToken;
        if (*add_bos) bos_ = template_bos;  // what Hugging Face adds, whatever bos_token says
      }
      if (!add_eos) {
        add_eos = template_eos != kNoToken;
        if (*add_eos) eos_ = template_eos;
      }
    }
    add_bos_ = *add_bos;
    add_eos_ = *add_eos;
    if (add_bos_ && bos_ == kNoToken)
      return tok_config_.error("add_bos_token", "is true, but no bos_token is given");
    if (add_eos_ && eos_ == kNoToken)
      return tok_config_.error("add_eos_token", "is true, but no eos_token is given");
    return {};
  }

  Status read_post_processor(int32_t* bos, int32_t* eos) {
    const json* post = json_member(tok_.doc, "post_processor");
    if (post == nullptr) return {};
    std::vector<std::pair<const json*, std::string>> items;
    VESPER_ASSIGN_OR_RETURN(const std::string type,
                            string_member(tok_, *post, "type", "post_processor.type", ""));
    if (type == "Sequence") {
      const json* list = json_member(*post, "processors");
      if (list == nullptr || !list->is_array())
        return tok_.error("post_processor.processors", "is missing or not an array");
      for (size_t i = 0; i < list->size(); ++i)
        items.emplace_back(&(*list)[i], indexed("post_processor.processors", i));
    } else {
      items.emplace_back(post, "post_processor");
    }
    for (const auto& [item, field] : items) {
      VESPER_ASSIGN_OR_RETURN(const std::string t,
                              string_member(tok_, *item, "type", field + ".type", ""));
      if (t == "ByteLevel") continue;  // offsets only
      if (t != "TemplateProcessing")
        return tok_.error(field + ".type",
                          "is " + quote(t) +
                              ": only TemplateProcessing and ByteLevel are understood (or give "
                              "add_bos_token and add_eos_token in tokenizer_config.json)");
      const json* single = json_member(*item, "single");
      if (single == nullptr || !single->is_array())
        return tok_.error(field + ".single", "is missing or not an array");
      bool seen_text = false;
      for (size_t i = 0; i < single->size(); ++i) {
        const json& piece = (*single)[i];
        if (json_member(piece, "Sequence")) {
          seen_text = true;
          continue;
        }
        const json* special = json_member(piece, "SpecialToken");
        const json* name = special ? json_member(*special, "id") : nullptr;
        if (name == nullptr || !name->is_string())
          return tok_.error(indexed(field + ".single", i),
                            "is neither a Sequence nor a SpecialToken with a string id");
        const std::string& text = name->get_ref<const std::string&>();
        // The template's special_tokens map gives the ids; a token of the vocabulary otherwise.
        int32_t id = kNoToken;
        const json* specials = json_member(*item, "special_tokens");
        const json* entry = specials ? json_member(*specials, text) : nullptr;
        const json* ids = entry ? json_member(*entry, "ids") : nullptr;
        if (ids != nullptr && ids->is_array() && ids->size() == 1 && json_int((*ids)[0]) &&
            *json_int((*ids)[0]) >= 0 &&
            *json_int((*ids)[0]) < static_cast<int64_t>(tokens_.size())) {
          id = static_cast<int32_t>(*json_int((*ids)[0]));
        } else if (const auto it = token_ids_.find(text); it != token_ids_.end()) {
          id = it->second;
        } else {
          return tok_.error(indexed(field + ".single", i),
                            "adds " + quote(text) + ", which is not a token");
        }
        int32_t* slot = seen_text ? eos : bos;
        if (*slot != kNoToken)
          return tok_.error(field + ".single", std::string("adds more than one special token ") +
                                                   (seen_text ? "after" : "before") +
                                                   " the text, which is not supported");
        *slot = id;
      }
    }
    return {};
  }

  // --- chat templates --------------------------------------------------------------------------

  Status read_chat_templates() {
    if (const json* t = json_member(tok_config_.doc, "chat_template")) {
      if (t->is_string()) {
        chat_templates_.emplace_back("", t->get<std::string>());
        return {};
      }
      if (!t->is_array())
        return tok_config_.error("chat_template", "is neither a string nor a list of templates");
      for (size_t i = 0; i < t->size(); ++i) {
        const json* name = json_member((*t)[i], "name");
        const json* text = json_member((*t)[i], "template");
        if (name == nullptr || !name->is_string() || text == nullptr || !text->is_string())
          return tok_config_.error(indexed("chat_template", i),
                                   "needs a string \"name\" and a string \"template\"");
        const std::string n = name->get<std::string>();
        chat_templates_.emplace_back(n == "default" ? "" : n, text->get<std::string>());
      }
      return {};
    }
    // Newer transformers save the template beside tokenizer_config.json.
    const fs::path jinja = dir_ / "chat_template.jinja";
    std::error_code ec;
    if (fs::is_regular_file(jinja, ec)) {
      std::ifstream in(jinja, std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      if (!in) return make_error(jinja.string() + ": cannot be read");
      chat_templates_.emplace_back("", text.str());
      return {};
    }
    VESPER_ASSIGN_OR_RETURN(const JsonFile f, read_json_file(dir_ / "chat_template.json", false));
    if (const json* t = json_member(f.doc, "chat_template")) {
      if (!t->is_string()) return f.error("chat_template", "is not a string");
      chat_templates_.emplace_back("", t->get<std::string>());
    }
    return {};
  }

  // --- output ----------------------------------------------------------------------------------

  Metadata metadata() const {
    Metadata md;
    const auto add = [&](std::string key, gguf::Value value) {
      md.emplace_back(std::move(key), std::move(value));
    };
    add("tokenizer.ggml.model", gguf::Value::string(byte_level_ ? "gpt2" : "llama"));
    add("tokenizer.ggml.pre", gguf::Value::string(byte_level_ ? pre_name_ : "default"));
    add("tokenizer.ggml.tokens", gguf::Value::string_array(tokens_));
    if (!byte_level_) add("tokenizer.ggml.scores", gguf::Value::f32_array(scores_));
    add("tokenizer.ggml.token_type", gguf::Value::i32_array(types_));
    // For "llama" these make Vesper merge by rank, exactly as Hugging Face does (README.md).
    add("tokenizer.ggml.merges", gguf::Value::string_array(merges_));
    if (!byte_level_)
      add("tokenizer.ggml.add_space_prefix", gguf::Value::boolean(add_space_prefix_));
    const std::pair<const char*, int32_t> ids[] = {
        {"tokenizer.ggml.bos_token_id", bos_},
        {"tokenizer.ggml.eos_token_id", eos_},
        {"tokenizer.ggml.unknown_token_id", unk_},
        {"tokenizer.ggml.padding_token_id", pad_},
    };
    for (const auto& [key, id] : ids)
      if (id != kNoToken) add(key, gguf::Value::u32(static_cast<uint32_t>(id)));
    add("tokenizer.ggml.add_bos_token", gguf::Value::boolean(add_bos_));
    add("tokenizer.ggml.add_eos_token", gguf::Value::boolean(add_eos_));
    if (!eog_ids_.empty()) {
      // llama.cpp knows end-of-generation tokens by their text, plus EOS, EOT and EOM: give the
      // first two it would miss the EOT and EOM slots. Vesper reads the whole list.
      const char* slots[] = {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
      size_t next_slot = 0;
      std::vector<gguf::Value> list;
      for (int32_t id : eog_ids_) {
        list.push_back(gguf::Value::u32(static_cast<uint32_t>(id)));
        if (id == eos_ || is_eog_text(tokens_[static_cast<size_t>(id)]) || next_slot == 2) continue;
        add(slots[next_slot++], gguf::Value::u32(static_cast<uint32_t>(id)));
      }
      add("tokenizer.ggml.eog_token_ids",
          gguf::Value::array(gguf::ValueType::kUint32, std::move(list)));
    }
    for (const auto& [name, text] : chat_templates_)
      add(name.empty() ? "tokenizer.chat_template" : "tokenizer.chat_template." + name,
          gguf::Value::string(text));
    return md;
  }

  fs::path dir_;
  JsonFile tok_;
  JsonFile tok_config_;
  JsonFile special_map_;
  JsonFile gen_config_;
  JsonFile config_;
  const json* model_ = nullptr;
  const json* pre_ = nullptr;

  bool byte_level_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool add_space_prefix_ = false;  // SentencePiece-style
  bool split_at_space_ = false;    // SentencePiece-style Metaspace with split
  std::string pre_name_;           // byte-level: the tokenizer.ggml.pre preset

  std::vector<TokenEntry> entries_;                     // by id, as the files give them
  std::unordered_map<std::string, int32_t> vocab_ids_;  // model.vocab only (what merges may name)
  std::unordered_map<std::string, int32_t> token_ids_;  // every final token text
  std::vector<std::string> tokens_;
  std::vector<int32_t> types_;
  std::vector<float> scores_;
  std::vector<std::string> merges_;

  int32_t bos_ = kNoToken;
  int32_t eos_ = kNoToken;
  int32_t unk_ = kNoToken;
  int32_t pad_ = kNoToken;
  bool add_bos_ = false;
  bool add_eos_ = false;
  std::vector<int32_t> eog_ids_;
  std::vector<std::pair<std::string, std::string>> chat_templates_;  // name ("" = default), text
};

}  // namespace

Result<Metadata> hf_tokenizer_metadata(const std::string& dir) {
  return HfTokenizerReader(dir).read();
}

}  // namespace vesper::tokenizer
