#!/usr/bin/env bash
# One check of spillway-config: exit status AND output, so a tool that exits
# non-zero for the wrong reason (or prints the right words and exits 0) fails.
#   check_spillway_config.sh CASE BINARY WRAPPER BUILD_DIR
set -uo pipefail
check_case="$1" binary="$2" wrapper="$3" build_dir="$4"

# run ENV... -- COMMAND...: sets $status, $stdout, $stderr.
run() {
  local out_file err_file
  out_file="$(mktemp)" err_file="$(mktemp)"
  env "$@" >"$out_file" 2>"$err_file"
  status=$?
  stdout="$(cat "$out_file")" stderr="$(cat "$err_file")"
  rm -f "$out_file" "$err_file"
  printf 'exit %s\n--- stdout\n%s\n--- stderr\n%s\n' "$status" "$stdout" "$stderr"
}
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_status() { [[ "$status" == "$1" ]] || fail "expected exit $1, got $status"; }
expect_in() { grep -qF -- "$2" <<<"$1" || fail "expected output to contain: $2"; }
expect_not_in() { ! grep -qF -- "$2" <<<"$1" || fail "expected output not to contain: $2"; }

case "$check_case" in
  unknown_key)
    run SPILLWAY_CONF=bogus:1 "$binary"
    [[ "$status" != 0 ]] || fail "a bogus key must exit non-zero"
    expect_status 2
    expect_in "$stderr" "'bogus'"
    expect_in "$stderr" "known keys: device,"
    ;;
  bad_value)
    run SPILLWAY_CONF="chunk_size:abc" "$binary"
    expect_status 2
    expect_in "$stderr" "bad value 'abc' for 'chunk_size'"
    expect_in "$stderr" "KiB"
    ;;
  good_config)
    run SPILLWAY_CONF=" chunk_size : 2MiB , policy:LRU" "$binary"
    expect_status 0
    expect_in "$stdout" "chunk_size: 2097152B"
    expect_in "$stdout" "policy: lru"
    expect_in "$stdout" "(set)"
    expect_in "$stdout" "device: auto"
    expect_in "$stdout" "(default)"
    expect_in "$stdout" "sim_bandwidth"  # the table of keys follows
    [[ -z "$stderr" ]] || fail "a good configuration must print nothing on stderr"
    ;;
  conf_overrides_env)
    run SPILLWAY_CONF=bogus:1 "$binary" --conf "log:debug"
    expect_status 0
    expect_in "$stdout" "log: debug"
    ;;
  keys_only)
    run SPILLWAY_CONF=bogus:1 "$binary" --keys
    expect_status 0
    expect_in "$stdout" "strict_residency"
    expect_not_in "$stdout" "Effective configuration"
    ;;
  wrapper)
    # The source-tree wrapper finds the binary through SPILLWAY_BUILD_DIR.
    run SPILLWAY_BUILD_DIR="$build_dir" SPILLWAY_CONF=bogus:1 "$wrapper"
    expect_status 2
    expect_in "$stderr" "'bogus'"
    run SPILLWAY_BUILD_DIR="$build_dir/no-such-build" SPILLWAY_CONF= "$wrapper"
    expect_status 127
    expect_in "$stderr" "cmake --build"
    ;;
  *)
    fail "unknown case '$check_case'"
    ;;
esac
echo "PASS: $check_case"
