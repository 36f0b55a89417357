// Communicator: what a group of processes running one model needs (tensor parallelism's
// collectives, pipeline stages' activations), over whatever transport carries it (Open MPI:
// dist/mpi_communicator.h).
//
// The collectives (all_gather, gather, all_gather_i64, split) are made by every rank of the group
// in the same order, with the same sizes; the rest are point to point. The collectives move values
// and never add them (there is no all-reduce), so no result depends on the order a transport
// would reduce in.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vesper::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "open-mpi, 2 ranks on vm, vm": what the startup log says.
  virtual std::string describe() const = 0;

  // Messages of any size from one rank to another (the leader's commands to each follower).
  // post_message takes the bytes and returns at once, whether or not `to` is receiving yet (the
  // communicator keeps them until delivered: a leader never waits for a busy follower).
  // receive_message waits for the next message from `from` (for ever when `unbounded`: a follower
  // waiting for an idle leader's next command) and replaces `bytes` with it. Messages from one
  // rank arrive in the order they were posted.
  virtual void post_message(std::vector<uint8_t> bytes, int to) = 0;
  virtual void receive_message(std::vector<uint8_t>& bytes, int from, bool unbounded) = 0;
  // Each rank's n floats, in rank order, into out [size x n] of every rank.
  virtual void all_gather(const float* in, int64_t n, float* out) = 0;
  // Each rank's n floats, in rank order, into out [size x n] of `root` (others' out unused).
  virtual void gather(const float* in, int64_t n, float* out, int root) = 0;
  // Point to point (pipeline stages): n floats to rank `to` / from rank `from`; a send completes
  // once the receiver has them or they are buffered.
  virtual void send(const float* data, int64_t n, int to) = 0;
  virtual void receive(float* data, int64_t n, int from) = 0;
  // The same, begun without waiting: the transfer goes on while this rank computes, and
  // complete() waits for it (the floats must stay untouched until then). Sends and receives,
  // begun or not, between two ranks match in the order they were made. Pipeline parallelism
  // keeps a pass in flight a stage with them.
  using Transfer = int64_t;
  virtual Transfer begin_send(const float* data, int64_t n, int to) = 0;
  virtual Transfer begin_receive(float* data, int64_t n, int from) = 0;
  virtual void complete(Transfer transfer) = 0;
  // The ranks of this group with the same `color`, ordered by `key`, as a group of their own
  // (collective: every rank calls it).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // One int64 from every rank, in rank order, on every rank.
  virtual std::vector<int64_t> all_gather_i64(int64_t value) = 0;
  // Ends every process of the job with `why` on standard error (a worker's fatal error).
  [[noreturn]] virtual void abort(const std::string& why) = 0;

  // What this rank's collectives have moved so far: calls, bytes this rank sent and received
  // (commands included), and seconds inside them (waiting for the slowest rank included).
  struct Traffic {
    int64_t calls = 0;
    int64_t bytes = 0;
    double seconds = 0;
  };
  Traffic traffic() const { return traffic_; }

 protected:
  Traffic traffic_;
};

}  // namespace vesper::dist
