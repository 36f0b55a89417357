#include "tokenizer/bpe_presets.h"

#include <utility>

namespace vesper::tokenizer {
namespace {

// The regexes are upstream data (from each model's tokenizer.json, as llama.cpp adapted them),
// kept verbatim except that non-ASCII characters are written as \x{...} escapes so that no
// editor or Unicode normalization can silently change a range bound.

// GPT-2's pattern. llama.cpp drops the final "|\s+" (its hand-written matcher has that branch
// anyway); keeping it here gives the same pieces, since unmatched text also becomes a piece.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3: tiktoken cl100k with the (?i:...) contractions spelled out as llama.cpp does.
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr const char* kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-4o (o200k) and Tekken use \p{Lu}-style classes; PCRE2 has them, so these are the
// tokenizer.json originals (llama.cpp rewrites them with lookaheads because std::regex lacks
// them).
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// CJK ideographs (U+4E00..U+9FA5), everything from U+0800 up to them, and Hangul syllables.
constexpr const char* kDeepseekCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

// DeepSeek LLM's letter class (Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee, ...).
constexpr const char* kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
    R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})"
    R"(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})"
    R"(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})"
    R"(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})"
    R"(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D})"
    R"(\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3})"
    R"(\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D})"
    R"(\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184})"
    R"(\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D})"
    R"(\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF})"
    R"(\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F})"
    R"(\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
    R"(\x{1E900}-\x{1E943}]+)";

// ASCII and full-width punctuation, curly quotes, ideographic space, comma and full stop.
constexpr const char* kDeepseekPunct =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";

// The BLOOM family: anything but spaces and a few sentence marks (… 。 ， 、 । ۔ ،).
constexpr const char* kBloom = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";

BpePreset make(std::vector<std::string> patterns) {
  BpePreset p;
  p.patterns = std::move(patterns);
  return p;
}

BpePreset no_clean(BpePreset p) {
  p.clean_spaces = false;
  return p;
}

