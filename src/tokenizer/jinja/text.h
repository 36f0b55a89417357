// Python str operations on UTF-8 text, code point by code point, for the Jinja engine's
// filters and string methods (len, slicing, strip, split, upper, lower, title, ...).
//
// Decoding is lossless: a byte that is not part of valid UTF-8 decodes to U+DC80..U+DCFF
// (Python's "surrogateescape") and encodes back to the same byte, so slicing never corrupts
// text that was not UTF-8 to begin with. Case mapping covers ASCII, Latin-1, Latin Extended-A,
// Greek and Cyrillic (the scripts chat templates meet in role names and markers); other
// scripts are left unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vesper::tokenizer::jinja::text {

std::vector<uint32_t> decode(std::string_view s);
std::string encode(const std::vector<uint32_t>& cps);
std::string encode(const uint32_t* begin, const uint32_t* end);
void append_codepoint(uint32_t cp, std::string* out);
size_t length(std::string_view s);  // in code points

bool is_space(uint32_t cp);  // Python str.isspace()
bool is_alpha(uint32_t cp);  // letters of the scripts above, and CJK ideographs
bool is_digit(uint32_t cp);  // ASCII digits
uint32_t to_upper(uint32_t cp);
uint32_t to_lower(uint32_t cp);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);   // Python str.capitalize
std::string python_title(std::string_view s);  // Python str.title (words are letter runs)
std::string jinja_title(std::string_view s);   // Jinja's |title (words split at spaces, -([{<)

// Python str.strip / lstrip / rstrip: without `chars`, strips whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);

// Python str.split(sep, maxsplit) / rsplit; sep == nullptr splits on whitespace runs.
std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
// Python str.splitlines(keepends=False) for \n, \r\n and \r.
std::vector<std::string> splitlines(std::string_view s);

// Python str.replace(old, new, count); count < 0 means all.
std::string replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);
// Python str.count(sub).
int64_t count(std::string_view s, std::string_view sub);
// Python str.find / rfind, in code points; -1 when absent.
int64_t find(std::string_view s, std::string_view sub, bool reverse);

// HTML escaping as Jinja's |escape does it (& < > " ').
std::string html_escape(std::string_view s);

}  // namespace vesper::tokenizer::jinja::text
