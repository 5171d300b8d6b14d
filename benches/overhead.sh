#!/usr/bin/env bash
# benches/overhead.sh: the out-of-process overhead benchmark (issue 11).
#
# Builds release binaries and runs, as separate processes on 127.0.0.1:
#   - the prepared upstream (examples/gateway/fixtures/prepared_upstream.rs):
#     a small completion and a 100-token stream (one HTTP chunk per event)
#     built once and answered from those bytes, so that it is not the
#     bottleneck; or, with --fake-upstream, the scripted fake
#     (examples/gateway/fixtures/fake_upstream.rs, no pacing), which is;
#   - a bare hyper pass-through proxy (examples/gateway/fixtures/passthrough.rs,
#     built as binary `passthrough` of benches/fixtures, without the
#     gateway's dev-dependencies' features, and without the gateway's
#     profile: in target/baseline), the baseline;
#   - the gateway (target/release/tower-llm-gateway, package tower-llm-gateway)
#     with one provider, no routes, twice: with RUST_LOG=warn, and as shipped
#     (RUST_LOG unset: the default filter, one log line per turn, to a
#     file truncated after every run);
#   - wrk as the load generator (installed with apt-get when missing).
# Six workloads (small completion, 100-token stream sent at once, and the
# same stream paced 1 ms per event, at 1 and 32 connections; four with
# --fake-upstream or --quick), the pass-through and both gateways interleaved in every
# round; prints medians, throughput ratios and p50 gaps against the
# pass-through, the CPU time (user + system) each proxy and the upstream
# spent per request, the upstream's and the host's CPU share during the
# runs, the issue 29 targets met or missed (each CPU verdict with the
# median of the rounds' own ratios beside it, and every round's ratio as a
# noise check), then the client-side writes
# per stream of the pass-through and the RUST_LOG=warn gateway (strace with
# per-fd attribution, cross-checked with /proc/PID/io).
#
# Usage (from anywhere in the repo):
#   benches/overhead.sh [--rounds N] [--duration SECS] [--streams N] [--quick]
#                       [--fake-upstream] [--no-default-log] [--keep]
#                       [--compare NAME=BINARY]...
# --compare runs another gateway binary (built from another commit, or with
# an experiment in it) beside the others, with RUST_LOG=warn, so that an
# A/B of a change is measured in one run, interleaved, on the same host.
# Nothing is pinned to a core: the point is to measure as a user would.

set -euo pipefail

ROUNDS=3
DURATION=10
STREAMS=200
HIGH_CONNS=32
WARMUP=1
KEEP=0
FAKE_UPSTREAM=0
DEFAULT_LOG=1
COMPARE=()
QUICK=0
ONLY=

usage() {
    cat <<'EOF'
usage: benches/overhead.sh [--rounds N] [--duration SECS] [--streams N] [--quick]
                           [--fake-upstream] [--no-default-log] [--keep]
                           [--only WORKLOAD[,WORKLOAD...]] [--compare NAME=BINARY]...

  --rounds N        interleaved rounds; medians are reported (default 3)
  --duration SECS   length of each wrk run (default 10)
  --streams N       streams used to count writes per stream (default 200)
  --quick           smoke run: 1 round, 2 s runs, 50 streams, no paced
                    stream (under a minute)
  --fake-upstream   the scripted fake upstream (fake_upstream.rs) instead of
                    the prepared one: the upstream of the figures before
                    issue 29, itself the bottleneck at 32 connections
  --no-default-log  skip the gateway as shipped (RUST_LOG unset); only the
                    RUST_LOG=warn gateway runs
  --keep            keep the work directory (logs, strace output, raw results)
  --only WORKLOADS  run only these workloads (comma-separated: small1, small32,
                    stream1, stream32, paced1, paced32), and skip counting
                    writes per stream: e.g. --only small32 --rounds 20
                    --duration 5 for the CPU target of a small completion by
                    twenty interleaved triples, the steadier measure on a
                    noisy host (about 6 min)
  --compare NAME=BINARY
                    also run this gateway binary, with RUST_LOG=warn and the
                    same configuration, interleaved with the others and
                    reported as gateway NAME (repeatable; NAME is a word)
EOF
}

while (($#)); do
    case "$1" in
    --rounds) ROUNDS=${2:?--rounds needs a value}; shift 2 ;;
    --duration) DURATION=${2:?--duration needs a value}; shift 2 ;;
    --streams) STREAMS=${2:?--streams needs a value}; shift 2 ;;
    --quick) ROUNDS=1; DURATION=2; STREAMS=50; QUICK=1; shift ;;
    --fake-upstream) FAKE_UPSTREAM=1; shift ;;
    --no-default-log) DEFAULT_LOG=0; shift ;;
    --keep) KEEP=1; shift ;;
    --only)
        [[ ${2:-} =~ ^[a-z0-9]+(,[a-z0-9]+)*$ ]] || { echo "--only needs WORKLOAD[,WORKLOAD...]" >&2; exit 2; }
        ONLY=$2; shift 2 ;;
    --compare)
        [[ ${2:-} =~ ^[A-Za-z0-9_]+=.+$ ]] || { echo "--compare needs NAME=BINARY" >&2; exit 2; }
        COMPARE+=("$2"); shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
