// AdapterRegistry: the adapters a server or batch can use, by name (vLLM's --lora-modules and
// /v1/load_lora_adapter), the ones merged into every request (llama.cpp's --lora /
// --lora-scaled), and the loaded copies the forward pass reads (model::AdapterSource).
//
// Two kinds of holders, so that waiting requests cost no memory:
//  - a request holds its adapter's registration (hold / unhold) from the moment the engine takes
//    it until it is done: the name may be removed meanwhile, the request still finishes with the
//    adapter it asked for;
//  - a sequence the runner computes pins a loaded copy (pin / unpin): pinned copies are never
//    dropped. Only running sequences pin, and the scheduler lets at most --max-loras distinct
//    adapters run, so at most that many copies are pinned however many requests wait.
// Unpinned copies beyond --max-cpu-loras are dropped, least recently used first, and read again
// from their path when next pinned. A copy whose file no longer reads marks the registration
// broken: every later pin of it fails (its requests are aborted) rather than run anything else.
//
// Not thread-safe: the engine loop owns it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"
#include "lora/adapter.h"
#include "lora/adapter_read.h"
#include "model/adapter_source.h"
#include "model/model_config.h"

namespace vesper::lora {

// An adapter given a name (--lora-modules name=path).
struct LoraModuleSpec {
  std::string name;
  std::string path;
  std::string base_model_name;  // vLLM's JSON form; informational
};

// An adapter applied to every request (--lora FILE = scale 1, --lora-scaled FILE SCALE).
struct MergedAdapterSpec {
  std::string path;
  float scale = 1.0f;
};

struct LoraConfig {
  bool enable_lora = false;               // --enable-lora
  std::vector<LoraModuleSpec> modules;    // --lora-modules
  std::vector<MergedAdapterSpec> merged;  // --lora, --lora-scaled
  int64_t max_loras = 1;                  // --max-loras: distinct adapters in one step
  int64_t max_lora_rank = 16;             // --max-lora-rank
  int64_t max_cpu_loras = 0;              // --max-cpu-loras: loaded copies kept (0: max_loras)
  bool runtime_updating = false;          // --enable-lora-runtime-updating
  // --lora-allowed-dirs: where /v1/load_lora_adapter may read (default: the directories of
  // --lora-modules); init() replaces them by their absolute and resolved forms.
  std::vector<std::string> allowed_dirs;

  bool any() const { return enable_lora || !merged.empty(); }
};

class AdapterRegistry final : public model::AdapterSource {
 public:
  AdapterRegistry(const LoraConfig& config, const model::ModelConfig& model,
                  backend::Backend& backend);
  ~AdapterRegistry() override;

  // Loads the merged adapters and checks every named one by loading it (keeping up to
  // --max-cpu-loras of them). Errors name the flag, the adapter and the file.
  Status init();

  // Registers `name` for the adapter at `path`, read and checked now. An error (nothing
  // registered) for a name already registered, a bad file, or a rank over --max-lora-rank.
  Status add(const std::string& name, const std::string& path);
  // Registers `name` for an adapter read already (off the engine thread: read_adapter with
  // config().max_lora_rank and model_config()); only its upload happens here.
  Status add(const std::string& name, const HostAdapter& adapter);
  const model::ModelConfig& model_config() const { return model_; }
  // Forgets `name`; requests holding it finish with it. False for an unknown name.
  bool remove(const std::string& name);
  bool contains(const std::string& name) const { return names_.count(name) > 0; }

  struct Info {
    std::string name;
    std::string path;
    bool loaded = false;
  };
  std::vector<Info> list() const;  // sorted by name

  // A request for adapter `name` starts: the registration's id (never reused; it roots the
  // prefix cache's chain). Nothing is read. Error: an unknown name.
  Result<uint64_t> hold(const std::string& name);
  // One more holder of a held registration (a forked sequence).
  void hold_again(uint64_t id);
  // A holder is done with it.
  void unhold(uint64_t id);
  // Whether pin(id) can answer without reading a file: a copy is loaded, or the registration is
  // broken or gone (pin fails at once). Otherwise the copy is read on a thread of its own (started
  // by the first call), and installed by the call that finds the read done: the scheduler asks
  // before admitting a sequence, so the engine thread never waits on a file. A read that fails
  // or outlasts kReadTimeout breaks the registration.
  bool ready(uint64_t id);
  // A sequence of registration `id` runs: the slot of its loaded copy, read now if it was not
  // (only when ready() was not asked first). Error (and the registration broken) when the file
  // no longer reads.
  Result<int32_t> pin(uint64_t id);
  // That sequence no longer runs.
  void unpin(int32_t slot);
  // The name registration `id` had ("" when unknown).
  const std::string& name_of(uint64_t id) const;
  int64_t num_pinned() const { return num_pinned_; }
  int64_t num_loaded() const;
  int64_t loaded_bytes() const;
  // The pool the memory plan counts: the merged adapters and --max-cpu-loras copies of the
  // largest named adapter read so far.
  int64_t budget_bytes() const;
  int64_t num_loads() const { return num_loads_; }  // files read, reloads included
  const LoraConfig& config() const { return config_; }

  // model::AdapterSource
  std::span<const backend::LowRankModule> modules(int32_t slot, int64_t layer,
                                                  model::Projection p) const override;
  bool any() const override { return num_pinned_ > 0 || !merged_.empty(); }
  uint64_t slot_version(int32_t slot) const override {
    return slot < 0 || slot >= static_cast<int32_t>(slots_.size())
               ? 1
               : slots_[static_cast<size_t>(slot)].version;
  }

 private:
  struct Registration {
    std::string name;
    std::string path;
    int64_t holders = 0;  // requests holding it
    bool listed = true;   // false once its name was removed
    bool broken = false;  // its file stopped reading: pins fail
    int32_t slot = -1;    // loaded in this slot, or -1
  };
  struct Slot {
    std::unique_ptr<Adapter> adapter;  // null: a free slot
    uint64_t id = 0;                   // its registration
    int64_t pins = 0;                  // running sequences reading it
    uint64_t last_use = 0;             // for least-recently-used eviction
    uint64_t version = 0;              // AdapterSource::slot_version: new with each copy
    // [layer * kNumProjections + projection]: the adapter's module, then the merged ones.
    std::vector<std::vector<backend::LowRankModule>> modules;
  };
  Result<std::unique_ptr<Adapter>> load(const std::string& path, float scale) const;
  Status register_copy(const std::string& name, const std::string& path,
                       std::unique_ptr<Adapter> adapter);
  int32_t install(std::unique_ptr<Adapter> adapter, uint64_t id);
  // Forgets a registration nobody lists, holds or pins (and frees its copy).
  void maybe_forget(uint64_t id);
  void free_slot(int32_t slot);
  void evict_beyond_limit();
  int64_t cpu_limit() const;

  LoraConfig config_;
  model::ModelConfig model_;
  backend::Backend& backend_;
  std::map<std::string, uint64_t> names_;  // listed names -> registration ids
  std::map<uint64_t, Registration> registrations_;
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<Adapter>> merged_;
  std::vector<std::vector<backend::LowRankModule>> merged_modules_;  // slot -1
  std::map<uint64_t, AdapterRead> reads_;  // copies being read again, by registration
  uint64_t next_id_ = 1;
  uint64_t clock_ = 0;
  int64_t num_loads_ = 0;
  int64_t num_pinned_ = 0;     // slots with pins > 0
  int64_t largest_bytes_ = 0;  // the largest named adapter read so far
};

}  // namespace vesper::lora
