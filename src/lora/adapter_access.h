// What a server lets clients name and read as adapters (/v1/load_lora_adapter):
//  - names: 1 to kMaxAdapterNameLength characters of letters, digits and . _ - : /, with no
//    empty, "." or ".." segment between slashes (a name is an id in /v1/models and in metrics,
//    never a path);
//  - paths: only under the directories the operator allows (--lora-allowed-dirs, by default the
//    directories of --lora-modules), judged after resolving "..", symlinks and relative parts,
//    so that a client can neither read nor probe files elsewhere.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/result.h"

namespace vesper::lora {

inline constexpr size_t kMaxAdapterNameLength = 128;

// Error naming the rule when `name` breaks it.
Status check_adapter_name(const std::string& name);

// `dirs` as the allowed set: each directory absolute as named and resolved (each must be an
// existing directory; the error names `flag`).
Result<std::vector<std::string>> canonical_dirs(const std::vector<std::string>& dirs,
                                                const std::string& flag);

// The directories --lora-allowed-dirs defaults to: the directory each module is in (a GGUF
// file's directory, a PEFT directory's parent), absolute, without repeats.
std::vector<std::string> module_dirs(const std::vector<std::string>& module_paths);

// `path` resolved (absolute, "..", symlinks) when it lies under one of `allowed` (canonical
// directories). An error saying only that it is outside them, or that it is not readable (the
// same message whether it is missing, unreadable or of another type: nothing else is revealed).
Result<std::string> resolve_allowed_path(const std::string& path,
                                         const std::vector<std::string>& allowed);

// The one message for a path that is not a readable adapter.
std::string not_an_adapter_message(const std::string& path);

}  // namespace vesper::lora
