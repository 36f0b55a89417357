#include "backend/backend_factory.h"

#include "backend/cpu_backend.h"

namespace vesper::backend {

Result<std::unique_ptr<Backend>> create_backend(const BackendOptions& options) {
  if (options.name == "cpu")
    return std::unique_ptr<Backend>(
        std::make_unique<CpuBackend>(options.threads, options.group, options.tensor_group));
  return make_error("backend \"" + options.name + "\" is not built into this vesper (built: cpu)");
}

}  // namespace vesper::backend
