#!/usr/bin/env bash
# sluiced and Limitador on their memory stores, side by side in one run, under a load
# generator that is not Sluice's: h2load (nghttp2, `apt-get install nghttp2-client`) sending
# Envoy RLS `ShouldRateLimit` calls with a raw gRPC body, and the same servers under
# sluice-bench's closed loop. Each round runs every server once per layout and generator,
# servers alternating (their order turns each round), so noise on the shared machine hits
# all of them. Prints a Markdown table of medians and per-round ratios; raw rows go to
# bench/results/h2load-*.json.
#
# Limitador is not part of this repository and is not built here: pass the path of a
# limitador-server binary you built (Kuadrant/limitador, `cargo build --release -p
# limitador-server`).
#
#   cargo build --release -p sluiced -p sluice-bench
#   bench/h2load-compare.sh /path/to/limitador-server
#
# h2load sends one fixed body (it cannot vary bodies per request): the Envoy request of one
# key, written by `sluice-bench --print-request`. So h2load offers one hot key; the rule's
# limit (1,000,000,000 a minute) keeps every decision a counted admit. sluice-bench offers its
# usual 10,000 uniform users under the same rule. After each h2load run the servers' own
# counters (sluiced: sluice_decisions_total allowed; Limitador: authorized_calls) must have
# grown by h2load's 2xx count, which shows every answer was a gRPC OK decision (an error is a
# 200 too, with grpc-status in the trailers); before the first round the body is also sent
# by sluice-bench's own client, which checks grpc-status and overall_code on every answer.
#
# Layouts: pinned (server on SERVER_CPU, default 0; load on LOAD_CPU, default 1) and unpinned
# (no taskset: both share the machine's cores as the scheduler likes, as a new user runs
# them).
#
# Env: LIMITADOR (instead of the first argument), SLUICED, BENCH; SLUICED_B (a second sluiced
# binary: a third server, "sluice-b", for A/B runs of a change), SLUICED_ARGS / SLUICED_B_ARGS
# (extra flags, word-split); SERVERS (default "sluice limitador", plus sluice-b with
# SLUICED_B), LAYOUTS ("pinned unpinned"), GENERATORS ("h2load sluice-bench"), ROUNDS (3);
# h2load: H2_REQUESTS (-n, 400000), H2_CLIENTS (-c, 4), H2_STREAMS (-m, 32), H2_THREADS (-t,
# 1), H2_WARMUP (requests sent before each measured run, 20000); sluice-bench: SB_CONCURRENCY
# (128), SB_SECONDS (8), SB_WARMUP (1), SB_CONNECTIONS (4), SB_THREADS (its threads, a single-threaded runtime each;
# default: the CPUs it may run on, so 2 unpinned and 1 pinned; h2load runs -t 1); HEADERS (on: both answer with
# X-RateLimit-Limit/-Remaining/-Reset, as in compare-limitador.sh; off: neither).
source "$(dirname "$0")/common.sh"

LIMITADOR="${LIMITADOR:-${1:-}}"
if [ -z "$LIMITADOR" ] || [ ! -x "$LIMITADOR" ]; then
  echo "usage: $0 /path/to/limitador-server" >&2
  exit 2
