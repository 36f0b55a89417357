#include "tokenizer/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/check.h"
#include "tokenizer/utf8.h"

namespace vesper::tokenizer {

struct RegexSplitter::Compiled {
  std::string pattern;
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

namespace {

// Per-call match state: match data, and a JIT stack larger than PCRE2's 32 KiB default so
// long runs (e.g. 100k spaces against \s*[\r\n]+) do not exhaust it.
class MatchScratch {
 public:
  MatchScratch() {
    data_ = pcre2_match_data_create(1, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    VESPER_CHECK(data_ != nullptr && context_ != nullptr, "PCRE2 allocation failed");
  }
  ~MatchScratch() {
    pcre2_match_data_free(data_);
    pcre2_match_context_free(context_);
    pcre2_jit_stack_free(jit_stack_);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;

  void ensure_jit_stack() {
    if (jit_stack_ != nullptr) return;
    jit_stack_ = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    if (jit_stack_ != nullptr) pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
  }

  pcre2_match_data* data() { return data_; }
  pcre2_match_context* context() { return context_; }

 private:
  pcre2_match_data* data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* jit_stack_ = nullptr;
};

// One pcre2_match; on a JIT resource error retries with the interpreter. Returns false when
// there is no match (or the match could not complete, which we treat the same way).
bool match_at(const pcre2_code* code, bool jit, std::string_view subject, size_t start,
              uint32_t options, MatchScratch* scratch, size_t* match_begin, size_t* match_end) {
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  if (jit) scratch->ensure_jit_stack();
  int rc = pcre2_match(code, s, subject.size(), start, options | PCRE2_NO_UTF_CHECK,
                       scratch->data(), scratch->context());
  if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && jit) {
    rc = pcre2_match(code, s, subject.size(), start, options | PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                     scratch->data(), scratch->context());
  }
  if (rc < 0) return false;  // no match, or a match/heap limit hit: the rest stays one gap
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch->data());
  *match_begin = ov[0];
  *match_end = ov[1];
  return true;
}

// Appends the matches of one pattern in `piece` and the gaps between them to `out`, with
// offsets relative to the whole text (`base`). The pattern sees only the piece.
void split_piece(const pcre2_code* code, bool jit, std::string_view piece, size_t base,
                 MatchScratch* scratch, std::vector<Span>* out) {
  size_t last = 0;  // end of what has been emitted
  size_t pos = 0;   // where the next search starts
  uint32_t options = 0;
  while (pos <= piece.size()) {
    size_t mb = 0;
    size_t me = 0;
    if (!match_at(code, jit, piece, pos, options, scratch, &mb, &me)) {
      if (options == 0) break;
      // No non-empty match right at `pos` after an empty one: step one character on.
      options = 0;
      if (pos >= piece.size()) break;
      pos += std::min(utf8_sequence_length(static_cast<uint8_t>(piece[pos])), piece.size() - pos);
      continue;
    }
    if (mb > last) out->push_back({base + last, base + mb});
    if (me > mb) {
      out->push_back({base + mb, base + me});
      last = me;
      pos = me;
      options = 0;
    } else {
      // An empty match only marks a cut. Look for a non-empty match at the same place before
      // moving on, as global matching in Perl, PCRE2 and std::regex does.
      last = mb;
      pos = mb;
      options = PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED;
    }
  }
  if (last < piece.size()) out->push_back({base + last, base + piece.size()});
}

}  // namespace

Result<RegexSplitter> RegexSplitter::compile(const std::vector<std::string>& patterns) {
  RegexSplitter splitter;
  for (const std::string& pattern : patterns) {
    auto compiled = std::make_shared<Compiled>();
    compiled->pattern = pattern;
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    // DOLLAR_ENDONLY: '$' means end of piece, as in ECMAScript and Rust regexes.
    compiled->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_offset,
                                   nullptr);
    if (compiled->code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(err, message, sizeof(message));
      return make_error("pre-tokenizer pattern \"" + pattern + "\": PCRE2 error at offset " +
                        std::to_string(err_offset) + ": " + reinterpret_cast<const char*>(message));
    }
    compiled->jit = pcre2_jit_compile(compiled->code, PCRE2_JIT_COMPLETE) == 0;
    splitter.patterns_.push_back(std::move(compiled));
  }
  return splitter;
}

std::vector<Span> RegexSplitter::split(std::string_view text) const {
  std::vector<Span> pieces;
  if (text.empty()) return pieces;
  pieces.push_back({0, text.size()});
  if (patterns_.empty()) return pieces;
  // One scratch per thread: encode() runs this once per text fragment, and creating a JIT
  // stack each time would cost a mapping per fragment.
  thread_local MatchScratch scratch;
  std::vector<Span> next;
  for (const auto& compiled : patterns_) {
    next.clear();
    next.reserve(pieces.size() * 2);
    for (const Span& piece : pieces) {
      split_piece(compiled->code, compiled->jit, text.substr(piece.begin, piece.end - piece.begin),
                  piece.begin, &scratch, &next);
    }
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace vesper::tokenizer
