// AdapterBinder: how the scheduler binds a sequence's adapter (Sequence::adapter_id, a LoRA or
// VeRA registration) to a loaded copy when it writes the sequence into a plan, so that the plan
// carries the copy's slot and nothing edits it afterwards. The engine implements it over
// lora::AdapterRegistry (pin reads the file when no copy is loaded).
//
// The scheduler pins when a sequence becomes resident in the runner (admitted, swapped back in,
// forked) and unpins when the runner stops reading it (finished, aborted, preempted), once no plan
// the runner may still be running reads it.
#pragma once

#include <cstdint>

#include "core/result.h"

namespace vesper::sched {

class AdapterBinder {
 public:
  virtual ~AdapterBinder() = default;
  // The slot of a loaded copy of adapter `adapter_id`, held until unpin. An error (naming the
  // adapter and its file) when no copy can be loaded.
  virtual Result<int32_t> pin(uint64_t adapter_id) = 0;
  // Whether pin(adapter_id) answers without reading a file now. False while a copy is read off
  // the engine thread: the scheduler leaves the sequence waiting (or swapped) and asks again.
  virtual bool ready(uint64_t adapter_id) = 0;
  virtual void unpin(int32_t slot) = 0;
};

}  // namespace vesper::sched
