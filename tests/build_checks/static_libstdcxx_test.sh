#!/usr/bin/env bash
# Configuring refuses a g++ that finds only libstdc++.a (Note [A compiler
# without a shared libstdc++] in cmake/SharedLibstdcxx.cmake), naming the
# problem and a compiler that works, and accepts this build's own g++.
#
#   static_libstdcxx_test.sh CXX SOURCE_DIR SCRATCH
set -euo pipefail
cxx="$1" source_dir="$2" scratch="$3"
rm -rf "$scratch" && mkdir -p "$scratch"

# A g++ that finds only libstdc++.a, otherwise this build's.
export SPILLWAY_REAL_CXX="$cxx"
without_shared="$source_dir/tests/support/gxx_without_shared_libstdcxx"

configure() {  # configure NAME CXX: cmake's output in $scratch/NAME.log, its status
  cmake -S "$source_dir/tests/build_checks/project" -B "$scratch/$1" \
    -DCMAKE_CXX_COMPILER="$2" -DSPILLWAY_SOURCE_DIR="$source_dir" >"$scratch/$1.log" 2>&1
}

configure good "$cxx" || { cat "$scratch/good.log"; echo "FAIL: refused $cxx, which finds libstdc++.so"; exit 1; }
if configure static "$without_shared"; then
  cat "$scratch/static.log"
  echo "FAIL: configured with a g++ that finds only libstdc++.a"
  exit 1
fi
# CMake wraps the message: compare it on one line.
message="$(tr -s ' \n' '  ' <"$scratch/static.log")"
for expected in "finds no shared libstdc++" "answers 'libstdc++.so'" "CXX="; do
  grep -q -F "$expected" <<<"$message" ||
    { cat "$scratch/static.log"; echo "FAIL: the error does not say '$expected'"; exit 1; }
done
echo "ok: refused the g++ without libstdc++.so, accepted $cxx"
