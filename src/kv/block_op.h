// The block operations a step runs before its forward pass, as the KV manager asks for them:
// copy-on-write copies, swaps between the device and the host pools, and KIVI group
// quantizations. A plan carries them as one list in the order they were decided
// (sched/scheduler_output.h), and a runner performs them in that order: each op reads what the
// ops before it left. That order is always valid: a block released by one decision (a swap-out,
// a quantization, a free) is handed out only by a later one, so whatever reads it runs before
// whatever writes it.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/block_pool.h"

namespace vesper::kv {

struct BlockCopy {
  BlockId src;
  BlockId dst;
};

// One block moved between device and host: copy device->host on swap-out, host->device on swap-in.
struct SwapMapping {
  BlockId device;
  BlockId host;
};

// One KIVI group made quantized (KvCacheManager::compact): the runner quantizes the group's
// residual rows, held by `rows` (in order), into block `dst`; `rows` are already released
// (whatever reuses them writes later in the step).
struct GroupQuantization {
  std::vector<BlockId> rows;
  BlockId dst;
  bool operator==(const GroupQuantization&) const = default;
};

struct BlockOp {
  enum class Kind : uint8_t {
    kCopy,           // device block src -> device block dst (copy-on-write)
    kSwapOut,        // device block src -> host block dst
    kSwapIn,         // host block src -> device block dst
    kQuantizeGroup,  // the residual-row device blocks `rows`, in order -> device block dst
  };
  Kind kind = Kind::kCopy;
  BlockId src = 0;  // unused by kQuantizeGroup
  BlockId dst = 0;
  std::vector<BlockId> rows;  // kQuantizeGroup only

  static BlockOp copy(const BlockCopy& c) { return {Kind::kCopy, c.src, c.dst, {}}; }
  static BlockOp swap_out(const SwapMapping& m) { return {Kind::kSwapOut, m.device, m.host, {}}; }
  static BlockOp swap_in(const SwapMapping& m) { return {Kind::kSwapIn, m.host, m.device, {}}; }
  static BlockOp quantize(GroupQuantization q) {
    return {Kind::kQuantizeGroup, 0, q.dst, std::move(q.rows)};
  }
  bool operator==(const BlockOp&) const = default;
};

// The number of ops of one kind in a list (statistics, tests).
inline int64_t count_block_ops(const std::vector<BlockOp>& ops, BlockOp::Kind kind) {
  int64_t n = 0;
  for (const BlockOp& op : ops) n += op.kind == kind ? 1 : 0;
  return n;
}

}  // namespace vesper::kv
