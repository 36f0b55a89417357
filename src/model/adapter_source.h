// AdapterSource: what the forward pass asks of adapters (LoRA, VeRA; src/lora/ implements it).
// A sequence of the batch names an adapter slot (ForwardBatch::seq_adapter, -1: none); after
// each projection's base matmul, the rows of every sequence get the low-rank modules its slot
// adds to that projection (Backend::add_low_rank), so one pass serves many adapters at once.
#pragma once

#include <cstdint>
#include <span>

#include "backend/backend.h"

namespace vesper::model {

// The seven projections of a llama layer an adapter may target (GGUF names in comments).
enum class Projection : int32_t {
  kQ,     // attn_q
  kK,     // attn_k
  kV,     // attn_v
  kO,     // attn_output
  kGate,  // ffn_gate
  kUp,    // ffn_up
  kDown,  // ffn_down
};
inline constexpr int32_t kNumProjections = 7;

class AdapterSource {
 public:
  virtual ~AdapterSource() = default;
  // The modules rows of adapter slot `slot` (-1: none) add to projection `p` of layer `layer`,
  // in the order they are applied; empty when there are none. Valid until the next call that
  // changes the source (never during a forward pass).
  virtual std::span<const backend::LowRankModule> modules(int32_t slot, int64_t layer,
                                                          Projection p) const = 0;
  // False when no slot adds anything (the forward pass then skips the lookups).
  virtual bool any() const = 0;
  // Changes whenever what `slot` holds changes (a copy loaded into it); slot -1 (the merged
  // adapters) keeps one. A parallel job's leader sends a slot's modules to the other ranks when
  // its version is new to them (model.h).
  virtual uint64_t slot_version(int32_t slot) const = 0;
};

}  // namespace vesper::model
