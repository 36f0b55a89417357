// dist/job_end.h: the abort handler runs once, and mpirun's kill sequence is read from the
// SIGCONT that starts it and the interval mpirun passes its ranks.
#include "dist/job_end.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace vesper::dist {
namespace {

TEST(JobEnd, KillClockStartsWithSigcontAndUsesMpirunsInterval) {
  unsetenv("OMPI_MCA_odls_base_sigkill_timeout");
  EXPECT_EQ(launcher_kill_interval(), 1.0);  // Open MPI's default
  setenv("OMPI_MCA_odls_base_sigkill_timeout", "2.5", 1);
  EXPECT_EQ(launcher_kill_interval(), 2.5);
  EXPECT_FALSE(launcher_kill_in().has_value());  // no SIGCONT yet
  watch_launcher_kill();
  EXPECT_FALSE(launcher_kill_in().has_value());
  ASSERT_EQ(raise(SIGCONT), 0);
  // SIGTERM 2.5 s after the SIGCONT, SIGKILL 2.5 s after that.
  const std::optional<double> left = launcher_kill_in();
  ASSERT_TRUE(left.has_value());
  EXPECT_GT(*left, 4.0);
  EXPECT_LE(*left, 5.0);
  setenv("OMPI_MCA_odls_base_sigkill_timeout", "0", 1);  // no wait between the signals
  EXPECT_EQ(launcher_kill_interval(), 0.0);
  setenv("OMPI_MCA_odls_base_sigkill_timeout", "soon", 1);  // not a time: the default
  EXPECT_EQ(launcher_kill_interval(), 1.0);
  unsetenv("OMPI_MCA_odls_base_sigkill_timeout");
}

// (One test: the handler runs once a process.)
TEST(JobEnd, AbortHandlerRunsOnceAndAnAbortElsewhereWaitsForIt) {
  std::vector<std::string> calls;
  std::atomic<bool> started{false}, finished{false};
  set_abort_handler([&](const std::string& why) {
    calls.push_back(why);
    started = true;
    run_abort_handler("again, from within");  // an abort while answering: returns at once
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    finished = true;
  });
  std::thread first([] { run_abort_handler("rank 0: MPI_Wait has waited 3 s"); });
  while (!started) std::this_thread::yield();
  run_abort_handler("a second abort, on another thread");  // returns once the first is done
  EXPECT_TRUE(finished);
  first.join();
  set_abort_handler({});
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], "rank 0: MPI_Wait has waited 3 s");
}

}  // namespace
}  // namespace vesper::dist
