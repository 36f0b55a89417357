#!/usr/bin/env bash
# Set up the llama.cpp reference for Vesper (idempotent; safe to run again).
#
#   1. npm-installs node-llama-cpp@3.21.1 + @node-llama-cpp/linux-x64@3.21.1 into ./node_modules
#      with --ignore-scripts (nothing is downloaded or compiled besides the npm tarballs) and
#      --omit=optional (skips the CUDA/Vulkan/other-platform packages, several hundred MB).
#   2. extracts llama.h / ggml*.h from llama.cpp's source bundle shipped in node-llama-cpp
#      (node_modules/node-llama-cpp/llama/gitRelease.bundle) into ./build/include.
#   3. compiles llama_greedy.cpp, llama_bench_driver.cpp and llama_kl.cpp with the system g++ into ./build/, linked
#      against the prebuilt CPU libraries in node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 (rpath).
#
# Needs: x86-64 Linux with glibc >= 2.34 and libstdc++ >= GCC 12's, node >= 20 + npm, g++ (C++17), git, tar.
# Environment: CXX (default g++), FORCE_NPM=1 to reinstall the packages.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"

NLC_VERSION=3.21.1
LIBDIR_REL="node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
BUNDLE="node_modules/node-llama-cpp/llama/gitRelease.bundle"
BUILD="$HERE/build"
CXX="${CXX:-g++}"

say() { printf '[llamacpp setup] %s\n' "$*"; }
fail() { printf '[llamacpp setup] ERROR: %s\n' "$*" >&2; exit 1; }

# ---- prerequisites --------------------------------------------------------------------------
[ "$(uname -s)" = Linux ] || fail "Linux only (the prebuilt libraries are @node-llama-cpp/linux-x64)"
[ "$(uname -m)" = x86_64 ] || fail "x86-64 only: this machine is $(uname -m)"
for tool in node npm git tar "$CXX"; do
    command -v "$tool" >/dev/null 2>&1 || fail "'$tool' not found in PATH (Debian: apt-get install nodejs npm git g++)"
