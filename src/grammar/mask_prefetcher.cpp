#include "grammar/mask_prefetcher.h"

#include <utility>

namespace vesper::grammar {

MaskPrefetcher::MaskPrefetcher() : thread_([this] { run(); }) {}

MaskPrefetcher::~MaskPrefetcher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void MaskPrefetcher::request(std::shared_ptr<const CompiledGrammar> grammar, StateId state) {
  // Checked before queueing too: most states of a long output were seen before.
  if (grammar == nullptr || !grammar->mask_pending(state)) return;
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= kMaxQueued) return;
    queue_.push_back({std::move(grammar), state});
  }
  wake_.notify_one();
}

void MaskPrefetcher::wait_idle() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

int64_t MaskPrefetcher::num_computed() const {
  std::lock_guard lock(mu_);
  return num_computed_;
}

void MaskPrefetcher::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    Request r = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    // The step may have reached the state first (or an earlier request computed it): then
    // this finds the mask cached, or waits for the step's computation.
    bool computed = false;
    r.grammar->allowed(r.state, &computed);
    r.grammar.reset();  // a finished request's grammar is not kept alive by this thread
    lock.lock();
    busy_ = false;
    if (computed) ++num_computed_;
    if (queue_.empty()) idle_.notify_all();
  }
}

}  // namespace vesper::grammar
