# Entry points for people and CI. Everything builds with CMake presets (CMakePresets.json).
#   make run   install missing Debian packages, build, and run the main job on the default model
#   make test  install missing packages, build with -Werror, run every test, then again under
#              ASan+UBSan (less the feature server suites, below), the engine and server tests
#              under TSan, and each fuzz target for 15 s
#   make fuzz  build the libFuzzer targets (clang) and run each for FUZZ_SECONDS (tests/fuzz/README.md)
MODEL ?= ../shared/models/stories260K-f32.gguf
PORT ?= 8000
JOBS ?= 2
FUZZ_SECONDS ?= 45
# What `make test` gives each fuzz target: a regression check that keeps CI inside its time; longer
# campaigns run with `make fuzz` (FUZZ_SECONDS).
CI_FUZZ_SECONDS ?= 15

.PHONY: deps node-deps build run test test-release test-asan test-tsan test-fuzz fuzz clean

deps:
	./scripts/install-deps.sh

# The server tests use the official OpenAI Node SDK, pinned in tests/server/package-lock.json.
node-deps: deps
	cd tests/server && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error

build: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)

run: build
	./build/bin/vesper serve $(MODEL) --port $(PORT)

test-release: node-deps
	cmake --preset ci >/dev/null
	cmake --build --preset ci -j $(JOBS)
	ctest --preset ci -j $(JOBS)

# The server suites that drive one engine feature over HTTP (adapters, grammar limits, KV
# sparsity, speculation, HF checkpoints, prefix caching, logits controls; parallel needs Open MPI)
# run in the release stage only (the asan test preset leaves them out): their engine paths run
# under ASan in the engine tests, and their request parsing in the fuzz targets.
test-asan: node-deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

# ThreadSanitizer: the engine, async-engine and server tests (the tsan presets pick them).
test-tsan: node-deps
	cmake --preset tsan >/dev/null
	cmake --build --preset tsan -j $(JOBS)
	ctest --preset tsan -j $(JOBS)

# Every fuzz target for CI_FUZZ_SECONDS, JOBS at a time.
test-fuzz: deps
	FUZZ_PARALLEL=$(JOBS) JOBS=$(JOBS) tests/fuzz/run-fuzzers $(CI_FUZZ_SECONDS)

test: test-release test-asan test-tsan test-fuzz

fuzz: deps
	JOBS=$(JOBS) tests/fuzz/run-fuzzers $(FUZZ_SECONDS)

clean:
	rm -rf build build-ci build-asan build-debug build-fuzz build-tsan
