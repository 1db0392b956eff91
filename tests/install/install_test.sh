#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds and runs a separate
# project that finds it with find_package(spillway).
set -euo pipefail
build=$1 scratch=$2 consumer=$3 sanitizer=${4:-}
rm -rf "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
flags=()
case $sanitizer in
  address) flags=(-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined) ;;
  thread) flags=(-DCMAKE_CXX_FLAGS=-fsanitize=thread) ;;
esac
cmake -S "$consumer" -B "$scratch/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" "${flags[@]}" >/dev/null
cmake --build "$scratch/consumer" >/dev/null
"$scratch/consumer/consumer"
