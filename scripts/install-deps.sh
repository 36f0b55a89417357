#!/usr/bin/env bash
# Installs the Debian 12 packages Vesper needs to build and test, if any are missing.
# Runs apt-get as root, or through sudo when not root. Safe to run again.
set -euo pipefail

packages=(
  build-essential g++ cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev nlohmann-json3-dev libcli11-dev libboost-dev libboost-system-dev libssl-dev
  libsimde-dev
  libopenmpi-dev openmpi-bin
  python3-dev pybind11-dev python3-pytest
  clang-14 libfuzzer-14-dev
)
# Node.js and npm run the HTTP end-to-end tests (with the OpenAI Node SDK) and the llama.cpp
# comparison harness; any Node.js >= 18 already on the PATH will do.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
