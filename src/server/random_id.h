// Response and tool-call ids: a prefix and 32 hex digits from OpenSSL's CSPRNG, as vLLM's
// ("cmpl-", "chatcmpl-", "chatcmpl-tool-" + a random UUID's hex). A counter would be guessable
// and repeat across restarts and replicas; a seeded PRNG's later ids follow from earlier ones.
#pragma once

#include <string>
#include <string_view>

namespace vesper::server {

std::string random_id(std::string_view prefix);

}  // namespace vesper::server
