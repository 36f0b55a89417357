// ModelRunner: runs step plans (sched/scheduler_output.h) on the backend. It owns the device KV
// storage and the host swap storage (allocated once at start) and keeps a mirror of its
// sequences (sched/sequence_mirror.h) built from the plans alone: it never asks the scheduler
// anything, so the plans it runs may come from a scheduler in another thread or process.
//
// execute(plan): applies the plan to the mirror, performs its slot copies, swap-outs, swap-ins
// and copy-on-write copies (in that order: swap-outs read blocks the step may hand to others), then
// builds one ForwardBatch with the batch builder (ForwardBatch::add_sequence: prefill chunks,
// decodes and verifications together, no padding) and runs one forward pass. The K/V contract
// the scheduler relies on is model/model.h's.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"
#include "engine/step_phases.h"
#include "model/model.h"
#include "sched/scheduler_output.h"
#include "sched/sequence_mirror.h"

namespace vesper::engine {

class ModelRunner {
 public:
  // Device and host (swap) KV storage of `spec` (the model's kv_spec), num_blocks and
  // num_swap_blocks blocks.
  ModelRunner(model::Model& model, const backend::KvCacheSpec& spec, int64_t num_blocks,
              int64_t num_swap_blocks);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Runs the plan. An error, with nothing run, when the plan does not fit the mirror (a plan
  // from another history). With `clock`, the batch build and the forward pass are timed.
  Status execute(const sched::SchedulerOutput& plan, PhaseClock* clock = nullptr);

  // The logits of the last execute: scheduled entry i's rows (num_logits_rows of them, the
  // last committed token's first) start at row first_logits_row()[i] (-1: none).
  const std::vector<int32_t>& first_logits_row() const { return first_logits_row_; }
  std::span<const float> logits_row(int64_t row) const {
    return logits_.subspan(static_cast<size_t>(row * n_vocab_), static_cast<size_t>(n_vocab_));
  }
  // The final hidden state (after the output norm) of the same rows (Model::hidden_rows).
  std::span<const float> hidden_row(int64_t row) const {
    const size_t e = static_cast<size_t>(model_.config().n_embd);
    return model_.hidden_rows().subspan(static_cast<size_t>(row) * e, e);
  }

  // KV storage of another model indexed by the same block tables (a draft model's): every plan's
  // swaps and copies are applied to it too.
  void add_companion_storage(backend::KvHandle device, backend::KvHandle host);

  const sched::SequenceMirror& mirror() const { return mirror_; }
  backend::KvHandle device_kv() const { return device_; }

 private:
  model::Model& model_;
  backend::Backend& backend_;
  model::KvTableLayout layout_;  // how block tables map positions to slots
  int64_t n_vocab_;
  backend::KvHandle device_;
  backend::KvHandle host_;
  std::vector<std::pair<backend::KvHandle, backend::KvHandle>> companions_;  // (device, host)
  sched::SequenceMirror mirror_;
  // Reused every step.
  model::ForwardBatch batch_;
  std::vector<int32_t> tokens_, parents_, copy_src_, copy_dst_, first_logits_row_;
  std::vector<int64_t> slot_src_, slot_dst_;
  std::span<const float> logits_;
};

}  // namespace vesper::engine