fi
command -v h2load >/dev/null || { echo "h2load not found (apt-get install nghttp2-client)" >&2; exit 2; }
SLUICED_B="${SLUICED_B:-}"
if [ -n "$SLUICED_B" ] && [ ! -x "$SLUICED_B" ]; then echo "SLUICED_B=$SLUICED_B is not executable" >&2; exit 2; fi
DEFAULT_SERVERS="sluice limitador"; [ -n "$SLUICED_B" ] && DEFAULT_SERVERS="sluice sluice-b limitador"
read -r -a SERVERS <<<"${SERVERS:-$DEFAULT_SERVERS}"
read -r -a LAYOUTS <<<"${LAYOUTS:-pinned unpinned}"
read -r -a GENERATORS <<<"${GENERATORS:-h2load sluice-bench}"
ROUNDS="${ROUNDS:-3}"
H2_REQUESTS="${H2_REQUESTS:-400000}" H2_CLIENTS="${H2_CLIENTS:-4}" H2_STREAMS="${H2_STREAMS:-32}"
H2_THREADS="${H2_THREADS:-1}" H2_WARMUP="${H2_WARMUP:-20000}"
SB_CONCURRENCY="${SB_CONCURRENCY:-128}" SB_SECONDS="${SB_SECONDS:-8}" SB_WARMUP="${SB_WARMUP:-1}"
SB_CONNECTIONS="${SB_CONNECTIONS:-4}"
HEADERS="${HEADERS:-on}"
PIN_SERVER_CPU="$SERVER_CPU" PIN_LOAD_CPU="$LOAD_CPU"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$ROOT/bench/results/h2load-$STAMP.json"
PATH_RLS=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit

cat >"$WORK/sluice-rules.yaml" <<'RULES'
domain: bench
rules:
  - { id: per-user, key: [user], algorithm: fixed_window, limit: 1000000000, window: 1m }
RULES
cat >"$WORK/limitador-limits.yaml" <<'LIMITS'
- namespace: bench
  name: per-user
  max_value: 1000000000
  seconds: 60
  conditions: []
  variables:
    - descriptors[0].user
LIMITS
if [ "$HEADERS" = on ]; then
  printf 'log: warn\nenvoy: { header_set: x_ratelimit }\n' >"$WORK/sluiced.yaml"
  LIMITADOR_HEADERS=(--rate-limit-headers DRAFT_VERSION_03)
else
  printf 'log: warn\nenvoy: { response_headers: false, raw_body: false }\n' >"$WORK/sluiced.yaml"
  LIMITADOR_HEADERS=()
fi

# The one body h2load sends: the hot key's request (user=u0), framed.
"$BENCH" --print-request --api envoy --domain bench --key-name user --key-prefix u >"$WORK/body.bin"

start_server() { # start_server NAME GRPC_PORT HTTP_PORT -> pid on stdout
  local who="$1" grpc="$2" http="$3" bin extra=()
  case "$who" in
    sluice | sluice-b)
      if [ "$who" = sluice ]; then bin="$SLUICED"; read -r -a extra <<<"${SLUICED_ARGS:-}"
      else bin="$SLUICED_B"; read -r -a extra <<<"${SLUICED_B_ARGS:-}"; fi
      RUST_LOG=warn pin "$SERVER_CPU" "$bin" --config "$WORK/sluiced.yaml" --rules "$WORK/sluice-rules.yaml" \
        --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" "${extra[@]}" >"$WORK/$who.log" 2>&1 &
      ;;
    limitador)
      pin "$SERVER_CPU" "$LIMITADOR" --rls-ip 127.0.0.1 --rls-port "$grpc" --http-ip 127.0.0.1 \
        --http-port "$http" "${LIMITADOR_HEADERS[@]}" "$WORK/limitador-limits.yaml" memory --cache 40000 \
        >"$WORK/$who.log" 2>&1 &
      ;;
    *) echo "unknown server $who" >&2; return 1 ;;
  esac
  local pid=$!
  wait_port "$grpc" >&2
  wait_port "$http" >&2
  echo "$pid"
}

admitted() { # admitted NAME HTTP_PORT: the server's count of admitted decisions so far
  python3 - "$1" "$2" <<'PY'
import sys, urllib.request
who, port = sys.argv[1], sys.argv[2]
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
name = "authorized_calls" if who == "limitador" else "sluice_decisions_total"
n = 0
for line in text.splitlines():
    if line.startswith(name) and (who == "limitador" or 'outcome="allowed"' in line):
        n += int(float(line.split()[-1]))
print(n)
PY
}

