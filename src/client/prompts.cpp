#include "client/prompts.h"

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string_view>

namespace vesper::client {
namespace {

// Frequent English words that llama vocabularies hold as single tokens.
constexpr std::array<std::string_view, 240> kWords = {
    "the",     "of",      "and",       "to",      "in",      "a",       "is",       "that",
    "for",     "it",      "as",        "was",     "with",    "be",      "by",       "on",
    "not",     "he",      "this",      "are",     "or",      "his",     "from",     "at",
    "which",   "but",     "have",      "an",      "had",     "they",    "you",      "were",
    "their",   "one",     "all",       "we",      "can",     "her",     "has",      "there",
    "been",    "if",      "more",      "when",    "will",    "would",   "who",      "so",
    "no",      "she",     "other",     "its",     "may",     "these",   "what",     "them",
    "than",    "some",    "him",       "time",    "into",    "only",    "do",       "first",
    "any",     "my",      "now",       "such",    "like",    "our",     "over",     "man",
    "me",      "even",    "most",      "made",    "after",   "also",    "did",      "many",
    "before",  "must",    "through",   "years",   "where",   "much",    "your",     "way",
    "well",    "down",    "should",    "because", "each",    "just",    "those",    "people",
    "how",     "too",     "little",    "state",   "good",    "very",    "make",     "world",
    "still",   "own",     "see",       "men",     "work",    "long",    "get",      "here",
    "between", "both",    "life",      "being",   "under",   "never",   "day",      "same",
    "another", "know",    "while",     "last",    "might",   "us",      "great",    "old",
    "year",    "off",     "come",      "since",   "against", "go",      "came",     "right",
    "used",    "take",    "three",     "house",   "use",     "during",  "without",  "again",
    "place",   "around",  "however",   "home",    "small",   "found",   "thought",  "went",
    "say",     "part",    "once",      "general", "high",    "upon",    "school",   "every",
    "does",    "got",     "united",    "left",    "number",  "course",  "war",      "until",
    "always",  "away",    "something", "fact",    "though",  "water",   "less",     "public",
    "put",     "think",   "almost",    "hand",    "enough",  "far",     "took",     "head",
    "yet",     "system",  "set",       "better",  "told",    "nothing", "night",    "end",
    "why",     "called",  "door",      "eyes",    "find",    "going",   "look",     "asked",
    "later",   "point",   "knew",      "city",    "next",    "program", "business", "give",
    "group",   "toward",  "young",     "days",    "let",     "room",    "side",     "social",
    "given",   "present", "several",   "order",   "second",  "rather",  "per",      "face",
    "among",   "form",    "often",     "early",   "white",   "case",    "become",   "large",
    "need",    "big",     "four",      "within",  "felt",    "along",   "children", "saw",
};

}  // namespace

std::vector<BenchRequest> random_requests(int64_t num_requests, int64_t input_len,
                                          int64_t output_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, kWords.size() - 1);
  std::vector<BenchRequest> reqs(static_cast<size_t>(num_requests));
  for (BenchRequest& r : reqs) {
    for (int64_t w = 0; w < input_len; ++w) {
      if (w > 0) r.prompt.push_back(' ');
      r.prompt.append(kWords[pick(rng)]);
    }
    r.prompt_len = input_len;
    r.output_len = output_len;
  }
  return reqs;
}

int64_t count_words(const std::string& text) {
  int64_t words = 0;
  bool in_word = false;
  for (unsigned char c : text) {
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
    if (!space && !in_word) ++words;
    in_word = !space;
  }
  return words;
}

Result<std::vector<BenchRequest>> load_dataset(const std::string& path, int64_t max_requests,
                                               int64_t default_output_len) {
  std::ifstream f(path);
  if (!f) return make_error(path + ": cannot open the dataset");
  std::vector<BenchRequest> reqs;
  std::string line;
  for (size_t n = 1; static_cast<int64_t>(reqs.size()) < max_requests && std::getline(f, line);
       ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n) + ": ";
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      return make_error(where + "expected {\"prompt\": string, \"output_len\": integer}");
    BenchRequest r;
    r.prompt = j["prompt"].get<std::string>();
    r.prompt_len = count_words(r.prompt);
    r.output_len = default_output_len;
    if (auto it = j.find("output_len"); it != j.end()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 1)
        return make_error(where + "\"output_len\" must be a positive integer");
      r.output_len = it->get<int64_t>();
    }
    reqs.push_back(std::move(r));
  }
  if (reqs.empty()) return make_error(path + ": no requests in the dataset");
  return reqs;
}

}  // namespace vesper::client
