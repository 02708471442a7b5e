#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Usage: check_rounds.sh ROUNDS CHORUS_RUN PERF_BINARY [perf flags...]
# Runs PERF_BINARY on 2 ranks with -R ROUNDS and --json, and fails unless every row of the JSON
# has ROUNDS rounds and reports their median as its time.
set -eu
rounds=$1 run=$2 perf=$3
shift 3
json=$(mktemp /tmp/check_rounds.XXXXXX.json)
trap 'rm -f "$json"' EXIT
"$run" -n 2 --timeout 120 "$perf" -R "$rounds" --json "$json" "$@"
awk -v want="$rounds" '
  /"time_us"/ {
    rows++
    line = $0
    sub(/.*"time_us": /, "", line); split(line, t, ","); time = t[1] + 0
    if ($0 !~ /"rounds_us": \[/) { print "row " rows " has no rounds_us: " $0; bad = 1; next }
    line = $0
    sub(/.*"rounds_us": \[/, "", line); sub(/\].*/, "", line)
    n = split(line, r, ", ")
    if (n != want) { print "row " rows " has " n " rounds, not " want; bad = 1; next }
    for (i = 1; i <= n; i++) v[i] = r[i] + 0
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { x = v[j]; v[j] = v[j - 1]; v[j - 1] = x }
    med = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    if (med != time) { print "row " rows ": time_us " time " is not the median " med " of its rounds"; bad = 1 }
  }
  END {
    if (rows == 0) { print "no rows"; exit 1 }
    if (bad) exit 1
    print rows " rows, each the median of its " want " rounds"
  }' "$json"