BpePreset preset_default() {
  return make({R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"});
}
BpePreset preset_gpt2() { return make({kGpt2}); }
BpePreset preset_llama3() { return make({kLlama3}); }
BpePreset preset_llama3_family() {
  BpePreset p = make({kLlama3});
  p.ignore_merges = true;
  p.add_bos = true;
  return p;
}
BpePreset preset_qwen2() { return make({kQwen2}); }
BpePreset preset_starcoder() { return make({R"(\p{N})", kGpt2}); }
BpePreset preset_falcon() {
  return make({R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"});
}
BpePreset preset_deepseek_llm() {
  return no_clean(make({R"([\r\n])", kDeepseekLetters, kDeepseekPunct, R"(\s+$)", kDeepseekCjk,
                        R"(\p{N}+)"}));
}
BpePreset preset_deepseek_coder() {
  return no_clean(make({R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}));
}
BpePreset preset_deepseek_v3() {
  return no_clean(make({
      R"(\p{N}{1,3})",
      R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
      R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
  }));
}
BpePreset preset_chameleon() {
  BpePreset p = no_clean(make({
      R"(<sentinel:[0-9]+>)",
      R"((IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z)",
      R"(([\t\n]|    |  ))",
      R"(\p{N})",
      R"([\p{P}!-/:-@\[-`{-~])",
      kGpt2,
  }));
  p.add_bos = true;
  return p;
}
BpePreset preset_tekken() {
  BpePreset p = no_clean(make({kTekken}));
  p.ignore_merges = true;
  p.add_bos = true;
  return p;
}
BpePreset preset_bailingmoe() {
  return no_clean(make({
      R"('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)",
  }));
}
BpePreset preset_seed_coder() {
  return no_clean(make({
      R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)",
  }));
}
BpePreset preset_chatglm4() {
  BpePreset p = make({kLlama3});
  p.no_default_bos = true;
  return p;
}
BpePreset preset_tiny_aya() {
  return no_clean(make({R"(\d{1,3}(?=(?:\d{3})*\b))", kGpt4o}));
}
BpePreset preset_superbpe() { return no_clean(make({R"(\p{N}+)", R"((?=(\d{3})+(?!\d)))"})); }
BpePreset preset_with_sep(BpePreset p) {
  p.add_sep = true;
  return p;
}

struct NamedPreset {
  std::string_view name;
  BpePreset (*make)();
};

// tokenizer.ggml.pre -> preset, following llama.cpp's mapping.
const NamedPreset kPresets[] = {
    {"default", preset_default},
    {"llama3", preset_llama3_family},
    {"llama-v3", preset_llama3_family},
    {"llama-bpe", preset_llama3_family},
    {"falcon3", preset_llama3_family},
    {"falcon-h1", preset_llama3_family},
    {"pixtral", preset_llama3_family},
    {"midm-2.0", preset_llama3_family},
    {"lfm2", preset_llama3_family},
    {"dbrx", preset_llama3},
    {"smaug-bpe", preset_llama3},
    {"deepseek-llm", preset_deepseek_llm},
    {"deepseek-coder", preset_deepseek_coder},
    {"deepseek-v3", preset_deepseek_v3},
    {"hunyuan-dense", preset_deepseek_v3},
    {"falcon", preset_falcon},
    {"mpt", preset_gpt2},
    {"gpt-2", preset_gpt2},
    {"phi-2", preset_gpt2},
    {"jina-es", preset_gpt2},
    {"jina-de", preset_gpt2},
    {"gigachat", preset_gpt2},
    {"jina-v2-es", preset_gpt2},
    {"jina-v2-de", preset_gpt2},
    {"a.x-4.0", preset_gpt2},
    {"mellum", preset_gpt2},
    {"modern-bert", preset_gpt2},
    {"exaone4", preset_gpt2},
    {"olmo", preset_gpt2},
    {"jais", preset_gpt2},
    {"trillion", [] { return no_clean(preset_gpt2()); }},
    {"granite-docling", [] { return no_clean(preset_gpt2()); }},
    {"jina-v1-en", [] { return preset_with_sep(preset_gpt2()); }},
    {"jina-v2-code", [] { return preset_with_sep(preset_gpt2()); }},
    {"roberta-bpe", [] { return preset_with_sep(preset_gpt2()); }},
    {"starcoder", preset_starcoder},
    {"refact", preset_starcoder},
    {"codeshell", preset_starcoder},
    {"exaone", preset_starcoder},
    {"minerva-7b", preset_starcoder},
    {"mellum2", preset_starcoder},
    {"command-r", [] { return no_clean(preset_starcoder()); }},
    {"smollm", [] { return no_clean(preset_starcoder()); }},
    {"qwen2", [] { return no_clean(preset_qwen2()); }},
    {"deepseek-r1-qwen", [] { return no_clean(preset_qwen2()); }},
    {"kormo", [] { return no_clean(preset_qwen2()); }},
    {"f2llmv2", [] { return no_clean(preset_qwen2()); }},
    {"hunyuan", [] { return no_clean(preset_qwen2()); }},
    {"grok-2", [] { return no_clean(preset_qwen2()); }},
    {"solar-open", [] { return no_clean(preset_qwen2()); }},
    {"stablelm2", preset_qwen2},
    {"megrez", preset_qwen2},
    {"qwen35", [] { return no_clean(make({kQwen35})); }},
    {"poro-chat", [] { return no_clean(make({kBloom})); }},
    {"bloom", [] { return make({kBloom}); }},
    {"gpt3-finnish", [] { return make({kBloom}); }},
    {"viking", [] { return no_clean(make({kBloom, R"(\p{N})"})); }},
    {"glm4", preset_chatglm4},
    {"chatglm-bpe", preset_chatglm4},
    {"tekken", preset_tekken},
    {"chameleon", preset_chameleon},
    {"gpt-4o", [] { return no_clean(make({kGpt4o})); }},
    {"llama4", [] { return no_clean(make({kGpt4o})); }},
    {"kanana2", [] { return no_clean(make({kGpt4o})); }},
    {"minimax-m2", [] { return no_clean(make({kGpt4o})); }},
    {"tiny_aya", preset_tiny_aya},
    {"cohere2moe", preset_tiny_aya},
    {"superbpe", preset_superbpe},
    {"bailingmoe", preset_bailingmoe},
    {"bailingmoe2", preset_bailingmoe},
    {"llada-moe", preset_bailingmoe},
    {"seed-coder", preset_seed_coder},
};

}  // namespace

std::optional<BpePreset> find_bpe_preset(std::string_view pre) {
  if (pre.empty()) pre = "default";
  for (const NamedPreset& p : kPresets)
    if (p.name == pre) return p.make();
  return std::nullopt;
}

std::vector<std::string_view> bpe_preset_names() {
  std::vector<std::string_view> names;
  for (const NamedPreset& p : kPresets) names.push_back(p.name);
  return names;
}

}  // namespace vesper::tokenizer
