// FollowerAdapters: the adapter slots a follower rank of a parallel job holds (model.h): copies of
// the modules the leader's AdapterSource holds in each slot it has used, sent by the leader when
// a slot's version is new (ShardCommand::kAdapterSlot) and kept in this rank's backend buffers.
// A pipeline stage keeps its own layers' modules alone; a tensor-parallel rank keeps them whole
// and the forward pass reads its rows of each (Model::add_adapter_deltas).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/adapter_source.h"

namespace vesper::model {

class FollowerAdapters final : public AdapterSource {
 public:
  explicit FollowerAdapters(backend::Backend& backend) : backend_(backend) {}
  ~FollowerAdapters() override;
  FollowerAdapters(const FollowerAdapters&) = delete;
  FollowerAdapters& operator=(const FollowerAdapters&) = delete;

  // Slot `slot` now holds `modules` ([layer * kNumProjections + projection], each its modules in
  // order) at `version`; their tensors are this rank's buffers, which the slot now owns (the
  // buffers it held before are released).
  void replace(int32_t slot, uint64_t version,
               std::vector<std::vector<backend::LowRankModule>> modules,
               std::vector<backend::Buffer> buffers);

  std::span<const backend::LowRankModule> modules(int32_t slot, int64_t layer,
                                                  Projection p) const override;
  bool any() const override { return !slots_.empty(); }
  uint64_t slot_version(int32_t slot) const override;

 private:
  struct Slot {
    uint64_t version = 0;
    std::vector<std::vector<backend::LowRankModule>> modules;
    std::vector<backend::Buffer> buffers;
  };
  void release(Slot& s);

  backend::Backend& backend_;
  std::map<int32_t, Slot> slots_;
};

}  // namespace vesper::model
