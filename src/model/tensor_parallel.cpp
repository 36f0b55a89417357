// Model's tensor-parallel half (model.h): the leader's KV storage operations and their broadcast,
// the commands' encoding (shard_commands.h), and the follower's loop.
#include <algorithm>
#include <optional>

#include "core/byte_stream.h"
#include "core/check.h"
#include "model/model.h"
#include "model/shard_commands.h"

namespace vesper::model {
namespace {

ByteWriter command(ShardCommand kind) {
  ByteWriter w;
  w.u64(static_cast<uint64_t>(kind));
  return w;
}

template <class Int>
void put(ByteWriter& w, const std::vector<Int>& v) {
  w.ints(std::span<const Int>(v));
}

template <class Int>
void put(ByteWriter& w, std::span<const Int> v) {
  w.ints(v);
}

// Reads a command's fields in order; the first fault sticks and every later read gives zero.
class Fields {
 public:
  explicit Fields(std::span<const uint8_t> bytes) : r_(bytes) {}
  int64_t i64() {
    if (!ok()) return 0;
    auto v = r_.i64();
    if (!v) return fail(v.error()), 0;
    return *v;
  }
  uint64_t u64() {
    if (!ok()) return 0;
    auto v = r_.u64();
    if (!v) return fail(v.error()), 0;
    return *v;
  }
  bool boolean() {
    if (!ok()) return false;
    auto v = r_.boolean();
    if (!v) return fail(v.error()), false;
    return *v;
  }
  void str(std::string& out) {
    if (ok())
      if (Status s = r_.str(out); !s) fail(s.error());
  }
  template <class Int>
  void ints(std::vector<Int>& out) {
    if (ok())
      if (Status s = r_.ints(out); !s) fail(s.error());
  }
  backend::KvCacheSpec spec() {
    if (!ok()) return {};
    auto s = read_kv_spec(r_);
    if (!s) return fail(s.error()), backend::KvCacheSpec{};
    return *s;
  }
  bool ok() const { return !error_; }
  Status status() const {
    if (error_) return *error_;
    if (!r_.done()) return make_error("a command with bytes left over");
    return {};
  }

