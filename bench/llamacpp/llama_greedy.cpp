// llama_greedy: run real llama.cpp (the prebuilt CPU libraries shipped in the npm package
// @node-llama-cpp/linux-x64) on a GGUF file with plain greedy decoding, and print the token ids.
//
// It is Vesper's reference: the ids it prints are the expected ids in Vesper's tests, and the same
// program is meant to be reused as the llama.cpp side of side-by-side benchmarks.
//
// Build: bench/llamacpp/setup.sh (g++ against the headers from the llama.cpp source bundle, linked
// with rpath to node_modules/@node-llama-cpp/linux-x64/bins/linux-x64).
//
// Usage: see usage() below.

#include "cpu_backend.h"
#include "llama.h"
#include "ggml.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

void usage(const char * argv0) {
    std::fprintf(stderr,
        "usage: %s MODEL.gguf --prompt TEXT [--n-predict N] [options]\n"
        "\n"
        "Greedy decoding with llama.cpp: the prompt is evaluated in one llama_decode call, then each\n"
        "next token is the argmax of the logits (first maximum wins on ties; no sampler, no randomness).\n"
        "\n"
        "options:\n"
        "  --prompt TEXT         prompt text (required)\n"
        "  --n-predict N         number of tokens to generate (default 32)\n"
        "  --threads T           CPU threads (default 1); T > 1 uses a persistent ggml threadpool\n"
        "                        attached with llama_attach_threadpool, as llama-bench does\n"
        "  --no-threadpool       with T > 1, let ggml make its own threadpool instead\n"
        "  --json                print one JSON object instead of plain text\n"
        "  --tokenize-only       only tokenize the prompt and print its ids (loads the vocab only)\n"
        "  --no-bos              tokenize with add_special=false (no BOS/EOS added)\n"
        "  --parse-special       tokenize with parse_special=true (default false)\n"
        "  --stop-at-eos         stop after an end-of-generation token (it is kept in the ids)\n"
        "  --n-ctx N             context size (default: prompt tokens + n-predict, min 16)\n"
        "  --flash-attn on|off|auto   (default auto = llama.cpp's default)\n"
        "  --kv-type f16|f32     K and V cache type (default f16 = llama.cpp's default)\n"
        "  --cpu-variant NAME    force libggml-cpu-NAME.so (e.g. haswell, x64, sse42) instead of the\n"
        "                        best-scoring variant for this CPU\n"
        "  --top K               with --json, also list the K largest logits of each step as\n"
        "                        [id, logit] pairs (\"top\"), for tolerance-based comparisons\n"
        "  --timings             add wall-clock timings (prompt eval, generation) to the output\n"
        "  --verbose             show llama.cpp's own log\n",
        argv0);
}

bool g_verbose = false;
std::vector<std::string> g_fa_log;  // llama.cpp log lines that say how flash attention was resolved

void log_cb(enum ggml_log_level level, const char * text, void * /*user*/) {
    if (text && std::strstr(text, "Flash Attention")) {
        std::string s(text);
        while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
        g_fa_log.push_back(s);
    }
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        std::fputs(text, stderr);
    }
}

[[noreturn]] void die(const char * fmt, ...) {
    std::fputs("llama_greedy: error: ", stderr);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fputc('\n', stderr);
    std::exit(1);
}

// JSON string escaping. Bytes that are not valid UTF-8 (a lone byte token may be half a
// character) become U+FFFD so that the output stays valid JSON; ids are the ground truth.
std::string json_str(const std::string & s) {
    std::string o = "\"";
    const auto * p = reinterpret_cast<const unsigned char *>(s.data());
    size_t n = s.size();
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c < 0x80) {
            switch (c) {
                case '"': o += "\\\""; break;
                case '\\': o += "\\\\"; break;
                case '\n': o += "\\n"; break;
                case '\r': o += "\\r"; break;
                case '\t': o += "\\t"; break;
                default:
                    if (c < 0x20) {
                        char buf[8];
                        std::snprintf(buf, sizeof buf, "\\u%04x", c);
                        o += buf;
                    } else {
                        o += static_cast<char>(c);
                    }
            }
            ++i;
            continue;
        }
        int len = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
        bool ok = len > 0 && i + len <= n;
        for (int k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xc0) == 0x80;
        if (ok) {
            o.append(s, i, len);
            i += len;
        } else {
            o += "\\ufffd";
            ++i;
        }
    }
    return o + "\"";
}

std::string json_ids(const std::vector<llama_token> & v) {
    std::string o = "[";
    for (size_t i = 0; i < v.size(); ++i) {
        if (i) o += ", ";
        o += std::to_string(v[i]);
    }
    return o + "]";
}

