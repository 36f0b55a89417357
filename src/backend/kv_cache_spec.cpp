#include "backend/kv_cache_spec.h"

namespace vesper::backend {

std::string_view kv_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return "f32";
  }
  return "?";
}

int64_t KvCacheSpec::element_bytes() const {
  switch (dtype) {
    case KvDtype::kF32:
      return 4;
  }
  return 0;
}

int64_t KvCacheSpec::block_metadata_bytes() const {
  switch (dtype) {
    case KvDtype::kF32:
      return 0;
  }
  return 0;
}

}  // namespace vesper::backend
