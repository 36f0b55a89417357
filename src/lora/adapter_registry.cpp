#include "lora/adapter_registry.h"

#include <algorithm>

#include "backend/low_rank.h"
#include "core/logging.h"
#include "lora/adapter_access.h"
#include "lora/adapter_read.h"

namespace vesper::lora {

AdapterRegistry::AdapterRegistry(const LoraConfig& config, const model::ModelConfig& model,
                                 backend::Backend& backend)
    : config_(config), model_(model), backend_(backend) {}

AdapterRegistry::~AdapterRegistry() = default;

int64_t AdapterRegistry::cpu_limit() const {
  return std::max<int64_t>(config_.max_cpu_loras > 0 ? config_.max_cpu_loras : config_.max_loras,
                           1);
}

Result<std::unique_ptr<Adapter>> AdapterRegistry::load(const std::string& path, float scale) const {
  VESPER_ASSIGN_OR_RETURN(HostAdapter host,
                          read_adapter(path, model_, config_.max_lora_rank, scale));
  return Adapter::upload(host, backend_);
}

Status AdapterRegistry::init() {
  if (config_.max_loras < 1)
    return make_error("--max-loras must be at least 1, got " + std::to_string(config_.max_loras));
  if (config_.max_lora_rank < 1 || config_.max_lora_rank > backend::kMaxLowRank)
    return make_error("--max-lora-rank must be in 1.." + std::to_string(backend::kMaxLowRank) +
                      ", got " + std::to_string(config_.max_lora_rank));
  if (config_.max_cpu_loras != 0 && config_.max_cpu_loras < config_.max_loras)
    return make_error("--max-cpu-loras " + std::to_string(config_.max_cpu_loras) +
                      " is less than --max-loras " + std::to_string(config_.max_loras));
  if (!config_.enable_lora && !config_.modules.empty())
    return make_error("--lora-modules needs --enable-lora");
  const size_t layer_modules = static_cast<size_t>(model_.n_layer * model::kNumProjections);
  merged_modules_.assign(layer_modules, {});
  for (const MergedAdapterSpec& m : config_.merged) {
    auto loaded = load(m.path, m.scale);
    if (!loaded) return make_error("--lora: " + loaded.error().message);
    const Adapter& a = **loaded;
    for (size_t i = 0; i < a.modules().size(); ++i)
      if (a.modules()[i].rank > 0) merged_modules_[i].push_back(a.modules()[i]);
    log_info("adapter %s (%s, rank %lld, %.2f MiB) merged into every request at scale %g",
             m.path.c_str(), kind_name(a.kind()), static_cast<long long>(a.max_rank()),
             a.bytes() / 1048576.0, m.scale);
    merged_.push_back(std::move(*loaded));
  }
  for (const LoraModuleSpec& m : config_.modules) {
    Status added = add(m.name, m.path);
    if (!added) return make_error("--lora-modules " + m.name + ": " + added.error().message);
  }
  if (config_.runtime_updating) {
    std::vector<std::string> dirs = config_.allowed_dirs;
    if (dirs.empty()) {
      std::vector<std::string> paths;
      for (const LoraModuleSpec& m : config_.modules) paths.push_back(m.path);
      dirs = module_dirs(paths);
    }
    VESPER_ASSIGN_OR_RETURN(config_.allowed_dirs, canonical_dirs(dirs, "--lora-allowed-dirs"));
    std::string listed;
    for (const auto& d : dirs) listed += (listed.empty() ? "" : ", ") + d;
    if (listed.empty())
      log_warning(
          "/v1/load_lora_adapter can load nothing: no --lora-allowed-dirs and no "
          "--lora-modules");
    else
      log_info("/v1/load_lora_adapter reads adapters under: %s", listed.c_str());
  }
  return {};
}

int32_t AdapterRegistry::install(std::unique_ptr<Adapter> adapter, uint64_t id) {
  int32_t slot = -1;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!slots_[i].adapter) {
      slot = static_cast<int32_t>(i);
      break;
    }
  if (slot < 0) {
    slots_.emplace_back();
    slot = static_cast<int32_t>(slots_.size()) - 1;
  }
  Slot& s = slots_[static_cast<size_t>(slot)];
  largest_bytes_ = std::max(largest_bytes_, adapter->bytes());
  s.adapter = std::move(adapter);
  s.id = id;
  s.pins = 0;
  s.last_use = ++clock_;
  s.version = clock_ + 1;  // distinct from every version before (slot -1's is 1)
  // Per projection: the adapter's module, then the merged ones.
  s.modules.assign(merged_modules_.size(), {});
  for (size_t i = 0; i < s.modules.size(); ++i) {
    if (s.adapter->modules()[i].rank > 0) s.modules[i].push_back(s.adapter->modules()[i]);
    s.modules[i].insert(s.modules[i].end(), merged_modules_[i].begin(), merged_modules_[i].end());
  }
  registrations_.at(id).slot = slot;
  ++num_loads_;
  return slot;
}

