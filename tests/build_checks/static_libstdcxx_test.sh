#!/usr/bin/env bash
# Configuring refuses a g++ that finds only libstdc++.a (Note [A compiler
# without a shared libstdc++] in cmake/SharedLibstdcxx.cmake), naming the
# problem and a compiler that works, and accepts this build's own g++.
#
#   static_libstdcxx_test.sh CXX SOURCE_DIR SCRATCH
set -euo pipefail
cxx="$1" source_dir="$2" scratch="$3"
rm -rf "$scratch" && mkdir -p "$scratch"

# The H200 image's /opt/gcc/bin/g++ answers -print-file-name=libstdc++.so
# with the bare name: it has libstdc++.a and a libstdc++.so link that points
# nowhere. This g++ answers the same and otherwise is this build's.
cat >"$scratch/g++" <<WRAPPER
#!/usr/bin/env bash
[[ "\$*" == "-print-file-name=libstdc++.so" ]] && { echo libstdc++.so; exit 0; }
exec "$cxx" "\$@"
WRAPPER
chmod +x "$scratch/g++"

configure() {  # configure NAME CXX: cmake's output in $scratch/NAME.log, its status
  cmake -S "$source_dir/tests/build_checks/project" -B "$scratch/$1" \
    -DCMAKE_CXX_COMPILER="$2" -DSPILLWAY_SOURCE_DIR="$source_dir" >"$scratch/$1.log" 2>&1
}

configure good "$cxx" || { cat "$scratch/good.log"; echo "FAIL: refused $cxx, which finds libstdc++.so"; exit 1; }
if configure static "$scratch/g++"; then
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
