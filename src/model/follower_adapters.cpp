#include "model/follower_adapters.h"

namespace vesper::model {

FollowerAdapters::~FollowerAdapters() {
  for (auto& [slot, s] : slots_) release(s);
}

void FollowerAdapters::release(Slot& s) {
  for (const backend::Buffer b : s.buffers) backend_.release(b);
  s.buffers.clear();
}

void FollowerAdapters::replace(int32_t slot, uint64_t version,
                               std::vector<std::vector<backend::LowRankModule>> modules,
                               std::vector<backend::Buffer> buffers) {
  Slot& s = slots_[slot];
  release(s);
  s.version = version;
  s.modules = std::move(modules);
  s.buffers = std::move(buffers);
}

std::span<const backend::LowRankModule> FollowerAdapters::modules(int32_t slot, int64_t layer,
                                                                  Projection p) const {
  const auto it = slots_.find(slot);
  const size_t i = static_cast<size_t>(layer * kNumProjections + static_cast<int32_t>(p));
  if (it == slots_.end() || i >= it->second.modules.size()) return {};
  return it->second.modules[i];
}

uint64_t FollowerAdapters::slot_version(int32_t slot) const {
  const auto it = slots_.find(slot);
  return it == slots_.end() ? 0 : it->second.version;
}

}  // namespace vesper::model
