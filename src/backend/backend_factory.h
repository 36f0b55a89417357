// The backend a command computes on, picked by name: what the engine, perplexity and the
// parallel workers create instead of naming a class.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/result.h"
#include "dist/communicator.h"

namespace vesper::backend {

struct BackendOptions {
  std::string name = "cpu";  // the only one so far
  int threads = 0;           // compute threads; 0: all hardware threads
  // The job's ranks (pipeline stages send to one another over it), and the tensor-parallel group
  // of this rank's stage that the collectives run over (none: no split); both outlive the
  // backend.
  dist::Communicator* group = nullptr;
  dist::Communicator* tensor_group = nullptr;
};

// Errors name the backend asked for.
Result<std::unique_ptr<Backend>> create_backend(const BackendOptions& options);

}  // namespace vesper::backend
