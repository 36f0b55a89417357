// ModelRunner: turns a SchedulerOutput into work on the backend: swap-outs, swap-ins and
// copy-on-write block copies first, then one forward pass over a ForwardBatch built from the
// scheduled sequences (prefill chunks and decodes together, no padding). It owns the device KV
// cache and the host swap space, both allocated once at start.
//
// Contract the prefix cache relies on: within each layer, the forward pass writes the K/V of
// every scheduled token before any attention of that layer reads the cache. A sequence admitted
// in a step may then share prefix-cache blocks that another sequence fills in that same step
// (sched/scheduler.h).
#pragma once

#include <memory>
#include <vector>

#include "backend/kv_cache.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "sched/scheduler.h"

namespace vesper::engine {

class ModelRunner {
 public:
  ModelRunner(model::Model& model, int64_t num_blocks, int64_t num_swap_blocks, int64_t block_size, ThreadPool& pool);

  // Runs the step. For each scheduled sequence with samples == true, in order, one row of
  // logits ([n_vocab]) is left in logits(); sampled_ids() says whose.
  void execute(const sched::SchedulerOutput& step, const sched::Scheduler& scheduler);

  const std::vector<sched::SeqId>& sampled_ids() const { return sampled_ids_; }
  float* logits_row(size_t i) { return logits_.data() + i * model_.config().n_vocab; }

 private:
  model::Model& model_;
  ThreadPool& pool_;
  int64_t block_size_;
  backend::KvCache device_;
  backend::KvCache host_;
  model::ForwardBatch batch_;
  std::vector<float> logits_;
  std::vector<sched::SeqId> sampled_ids_;
};

}  // namespace vesper::engine