 private:
  void fail(const Error& e) {
    if (!error_) error_ = e;
  }
  ByteReader r_;
  std::optional<Error> error_;
};

}  // namespace

void write_kv_spec(ByteWriter& w, const backend::KvCacheSpec& spec) {
  w.u64(static_cast<uint64_t>(spec.dtypes.k));
  w.u64(static_cast<uint64_t>(spec.dtypes.v));
  for (const int64_t v : {spec.n_layers, spec.block_size, spec.n_kv_heads, spec.head_dim,
                          spec.kivi_residual_length, spec.residual_rows})
    w.i64(v);
  w.boolean(spec.key_bounds);
}

Result<backend::KvCacheSpec> read_kv_spec(ByteReader& r) {
  backend::KvCacheSpec s;
  VESPER_ASSIGN_OR_RETURN(const uint64_t k, r.u64());
  VESPER_ASSIGN_OR_RETURN(const uint64_t v, r.u64());
  if (k > 255 || v > 255) return make_error("a KV element type out of range");
  s.dtypes.k = static_cast<backend::KvDtype>(k);
  s.dtypes.v = static_cast<backend::KvDtype>(v);
  for (int64_t* field : {&s.n_layers, &s.block_size, &s.n_kv_heads, &s.head_dim,
                         &s.kivi_residual_length, &s.residual_rows}) {
    VESPER_ASSIGN_OR_RETURN(*field, r.i64());
  }
  VESPER_ASSIGN_OR_RETURN(s.key_bounds, r.boolean());
  return s;
}

std::vector<uint8_t> stop_command() {
  return command(ShardCommand::kStop).take();
}

std::vector<uint8_t> reserve_command(const StepCapacity& c) {
  ByteWriter w = command(ShardCommand::kReserve);
  for (const int64_t v : {c.tokens, c.logits_rows, c.seqs, c.table_entries}) w.i64(v);
  return w.take();
}

std::vector<uint8_t> forward_command(const ForwardBatch& b, backend::KvHandle kv) {
  ByteWriter w = command(ShardCommand::kForward);
  w.u64(kv.id);
  put(w, b.token_ids);
  put(w, b.positions);
  put(w, b.token_seq);
  put(w, b.query_start);
  put(w, b.block_tables);
  put(w, b.table_offsets);
  put(w, b.slot_mapping);
  put(w, b.logits_rows);
  put(w, b.seq_adapter);
  put(w, b.tree_parents);
  put(w, b.quantized_groups);
  put(w, b.gap_begin);
  put(w, b.gap_end);
  put(w, b.block_budget);
  return w.take();
}

void Model::broadcast(std::vector<uint8_t> command) {
  group_->broadcast(command, 0);
}

backend::KvHandle Model::create_kv(const backend::KvCacheSpec& spec, int64_t num_blocks,
                                   backend::MemoryKind kind) {
  const backend::KvHandle kv = backend_.create_kv(spec, num_blocks, kind);
  if (leads()) {
    ByteWriter w = command(ShardCommand::kCreateKv);
    w.u64(kv.id);
    write_kv_spec(w, spec);
    w.i64(num_blocks);
    w.u64(static_cast<uint64_t>(kind));
    broadcast(w.take());
  }
  return kv;
}

void Model::release_kv(backend::KvHandle kv) {
  if (leads()) {
    ByteWriter w = command(ShardCommand::kReleaseKv);
    w.u64(kv.id);
    broadcast(w.take());
  }
  backend_.release_kv(kv);
}

void Model::copy_kv_blocks(backend::KvHandle to, backend::KvHandle from,
                           std::span<const int32_t> src, std::span<const int32_t> dst) {
  if (leads()) {
    ByteWriter w = command(ShardCommand::kCopyKvBlocks);
    w.u64(to.id);
    w.u64(from.id);
    put(w, src);
    put(w, dst);
    broadcast(w.take());
  }
  backend_.copy_kv_blocks(to, from, src, dst);
}

void Model::copy_kv_slots(backend::KvHandle kv, std::span<const int64_t> src,
                          std::span<const int64_t> dst) {
  if (leads()) {
    ByteWriter w = command(ShardCommand::kCopyKvSlots);
    w.u64(kv.id);
    put(w, src);
    put(w, dst);
    broadcast(w.take());
  }
  backend_.copy_kv_slots(kv, src, dst);
}

void Model::quantize_kv_group(backend::KvHandle kv, std::span<const int32_t> rows, int32_t dst) {
  if (leads()) {
    ByteWriter w = command(ShardCommand::kQuantizeKvGroup);
    w.u64(kv.id);
    put(w, rows);
    w.i64(dst);
    broadcast(w.take());
  }
  backend_.quantize_kv_group(kv, rows, dst);
}

void Model::calibrate_kv_scales(backend::KvHandle kv) {
  if (leads()) {
    ByteWriter w = command(ShardCommand::kCalibrateKvScales);
    w.u64(kv.id);
    broadcast(w.take());
  }
  backend_.calibrate_kv_scales(kv);
}

std::vector<std::vector<int64_t>> Model::ask_followers(std::vector<uint8_t> request,
                                                       std::span<const int64_t> figures) {
  VESPER_CHECK(leads(), "ask_followers: not the leader");
  ByteWriter w = command(ShardCommand::kAsk);
  w.u64(figures.size());
  w.str(std::string_view(reinterpret_cast<const char*>(request.data()), request.size()));
  broadcast(w.take());
  std::vector<std::vector<int64_t>> per_rank(static_cast<size_t>(group_->size()));
  for (const int64_t figure : figures) {
    const std::vector<int64_t> all = group_->all_gather_i64(figure);
    for (size_t r = 0; r < all.size(); ++r) per_rank[r].push_back(all[r]);
  }
  return per_rank;
}

backend::KvHandle Model::local_kv(uint64_t leader_handle) const {
  for (const auto& [id, kv] : follower_kv_)
    if (id == leader_handle) return kv;
  return {};
}

Status Model::follow_leader(const FollowerAnswer& answer) {
  if (group_ == nullptr || leads()) return make_error("follow_leader: not a follower");
  std::vector<uint8_t> bytes;
  ForwardBatch batch;
  std::vector<int32_t> src32, dst32;
  std::vector<int64_t> src64, dst64;
  for (;;) {
    group_->broadcast(bytes, 0);
    Fields f(bytes);
    const auto kind = static_cast<ShardCommand>(f.u64());
    // A handle the leader made: this rank's storage for it, or an error.
    auto storage = [&]() -> Result<backend::KvHandle> {
      const uint64_t id = f.u64();
      const backend::KvHandle kv = local_kv(id);
      if (!kv.valid())
        return make_error("the leader names KV storage " + std::to_string(id) +
                          ", which this rank never made");
      return kv;
    };
    switch (kind) {
      case ShardCommand::kStop:
        VESPER_TRY(f.status());
        return {};
      case ShardCommand::kReserve: {
        StepCapacity c;
        c.tokens = f.i64();
        c.logits_rows = f.i64();
        c.seqs = f.i64();
        c.table_entries = f.i64();
        VESPER_TRY(f.status());
        reserve(c);
        break;
      }
      case ShardCommand::kForward: {
        VESPER_ASSIGN_OR_RETURN(const backend::KvHandle kv, storage());
        f.ints(batch.token_ids);
        f.ints(batch.positions);
        f.ints(batch.token_seq);
        f.ints(batch.query_start);
        f.ints(batch.block_tables);
        f.ints(batch.table_offsets);
        f.ints(batch.slot_mapping);
        f.ints(batch.logits_rows);
        f.ints(batch.seq_adapter);
        f.ints(batch.tree_parents);
        f.ints(batch.quantized_groups);
        f.ints(batch.gap_begin);
        f.ints(batch.gap_end);
        f.ints(batch.block_budget);
        VESPER_TRY(f.status());
        forward(batch, kv);
        break;
      }
      case ShardCommand::kCreateKv: {
        const uint64_t id = f.u64();
        const backend::KvCacheSpec spec = f.spec();
        const int64_t blocks = f.i64();
        const auto kind_of_memory = static_cast<backend::MemoryKind>(f.u64());
        VESPER_TRY(f.status());
        follower_kv_.emplace_back(id, backend_.create_kv(spec, blocks, kind_of_memory));
        break;
      }
      case ShardCommand::kReleaseKv: {
        VESPER_ASSIGN_OR_RETURN(const backend::KvHandle kv, storage());
        VESPER_TRY(f.status());
        backend_.release_kv(kv);
        std::erase_if(follower_kv_, [&](const auto& e) { return e.second.id == kv.id; });
        break;
      }
      case ShardCommand::kCopyKvBlocks: {
        VESPER_ASSIGN_OR_RETURN(const backend::KvHandle to, storage());
        VESPER_ASSIGN_OR_RETURN(const backend::KvHandle from, storage());
        f.ints(src32);
        f.ints(dst32);
        VESPER_TRY(f.status());
        backend_.copy_kv_blocks(to, from, src32, dst32);
        break;
      }
      case ShardCommand::kCopyKvSlots: {
        VESPER_ASSIGN_OR_RETURN(const backend::KvHandle kv, storage());
        f.ints(src64);
        f.ints(dst64);
        VESPER_TRY(f.status());
        backend_.copy_kv_slots(kv, src64, dst64);
        break;
      }
      case ShardCommand::kQuantizeKvGroup: {
        VESPER_ASSIGN_OR_RETURN(const backend::KvHandle kv, storage());
        f.ints(src32);
        const int64_t dst = f.i64();
        VESPER_TRY(f.status());
        backend_.quantize_kv_group(kv, src32, static_cast<int32_t>(dst));
        break;
      }
      case ShardCommand::kCalibrateKvScales: {
        VESPER_ASSIGN_OR_RETURN(const backend::KvHandle kv, storage());
        VESPER_TRY(f.status());
        backend_.calibrate_kv_scales(kv);
        break;
      }
      case ShardCommand::kAsk: {
        const uint64_t count = f.u64();
        std::string request;
        f.str(request);
        VESPER_TRY(f.status());
        if (!answer) return make_error("the leader asks a question this rank has no answer for");
        VESPER_ASSIGN_OR_RETURN(
            const std::vector<int64_t> figures,
            answer(*this, {reinterpret_cast<const uint8_t*>(request.data()), request.size()}));
        if (figures.size() != count)
          return make_error("this rank answers " + std::to_string(figures.size()) +
                            " figures, the leader " + std::to_string(count));
        for (const int64_t figure : figures) group_->all_gather_i64(figure);
        break;
      }
      default:
        return make_error("an unknown command " + std::to_string(static_cast<uint64_t>(kind)) +
                          " from the leader");
    }
  }
}

}  // namespace vesper::model
