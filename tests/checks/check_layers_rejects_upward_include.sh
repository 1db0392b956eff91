#!/usr/bin/env bash
# check_layers.py on a small repository: passes while includes point down the
# table in its docs/design.md, fails naming the file, line and rule when one
# points up.
#   check_layers_rejects_upward_include.sh PYTHON CHECK_LAYERS_PY
set -euo pipefail
python=$1
checker=$2
repo=$(mktemp -d)
trap 'rm -rf "$repo"' EXIT

mkdir -p "$repo/docs" "$repo/low" "$repo/high"
cat >"$repo/docs/design.md" <<'TABLE'
| folder | may include |
|---|---|
| `low/` | `low/` |
| `high/` | `high/`, `low/` |
TABLE
printf '#pragma once\n#include <vector>\n' >"$repo/low/base.h"
printf '#include "low/base.h"\n#include "helper.h"\n' >"$repo/high/user.cc"
git -C "$repo" init -q && git -C "$repo" add -A
"$python" "$checker" "$repo"

printf '#pragma once\n#include <vector>\n#include "high/user.h"\n' >"$repo/low/base.h"
if output=$("$python" "$checker" "$repo"); then
  echo "an upward include passed: $output" >&2
  exit 1
fi
grep -q 'low/base.h:3: includes "high/user.h", but low/ may include only low/' <<<"$output"
echo "check_layers.py: accepts includes down the table, rejects one pointing up"
