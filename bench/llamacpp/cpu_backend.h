// Loading llama.cpp's CPU backend from the prebuilt node-llama-cpp libraries, and attaching a
// persistent ggml threadpool: what every driver in bench/llamacpp needs before it can decode.
//
// The libraries are built with GGML_BACKEND_DL: linking libllama alone gives a model with no CPU
// backend, and the CPU backend exists as one libggml-cpu-<variant>.so per instruction set
// (x64, sse42, haswell, skylakex, icelake, zen4, ...), next to libllama.
#pragma once

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "llama.h"

#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace llamacpp_ref {

struct CpuBackend {
  std::string variant;  // e.g. "haswell"; empty on failure
  std::string error;    // why loading failed
};

// Directory that holds libllama / libggml*.so: found from the loaded libllama itself, so a binary
// keeps working wherever its rpath points.
inline std::string lib_dir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&llama_backend_init), &info) || !info.dli_fname) return ".";
  std::string path = info.dli_fname;
  auto pos = path.find_last_of('/');
  return pos == std::string::npos ? std::string(".") : path.substr(0, pos);
}

// Loads the libggml-cpu-*.so variant that ggml_backend_load_best() would pick (the highest
// ggml_backend_score(); 0 means the CPU lacks its instructions, so an AVX-512 variant is never
// picked on a machine without AVX-512), or `forced` when not empty. The choice is returned so
// that results can say which code ran.
inline CpuBackend load_cpu_backend(const std::string& forced, bool verbose) {
  const std::string dir = lib_dir(), prefix = "libggml-cpu-", suffix = ".so";
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string f = e->d_name;
      if (f.size() > prefix.size() + suffix.size() && f.compare(0, prefix.size(), prefix) == 0 &&
          f.compare(f.size() - suffix.size(), suffix.size(), suffix) == 0) {
        names.push_back(f.substr(prefix.size(), f.size() - prefix.size() - suffix.size()));
      }
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  if (names.empty()) return {"", "no libggml-cpu-*.so in " + dir};
  std::string best = forced;
  if (!forced.empty()) {
    if (std::find(names.begin(), names.end(), forced) == names.end()) {
      return {"", "--cpu-variant " + forced + ": no libggml-cpu-" + forced + ".so in " + dir};
    }
  } else {
    int best_score = 0;
    for (const auto& n : names) {
      const std::string path = dir + "/" + prefix + n + suffix;
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) continue;
      auto score_fn = reinterpret_cast<int (*)()>(dlsym(h, "ggml_backend_score"));
      const int s = score_fn ? score_fn() : 0;
      if (verbose) std::fprintf(stderr, "cpu variant %-16s score %d\n", n.c_str(), s);
      if (s > best_score) {
        best_score = s;
        best = n;
      }
      dlclose(h);
    }
    if (best.empty()) return {"", "no libggml-cpu-*.so variant in " + dir + " supports this CPU"};
  }
  const std::string path = dir + "/" + prefix + best + suffix;
  if (!ggml_backend_load(path.c_str())) return {"", "ggml_backend_load(" + path + ") failed"};
  return {best, ""};
}

// A persistent threadpool for n_threads, attached to contexts as llama-bench does (the threads
// spin between graphs instead of being created per decode). ggml_threadpool_new lives in the
// dynamically loaded CPU backend, so it is looked up through the backend registry.
class Threadpool {
 public:
  explicit Threadpool(int n_threads) {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("CPU");
    if (!reg) return;
    auto* new_fn = (decltype(ggml_threadpool_new)*)ggml_backend_reg_get_proc_address(
        reg, "ggml_threadpool_new");
    free_fn_ = (decltype(ggml_threadpool_free)*)ggml_backend_reg_get_proc_address(
        reg, "ggml_threadpool_free");
    if (!new_fn || !free_fn_) return;
    ggml_threadpool_params params = ggml_threadpool_params_default(n_threads);
    pool_ = new_fn(&params);
  }
  ~Threadpool() {
    if (pool_) free_fn_(pool_);
  }
  Threadpool(const Threadpool&) = delete;
  Threadpool& operator=(const Threadpool&) = delete;

  ggml_threadpool* get() const { return pool_; }

 private:
  ggml_threadpool* pool_ = nullptr;
  decltype(ggml_threadpool_free)* free_fn_ = nullptr;
};

}  // namespace llamacpp_ref
