// Proposer: the one seam between the runner and speculative decoding's proposers (n-gram prompt
// lookup, a draft model, Medusa heads). The runner owns its proposer: right after a step's
// sampling it asks for proposals for the sequences whose next step computes the token they just
// sampled, reading each from its mirror (sched/sequence_mirror.h); the proposals travel back in
// ModelRunnerOutput and the scheduler schedules them as speculative tokens in a later plan. After
// the step that verified them, the runner tells the proposer what was kept.
//
// A proposer that keeps KV of its own (a draft model) keeps it in storage indexed by the target's
// block tables (companion storage): the runner applies every plan's swaps, copies and KIVI group
// quantizations to it too, and the proposer writes only into blocks a sequence holds alone (the
// mirror counts block references). Nothing here reaches into the scheduler or the block pool.
//
// Made by make_proposer (spec/make_proposer.h) from SpeculativeConfig; the memory plan asks it for
// its weights, its companion cache and activations before anything is allocated.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache_manager.h"
#include "model/model.h"
#include "sched/sequence_mirror.h"

namespace vesper::spec {

// A sequence to propose for: it just sampled a token, which its next step computes.
struct ProposalRequest {
  kv::SeqId id = 0;
  int64_t k = 0;  // at most this many proposals
  // The row of the step's forward pass (Model::hidden_states) whose final hidden state gave the
  // newest token (Medusa heads read it); -1: none.
  int64_t hidden_row = -1;
};

// Proposed tokens: a chain, or with `parents` (one per token: the parent's index, -1 for the
// last committed token; parents first) a tree.
struct Proposal {
  std::vector<int32_t> tokens;
  std::vector<int32_t> parents;
};

class Proposer {
 public:
  // How proposing grows with k (for --num-speculative-tokens auto): a draft model runs k passes
  // over the sequences; Medusa heads run once, whatever k; n-gram lookup is free.
  enum class Cost { kFree, kPassPerToken, kOnePass };

  virtual ~Proposer() = default;

  // For the startup log.
  virtual std::string describe() const = 0;
  virtual Cost cost() const = 0;
  // Bytes of weights it adds to the memory plan.
  virtual int64_t weight_bytes() const { return 0; }
  // Its companion KV cache (laid out like the target's `target` spec, indexed by the target's
  // tables), if it keeps one.
  virtual std::optional<backend::KvCacheSpec> companion_spec(
      const backend::KvCacheSpec& target) const {
    (void)target;
    return std::nullopt;
  }
  // Activation bytes for steps up to `capacity`.
  virtual int64_t activation_bytes(const model::StepCapacity& capacity) const {
    (void)capacity;
    return 0;
  }
  // KV slots past what the target computes that its proposals' own KV needs (a draft model writes
  // the first k - 1 proposals' rows): the scheduler's lookahead slots.
  virtual int64_t lookahead_slots(int64_t k) const {
    (void)k;
    return 0;
  }
  // The depth of its proposals' trees at k (0: chains only; KIVI needs a longer residual window).
  virtual int64_t max_tree_depth(int64_t k) const {
    (void)k;
    return 0;
  }
  // Allocates the companion cache (companion_spec) of num_blocks device and num_swap_blocks host
  // blocks, and activations for steps up to `capacity`.
  virtual void allocate(const backend::KvCacheSpec& spec, int64_t num_blocks,
                        int64_t num_swap_blocks, const model::StepCapacity& capacity) {
    (void)spec, (void)num_blocks, (void)num_swap_blocks, (void)capacity;
  }
  // The companion cache's device and host storage (valid after allocate).
  virtual std::optional<std::pair<backend::KvHandle, backend::KvHandle>> companion_storage() const {
    return std::nullopt;
  }

  // Proposals for each request (out[i] for requests[i]; empty: none), from the sequences as the
  // mirror holds them after the step's sampling. `hidden` is the step's Model::hidden_states.
  virtual void propose(std::span<const ProposalRequest> requests,
                       const sched::SequenceMirror& mirror, const backend::Tensor& hidden,
                       std::vector<Proposal>& out) = 0;
  // Sequence `id`'s last proposals were verified: `committed` holds the tokens committed after
  // the root (the kept proposals, then the token drawn after them), the first num_accepted of them
  // proposals.
  virtual void on_verified(kv::SeqId id, std::span<const int32_t> committed, int64_t num_accepted) {
    (void)id, (void)committed, (void)num_accepted;
  }
  // Sequence `id`'s KV is gone (preempted by recompute): a cache of its own starts over.
  virtual void on_kv_lost(kv::SeqId id) { (void)id; }
  // Sequence `id` is finished or aborted.
  virtual void forget(kv::SeqId id) { (void)id; }
  // KIVI with a companion cache: the leading positions of `id` whose rows it holds (a group is
  // quantized only once they are written); -1 without a companion cache.
  virtual int64_t rows_written(kv::SeqId id) const {
    (void)id;
    return -1;
  }
  // Seconds proposing for `rows` sequences costs (one token's worth for kPassPerToken), for the
  // auto policy's cost model; measured once at start.
  virtual double time_proposal(int64_t rows) {
    (void)rows;
    return 0;
  }
};

}  // namespace vesper::spec
