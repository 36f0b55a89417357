// Model's tensor-parallel half (model.h): the leader's KV storage operations and their broadcast,
// the commands' encoding (shard_commands.h), and the follower's loop.
#include <algorithm>
#include <optional>
#include <string>

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
  // Posted, not waited for: with pipeline passes in flight a follower may still be computing
  // the pass before, and the leader goes on with its own stage meanwhile.
  for (int r = 1; r < group_->size(); ++r)
    group_->post_message(r + 1 < group_->size() ? command : std::move(command), r);
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

void Model::share_adapter_slots(const ForwardBatch& batch) {
  std::vector<int32_t> slots(batch.seq_adapter.begin(), batch.seq_adapter.end());
  if (static_cast<int64_t>(slots.size()) < batch.num_seqs()) slots.push_back(-1);
  std::sort(slots.begin(), slots.end());
  slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
  std::vector<uint8_t> bytes;
  for (const int32_t slot : slots) {
    const uint64_t version = adapters_->slot_version(slot);
    const auto sent = shared_slot_versions_.find(slot);
    if (sent != shared_slot_versions_.end() && sent->second == version) continue;
    ByteWriter w = command(ShardCommand::kAdapterSlot);
    w.i64(slot);
    w.u64(version);
    // Every layer's modules (a pipeline stage keeps its own), each tensor's elements as they lie.
    auto put_tensor = [&](const backend::Tensor& t) {
      w.boolean(t.buffer.valid());
      if (!t.buffer.valid()) return;
      w.u64(static_cast<uint64_t>(t.dtype));
      w.i64(t.rows);
      w.i64(t.cols);
      bytes.resize(static_cast<size_t>(t.numel() * backend::dtype_bytes(t.dtype)));
      backend_.copy_to_host(bytes.data(), t);
      w.str(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    };
    for (int64_t layer = 0; layer < config_.n_layer; ++layer)
      for (int32_t p = 0; p < kNumProjections; ++p) {
        const auto modules = adapters_->modules(slot, layer, static_cast<Projection>(p));
        w.u64(modules.size());
        for (const backend::LowRankModule& m : modules) {
          for (const int64_t v :
               {m.a_stride, m.b_stride, m.rank, m.n_in, m.n_out, m.permute_head_dim})
            w.i64(v);
          w.f32(m.scale);
          for (const backend::Tensor* t : {&m.a, &m.b, &m.lambda_d, &m.lambda_b}) put_tensor(*t);
        }
      }
    backend_.synchronize();
    broadcast(w.take());
    shared_slot_versions_[slot] = version;
  }
}

Status Model::receive_adapter_slot(std::span<const uint8_t> message) {
  ByteReader r(message);
  VESPER_ASSIGN_OR_RETURN(const uint64_t kind, r.u64());
  (void)kind;
  VESPER_ASSIGN_OR_RETURN(const int64_t slot, r.i64());
  VESPER_ASSIGN_OR_RETURN(const uint64_t version, r.u64());
  std::vector<std::vector<backend::LowRankModule>> modules(
      static_cast<size_t>(config_.n_layer * kNumProjections));
  std::vector<backend::Buffer> buffers;
  std::string data;
  for (int64_t layer = 0; layer < config_.n_layer; ++layer)
    for (int32_t p = 0; p < kNumProjections; ++p) {
      VESPER_ASSIGN_OR_RETURN(const size_t count, r.count());
      // A pipeline stage keeps its own layers' modules (the others are read and dropped).
      const bool keep = layer >= first_layer_ && layer < first_layer_ + shard_.n_layer;
      for (size_t i = 0; i < count; ++i) {
        backend::LowRankModule m;
        for (int64_t* v :
             {&m.a_stride, &m.b_stride, &m.rank, &m.n_in, &m.n_out, &m.permute_head_dim}) {
          VESPER_ASSIGN_OR_RETURN(*v, r.i64());
        }
        VESPER_ASSIGN_OR_RETURN(m.scale, r.f32());
        for (backend::Tensor* t : {&m.a, &m.b, &m.lambda_d, &m.lambda_b}) {
          VESPER_ASSIGN_OR_RETURN(const bool present, r.boolean());
          if (!present) continue;
          VESPER_ASSIGN_OR_RETURN(const uint64_t dtype, r.u64());
          VESPER_ASSIGN_OR_RETURN(const int64_t rows, r.i64());
          VESPER_ASSIGN_OR_RETURN(const int64_t cols, r.i64());
          VESPER_TRY(r.str(data));
          if (dtype > static_cast<uint64_t>(backend::DType::kF16) || rows < 0 || cols < 0 ||
              static_cast<int64_t>(data.size()) !=
                  rows * cols * backend::dtype_bytes(static_cast<backend::DType>(dtype)))
            return make_error("an adapter tensor whose bytes do not match its shape");
          if (!keep) continue;
          *t = backend_.allocate(static_cast<backend::DType>(dtype), rows, cols,
                                 backend::MemoryKind::kDevice);
          backend_.copy_to_device(*t, data.data());
          buffers.push_back(t->buffer);
        }
        if (keep) modules[static_cast<size_t>(layer * kNumProjections + p)].push_back(m);
      }
    }
  if (!r.done()) return make_error("an adapter slot message with bytes left over");
  if (!follower_adapters_) {
    follower_adapters_ = std::make_unique<FollowerAdapters>(backend_);
    adapters_ = follower_adapters_.get();
  }
  follower_adapters_->replace(static_cast<int32_t>(slot), version, std::move(modules),
                              std::move(buffers));
  return {};
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
    // An idle leader (a server between requests) may send nothing for days.
    group_->receive_message(bytes, 0, /*unbounded=*/true);
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
      case ShardCommand::kAdapterSlot:
        VESPER_TRY(receive_adapter_slot(bytes));
        break;
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
