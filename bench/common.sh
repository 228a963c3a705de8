# Shared helpers of bench/*.sh (sourced, not run). Loopback only; every process started here
# is stopped by its pid on exit.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SLUICED="${SLUICED:-$ROOT/target/release/sluiced}"
BENCH="${BENCH:-$ROOT/target/release/sluice-bench}"
# CPU pinning (2-core machine): the limiter under test alone on SERVER_CPU, the load generator
# (and Redis) on LOAD_CPU, so "decisions/s" is per server core and client and server do not
# steal each other's cycles. Set both empty to not pin. REDIS_CPU (default LOAD_CPU) moves
# Redis: REDIS_CPU=0 puts it beside the server, so "decisions/s" counts the server's and its
# Redis's CPU together, and the load generator has a core of its own.
SERVER_CPU="${SERVER_CPU-0}"
LOAD_CPU="${LOAD_CPU-1}"
REDIS_CPU="${REDIS_CPU-$LOAD_CPU}"
WORK="$(mktemp -d /tmp/sluice-bench.XXXXXX)"
PIDS=()

cleanup() {
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null || true
  done
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && wait "$p" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

# pin CPU CMD...: exec CMD on CPU (unpinned when CPU is empty). It replaces the calling shell,
# so call it in the background (`pin ... &`, then $! is CMD's own pid) or inside $(...).
pin() {
  local cpu="$1"; shift
  if [ -n "$cpu" ] && command -v taskset >/dev/null; then exec taskset -c "$cpu" "$@"; else exec "$@"; fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_port() { # wait_port PORT: until something listens on 127.0.0.1:PORT (20 s at most)
  for _ in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing listens on 127.0.0.1:$1" >&2
  return 1
}

stop() { # stop PID: SIGTERM, then wait until it is gone (10 s, then SIGKILL)
  kill "$1" 2>/dev/null || true
  for _ in $(seq 1 100); do
    [ -e "/proc/$1" ] || return 0
    wait "$1" 2>/dev/null || sleep 0.1
  done
  kill -9 "$1" 2>/dev/null || true
}

start_redis() { # start_redis PORT
  pin "$REDIS_CPU" redis-server --port "$1" --bind 127.0.0.1 --save "" --appendonly no \
    --daemonize no --loglevel warning >"$WORK/redis.log" 2>&1 &
  PIDS+=($!)
  wait_port "$1"
}

# cpu_seconds PID: CPU time (user + system, all threads) the process has used so far.
cpu_seconds() {
  python3 -c 'import os,sys; f=open(f"/proc/{sys.argv[1]}/stat").read().rsplit(")",1)[1].split(); print((int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK"))' "$1"
}

# bench ARGS...: one sluice-bench run, pinned, JSON report on stdout. With SERVER_PID set, the
# report also gets the server's CPU seconds during the run and decisions per server CPU second,
# which stays meaningful when other work shares the machine.
bench() {
  local before after r
  [ -n "${SERVER_PID:-}" ] && before="$(cpu_seconds "$SERVER_PID")"
  r="$(pin "$LOAD_CPU" "$BENCH" --json --quiet "$@")"
  if [ -n "${SERVER_PID:-}" ]; then
    after="$(cpu_seconds "$SERVER_PID")"
    r="$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); cpu=float(sys.argv[3])-float(sys.argv[2]); n=r["allowed"]+r["denied"]
# Warm-up requests are served too: count them by the measured share of the run.
r["server_cpu_s"]=round(cpu,2); r["load1"]=float(open("/proc/loadavg").read().split()[0])
r["decisions_per_cpu_s"]=round(n*(1+float(sys.argv[4])/max(r["seconds"],1e-9))/cpu) if cpu>0 else None
print(json.dumps(r))' "$r" "$before" "$after" "${WARMUP:-2}")"
  fi
  echo "$r"
}

# field JSON NAME: a number from a bench report (jq-free).
field() {
  python3 -c 'import json,sys; v=json.loads(sys.argv[1]); 
for k in sys.argv[2].split("."): v=v[k]
print(v)' "$1" "$2"
}

# saturation LABEL ARGS...: closed-loop runs at growing concurrency; prints the best report.
# The steps span both servers' peaks: on Redis, Limitador peaks at 16-32 clients and Sluice
# at 512-1,024 (docs/benchmark.md, runs MM and NN); a narrower range shortchanges one.
saturation() {
  local label="$1"; shift
  local best="" best_rate=0 c r rate
  for c in ${CONCURRENCY_STEPS:-8 16 32 64 128 256 512 1024}; do
    r="$(bench "$@" --concurrency "$c" --duration "${SAT_SECONDS:-10}" --warmup "${WARMUP:-2}")"
    rate="$(field "$r" decisions_per_s)"
    echo "  $label closed loop, concurrency $c: $rate decisions/s ($(field "$r" decisions_per_cpu_s 2>/dev/null || echo -) per server CPU-s), errors $(field "$r" errors), load $(cut -d' ' -f1 /proc/loadavg)" >&2
    if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$rate" "$best_rate"; then
      best="$r"; best_rate="$rate"
    fi
  done
  echo "$best"
}
