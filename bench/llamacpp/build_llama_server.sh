#!/usr/bin/env bash
# Build llama.cpp's llama-server (CPU only) from the source bundle that node-llama-cpp ships, as a
# reference OpenAI-compatible server for `vesper bench serve` (idempotent; safe to run again).
#
#   1. clones node_modules/node-llama-cpp/llama/gitRelease.bundle into build/llama.cpp-src
#      (run setup.sh first: it npm-installs the package);
#   2. configures with cmake (CPU only, -DGGML_NATIVE=ON, no curl, no tests/examples, no network)
#      into build/llama.cpp-build and builds only the `llama-server` target;
#   3. links the binary to build/llama-server.
#
# Takes a while on 2 cores (about half an hour). Environment: JOBS (default 2), CC/CXX as for cmake.
#
# Run it (bind to loopback only):
#   bench/llamacpp/build/llama-server -m ../shared/models/stories260K-f32.gguf \
#       --host 127.0.0.1 --port 8090 -t 2 -np 16 -cb
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"

BUNDLE="node_modules/node-llama-cpp/llama/gitRelease.bundle"
BUILD="$HERE/build"
SRC="$BUILD/llama.cpp-src"
OUT="$BUILD/llama.cpp-build"
JOBS="${JOBS:-2}"

say() { printf '[llama-server build] %s\n' "$*"; }
fail() { printf '[llama-server build] ERROR: %s\n' "$*" >&2; exit 1; }

for tool in git cmake; do
    command -v "$tool" >/dev/null 2>&1 || fail "'$tool' not found in PATH"
done
[ -f "$BUNDLE" ] || fail "$BUNDLE is missing: run bench/llamacpp/setup.sh first"

# ---- 1. source -------------------------------------------------------------------------------
bundle_commit="$(git bundle list-heads "$BUNDLE" | awk '$2 == "HEAD" {print $1; exit}')"
[ -n "$bundle_commit" ] || fail "cannot read the HEAD commit of $BUNDLE"
mkdir -p "$BUILD"
if [ -d "$SRC/.git" ] && [ "$(git -C "$SRC" rev-parse HEAD 2>/dev/null)" = "$bundle_commit" ]; then
    say "source already cloned at $SRC (commit $bundle_commit)"
else
    say "cloning $BUNDLE into $SRC"
    rm -rf "$SRC"
    git -c advice.detachedHead=false clone -q "$BUNDLE" "$SRC" || fail "git clone of the bundle failed"
    git -C "$SRC" -c advice.detachedHead=false checkout -q "$bundle_commit" || fail "checkout of $bundle_commit failed"
fi

# ---- 2. configure and build ------------------------------------------------------------------
say "configuring $OUT"
cmake -S "$SRC" -B "$OUT" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF \
    >"$BUILD/llama-server-configure.log" 2>&1 ||
    { tail -40 "$BUILD/llama-server-configure.log" >&2; fail "cmake configure failed (log: $BUILD/llama-server-configure.log)"; }

say "building target llama-server with -j$JOBS (log: $BUILD/llama-server-build.log)"
cmake --build "$OUT" --target llama-server -j "$JOBS" >"$BUILD/llama-server-build.log" 2>&1 ||
    { tail -40 "$BUILD/llama-server-build.log" >&2; fail "build failed (log: $BUILD/llama-server-build.log)"; }

bin="$OUT/bin/llama-server"
[ -x "$bin" ] || fail "$bin was not produced"
ln -sf "$bin" "$BUILD/llama-server"
"$BUILD/llama-server" --version >/dev/null 2>&1 || fail "$BUILD/llama-server does not start"
say "done: $BUILD/llama-server ($("$BUILD/llama-server" --version 2>&1 | head -1))"
