// SequenceMirror: what a runner holds of its sequences (committed tokens and block table), kept
// up to date from step plans alone (sched/scheduler_output.h). The runner in the engine keeps
// one; so does anything else that runs steps from plans (another process, a test replaying
// serialized plans).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "sched/scheduler_output.h"

namespace vesper::sched {

class SequenceMirror {
 public:
  struct Entry {
    std::vector<int32_t> tokens;
    std::vector<kv::BlockId> block_table;
    int32_t adapter = -1;          // adapter slot (NewSequenceData::adapter)
    int64_t quantized_groups = 0;  // KIVI: quantized groups at the front of block_table
  };

  // Applies a plan's dropped, new and cached parts, in that order. An error (with the mirror
  // unchanged from that sequence on) when the plan does not fit what the mirror holds: a new
  // sequence it already holds, a cached one it does not, a replaced entry outside the table, a
  // scheduled sequence it does not hold or whose tokens do not reach the entry's start.
  Status apply(const SchedulerOutput& plan);

  const Entry* find(SeqId id) const;
  size_t size() const { return seqs_.size(); }

 private:
  std::unordered_map<SeqId, Entry> seqs_;
};

}  // namespace vesper::sched