void AdapterRegistry::free_slot(int32_t slot) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  auto it = registrations_.find(s.id);
  if (it != registrations_.end() && it->second.slot == slot) it->second.slot = -1;
  s = Slot{};
}

void AdapterRegistry::evict_beyond_limit() {
  while (num_loaded() > cpu_limit()) {
    int32_t victim = -1;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (s.adapter && s.pins == 0 &&
          (victim < 0 || s.last_use < slots_[static_cast<size_t>(victim)].last_use))
        victim = static_cast<int32_t>(i);
    }
    if (victim < 0) return;  // every loaded adapter is pinned (at most --max-loras of them)
    free_slot(victim);
  }
}

void AdapterRegistry::maybe_forget(uint64_t id) {
  auto it = registrations_.find(id);
  if (it == registrations_.end()) return;
  const Registration& r = it->second;
  if (r.listed || r.holders > 0) return;
  reads_.erase(id);  // a read still out finishes unseen
  if (r.slot >= 0) {
    if (slots_[static_cast<size_t>(r.slot)].pins > 0) return;
    free_slot(r.slot);
  }
  registrations_.erase(it);
}

Status AdapterRegistry::add(const std::string& name, const std::string& path) {
  VESPER_TRY(check_adapter_name(name));
  if (names_.count(name)) return make_error("an adapter named '" + name + "' is already loaded");
  VESPER_ASSIGN_OR_RETURN(std::unique_ptr<Adapter> adapter, load(path, 1.0f));
  return register_copy(name, path, std::move(adapter));
}

Status AdapterRegistry::add(const std::string& name, const HostAdapter& adapter) {
  VESPER_TRY(check_adapter_name(name));
  if (names_.count(name)) return make_error("an adapter named '" + name + "' is already loaded");
  return register_copy(name, adapter.path, Adapter::upload(adapter, backend_));
}

Status AdapterRegistry::register_copy(const std::string& name, const std::string& path,
                                      std::unique_ptr<Adapter> adapter) {
  log_info("adapter '%s': %s (%s, rank %lld, %.2f MiB)", name.c_str(), path.c_str(),
           kind_name(adapter->kind()), static_cast<long long>(adapter->max_rank()),
           adapter->bytes() / 1048576.0);
  const uint64_t id = next_id_++;
  registrations_[id] = Registration{name, path, 0, true, false, -1};
  names_[name] = id;
  install(std::move(adapter), id);
  evict_beyond_limit();
  return {};
}

bool AdapterRegistry::remove(const std::string& name) {
  auto it = names_.find(name);
  if (it == names_.end()) return false;
  const uint64_t id = it->second;
  names_.erase(it);
  registrations_.at(id).listed = false;
  maybe_forget(id);  // else when its last holder and pin are gone
  return true;
}

std::vector<AdapterRegistry::Info> AdapterRegistry::list() const {
  std::vector<Info> out;
  for (const auto& [name, id] : names_) {
    const Registration& r = registrations_.at(id);
    out.push_back(Info{name, r.path, r.slot >= 0});
  }
  return out;
}

Result<uint64_t> AdapterRegistry::hold(const std::string& name) {
  auto it = names_.find(name);
  if (it == names_.end()) return make_error("no adapter named '" + name + "'");
  ++registrations_.at(it->second).holders;
  return it->second;
}

void AdapterRegistry::hold_again(uint64_t id) {
  auto it = registrations_.find(id);
  if (it != registrations_.end()) ++it->second.holders;
}