for n in "$ROUNDS" "$DURATION" "$STREAMS"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "not a positive number: $n" >&2; exit 2; }
done
for w in ${ONLY//,/ }; do
    [[ $w =~ ^(small|stream|paced)(1|32)$ ]] || { echo "--only: no workload $w" >&2; exit 2; }
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."

die() { echo "overhead.sh: $*" >&2; exit 1; }

# --- tools ------------------------------------------------------------------

APT_UPDATED=0
ensure_tool() { # command debian-package
    command -v "$1" >/dev/null 2>&1 && return 0
    local sudo=()
    ((EUID == 0)) || sudo=(sudo)
    echo "installing $2 with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! "${sudo[@]}" apt-get install -y -qq "$2" >/dev/null 2>&1; then
        ((APT_UPDATED)) || { "${sudo[@]}" apt-get update -qq >/dev/null && APT_UPDATED=1; }
        "${sudo[@]}" apt-get install -y -qq "$2" >/dev/null
    fi
    command -v "$1" >/dev/null 2>&1 || die "cannot install $2"
}
ensure_tool wrk wrk
ensure_tool strace strace
ensure_tool curl curl

# --- build --------------------------------------------------------------------

# build_bench_binaries EXAMPLE...; wait_ready PID LOG REGEX;
# upstream_ready PID LOG DIR
source benches/wait_ready.sh

UPSTREAM=prepared_upstream
((FAKE_UPSTREAM)) && UPSTREAM=fake_upstream
echo "building release binaries (tower-llm-gateway, passthrough, $UPSTREAM)..." >&2
build_bench_binaries "$UPSTREAM"
TARGET_DIR=$(cargo metadata --no-deps --format-version 1 |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
BIN="$TARGET_DIR/release/examples"
GATEWAY="$TARGET_DIR/release/tower-llm-gateway"
PASSTHROUGH="$TARGET_DIR/baseline/release/passthrough"
for b in "$BIN/$UPSTREAM" "$PASSTHROUGH" "$GATEWAY" "${COMPARE[@]#*=}"; do
    [[ -x $b ]] || die "missing $b"
done

# --- processes ----------------------------------------------------------------

WORK=$(mktemp -d "${TMPDIR:-/tmp}/overhead.XXXXXX")
PIDS=()
STRACE_PID=
cleanup() {
    local pid
    [[ -n $STRACE_PID ]] && kill "$STRACE_PID" 2>/dev/null
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for _ in $(seq 20); do
        local alive=0
        for pid in "${PIDS[@]}" $STRACE_PID; do kill -0 "$pid" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "${PIDS[@]}" $STRACE_PID; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if ((KEEP)); then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ((FAKE_UPSTREAM)); then
    "$BIN/fake_upstream" --port 0 --name up --tokens 8 --pace-ms 0 >"$WORK/upstream.log" 2>&1 &
else
    "$BIN/prepared_upstream" --port 0 --name up --tokens 100 --completion-tokens 8 \
        >"$WORK/upstream.log" 2>&1 &
fi
UP_PID=$!
PIDS+=("$UP_PID")
upstream_ready "$UP_PID" "$WORK/upstream.log" "$WORK"
RUST_LOG=warn "$GATEWAY" --config "$WORK/gateway.toml" >"$WORK/gateway.log" 2>&1 &
GW_PID=$!
PIDS+=("$GW_PID")
GW_ADDR=$(wait_ready "$GW_PID" "$WORK/gateway.log" 'ready on http://127\.0\.0\.1:[0-9]+')
GW_ADDR=${GW_ADDR##*//}

# The gateway as shipped: RUST_LOG unset, so the default filter and its two
# log lines per request, to stderr. They go to a file opened for appending,
# truncated after every wrk run (log_truncate) so that it does not grow to
# gigabytes; the ready line is on stdout.
if ((DEFAULT_LOG)); then
    env -u RUST_LOG "$GATEWAY" --config "$WORK/gateway.toml" \
        >"$WORK/gateway-default.log" 2>>"$WORK/gateway-default.err" &
    GWLOG_PID=$!
    PIDS+=("$GWLOG_PID")
    GWLOG_ADDR=$(wait_ready "$GWLOG_PID" "$WORK/gateway-default.log" 'ready on http://127\.0\.0\.1:[0-9]+')
    GWLOG_ADDR=${GWLOG_ADDR##*//}
fi
log_truncate() { ((DEFAULT_LOG)) && : >"$WORK/gateway-default.err"; return 0; }

"$PASSTHROUGH" --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$UP_PORT" \
    >"$WORK/passthrough.log" 2>&1 &
PT_PID=$!
PIDS+=("$PT_PID")
PT_ADDR=$(wait_ready "$PT_PID" "$WORK/passthrough.log" 'ready on http://127\.0\.0\.1:[0-9]+')
PT_ADDR=${PT_ADDR##*//}

declare -A ADDR=([pass]=$PT_ADDR [gw]=$GW_ADDR)
declare -A PID=([pass]=$PT_PID [gw]=$GW_PID)
declare -A LABEL=([pass]="pass-through" [gw]="gateway, warn" [gwlog]="gateway, default log")
TARGETS=(pass gw)
GATEWAYS=(gw)
if ((DEFAULT_LOG)); then
    ADDR[gwlog]=$GWLOG_ADDR
    PID[gwlog]=$GWLOG_PID
    TARGETS+=(gwlog)
    GATEWAYS+=(gwlog)
fi
# Other gateway binaries to compare (--compare), each with RUST_LOG=warn.
declare -A GW_TITLE=([gw]="gateway with RUST_LOG=warn" [gwlog]="gateway as shipped (RUST_LOG unset: the default filter, its log lines to a file)")
for c in "${COMPARE[@]}"; do
    name=${c%%=*}
    t="cmp_$name"
    RUST_LOG=warn "${c#*=}" --config "$WORK/gateway.toml" >"$WORK/gateway-$t.log" 2>&1 &
    PID[$t]=$!
    PIDS+=("${PID[$t]}")
    ADDR[$t]=$(wait_ready "${PID[$t]}" "$WORK/gateway-$t.log" 'ready on http://127\.0\.0\.1:[0-9]+')
    ADDR[$t]=${ADDR[$t]##*//}
    LABEL[$t]="gateway $name, warn"
    GW_TITLE[$t]="gateway $name (${c#*=}) with RUST_LOG=warn"
    TARGETS+=("$t")
    GATEWAYS+=("$t")
done
TRACED=(pass gw)
for c in "${COMPARE[@]}"; do TRACED+=("cmp_${c%%=*}"); done
PATH_CC=/v1/chat/completions

# --- workloads ------------------------------------------------------------------

# The prepared upstream looks for "stream":true; the scripted fake reads
# per-request settings from the model name.
SMALL_BODY='{"model":"bench","messages":[{"role":"user","content":"Say hello."}]}'
STREAM_BODY='{"model":"bench","stream":true,"messages":[{"role":"user","content":"Say hello."}]}'
# The prepared upstream paces a stream whose body holds "paced": each event
# alone, 1 ms apart (as providers send tokens, only faster).
PACED_BODY='{"model":"bench-paced","stream":true,"messages":[{"role":"user","content":"Say hello."}]}'
((FAKE_UPSTREAM)) &&
    STREAM_BODY='{"model":"bench#fault:tokens=100","stream":true,"messages":[{"role":"user","content":"Say hello."}]}'

write_lua() { # file body
    cat >"$1" <<EOF
-- wrk script written by benches/overhead.sh: one POST body, and a
-- machine-readable summary (latency in microseconds).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '$2'
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %.0f %.0f %.1f %d %d\n",
    latency:percentile(50), latency:percentile(99),
    summary.requests / (summary.duration / 1e6),
    e.connect + e.read + e.write + e.status + e.timeout, summary.requests))
end
EOF
}
write_lua "$WORK/small.lua" "$SMALL_BODY"
write_lua "$WORK/stream.lua" "$STREAM_BODY"
write_lua "$WORK/paced.lua" "$PACED_BODY"

WORKLOADS=(small1 small32 stream1 stream32)
# The paced stream only with the prepared upstream (the scripted fake's
# figures are those before issue 29), and not in a --quick run, which stays
# under a minute.
((FAKE_UPSTREAM || QUICK)) || WORKLOADS+=(paced1 paced32)
if [[ -n $ONLY ]]; then
    picked=()
    for w in ${ONLY//,/ }; do
        [[ " ${WORKLOADS[*]} " == *" $w "* ]] ||
            die "--only: no workload $w in this run (${WORKLOADS[*]})"
        picked+=("$w")
    done
    WORKLOADS=("${picked[@]}")
fi
declare -A W_LUA=([small1]=small [small32]=small [stream1]=stream [stream32]=stream
    [paced1]=paced [paced32]=paced)
declare -A W_CONNS=([small1]=1 [small32]=$HIGH_CONNS [stream1]=1 [stream32]=$HIGH_CONNS
    [paced1]=1 [paced32]=$HIGH_CONNS)
declare -A W_NAME=(
    [small1]="small completion"
    [small32]="small completion"
    [stream1]="100-token stream"
    [stream32]="100-token stream"
    [paced1]="paced stream"
    [paced32]="paced stream"
)

# --- sanity: the proxies answer what the upstream sends -----------------------------

for t in "${TARGETS[@]}"; do
    code=$(curl -sS --max-time 10 -o "$WORK/check.json" -w '%{http_code}' \
        -H 'content-type: application/json' -d "$SMALL_BODY" "http://${ADDR[$t]}$PATH_CC")
    [[ $code == 200 ]] && grep -q '"chat.completion"' "$WORK/check.json" ||
        die "${LABEL[$t]}: small completion answered $code: $(head -c 300 "$WORK/check.json")"
    curl -sS -N --max-time 10 -H 'content-type: application/json' -d "$STREAM_BODY" \
        "http://${ADDR[$t]}$PATH_CC" >"$WORK/check.sse"
    tokens=$(grep -o 'up-tok[0-9]*' "$WORK/check.sse" | wc -l)
    grep -q '^data: \[DONE\]' "$WORK/check.sse" && ((tokens == 100)) ||
        die "${LABEL[$t]}: stream had $tokens tokens: $(head -c 300 "$WORK/check.sse")"
    ((FAKE_UPSTREAM || QUICK)) && continue
    curl -sS -N --max-time 10 -H 'content-type: application/json' -d "$PACED_BODY" \
        "http://${ADDR[$t]}$PATH_CC" >"$WORK/check.sse"
    tokens=$(grep -o 'up-tok[0-9]*' "$WORK/check.sse" | wc -l)
    grep -q '^data: \[DONE\]' "$WORK/check.sse" && ((tokens == 100)) ||
        die "${LABEL[$t]}: paced stream had $tokens tokens: $(head -c 300 "$WORK/check.sse")"
done

# --- client-side writes per stream ---------------------------------------------------

# post_many URL BODY N: N requests, one after another on one keep-alive
# connection; prints how many answers completed (`[DONE]` or a completion).
post_many() {
    local urls=() i
    for ((i = 0; i < $3; i++)); do urls+=("$1"); done
    curl -sS --max-time 300 -H 'content-type: application/json' -d "$2" "${urls[@]}" |
        grep -oE '\[DONE\]|"chat\.completion"' | wc -l
}

syscw() { awk '/^syscw:/ { print $2 }' "/proc/$1/io"; }

# trace_writes TARGET: STREAMS streams through TARGET under strace -f. Writes
# are attributed per fd: fds returned by accept/accept4 during the trace are
# the client side; fds connected to the upstream port (connect() in the
# trace, or open sockets to it at the end) are the upstream side; the rest
# (tokio's eventfd wake-ups) are "other". Sets TRACE[TARGET] to
#   client-writes upstream-writes other-writes upstream-data-reads
trace_writes() {
    local t=$1 pid=${PID[$1]} trace="$WORK/strace.$1" done_count up_fds
    strace -f -s 0 -e signal=none \
        -e trace=accept,accept4,connect,read,readv,recvfrom,recvmsg,write,writev,sendto,sendmsg \
        -p "$pid" -o "$trace" 2>"$trace.err" &
    STRACE_PID=$!
    local deadline=$((SECONDS + 10))
    until grep -qs attached "$trace.err"; do
        ((SECONDS < deadline)) || die "strace did not attach: $(cat "$trace.err")"
        sleep 0.1
    done
    sleep 0.5
    done_count=$(post_many "http://${ADDR[$t]}$PATH_CC" "$STREAM_BODY" "$STREAMS")
    # Upstream sockets still open (the pool keeps them): inode -> fd.
    local port_hex inodes
    port_hex=$(printf '%04X' "$UP_PORT")
    inodes=$(awk -v p=":$port_hex" 'NR > 1 && substr($3, length($3) - 4) == p { print $10 }' \
        /proc/net/tcp | sort -u)
    up_fds=$(for fd in /proc/"$pid"/fd/*; do
        link=$(readlink "$fd" 2>/dev/null) || continue
        [[ $link =~ ^socket:\[([0-9]+)\]$ ]] || continue
        if grep -qxF -- "${BASH_REMATCH[1]}" <<<"$inodes"; then echo "${fd##*/}"; fi
    done | tr '\n' ' ')
    kill "$STRACE_PID" 2>/dev/null || true
    wait "$STRACE_PID" 2>/dev/null || true
    STRACE_PID=
    ((done_count == STREAMS)) || die "${LABEL[$t]}: $done_count of $STREAMS streams completed under strace"
    TRACE[$t]=$(awk -v up_port="$UP_PORT" -v up_fds="$up_fds" '
        BEGIN { n = split(up_fds, f, " "); for (i = 1; i <= n; i++) up[f[i]] = 1 }
        {
            tid = $1
            if (match($0, /<\.\.\. [a-z0-9]+ resumed>/)) {
                if (!(tid in pend)) next
                split(pend[tid], p, " "); call = p[1]; fd = p[2]; delete pend[tid]
                line = $0
            } else if (match($0, / [a-z0-9]+\([0-9]+,/)) {
                s = substr($0, RSTART + 1, RLENGTH - 2)
                call = substr(s, 1, index(s, "(") - 1); fd = substr(s, index(s, "(") + 1)
                if (call == "connect" && index($0, "htons(" up_port ")")) up[fd] = 1
                if ($0 ~ /<unfinished \.\.\.>$/) { pend[tid] = call " " fd; next }
                line = $0
            } else next
            n = split(line, parts, " = ")
            if (n < 2) next
            ret = parts[n] + 0
            if (call == "accept" || call == "accept4") { if (ret >= 0) client[ret] = 1; next }
            if (call ~ /^(write|writev|sendto|sendmsg)$/) writes[fd]++
            else if (call ~ /^(read|readv|recvfrom|recvmsg)$/ && ret > 0) reads[fd]++
        }
        END {
            for (fd in writes) {
                if (fd in client) cw += writes[fd]
                else if (fd in up) uw += writes[fd]
                else ow += writes[fd]
            }
            for (fd in reads) if ((fd in up) && !(fd in client)) ur += reads[fd]
            printf "%d %d %d %d\n", cw, uw, ow, ur
        }' "$trace")
}

declare -A TRACE SYSCW_STREAM SYSCW_SMALL
# Writes per stream are not counted in a run of --only some workloads.
[[ -n $ONLY ]] && TRACED=()
((${#TRACED[@]})) && echo "counting writes per stream ($STREAMS streams each, 1 connection)..." >&2
for t in "${TRACED[@]}"; do
    post_many "http://${ADDR[$t]}$PATH_CC" "$STREAM_BODY" 20 >/dev/null # warm-up
    trace_writes "$t"
    before=$(syscw "${PID[$t]}")
    n=$(post_many "http://${ADDR[$t]}$PATH_CC" "$STREAM_BODY" "$STREAMS")
    ((n == STREAMS)) || die "${LABEL[$t]}: $n of $STREAMS streams completed"
    SYSCW_STREAM[$t]=$(($(syscw "${PID[$t]}") - before))
    before=$(syscw "${PID[$t]}")
    n=$(post_many "http://${ADDR[$t]}$PATH_CC" "$SMALL_BODY" "$STREAMS")
    ((n == STREAMS)) || die "${LABEL[$t]}: $n of $STREAMS small completions completed"
    SYSCW_SMALL[$t]=$(($(syscw "${PID[$t]}") - before))
done

# --- throughput and latency: interleaved rounds ------------------------------------------

# cpu_ticks PID: the process's user + system CPU time so far, in clock
# ticks, all its threads (fields 14 and 15 of /proc/PID/stat; the names of
# these processes have no spaces).
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# host_ticks: the host's busy, stolen and total CPU ticks so far (the cpu
# line of /proc/stat: busy = user + nice + system + irq + softirq).
host_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8, $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9; exit }' /proc/stat; }
CLK_TCK=$(getconf CLK_TCK)
NCPU=$(nproc)

# run_wrk TARGET WORKLOAD SECS: prints
#   p50 p99 rps errors requests cpu up-cpu up-share host-busy host-steal
# cpu and up-cpu being the CPU time (user + system) per request in µs of the
# proxy and of the upstream: what each spent, less sensitive than latency to
# a busy host. up-share is the upstream's CPU time as a percentage of all
# the host's cores over the run (wall clock); host-busy and host-steal are
# the host's busy and stolen shares over the run, in percent.
run_wrk() {
    local conns=${W_CONNS[$2]} threads=1 out before after up_before up_after host_before host_after t0 t1
    ((conns > 1)) && threads=2
    host_before=$(host_ticks)
    up_before=$(cpu_ticks "$UP_PID")
    before=$(cpu_ticks "${PID[$1]}")
    t0=$EPOCHREALTIME
    out=$(wrk -t"$threads" -c"$conns" -d"${3}s" --timeout 5s -s "$WORK/${W_LUA[$2]}.lua" \
        "http://${ADDR[$1]}$PATH_CC" 2>&1) || die "wrk failed: $out"
    t1=$EPOCHREALTIME
    after=$(cpu_ticks "${PID[$1]}")
    up_after=$(cpu_ticks "$UP_PID")
    host_after=$(host_ticks)
    log_truncate
    grep -q '^RESULT ' <<<"$out" || die "wrk printed no result: $out"
    # wrk's own words for any errors (socket error kinds, non-2xx answers),
    # printed with the warning at the end.
    grep -E '^ *(Socket errors|Non-2xx)' <<<"$out" |
        sed "s/^ */${LABEL[$1]}, ${W_NAME[$2]} at $conns conns: /" >>"$WORK/errors" || true
    grep '^RESULT ' <<<"$out" | cut -d' ' -f2- |
        awk -v t=$((after - before)) -v u=$((up_after - up_before)) -v hz="$CLK_TCK" \
            -v ncpu="$NCPU" -v t0="$t0" -v t1="$t1" -v hb="$host_before" -v ha="$host_after" '{
            split(hb, b, " "); split(ha, a, " ")
            total = a[3] - b[3]
            printf "%s %.1f %.1f %.1f %.1f %.1f\n", $0,
                ($5 > 0 ? t * 1e6 / hz / $5 : 0), ($5 > 0 ? u * 1e6 / hz / $5 : 0),
                100 * u / hz / ((t1 - t0) * ncpu),
                (total > 0 ? 100 * (a[1] - b[1]) / total : 0),
                (total > 0 ? 100 * (a[2] - b[2]) / total : 0) }'
}

RESULTS="$WORK/results"
: >"$RESULTS"
echo "warming up (${WARMUP} s per proxy and workload)..." >&2
for w in "${WORKLOADS[@]}"; do
    for t in "${TARGETS[@]}"; do run_wrk "$t" "$w" "$WARMUP" >/dev/null; done
done
REVERSED=()
for ((i = ${#TARGETS[@]} - 1; i >= 0; i--)); do REVERSED+=("${TARGETS[i]}"); done
for ((r = 1; r <= ROUNDS; r++)); do
    # Odd rounds start with the pass-through, even rounds end with it.
    order=("${TARGETS[@]}")
    ((r % 2 == 0)) && order=("${REVERSED[@]}")
    for w in "${WORKLOADS[@]}"; do
        for t in "${order[@]}"; do
            echo "round $r/$ROUNDS: ${W_NAME[$w]}, ${W_CONNS[$w]} conn, ${LABEL[$t]} (${DURATION} s)" >&2
            echo "$r $w $t $(run_wrk "$t" "$w" "$DURATION")" >>"$RESULTS"
        done
    done
done

# --- report --------------------------------------------------------------------------

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
col() { awk -v w="$1" -v t="$2" -v c="$3" '$2 == w && $3 == t { print $c }' "$RESULTS"; }
# med WORKLOAD TARGET FIELD: the median of a results column (4 p50, 5 p99,
# 6 r/s, 9 proxy CPU, 10 upstream CPU, 11 upstream share, 12 host busy,
# 13 host steal).
med() { col "$1" "$2" "$3" | median; }

if ((FAKE_UPSTREAM)); then
    UP_DESC="the scripted fake upstream (fake_upstream.rs, no pacing)"
else
    UP_DESC="the prepared upstream (prepared_upstream.rs: answers from bytes built at start-up)"
fi

echo
echo "tower-llm-failover overhead, out of process: $UP_DESC, a bare hyper"
echo "pass-through and the gateway (one provider, no routes) as separate release processes;"
echo "wrk on 127.0.0.1 (1 thread at 1 conn, 2 threads at $HIGH_CONNS conns)."
echo "$NCPU cores, $(uname -sr); $ROUNDS interleaved round(s) of ${DURATION} s per run; medians."
# At one connection each thread sleeps between requests: how deep it
# sleeps (the cpuidle driver and its states) sets how cold it wakes, and
# moved the one-connection figures of unchanged code by +50 µs (see
# benches/README.md, "Two timers fewer per turn").
IDLE_DRIVER=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo unknown)
IDLE_STATES=$( (cat /sys/devices/system/cpu/cpu0/cpuidle/state*/name 2>/dev/null || true) | tr '\n' ' ')
echo "cpuidle: ${IDLE_DRIVER}${IDLE_STATES:+ (states: ${IDLE_STATES% })}."
# Whether the gateway's per-request functions lie side by side (cold, at
# one connection, that was worth 4 to 16 µs of p50; benches/README.md,
# "Hot functions side by side").
echo "gateway $(HOT_GATEWAY="$GATEWAY" benches/hot-functions.sh --check 2>&1 | head -2 | tr '\n' ' ')"
ERRORS=0
for w in "${WORKLOADS[@]}"; do
    for t in "${TARGETS[@]}"; do
        e=$(col "$w" "$t" 7 | awk '{ s += $1 } END { print s + 0 }')
        ((e == 0)) || { ERRORS=1; echo "warning: ${LABEL[$t]} ${W_NAME[$w]} at ${W_CONNS[$w]} conns: $e errors" >&2; }
    done
done
for g in "${GATEWAYS[@]}"; do
    echo
    echo "Latency and throughput, ${GW_TITLE[$g]}:"
    printf '%-18s %5s | %9s %9s %9s | %9s %9s %9s | %7s %9s\n' \
        "workload" "conns" "pass p50" "pass p99" "pass r/s" "gw p50" "gw p99" "gw r/s" "gw/pass" "p50 gap"
    printf '%-18s %5s | %9s %9s %9s | %9s %9s %9s | %7s %9s\n' \
        "" "" "(µs)" "(µs)" "" "(µs)" "(µs)" "" "r/s" "(µs)"
    for w in "${WORKLOADS[@]}"; do
        awk -v name="${W_NAME[$w]}" -v c="${W_CONNS[$w]}" \
            -v pp50="$(med "$w" pass 4)" -v pp99="$(med "$w" pass 5)" -v prps="$(med "$w" pass 6)" \
            -v gp50="$(med "$w" "$g" 4)" -v gp99="$(med "$w" "$g" 5)" -v grps="$(med "$w" "$g" 6)" 'BEGIN {
            printf "%-18s %5d | %9.0f %9.0f %9.0f | %9.0f %9.0f %9.0f | %6.2fx %+9.0f\n",
                name, c, pp50, pp99, prps, gp50, gp99, grps, grps / prps, gp50 - pp50 }'
    done
done
((ERRORS == 0)) || echo "(some runs had errors: see the warnings above)"
if ((ERRORS)) && [[ -s $WORK/errors ]]; then
    echo "wrk's error lines:" >&2
    sed 's/^/  /' "$WORK/errors" >&2
fi

echo
echo "CPU time (user + system, /proc/PID/stat, all threads) each proxy spent per request,"
echo "medians; the ratio is the gateway's cost against the pass-through's for the same work."
printf '%-18s %5s | %10s' "workload" "conns" "pass (µs)"
for g in "${GATEWAYS[@]}"; do printf ' | %10s %8s' "$g (µs)" "$g/pass"; done
printf '\n'
for w in "${WORKLOADS[@]}"; do
    pc=$(med "$w" pass 9)
    printf '%-18s %5d | %10.1f' "${W_NAME[$w]}" "${W_CONNS[$w]}" "$pc"
    for g in "${GATEWAYS[@]}"; do
        awk -v pc="$pc" -v gc="$(med "$w" "$g" 9)" \
            'BEGIN { printf " | %10.1f %7.2fx", gc, (pc > 0 ? gc / pc : 0) }'
    done
    printf '\n'
done

echo
echo "The upstream, while each proxy ran: its own CPU time per request, its CPU time as a"
echo "share of all $NCPU cores (wall clock), and the host's busy and stolen shares (/proc/stat);"
echo "medians. The upstream is far from the bottleneck while its share stays well under the"
echo "proxy's and the host is not saturated by it."
printf '%-18s %5s %-22s | %9s %10s | %10s %9s | %6s %6s\n' \
    "workload" "conns" "proxy" "r/s" "proxy µs" "upstream µs" "upstream" "host" "steal"
printf '%-18s %5s %-22s | %9s %10s | %10s %9s | %6s %6s\n' \
    "" "" "" "" "/request" "/request" "% of host" "busy %" "%"
for w in "${WORKLOADS[@]}"; do
    for t in "${TARGETS[@]}"; do
        printf '%-18s %5d %-22s | %9.0f %10.1f | %10.1f %8.1f%% | %5.1f%% %5.1f%%\n' \
            "${W_NAME[$w]}" "${W_CONNS[$w]}" "${LABEL[$t]}" "$(med "$w" "$t" 6)" \
            "$(med "$w" "$t" 9)" "$(med "$w" "$t" 10)" "$(med "$w" "$t" 11)" \
            "$(med "$w" "$t" 12)" "$(med "$w" "$t" 13)"
    done
done
awk -v ncpu="$NCPU" '$11 > m { m = $11 } END {
    printf "Upstream CPU share, highest of any run: %.1f%% of the host (%.0f%% of one core).\n", m, m * ncpu }' "$RESULTS"

# The targets name a small completion and a 100-token stream; the paced
# stream is checked against the stream's.
AT_HIGH=()
AT_ONE=()
for w in small32 stream32 paced32; do [[ " ${WORKLOADS[*]} " == *" $w "* ]] && AT_HIGH+=("$w"); done
for w in small1 stream1 paced1; do [[ " ${WORKLOADS[*]} " == *" $w "* ]] && AT_ONE+=("$w"); done
echo
echo "Issue 29 targets (gateway against the pass-through, same run, medians):"
for g in "${GATEWAYS[@]}"; do
    echo "  ${GW_TITLE[$g]}:"
    for w in "${AT_HIGH[@]}"; do
        # Beside the ratio of the medians, the median of each round's own
        # ratio: the pass-through's CPU per request moves between rounds
        # more than the gateway's, and a round's two runs are minutes apart
        # at most.
        per_round=$(awk -v w="$w" -v g="$g" '
            $2 == w && $3 == "pass" { p[$1] = $9 }
            $2 == w && $3 == g { c[$1] = $9 }
            END { for (r in c) if (p[r] > 0) print c[r] / p[r] }' "$RESULTS" | median)
        awk -v name="${W_NAME[$w]}" -v pc="$(med "$w" pass 9)" -v gc="$(med "$w" "$g" 9)" \
            -v pr="$per_round" 'BEGIN {
            r = (pc > 0 ? gc / pc : 0)
            printf "    CPU per request, %-16s at 32 conns: %5.2fx (at most 1.25x): %s (rounds: median %.2fx)\n",
                name, r, (r <= 1.25 ? "met" : "missed"), pr }'
    done
    for w in "${AT_ONE[@]}"; do
        awk -v name="${W_NAME[$w]}" -v pp="$(med "$w" pass 4)" -v gp="$(med "$w" "$g" 4)" 'BEGIN {
            d = gp - pp
            printf "    added p50,       %-16s at 1 conn:  %+5.0f µs (at most +25 µs): %s\n",
                name, d, (d <= 25 ? "met" : "missed") }'
    done
    for w in "${AT_HIGH[@]}"; do
        awk -v name="${W_NAME[$w]}" -v pr="$(med "$w" pass 6)" -v gr="$(med "$w" "$g" 6)" 'BEGIN {
            r = (pr > 0 ? gr / pr : 0)
            printf "    throughput,      %-16s at 32 conns: %5.2fx (at least 0.85x): %s\n",
                name, r, (r >= 0.85 ? "met" : "missed") }'
    done
done

echo
echo "Per round (noise check), CPU per request at $HIGH_CONNS conns, gateway/pass-through:"
for g in "${GATEWAYS[@]}"; do
    echo "  ${GW_TITLE[$g]%% (*}:"
    for w in "${AT_HIGH[@]}"; do
        awk -v w="$w" -v g="$g" -v name="${W_NAME[$w]}" '
            $2 == w { cpu[$1, $3] = $9; if ($1 > n) n = $1 }
            END {
                printf "    %-26s", name
                for (r = 1; r <= n; r++)
                    printf "  %.2fx (%.1f/%.1f)", cpu[r, g] / cpu[r, "pass"], cpu[r, g], cpu[r, "pass"]
                printf "\n"
            }' "$RESULTS"
    done
done

echo
echo "Per round (noise check), gateway/pass-through r/s and p50 gap (µs):"
for g in "${GATEWAYS[@]}"; do
    echo "  ${GW_TITLE[$g]%% (*}:"
    for w in "${WORKLOADS[@]}"; do
        awk -v w="$w" -v g="$g" -v name="${W_NAME[$w]}, ${W_CONNS[$w]} conn" '
            $2 == w { p50[$1, $3] = $4; rps[$1, $3] = $6; if ($1 > n) n = $1 }
            END {
                printf "    %-26s", name
                for (r = 1; r <= n; r++)
                    printf "  %.2fx %+.0f", rps[r, g] / rps[r, "pass"], p50[r, g] - p50[r, "pass"]
                printf "\n"
            }' "$RESULTS"
    done
done

((${#TRACED[@]})) || exit 0
echo
echo "Writes per 100-token stream, $STREAMS streams one after another on one connection."
echo "strace -f (per-fd: client = fds from accept4 in the trace; upstream = fds connected"
echo "to the upstream port; other = the rest, tokio's eventfd wake-ups). Under strace the"
echo "process runs slower, so reads may batch more than they do untraced."
printf '%-14s %14s %16s %14s %20s\n' "" "client writes" "upstream writes" "other writes" "upstream data reads"
for t in "${TRACED[@]}"; do
    read -r cw uw ow ur <<<"${TRACE[$t]}"
    awk -v l="${LABEL[$t]}" -v n="$STREAMS" -v cw="$cw" -v uw="$uw" -v ow="$ow" -v ur="$ur" \
        'BEGIN { printf "%-14s %14.2f %16.2f %14.2f %20.2f\n", l, cw / n, uw / n, ow / n, ur / n }'
done
echo
echo "Cross-check without a tracer: /proc/PID/io syscw (write-side syscalls of the whole"
echo "process, every fd) per request, $STREAMS of each; the difference is what streaming adds."
printf '%-14s %14s %18s %12s\n' "" "per stream" "per small compl." "difference"
for t in "${TRACED[@]}"; do
    awk -v l="${LABEL[$t]}" -v n="$STREAMS" -v s="${SYSCW_STREAM[$t]}" -v c="${SYSCW_SMALL[$t]}" \
        'BEGIN { printf "%-14s %14.2f %18.2f %12.2f\n", l, s / n, c / n, (s - c) / n }'
done
