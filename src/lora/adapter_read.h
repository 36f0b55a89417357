// AdapterRead: read_adapter (lora/adapter.h) on a thread of its own, so that no caller waits on a
// file longer than it chooses: a request worker waits a bounded time for a runtime load, the
// engine's registry polls between steps for a copy read again after eviction. The thread is
// detached: a read that never returns (a file on a stalled mount) holds up nobody, and finishes
// unseen once the AdapterRead is gone.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/result.h"
#include "lora/adapter.h"
#include "model/model_config.h"

namespace vesper::lora {

// A read (local file, at most a few hundred MiB) that takes longer than this is taken as failed.
inline constexpr double kAdapterReadTimeoutSeconds = 60;

class AdapterRead {
 public:
  // Starts reading the adapter at `path` for a model of `config` (scale 1).
  AdapterRead(const std::string& path, const model::ModelConfig& config, int64_t max_rank);

  bool done() const;
  // Waits up to `seconds` for the read; whether it is done.
  bool wait_for(double seconds) const;
  // Seconds since the read started.
  double elapsed() const;
  // The adapter or the reader's error, once done(); `recognized` as read_adapter sets it. Takes
  // the result: call once.
  Result<HostAdapter> take(bool* recognized = nullptr);

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
  double started_ = 0;
};

}  // namespace vesper::lora
