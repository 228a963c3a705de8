#!/usr/bin/env bash
# Runs every fuzz target in turn, one libFuzzer process at a time at the lowest priority,
# for the seconds given per target (docs/fuzzing.md). Crashes are kept in artifacts/<target>/
# and the campaign goes on (fork mode); each target's log is in logs/<target>.log, its last
# line the final figures.
#
#   fuzz/run.sh                       # 720 s per target, the hour of docs/fuzzing.md
#   fuzz/run.sh 60 envoy_rls          # one target for a minute
#   SKIP_BUILD=1 fuzz/run.sh          # with the targets as last built
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-720}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(envoy_rls sluice_v1 http_body gossip_datagram rules_file)
[ -n "${SKIP_BUILD:-}" ] || RUSTC_BOOTSTRAP=1 cargo fuzz build -O
mkdir -p logs
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  cp -n seeds/"$t"/* "corpus/$t/" 2>/dev/null || true
  nice -n 19 "target/x86_64-unknown-linux-gnu/release/$t" "corpus/$t" \
    -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 -timeout=10 \
    -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="artifacts/$t/" >"logs/$t.log" 2>&1 || true
  echo "$t: $(grep -E '^#[0-9]+' "logs/$t.log" | tail -1)"
done
