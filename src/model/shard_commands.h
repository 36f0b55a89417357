// The messages a tensor-parallel leader's model sends its followers (model.h): one per forward
// pass, reserve and KV storage operation, in the order the leader does them. Encoded with
// core/byte_stream.h; both ends are the same vesper build.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/byte_stream.h"
#include "model/forward_batch.h"
#include "model/model.h"

namespace vesper::model {

enum class ShardCommand : uint64_t {
  kStop = 1,           // the leader's model is gone: leave follow_leader
  kReserve,            // StepCapacity
  kForward,            // KV handle, ForwardBatch
  kCreateKv,           // the leader's handle, KvCacheSpec, blocks, memory kind
  kReleaseKv,          // handle
  kCopyKvBlocks,       // to, from, src blocks, dst blocks
  kCopyKvSlots,        // handle, src slots, dst slots
  kQuantizeKvGroup,    // handle, rows, dst
  kCalibrateKvScales,  // handle
  kAsk,                // figure count, request bytes (Model::ask_followers)
  kAdapterSlot         // slot, version, its modules with their tensors' bytes
};

// A KV storage spec in a message (every field).
void write_kv_spec(ByteWriter& w, const backend::KvCacheSpec& spec);
Result<backend::KvCacheSpec> read_kv_spec(ByteReader& r);

std::vector<uint8_t> stop_command();
std::vector<uint8_t> reserve_command(const StepCapacity& capacity);
std::vector<uint8_t> forward_command(const ForwardBatch& batch, backend::KvHandle kv);

}  // namespace vesper::model
