# Entry points for people and CI. Everything builds with CMake presets (CMakePresets.json).
#   make run   install missing Debian packages, build, and run the main job on the default model
#   make test  install missing packages, build with -Werror, run every test (then again under ASan+UBSan)
MODEL ?= ../shared/models/stories260K-f32.gguf
PORT ?= 8000
JOBS ?= 2

.PHONY: deps node-deps build run test test-release test-asan clean

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

test-asan: node-deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

test: test-release test-asan

clean:
	rm -rf build build-ci build-asan build-debug