void AdapterRegistry::unhold(uint64_t id) {
  auto it = registrations_.find(id);
  if (it == registrations_.end() || it->second.holders <= 0) return;
  --it->second.holders;
  maybe_forget(id);
}

bool AdapterRegistry::ready(uint64_t id) {
  auto it = registrations_.find(id);
  if (it == registrations_.end()) return true;
  Registration& r = it->second;
  if (r.broken || r.slot >= 0) return true;
  auto found = reads_.find(id);
  if (found == reads_.end()) {
    reads_.emplace(id, AdapterRead(r.path, model_, config_.max_lora_rank));
    return false;
  }
  AdapterRead& read = found->second;
  if (!read.done()) {
    if (read.elapsed() < kAdapterReadTimeoutSeconds) return false;
    reads_.erase(found);
    r.broken = true;
    log_error("adapter '%s' (%s): reading it again took over %.0f s; its requests are aborted",
              r.name.c_str(), r.path.c_str(), kAdapterReadTimeoutSeconds);
    return true;
  }
  Result<HostAdapter> result = read.take();
  reads_.erase(found);
  if (!result) {
    r.broken = true;  // pin reports it
    log_error("adapter '%s': %s", r.name.c_str(), result.error().message.c_str());
    return true;
  }
  // Installed unpinned; the pin that follows keeps it (eviction waits until then).
  install(Adapter::upload(*result, backend_), id);
  return true;
}

Result<int32_t> AdapterRegistry::pin(uint64_t id) {
  auto it = registrations_.find(id);
  if (it == registrations_.end())
    return make_error("adapter id " + std::to_string(id) + " is gone");
  Registration& r = it->second;
  if (r.broken)
    return make_error("adapter '" + r.name + "' (" + r.path + ") failed to load earlier");
  if (r.slot < 0) {
    auto loaded = load(r.path, 1.0f);
    if (!loaded) {
      r.broken = true;
      return make_error("adapter '" + r.name + "': " + loaded.error().message);
    }
    install(std::move(*loaded), id);
  }
  Slot& s = slots_[static_cast<size_t>(r.slot)];
  if (s.pins++ == 0) ++num_pinned_;
  s.last_use = ++clock_;
  const int32_t slot = r.slot;
  evict_beyond_limit();
  return slot;
}

void AdapterRegistry::unpin(int32_t slot) {
  if (slot < 0 || slot >= static_cast<int32_t>(slots_.size())) return;
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (!s.adapter || s.pins <= 0) return;
  if (--s.pins > 0) return;
  --num_pinned_;
  const uint64_t id = s.id;
  maybe_forget(id);
  evict_beyond_limit();
}

const std::string& AdapterRegistry::name_of(uint64_t id) const {
  static const std::string kNone;
  auto it = registrations_.find(id);
  return it == registrations_.end() ? kNone : it->second.name;
}

int64_t AdapterRegistry::num_loaded() const {
  return std::count_if(slots_.begin(), slots_.end(),
                       [](const Slot& s) { return s.adapter != nullptr; });
}

int64_t AdapterRegistry::loaded_bytes() const {
  int64_t bytes = 0;
  for (const Slot& s : slots_)
    if (s.adapter) bytes += s.adapter->bytes();
  for (const auto& m : merged_) bytes += m->bytes();
  return bytes;
}

int64_t AdapterRegistry::budget_bytes() const {
  int64_t bytes = cpu_limit() * largest_bytes_;
  for (const auto& m : merged_) bytes += m->bytes();
  return bytes;
}

std::span<const backend::LowRankModule> AdapterRegistry::modules(int32_t slot, int64_t layer,
                                                                 model::Projection p) const {
  const size_t i = static_cast<size_t>(layer * model::kNumProjections + static_cast<int32_t>(p));
  if (slot < 0 || slot >= static_cast<int32_t>(slots_.size()) ||
      !slots_[static_cast<size_t>(slot)].adapter)
    return i < merged_modules_.size() ? std::span<const backend::LowRankModule>(merged_modules_[i])
                                      : std::span<const backend::LowRankModule>();
  return slots_[static_cast<size_t>(slot)].modules[i];
}

}  // namespace vesper::lora