// Build number / commit baked into the prebuilt libllama-common.so (llama.cpp's common/build-info).
void build_info(int & number, std::string & commit) {
    number = -1;
    commit = "unknown";
    std::string path = llamacpp_ref::lib_dir() + "/libllama-common.so";
    void * h = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (!h) return;
    if (auto * n = static_cast<int *>(dlsym(h, "LLAMA_BUILD_NUMBER"))) number = *n;
    if (auto * c = static_cast<const char **>(dlsym(h, "LLAMA_COMMIT"))) commit = *c ? *c : "unknown";
    // keep it loaded: the strings live in it
}

std::string piece(const llama_vocab * vocab, llama_token id, bool special) {
    std::vector<char> buf(64);
    int n = llama_token_to_piece(vocab, id, buf.data(), (int32_t)buf.size(), 0, special);
    if (n < 0) {
        buf.resize(-n);
        n = llama_token_to_piece(vocab, id, buf.data(), (int32_t)buf.size(), 0, special);
    }
    if (n < 0) die("llama_token_to_piece failed for token %d", id);
    return std::string(buf.data(), n);
}

std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool add_special,
                                  bool parse_special) {
    int n = -llama_tokenize(vocab, text.data(), (int32_t)text.size(), nullptr, 0, add_special, parse_special);
    if (n < 0) n = 0;  // a positive return with a null buffer means 0 tokens
    std::vector<llama_token> toks(n);
    if (n > 0 &&
        llama_tokenize(vocab, text.data(), (int32_t)text.size(), toks.data(), n, add_special, parse_special) != n) {
        die("failed to tokenize the prompt");
    }
    return toks;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char ** argv) {
    std::string model_path, prompt, cpu_variant;
    bool have_prompt = false, json = false, tokenize_only = false, add_special = true, parse_special = false;
    bool stop_at_eos = false, use_threadpool = true, timings = false;
    int n_predict = 32, n_threads = 1, n_ctx_arg = 0, top_k = 0;
    std::string fa = "auto", kv = "f16";

    auto need = [&](int & i) -> const char * {
        if (i + 1 >= argc) {
            std::fprintf(stderr, "llama_greedy: error: %s needs a value\n", argv[i]);
            usage(argv[0]);
            std::exit(2);
        }
        return argv[++i];
    };
    auto to_int = [&](const char * opt, const char * s) {
        char * end = nullptr;
        long v = std::strtol(s, &end, 10);
        if (!*s || *end || v < 0 || v > 1000000) die("%s: bad number '%s'", opt, s);
        return (int)v;
    };
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--prompt" || a == "-p") { prompt = need(i); have_prompt = true; }
        else if (a == "--n-predict" || a == "-n") n_predict = to_int("--n-predict", need(i));
        else if (a == "--threads" || a == "-t") n_threads = to_int("--threads", need(i));
        else if (a == "--n-ctx" || a == "-c") n_ctx_arg = to_int("--n-ctx", need(i));
        else if (a == "--json") json = true;
        else if (a == "--tokenize-only") tokenize_only = true;
        else if (a == "--no-bos") add_special = false;
        else if (a == "--parse-special") parse_special = true;
        else if (a == "--stop-at-eos") stop_at_eos = true;
        else if (a == "--no-threadpool") use_threadpool = false;
        else if (a == "--timings") timings = true;
        else if (a == "--top") top_k = to_int("--top", need(i));
        else if (a == "--flash-attn" || a == "-fa") fa = need(i);
        else if (a == "--kv-type") kv = need(i);
        else if (a == "--cpu-variant") cpu_variant = need(i);
        else if (a == "--verbose" || a == "-v") g_verbose = true;
        else if (a == "--help" || a == "-h") { usage(argv[0]); return 0; }
        else if (!a.empty() && a[0] == '-') { std::fprintf(stderr, "llama_greedy: error: unknown option %s\n", a.c_str()); usage(argv[0]); return 2; }
        else if (model_path.empty()) model_path = a;
        else { std::fprintf(stderr, "llama_greedy: error: unexpected argument %s\n", a.c_str()); usage(argv[0]); return 2; }
    }
    if (model_path.empty() || !have_prompt) {
        usage(argv[0]);
        return 2;
    }
    if (n_threads < 1) die("--threads must be >= 1");
    enum llama_flash_attn_type fa_type;
    if (fa == "auto") fa_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
    else if (fa == "on") fa_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    else if (fa == "off") fa_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    else die("--flash-attn must be on, off or auto");
    enum ggml_type kv_type;
    if (kv == "f16") kv_type = GGML_TYPE_F16;
    else if (kv == "f32") kv_type = GGML_TYPE_F32;
    else die("--kv-type must be f16 or f32");
    if (FILE * f = std::fopen(model_path.c_str(), "rb")) std::fclose(f);
    else die("cannot open model file %s", model_path.c_str());

    llama_log_set(log_cb, nullptr);
    const llamacpp_ref::CpuBackend cpu = llamacpp_ref::load_cpu_backend(cpu_variant, g_verbose);
    if (cpu.variant.empty()) die("%s", cpu.error.c_str());
    const std::string variant = cpu.variant;
    llama_backend_init();

    int build_number;
    std::string build_commit;
    build_info(build_number, build_commit);

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    mparams.vocab_only = tokenize_only;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mparams);
    if (!model) die("failed to load model %s (run with --verbose for llama.cpp's log)", model_path.c_str());
    const llama_vocab * vocab = llama_model_get_vocab(model);

    const std::vector<llama_token> prompt_ids = tokenize(vocab, prompt, add_special, parse_special);

    if (tokenize_only) {
        if (json) {
            std::printf("{\"prompt\": %s, \"prompt_ids\": %s}\n", json_str(prompt).c_str(), json_ids(prompt_ids).c_str());
        } else {
            for (size_t i = 0; i < prompt_ids.size(); ++i) std::printf("%s%d", i ? " " : "", prompt_ids[i]);
            std::printf("\n");
        }
        llama_model_free(model);
        llama_backend_free();
        return 0;
    }
    if (prompt_ids.empty()) die("the prompt tokenizes to no tokens (nothing to decode)");

    const int n_prompt = (int)prompt_ids.size();
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = n_ctx_arg > 0 ? (uint32_t)n_ctx_arg : (uint32_t)std::max(16, n_prompt + n_predict);
    cparams.n_batch = std::max<uint32_t>(cparams.n_batch, (uint32_t)n_prompt);  // whole prompt in one decode
    cparams.n_ubatch = cparams.n_batch;                                         // ... and one ubatch
    cparams.n_threads = n_threads;
    cparams.n_threads_batch = n_threads;
    cparams.flash_attn_type = fa_type;
    cparams.type_k = kv_type;
    cparams.type_v = kv_type;
    cparams.no_perf = true;
    if ((uint32_t)(n_prompt + n_predict) > cparams.n_ctx) {
        die("prompt (%d tokens) + n-predict (%d) exceeds n-ctx %u", n_prompt, n_predict, cparams.n_ctx);
    }
    const int n_ctx_train = llama_model_n_ctx_train(model);
    if (n_ctx_train > 0 && n_prompt + n_predict > n_ctx_train) {
        std::fprintf(stderr, "llama_greedy: warning: prompt + n-predict = %d exceeds the model's training context %d\n",
                     n_prompt + n_predict, n_ctx_train);
    }

    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) die("failed to create the llama context (run with --verbose for llama.cpp's log)");

    // Persistent threadpool, as llama-bench does (cpu_backend.h).
    std::unique_ptr<llamacpp_ref::Threadpool> pool;
    ggml_threadpool * threadpool = nullptr;
    if (n_threads > 1 && use_threadpool) {
        pool = std::make_unique<llamacpp_ref::Threadpool>(n_threads);
        threadpool = pool->get();
        if (!threadpool) die("ggml_threadpool_new failed for %d threads", n_threads);
        llama_attach_threadpool(ctx, threadpool, nullptr);
    }

    const int n_vocab = llama_vocab_n_tokens(vocab);
    std::vector<llama_token> ids;
    std::vector<float> margins;  // top-1 minus top-2 logit at each step: small = fragile step
    std::vector<std::vector<std::pair<llama_token, float>>> tops;  // --top K
    std::string text;

    auto argmax = [&](int32_t i, float & margin) {
        const float * logits = llama_get_logits_ith(ctx, i);
        if (!logits) die("llama_get_logits_ith returned null");
        int best = 0;
        for (int k = 1; k < n_vocab; ++k) {
            if (logits[k] > logits[best]) best = k;  // strict: first maximum wins
        }
        float second = -INFINITY;
        for (int k = 0; k < n_vocab; ++k) {
            if (k != best && logits[k] > second) second = logits[k];
        }
        margin = logits[best] - second;
        if (top_k > 0) {
            std::vector<std::pair<llama_token, float>> v;
            v.reserve(n_vocab);
            for (int k = 0; k < n_vocab; ++k) v.emplace_back((llama_token)k, logits[k]);
            const size_t kk = std::min<size_t>((size_t)top_k, v.size());
            std::partial_sort(v.begin(), v.begin() + kk, v.end(), [](const auto & a, const auto & b) {
                return a.second > b.second || (a.second == b.second && a.first < b.first);
            });
            v.resize(kk);
            tops.push_back(std::move(v));
        }
        return (llama_token)best;
    };

    std::vector<llama_token> prompt_copy = prompt_ids;  // llama_batch_get_one takes a non-const pointer
    auto t0 = std::chrono::steady_clock::now();
    if (llama_decode(ctx, llama_batch_get_one(prompt_copy.data(), n_prompt)) != 0) die("llama_decode failed on the prompt");
    double t_prompt_ms = ms_since(t0);

    auto t1 = std::chrono::steady_clock::now();
    for (int step = 0; step < n_predict; ++step) {
        float margin;
        llama_token tok = argmax(-1, margin);
        ids.push_back(tok);
        margins.push_back(margin);
        text += piece(vocab, tok, false);
        if (stop_at_eos && llama_vocab_is_eog(vocab, tok)) break;
        if (step + 1 == n_predict) break;  // the last token needs no forward pass
        if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) die("llama_decode failed at step %d", step);
    }
    double t_gen_ms = ms_since(t1);

    if (json) {
        std::string fa_resolved;
        for (auto & l : g_fa_log) fa_resolved += (fa_resolved.empty() ? "" : "; ") + l;
        std::string m = "[";
        for (size_t i = 0; i < margins.size(); ++i) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%s%.4g", i ? ", " : "", margins[i]);
            m += buf;
        }
        m += "]";
        std::printf("{\"prompt\": %s, \"prompt_ids\": %s, \"ids\": %s, \"text\": %s", json_str(prompt).c_str(),
                    json_ids(prompt_ids).c_str(), json_ids(ids).c_str(), json_str(text).c_str());
        std::printf(", \"n_predict\": %d, \"top2_margins\": %s", n_predict, m.c_str());
        if (top_k > 0) {
            std::string t = "[";
            for (size_t i = 0; i < tops.size(); ++i) {
                t += i ? ", [" : "[";
                for (size_t j = 0; j < tops[i].size(); ++j) {
                    char buf[64];
                    std::snprintf(buf, sizeof buf, "%s[%d, %.9g]", j ? ", " : "", tops[i][j].first, tops[i][j].second);
                    t += buf;
                }
                t += "]";
            }
            t += "]";
            std::printf(", \"top\": %s", t.c_str());
        }
        std::printf(", \"settings\": {\"n_threads\": %d, \"threadpool\": %s, \"cpu_variant\": %s, \"n_ctx\": %u, "
                    "\"flash_attn\": %s, \"flash_attn_log\": %s, \"kv_type\": %s, \"add_special\": %s, "
                    "\"parse_special\": %s, \"stop_at_eos\": %s, \"prompt_eval\": \"one llama_decode call\"}",
                    n_threads, threadpool ? "true" : "false", json_str(variant).c_str(), llama_n_ctx(ctx),
                    json_str(fa).c_str(), json_str(fa_resolved).c_str(), json_str(kv).c_str(),
                    add_special ? "true" : "false", parse_special ? "true" : "false", stop_at_eos ? "true" : "false");
        std::printf(", \"llama_build\": {\"number\": %d, \"commit\": %s}", build_number, json_str(build_commit).c_str());
        if (timings) {
            std::printf(", \"timings\": {\"prompt_ms\": %.3f, \"gen_ms\": %.3f, \"n_gen_decodes\": %d}", t_prompt_ms,
                        t_gen_ms, std::max(0, (int)ids.size() - 1));
        }
        std::printf("}\n");
    } else {
        std::printf("prompt_ids:");
        for (auto t : prompt_ids) std::printf(" %d", t);
        std::printf("\nids:");
        for (auto t : ids) std::printf(" %d", t);
        std::printf("\ntext: %s\n", text.c_str());
        std::printf("cpu_variant: %s  threads: %d  threadpool: %s\n", variant.c_str(), n_threads, threadpool ? "yes" : "no");
        if (timings) {
            std::printf("prompt_ms: %.3f  gen_ms: %.3f  (%d decode calls)\n", t_prompt_ms, t_gen_ms,
                        std::max(0, (int)ids.size() - 1));
        }
    }

    llama_free(ctx);
    pool.reset();  // after the context that used it
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
