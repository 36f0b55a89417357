// WeakList<T>: weak references to objects others own (the open connections, the completions in
// flight), for the rare visit to all that are still alive: a shutdown, a parallel job's end.
// add() forgets the expired ones now and then (once the list has grown to twice the live count
// of the last pruning, plus a margin), so adding stays amortized O(1) and the list within twice
// the live count. Thread-safe; the visitor runs under the list's lock, so it must not add.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

namespace vesper::server {

template <typename T>
class WeakList {
 public:
  void add(const std::shared_ptr<T>& item) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (items_.size() >= 2 * live_at_pruning_ + 64) {
      std::erase_if(items_, [](const std::weak_ptr<T>& w) { return w.expired(); });
      live_at_pruning_ = items_.size();
    }
    items_.push_back(item);
  }

  // Calls visit(T&) on each item still alive.
  template <typename Visit>
  void for_each(Visit&& visit) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const std::weak_ptr<T>& w : items_)
      if (const std::shared_ptr<T> item = w.lock()) visit(*item);
  }

 private:
  std::mutex mutex_;
  std::vector<std::weak_ptr<T>> items_;  // under mutex_
  size_t live_at_pruning_ = 0;           // under mutex_
};

}  // namespace vesper::server
