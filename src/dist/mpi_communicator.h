// MpiCommunicator: Communicator over an Open MPI communicator (built only with VESPER_HAVE_MPI).
// Errors return to the caller instead of MPI's default of ending the job silently; a failed
// call ends the job through abort() with the MPI error string and the call that failed.
// Every call waits at most VESPER_DIST_TIMEOUT seconds (default 600; 0: forever) for the other
// ranks, then ends the job naming the call: a hung rank or a broken link cannot hold the job.
// The one unbounded wait is a follower's for rank 0's next command (rank 0 may idle for days).
// Tags: 0 carries activations and logits (send, receive, begin_*), 1 the leader's messages.
#pragma once

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace vesper::dist {

class MpiCommunicator final : public Communicator {
 public:
  // A duplicate of MPI_COMM_WORLD (MPI must be initialised).
  MpiCommunicator();
  // Adopts `comm` (an MPI_Comm, split from another), whose timeout is `timeout_seconds`.
  MpiCommunicator(void* comm, double timeout_seconds);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override;

  void post_message(std::vector<uint8_t> bytes, int to) override;
  void receive_message(std::vector<uint8_t>& bytes, int from, bool unbounded) override;
  void all_gather(const float* in, int64_t n, float* out) override;
  void gather(const float* in, int64_t n, float* out, int root) override;
  void send(const float* data, int64_t n, int to) override;
  void receive(float* data, int64_t n, int from) override;
  Transfer begin_send(const float* data, int64_t n, int to) override;
  Transfer begin_receive(float* data, int64_t n, int from) override;
  void complete(Transfer transfer) override;
  std::vector<int64_t> all_gather_i64(int64_t value) override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  [[noreturn]] void abort(const std::string& why) override;

 private:
  void check(int rc, const char* call);
  void describe_hosts();
  // Completes a nonblocking call (an MPI_Request*), within the timeout when `bounded`.
  void wait(void* request, const char* call, bool bounded);

  // Posted messages not yet known delivered (their bytes must live until then), oldest first.
  struct Outgoing {
    void* request = nullptr;  // an MPI_Request, heap-allocated (opaque here)
    std::vector<uint8_t> bytes;
  };
  // Drops the delivered messages from the front of outbox_; with `all`, waits for every one.
  void reap_outbox(bool all);

  void* comm_ = nullptr;  // MPI_Comm, kept opaque so this header needs no mpi.h
  std::deque<Outgoing> outbox_;
  // Transfers begun, not completed: an MPI_Request (heap-allocated), and the call that began it.
  struct Begun {
    void* request = nullptr;
    const char* call = "";
  };
  std::map<Transfer, Begun> transfers_;
  Transfer next_transfer_ = 1;
  int rank_ = 0;
  int size_ = 1;
  std::string hosts_;
  double timeout_seconds_ = 600;
};

}  // namespace vesper::dist
