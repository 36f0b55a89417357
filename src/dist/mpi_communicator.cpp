#include "dist/mpi_communicator.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "dist/job_end.h"

namespace vesper::dist {
namespace {

MPI_Comm& as_comm(void*& p) {
  return *reinterpret_cast<MPI_Comm*>(&p);
}

}  // namespace

static_assert(sizeof(MPI_Comm) <= sizeof(void*), "MPI_Comm must fit a pointer");

namespace {

// Counts one collective into `t` when it goes out of scope.
class Counted {
 public:
  Counted(Communicator::Traffic& t, int64_t bytes) : t_(t), bytes_(bytes), start_(MPI_Wtime()) {}
  ~Counted() {
    ++t_.calls;
    t_.bytes += bytes_;
    t_.seconds += MPI_Wtime() - start_;
  }

 private:
  Communicator::Traffic& t_;
  int64_t bytes_;
  double start_;
};

}  // namespace

MpiCommunicator::MpiCommunicator() {
  MPI_Comm_dup(MPI_COMM_WORLD, &as_comm(comm_));
  // Failures come back as return codes (check() turns them into a clear abort) instead of MPI's
  // default handler ending the job with MPI's own message only.
  MPI_Comm_set_errhandler(as_comm(comm_), MPI_ERRORS_RETURN);
  describe_hosts();
  if (const char* t = std::getenv("VESPER_DIST_TIMEOUT"); t != nullptr && *t != '\0')
    timeout_seconds_ = std::atof(t);
}

MpiCommunicator::MpiCommunicator(void* comm, double timeout_seconds)
    : comm_(comm), timeout_seconds_(timeout_seconds) {
  MPI_Comm_set_errhandler(as_comm(comm_), MPI_ERRORS_RETURN);
  describe_hosts();
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  void* comm = nullptr;
  check(MPI_Comm_split(as_comm(comm_), color, key, &as_comm(comm)), "MPI_Comm_split");
  return std::make_unique<MpiCommunicator>(comm, timeout_seconds_);
}

void MpiCommunicator::describe_hosts() {
  MPI_Comm_rank(as_comm(comm_), &rank_);
  MPI_Comm_size(as_comm(comm_), &size_);
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  // Every rank's host name, for the startup log.
  std::vector<char> all(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, as_comm(comm_));
  for (int r = 0; r < size_; ++r)
    hosts_ += (r ? ", " : "") + std::string(&all[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
}

MpiCommunicator::~MpiCommunicator() {
  // The followers read every posted message (the last is the stop command) before anyone frees.
  reap_outbox(true);
  for (auto& [id, begun] : transfers_) {
    wait(begun.request, begun.call, true);
    delete static_cast<MPI_Request*>(begun.request);
  }
  MPI_Comm_free(&as_comm(comm_));
}

std::string MpiCommunicator::describe() const {
  return "Open MPI, " + std::to_string(size_) + " ranks on " + hosts_;
}

void MpiCommunicator::check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  abort(std::string(call) + " failed on rank " + std::to_string(rank_) + ": " + text);
}

namespace {
// A rank that waits for another polls (MPI_Test, MPI_Improbe) rather than sleeping, since a
// step's transfers answer within microseconds. But where ranks share cores (more processes than
// cores: two jobs on one machine, or a rank beside other work) a polling rank takes the core
// from the very rank it waits for: two 2-rank jobs on 2 cores ran 30 times slower than one.
// Past a short spin the poll yields the core between probes to whatever else is ready to run,
// which costs nothing where nothing else is.
void yield_after_spinning(double start) {
  if (MPI_Wtime() - start > 20e-6) std::this_thread::yield();
}
}  // namespace

void MpiCommunicator::wait(void* request, const char* call, bool bounded) {
  MPI_Request& r = *static_cast<MPI_Request*>(request);
  const double start = MPI_Wtime();
  for (;;) {
    int done = 0;
    check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), call);
    if (done) return;
    yield_after_spinning(start);
    // A rank that stopped answering (a hung process, a broken link) would otherwise hold this
    // one forever; a dead process ends the job through mpirun already.
    if (bounded && timeout_seconds_ > 0 && MPI_Wtime() - start > timeout_seconds_)
      abort(std::string(call) + " has waited " + std::to_string(timeout_seconds_) +
            " s for the other ranks: one of them is hung or its link is down "
            "(VESPER_DIST_TIMEOUT sets the limit)");
  }
}

namespace {
constexpr int kDataTag = 0;
constexpr int kMessageTag = 1;
}  // namespace

void MpiCommunicator::post_message(std::vector<uint8_t> bytes, int to) {
  Counted counted(traffic_, static_cast<int64_t>(bytes.size()));
  if (bytes.size() > static_cast<size_t>(INT_MAX))
    abort("a message of " + std::to_string(bytes.size()) + " bytes is larger than one MPI message");
  reap_outbox(false);
  Outgoing& o = outbox_.emplace_back();
  o.bytes = std::move(bytes);
  o.request = new MPI_Request;
  check(MPI_Isend(o.bytes.data(), static_cast<int>(o.bytes.size()), MPI_BYTE, to, kMessageTag,
                  as_comm(comm_), static_cast<MPI_Request*>(o.request)),
        "MPI_Isend");
}

void MpiCommunicator::reap_outbox(bool all) {
  while (!outbox_.empty()) {
    auto* r = static_cast<MPI_Request*>(outbox_.front().request);
    if (all) {
      wait(r, "MPI_Isend", true);
    } else {
      int done = 0;
      check(MPI_Test(r, &done, MPI_STATUS_IGNORE), "MPI_Isend");
      if (!done) return;
    }
    delete r;
    outbox_.pop_front();
  }
}