# h2load_run GRPC_PORT REQUESTS: one h2load run on LOAD_CPU; a JSON line with its figures and
# its own CPU seconds (and the server's, with SERVER_PID).
h2load_run() {
  local cmd=(h2load -n "$2" -c "$H2_CLIENTS" -m "$H2_STREAMS" -t "$H2_THREADS"
    --header 'content-type: application/grpc' --header 'te: trailers' -d "$WORK/body.bin"
    "http://127.0.0.1:$1$PATH_RLS")
  [ -n "$LOAD_CPU" ] && cmd=(taskset -c "$LOAD_CPU" "${cmd[@]}")
  python3 - "${SERVER_PID:-}" "${cmd[@]}" <<'PY'
import json, os, re, subprocess, sys, resource
pid, cmd = sys.argv[1], sys.argv[2:]
def cpu(p):
    f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
before = cpu(pid) if pid else None
r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
out = subprocess.run(cmd, capture_output=True, text=True)
r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
after = cpu(pid) if pid else None
text = out.stdout
def grab(pattern, cast=float):
    m = re.search(pattern, text)
    return cast(m.group(1)) if m else None
row = {
    "req_per_s": grab(r"finished in [\d.]+\w+, ([\d.]+) req/s"),
    "requests": grab(r"requests: (\d+) total", int),
    "succeeded": grab(r"(\d+) succeeded", int),
    "failed": grab(r"(\d+) failed", int),
    "errored": grab(r"(\d+) errored", int),
    "status_2xx": grab(r"status codes: (\d+) 2xx", int),
    "client_cpu_s": round((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), 3),
    "exit": out.returncode,
    "load1": float(open("/proc/loadavg").read().split()[0]),
}
if before is not None:
    row["server_cpu_s"] = round(after - before, 3)
    n = row["status_2xx"] or 0
    row["decisions_per_cpu_s"] = round(n / (after - before)) if after > before else None
if row["req_per_s"] is None or out.returncode != 0:
    sys.stderr.write(text[-2000:] + out.stderr[-2000:])
print(json.dumps(row))
PY
}

layout() { # layout NAME: sets SERVER_CPU / LOAD_CPU for it
  case "$1" in
    pinned) SERVER_CPU="$PIN_SERVER_CPU"; LOAD_CPU="$PIN_LOAD_CPU" ;;
    unpinned) SERVER_CPU=""; LOAD_CPU="" ;;
    *) echo "unknown layout $1" >&2; exit 2 ;;
  esac
}

# The body against each server once, through the project's own client: every answer gRPC OK.
for who in "${SERVERS[@]}"; do
  layout pinned
  grpc="$(free_port)"; http="$(free_port)"
  pid="$(start_server "$who" "$grpc" "$http")"; PIDS+=("$pid")
  check="$("$BENCH" --json --quiet --api envoy --addr "127.0.0.1:$grpc" --domain bench --key-name user \
    --key-prefix u --dist hot --requests 2000 --concurrency 8 --warmup 0 --duration 30)"
  python3 - "$who" "$check" <<'PY'
import json, sys
r = json.loads(sys.argv[2])
ok = r["allowed"] == 2000 and r["errors"] == 0
print(f"{sys.argv[1]}: the hot key's request through sluice-bench's client: {r['allowed']} OK, "
      f"{r['denied']} over limit, {r['errors']} errors", file=sys.stderr)
sys.exit(0 if ok else 1)
PY
  stop "$pid"
done

