#!/usr/bin/env bash
# Renders spillway-report pages in headless Chromium and checks them:
#   render_in_chromium.sh SPILLWAY_REPORT REPORT_DEMO_PAGE V1_TRACE V2_TRACE OUT_DIR
# For the pages of a recorded version 1 trace, a recorded version 2 trace
# (the training demo) and the synthetic demo page (three clients and
# activations, every chart busy): the screenshot exists and is over 10 KB, and Chromium logged no
# console error or uncaught exception. Screenshots stay in OUT_DIR as test
# artifacts. Without Chromium the test fails: CI installs it
# (tools/install-deps.sh), and a skipped browser test would hide a broken page.
set -euo pipefail

report=$1
demo_page=$2
trace_v1=$3
trace_v2=$4
out_dir=$5

browser=""
for candidate in chromium chromium-browser google-chrome; do
  if command -v "$candidate" >/dev/null 2>&1; then
    browser=$(command -v "$candidate")
    break
  fi
done
if [[ -z $browser ]]; then
  echo "FAIL: chromium is not installed (looked for chromium, chromium-browser, google-chrome);" \
       "install it with tools/install-deps.sh or apt-get install chromium" >&2
  exit 1
fi

rm -rf "$out_dir"
mkdir -p "$out_dir"
"$report" "$trace_v1" -o "$out_dir/report_v1.html"
"$report" "$trace_v2" -o "$out_dir/report_v2.html"
"$demo_page" "$out_dir/report_synthetic.html"

failed=0
for page in report_v1 report_v2 report_synthetic; do
  screenshot="$out_dir/${page}_screenshot.png"
  log="$out_dir/${page}_chromium.log"
  # A profile of its own, so runs in parallel do not share a lock.
  timeout 120 "$browser" --headless=new --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="$out_dir/profile_$page" --no-first-run --no-default-browser-check \
    --window-size=1280,2000 --screenshot="$screenshot" --enable-logging=stderr --v=0 \
    "file://$out_dir/$page.html" >"$log" 2>&1 || {
      echo "FAIL: $browser exited with status $? on $page.html; log: $log" >&2
      cat "$log" >&2
      failed=1
      continue
    }
  if [[ ! -f $screenshot ]]; then
    echo "FAIL: no screenshot $screenshot; log: $log" >&2
    failed=1
    continue
  fi
  bytes=$(stat -c %s "$screenshot")
  if ((bytes <= 10240)); then
    echo "FAIL: screenshot $screenshot is only $bytes bytes (expected > 10 KB)" >&2
    failed=1
  fi
  # Chromium logs page console messages as "INFO:CONSOLE:1] \"message\", source: ...",
  # at INFO whatever the message's level (console.error included). The page
  # has no scripts, so any console line (a resource that failed to load, a
  # blocked request) is an error.
  if grep -E 'CONSOLE|Uncaught' "$log" >&2; then
    echo "FAIL: console errors while rendering $page.html (lines above; log: $log)" >&2
    failed=1
  fi
  echo "$page: screenshot $screenshot ($bytes bytes)"
  rm -rf "$out_dir/profile_$page"
done
exit $failed
