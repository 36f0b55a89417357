#include "dist/job_end.h"

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>

namespace vesper::dist {
namespace {

// The handler runs under handler_mutex: set_abort_handler waits for a running one to finish (its
// captures must outlive it), and so does an abort from another thread (whose MPI_Abort would
// otherwise cut the first one's answers short).
std::recursive_mutex handler_mutex;
std::function<void(const std::string&)> abort_handler;  // under handler_mutex
bool abort_handler_ran = false;                         // under handler_mutex

// CLOCK_MONOTONIC in nanoseconds: clock_gettime is async-signal-safe, so the handler may read it.
int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::atomic<int64_t> last_sigcont_ns{0};  // 0: none since watch_launcher_kill()
static_assert(std::atomic<int64_t>::is_always_lock_free, "written from a signal handler");
std::once_flag watch_once;

void on_sigcont(int) {
  last_sigcont_ns.store(monotonic_ns(), std::memory_order_relaxed);
}

}  // namespace

void set_abort_handler(std::function<void(const std::string& why)> handler) {
  std::lock_guard<std::recursive_mutex> lock(handler_mutex);
  abort_handler = std::move(handler);
}

void run_abort_handler(const std::string& why) {
  // Recursive: an abort from within the handler, on its own thread, finds it ran and returns.
  std::lock_guard<std::recursive_mutex> lock(handler_mutex);
  if (abort_handler_ran) return;
  abort_handler_ran = true;
  if (abort_handler) abort_handler(why);
}

void watch_launcher_kill() {
  std::call_once(watch_once, [] {
    struct sigaction action {};
    action.sa_handler = on_sigcont;
    sigemptyset(&action.sa_mask);
    // A SIGCONT must not make an interrupted system call fail on a thread that does not expect it.
    action.sa_flags = SA_RESTART;
    sigaction(SIGCONT, &action, nullptr);
  });
}

double launcher_kill_interval() {
  const char* v = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
  if (v == nullptr || *v == '\0') return 1.0;
  char* end = nullptr;
  const double t = std::strtod(v, &end);
  // 0 is a valid setting (no wait between the signals); what is not a number is Open MPI's default.
  return end != v && *end == '\0' && t >= 0 ? t : 1.0;
}

std::optional<double> launcher_kill_in() {
  const int64_t sigcont = last_sigcont_ns.load(std::memory_order_relaxed);
  if (sigcont == 0) return std::nullopt;
  const double since = static_cast<double>(monotonic_ns() - sigcont) * 1e-9;
  const double left = 2 * launcher_kill_interval() - since;
  // A SIGCONT from long ago (a job stopped and continued by hand) starts no kill sequence; a
  // little past the due time still counts (the SIGKILL may be on its way).
  if (left < -1.0) return std::nullopt;
  return std::max(0.0, left);
}

}  // namespace vesper::dist
