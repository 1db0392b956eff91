#!/usr/bin/env bash
# check_notes.py on small repositories: passes on well-formed Notes, fails
# naming a Note cited but not defined, and one defined twice.
#   check_notes_rejects_broken_notes.sh PYTHON CHECK_NOTES_PY
set -euo pipefail
python=$1
checker=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

make_repo() {  # make_repo DIR: a git repository of the files written after it
  mkdir -p "$1" && git -C "$1" init -q
}

make_repo "$scratch/good"
cat >"$scratch/good/a.cc" <<'CODE'
// Note [Defined here]
// The reason, in a paragraph.
int x;  // Note [Defined here]: cited beside the code.
CODE
printf '# Note [In Python]\n# Why.\nx = 1  # Note [In Python]\n' >"$scratch/good/b.py"
git -C "$scratch/good" add -A
"$python" "$checker" "$scratch/good"

make_repo "$scratch/dangling"
printf '// See Note [Nowhere].\nint y;\n' >"$scratch/dangling/a.cc"
git -C "$scratch/dangling" add -A
if output=$("$python" "$checker" "$scratch/dangling"); then
  echo "a dangling citation passed: $output" >&2
  exit 1
fi
grep -q 'Note \[Nowhere\] is cited but never defined: a.cc:1' <<<"$output"

make_repo "$scratch/twice"
printf '// Note [Twice]\n// One.\n\n// Note [Twice]\n// Two.\n' >"$scratch/twice/a.h"
git -C "$scratch/twice" add -A
if output=$("$python" "$checker" "$scratch/twice"); then
  echo "a Note defined twice passed: $output" >&2
  exit 1
fi
grep -q 'Note \[Twice\] is defined 2 times: a.h:1, a.h:4' <<<"$output"
echo "check_notes.py: accepts good Notes, rejects a dangling citation and a double definition"
