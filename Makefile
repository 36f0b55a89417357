# Entry points for people and CI. Everything builds with CMake presets (CMakePresets.json).
#   make run   install missing Debian packages, build, and run the main job on the default model
#   make test  install missing packages, build with -Werror, run every test (then again under ASan+UBSan)
MODEL ?= ../shared/models/stories260K.gguf
PROMPT ?= Once upon a time
JOBS ?= 2

.PHONY: deps build run test test-release test-asan clean

deps:
	./scripts/install-deps.sh

build: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)

run: build
	./build/bin/vesper generate $(MODEL) --prompt "$(PROMPT)" --max-tokens 64

test-release: deps
	cmake --preset ci >/dev/null
	cmake --build --preset ci -j $(JOBS)
	ctest --preset ci -j $(JOBS)

test-asan: deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

test: test-release test-asan

clean:
	rm -rf build build-ci build-asan build-debug