void MpiCommunicator::receive_message(std::vector<uint8_t>& bytes, int from, bool unbounded) {
  Counted counted(traffic_, 0);
  // Probed first, for its size; the timeout as wait()'s.
  const double start = MPI_Wtime();
  MPI_Message message;
  MPI_Status status;
  for (;;) {
    int found = 0;
    check(MPI_Improbe(from, kMessageTag, as_comm(comm_), &found, &message, &status), "MPI_Improbe");
    if (found) break;
    // Meanwhile this rank's own posted messages move on.
    reap_outbox(false);
    const double waited = MPI_Wtime() - start;
    // A follower of an idle leader (a server between requests) would otherwise keep a core busy
    // probing: past 100 ms without a message it probes once a millisecond. While the leader is
    // busy its commands come sooner than that, and the probe stays a spin.
    if (unbounded && waited > 0.1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    yield_after_spinning(start);
    if (!unbounded && timeout_seconds_ > 0 && waited > timeout_seconds_)
      abort("MPI_Improbe has waited " + std::to_string(timeout_seconds_) + " s for rank " +
            std::to_string(from) +
            ": it is hung or its link is down (VESPER_DIST_TIMEOUT sets the limit)");
  }
  int n = 0;
  check(MPI_Get_count(&status, MPI_BYTE, &n), "MPI_Get_count");
  bytes.resize(static_cast<size_t>(n));
  traffic_.bytes += n;
  MPI_Request r;
  check(MPI_Imrecv(bytes.data(), n, MPI_BYTE, &message, &r), "MPI_Imrecv");
  wait(&r, "MPI_Imrecv", true);
}

MpiCommunicator::Transfer MpiCommunicator::begin_send(const float* data, int64_t n, int to) {
  traffic_.bytes += n * static_cast<int64_t>(sizeof(float));
  auto* r = new MPI_Request;
  check(MPI_Isend(data, static_cast<int>(n), MPI_FLOAT, to, kDataTag, as_comm(comm_), r),
        "MPI_Isend");
  transfers_.emplace(next_transfer_, Begun{r, "MPI_Isend"});
  return next_transfer_++;
}

MpiCommunicator::Transfer MpiCommunicator::begin_receive(float* data, int64_t n, int from) {
  traffic_.bytes += n * static_cast<int64_t>(sizeof(float));
  auto* r = new MPI_Request;
  check(MPI_Irecv(data, static_cast<int>(n), MPI_FLOAT, from, kDataTag, as_comm(comm_), r),
        "MPI_Irecv");
  transfers_.emplace(next_transfer_, Begun{r, "MPI_Irecv"});
  return next_transfer_++;
}

void MpiCommunicator::complete(Transfer transfer) {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end()) return;
  Counted counted(traffic_, 0);
  auto* r = static_cast<MPI_Request*>(it->second.request);
  wait(r, it->second.call, true);
  delete r;
  transfers_.erase(it);
}

void MpiCommunicator::all_gather(const float* in, int64_t n, float* out) {
  // Sends its n floats to every other rank and receives theirs.
  Counted counted(traffic_, 2 * (size_ - 1) * n * static_cast<int64_t>(sizeof(float)));
  MPI_Request r;
  check(MPI_Iallgather(in, static_cast<int>(n), MPI_FLOAT, out, static_cast<int>(n), MPI_FLOAT,
                       as_comm(comm_), &r),
        "MPI_Iallgather");
  wait(&r, "MPI_Iallgather", true);
}

void MpiCommunicator::gather(const float* in, int64_t n, float* out, int root) {
  Counted counted(traffic_,
                  (rank_ == root ? size_ - 1 : 1) * n * static_cast<int64_t>(sizeof(float)));
  MPI_Request r;
  check(MPI_Igather(in, static_cast<int>(n), MPI_FLOAT, out, static_cast<int>(n), MPI_FLOAT, root,
                    as_comm(comm_), &r),
        "MPI_Igather");
  wait(&r, "MPI_Igather", true);
}

void MpiCommunicator::send(const float* data, int64_t n, int to) {
  Counted counted(traffic_, n * static_cast<int64_t>(sizeof(float)));
  MPI_Request r;
  check(MPI_Isend(data, static_cast<int>(n), MPI_FLOAT, to, kDataTag, as_comm(comm_), &r),
        "MPI_Isend");
  wait(&r, "MPI_Isend", true);
}

void MpiCommunicator::receive(float* data, int64_t n, int from) {
  Counted counted(traffic_, n * static_cast<int64_t>(sizeof(float)));
  MPI_Request r;
  check(MPI_Irecv(data, static_cast<int>(n), MPI_FLOAT, from, kDataTag, as_comm(comm_), &r),
        "MPI_Irecv");
  wait(&r, "MPI_Irecv", true);
}

std::vector<int64_t> MpiCommunicator::all_gather_i64(int64_t value) {
  std::vector<int64_t> out(static_cast<size_t>(size_));
  long long v = value;
  std::vector<long long> all(static_cast<size_t>(size_));
  check(MPI_Allgather(&v, 1, MPI_LONG_LONG, all.data(), 1, MPI_LONG_LONG, as_comm(comm_)),
        "MPI_Allgather");
  for (int r = 0; r < size_; ++r) out[static_cast<size_t>(r)] = all[static_cast<size_t>(r)];
  return out;
}

void MpiCommunicator::abort(const std::string& why) {
  std::fprintf(stderr, "vesper: error: rank %d: %s; ending all %d ranks\n", rank_, why.c_str(),
               size_);
  std::fflush(stderr);
  // Rank 0's server answers its in-flight requests before the job ends (a 500 naming why).
  run_abort_handler(why);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace vesper::dist