done
node_major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$node_major" -ge 20 ] || fail "node >= 20 is required (node-llama-cpp's engines field); found $(node --version)"
glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
if [ -n "$glibc" ]; then
    # The prebuilt libraries (built on Ubuntu 22.04) use symbols up to GLIBC_2.34 and
    # GLIBCXX_3.4.30 (libstdc++ of GCC >= 12; Debian 12 has it).
    [ "$(printf '%s\n2.34\n' "$glibc" | sort -V | head -1)" = 2.34 ] ||
        fail "glibc >= 2.34 is required by the prebuilt libraries; found $glibc"
fi

# ---- 1. npm packages --------------------------------------------------------------------------
installed_version() {  # $1 = package name; prints its installed version or nothing
    local pj="node_modules/$1/package.json"
    [ -f "$pj" ] && node -p "require('./$pj').version" 2>/dev/null || true
}
if [ "${FORCE_NPM:-0}" != 1 ] &&
   [ "$(installed_version node-llama-cpp)" = "$NLC_VERSION" ] &&
   [ "$(installed_version @node-llama-cpp/linux-x64)" = "$NLC_VERSION" ] &&
   [ -f "$BUNDLE" ] && [ -d "$LIBDIR_REL" ]; then
    say "npm packages already installed (node-llama-cpp@$NLC_VERSION, @node-llama-cpp/linux-x64@$NLC_VERSION)"
else
    npm_flags=(--ignore-scripts --omit=optional --no-audit --no-fund)
    if [ -f package-lock.json ]; then
        say "npm ci ${npm_flags[*]}"
        npm ci "${npm_flags[@]}" || fail "npm ci failed (is the npm registry reachable? see npm's log above)"
    else
        say "npm install ${npm_flags[*]}"
        npm install "${npm_flags[@]}" || fail "npm install failed (is the npm registry reachable? see npm's log above)"
    fi
    [ "$(installed_version node-llama-cpp)" = "$NLC_VERSION" ] ||
        fail "node-llama-cpp@$NLC_VERSION is not in node_modules after npm install"
    [ "$(installed_version @node-llama-cpp/linux-x64)" = "$NLC_VERSION" ] ||
        fail "@node-llama-cpp/linux-x64@$NLC_VERSION is not in node_modules after npm install"
fi
[ -f "$BUNDLE" ] || fail "$BUNDLE is missing (node-llama-cpp@$NLC_VERSION should ship it)"
[ -d "$LIBDIR_REL" ] || fail "$LIBDIR_REL is missing (@node-llama-cpp/linux-x64 should ship it)"

LIBDIR="$HERE/$LIBDIR_REL"
shopt -s nullglob
libllama=("$LIBDIR"/libllama.so* "$LIBDIR"/libllama.v*.so)    # libllama.so or libllama.v0.4.0.so
libggml=("$LIBDIR"/libggml.so* "$LIBDIR"/libggml.v*.so)
cpu_variants=("$LIBDIR"/libggml-cpu-*.so)
shopt -u nullglob
[ "${#libllama[@]}" -eq 1 ] || fail "expected exactly one libllama[.vX].so in $LIBDIR, found: ${libllama[*]:-none}"
[ "${#libggml[@]}" -eq 1 ] || fail "expected exactly one libggml[.vX].so in $LIBDIR, found: ${libggml[*]:-none}"
[ -f "$LIBDIR/libggml-base.so" ] || fail "libggml-base.so missing in $LIBDIR"
[ "${#cpu_variants[@]}" -ge 1 ] || fail "no libggml-cpu-*.so CPU backend in $LIBDIR"

# ---- 2. headers from the source bundle --------------------------------------------------------
mkdir -p "$BUILD"
bundle_commit="$(git bundle list-heads "$BUNDLE" | awk '$2 == "HEAD" {print $1; exit}')"
[ -n "$bundle_commit" ] || fail "cannot read the HEAD commit of $BUNDLE"
stamp="$BUILD/include/.bundle-commit"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$bundle_commit" ] && [ -f "$BUILD/include/llama.h" ]; then
    say "headers already extracted (bundle commit $bundle_commit)"
else
    say "extracting headers from $BUNDLE (commit $bundle_commit)"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    git -c advice.detachedHead=false clone -q --no-checkout "$BUNDLE" "$tmp/llama.cpp" ||
        fail "git clone of the bundle failed"
    mkdir -p "$tmp/src"
    git -C "$tmp/llama.cpp" archive --format=tar "$bundle_commit" include ggml/include CMakeLists.txt |
        tar -x -C "$tmp/src" || fail "git archive of the headers failed"
    rm -rf "$BUILD/include"
    mkdir -p "$BUILD/include"
    cp "$tmp"/src/include/*.h "$tmp"/src/ggml/include/*.h "$BUILD/include/"
    # llama.cpp's own version numbers, from its CMakeLists.txt
    ver="$(sed -n 's/^set(LLAMA_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$tmp/src/CMakeLists.txt" | paste -sd.)"
    tag="$(node -p "require('./node_modules/node-llama-cpp/llama/llama.cpp.info.json').tag" 2>/dev/null || echo unknown)"
    {
        echo "node-llama-cpp: $NLC_VERSION"
        echo "llama.cpp release tag (llama.cpp.info.json): $tag"
        echo "llama.cpp version (CMakeLists.txt): ${ver:-unknown}"
        echo "bundle HEAD commit: $bundle_commit"
        echo "bundle HEAD subject: $(git -C "$tmp/llama.cpp" log -1 --format=%s "$bundle_commit")"
    } > "$BUILD/llama_cpp_version.txt"
    echo "$bundle_commit" > "$stamp"
    rm -rf "$tmp"
    trap - EXIT
fi
[ -f "$BUILD/include/llama.h" ] && [ -f "$BUILD/include/ggml-cpu.h" ] ||
    fail "llama.h / ggml-cpu.h missing in $BUILD/include after extraction"

# ---- 3. compile the drivers ---------------------------------------------------------------------
# llama_greedy: the reference ids; llama_bench_driver: the llama.cpp side of bench/compare-llamacpp;
# llama_kl: perplexity / KL divergence of llama.cpp's KV cache types (bench/kv-cache/llamacpp-kl.sh).
# rpath relative to the binary, so the folder can move as a whole
rpath="\$ORIGIN/../$LIBDIR_REL"
for driver in llama_greedy llama_bench_driver llama_kl; do
    say "compiling build/$driver with $CXX"
    "$CXX" -std=c++17 -O2 -g -Wall -Wextra -Wno-unused-parameter \
        -I"$BUILD/include" -I"$HERE" \
        "$HERE/$driver.cpp" -o "$BUILD/$driver.tmp" \
        -L"$LIBDIR" "-l:$(basename "${libllama[0]}")" "-l:$(basename "${libggml[0]}")" -l:libggml-base.so \
        -Wl,-rpath,"$rpath" -ldl ||
        fail "compiling $driver.cpp failed"
    mv -f "$BUILD/$driver.tmp" "$BUILD/$driver"
    # smoke check: the binary starts and its libraries resolve
    "$BUILD/$driver" --help >/dev/null 2>&1 || {
        ldd "$BUILD/$driver" >&2 || true
        fail "build/$driver does not start (library resolution?)"
    }
done
say "done: $BUILD/llama_greedy, $BUILD/llama_bench_driver, $BUILD/llama_kl"
say "libraries: $LIBDIR"
sed 's/^/[llamacpp setup]   /' "$BUILD/llama_cpp_version.txt"