echo "[" >"$OUT"; first=1
for round in $(seq 1 "$ROUNDS"); do
  # Turn the order each round: no server always runs first (or right after another).
  order=("${SERVERS[@]:$(((round - 1) % ${#SERVERS[@]}))}" "${SERVERS[@]:0:$(((round - 1) % ${#SERVERS[@]}))}")
  for lay in "${LAYOUTS[@]}"; do
    layout "$lay"
    for gen in "${GENERATORS[@]}"; do
      for who in "${order[@]}"; do
        grpc="$(free_port)"; http="$(free_port)"
        pid="$(start_server "$who" "$grpc" "$http")"; SERVER_PID="$pid"; PIDS+=("$pid")
        if [ "$gen" = h2load ]; then
          SERVER_PID="" h2load_run "$grpc" "$H2_WARMUP" >/dev/null
          before="$(admitted "$who" "$http")"
          r="$(h2load_run "$grpc" "$H2_REQUESTS")"
          after="$(admitted "$who" "$http")"
          r="$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r["admitted"]=int(sys.argv[3])-int(sys.argv[2]); r["decisions_per_s"]=r["req_per_s"]; print(json.dumps(r))' "$r" "$before" "$after")"
          python3 - "$r" <<'PY' || { echo "h2load run of $who: not every answer was a counted admit" >&2; exit 1; }
import json, sys
r = json.loads(sys.argv[1])
sys.exit(0 if r["exit"] == 0 and r["status_2xx"] == r["requests"] == r["admitted"] else 1)
PY
        else
          r="$(bench --api envoy --addr "127.0.0.1:$grpc" --domain bench --key-name user --dist uniform \
            --keys 10000 --concurrency "$SB_CONCURRENCY" --connections "$SB_CONNECTIONS" \
            --duration "$SB_SECONDS" --warmup "$SB_WARMUP" ${SB_THREADS:+--threads "$SB_THREADS"})"
        fi
        stop "$pid"; SERVER_PID=""
        echo "round $round, $lay, $gen, $who: $(field "$r" decisions_per_s) decisions/s, $(field "$r" decisions_per_cpu_s) per server CPU-s, load $(cut -d' ' -f1 /proc/loadavg)" >&2
        [ $first = 1 ] || echo "," >>"$OUT"; first=0
        printf '{"round":%s,"layout":"%s","generator":"%s","server":"%s","headers":"%s","h2load":{"n":%s,"c":%s,"m":%s,"t":%s},"sb_threads":"%s","report":%s}\n' \
          "$round" "$lay" "$gen" "$who" "$HEADERS" "$H2_REQUESTS" "$H2_CLIENTS" "$H2_STREAMS" "$H2_THREADS" \
          "${SB_THREADS:-default}" "$r" >>"$OUT"
      done
    done
  done
done
echo "]" >>"$OUT"

python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = json.load(open(sys.argv[1]))
servers = list(dict.fromkeys(r["server"] for r in rows))
keys = list(dict.fromkeys((r["layout"], r["generator"]) for r in rows))
def get(lay, gen, who, field):
    return [r["report"].get(field) for r in rows if (r["layout"], r["generator"], r["server"]) == (lay, gen, who)]
print("| layout | generator | " + " | ".join(f"{s} decisions/s (median; runs)" for s in servers)
      + " | " + " | ".join(f"{s}/limitador" for s in servers if s != "limitador") + " | per server CPU-s (median) |")
print("| --- | --- | " + " | ".join("---:" for _ in servers) + " | "
      + " | ".join("---:" for s in servers if s != "limitador") + " | --- |")
for lay, gen in keys:
    med = {s: statistics.median(get(lay, gen, s, "decisions_per_s")) for s in servers}
    cells = [f"{med[s]:,.0f} ({', '.join(f'{v:,.0f}' for v in get(lay, gen, s, 'decisions_per_s'))})" for s in servers]
    ratios = []
    for s in servers:
        if s == "limitador" or "limitador" not in med: continue
        per = [a / b for a, b in zip(get(lay, gen, s, "decisions_per_s"), get(lay, gen, "limitador", "decisions_per_s"))]
        ratios.append(f"**{med[s] / med['limitador']:.2f}x** ({', '.join(f'{x:.2f}' for x in per)})")
    cpu = ", ".join(f"{s} {statistics.median([v or 0 for v in get(lay, gen, s, 'decisions_per_cpu_s')]):,.0f}" for s in servers)
    print(f"| {lay} | {gen} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {cpu} |")
PY
echo "raw rows: $OUT" >&2
