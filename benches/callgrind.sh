#!/usr/bin/env bash
# Instructions per request, exact on a noisy machine: the gateway
# (RUST_LOG=warn, and as shipped) and the bare pass-through, each run under
# valgrind's callgrind against the prepared upstream, for a small
# completion, a 100-token stream, and a small completion asked with a
# 64 KB prompt (`large-request`, a fifth of the requests). Each proxy is run twice, for FEW and
# MANY sequential requests; (instructions(MANY) - instructions(FEW)) /
# (MANY - FEW) is the cost of a request, with start-up and shutdown
# cancelled out (and the metrics clock's start-up calibration, which varies
# by millions of instructions, left out).
#
#   benches/callgrind.sh [FEW MANY]     (default 100 600)
#
# Needs valgrind and curl. Takes a few minutes after the release builds.
set -euo pipefail
cd "$(dirname "$0")/.."
FEW=${1:-100}
MANY=${2:-600}
# wait_ready PID LOG REGEX [SECS] (valgrind starts slowly: 60 s);
# valgrind_bench_setup (WORK, BIN, PASSTHROUGH, TARGET_DIR, the upstream and its port)
source benches/wait_ready.sh
valgrind_bench_setup callgrind.sh valgrind curl
# CALLGRIND_GATEWAY: another build of the gateway to count (an A/B).
GATEWAY=${CALLGRIND_GATEWAY:-"$TARGET_DIR/release/tower-llm-gateway"}

# SMALL, STREAM and LARGE (a 64 KB prompt), as hot-functions.sh sends them.
bench_bodies

# Instructions the proxy ran serving $2 requests of body $3; $1 names it.
instructions() { # proxy requests body
    local out="$WORK/cg.out" log="$WORK/proxy.log" pid addr
    rm -f "$out"
    case $1 in
        passthrough)
            valgrind --tool=callgrind --callgrind-out-file="$out" \
                "$PASSTHROUGH" --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$UP_PORT" \
                >"$log" 2>&1 &
            pid=$!
            addr=$(wait_ready $pid "$log" 'ready on http://127\.0\.0\.1:[0-9]+' 60)
            addr=${addr##*//} ;;
        gateway-warn | gateway-shipped)
            if [[ $1 == gateway-warn ]]; then export RUST_LOG=warn; else unset RUST_LOG; fi
            valgrind --tool=callgrind --callgrind-out-file="$out" \
                "$GATEWAY" --config "$WORK/gateway.toml" >"$log" 2>"$WORK/stderr.log" &
            pid=$!
            addr=$(wait_ready $pid "$log" 'ready on http://127\.0\.0\.1:[0-9]+' 60)
            addr=${addr##*//} ;;
    esac
    # One curl, one kept-alive connection, the requests one after another
    # (a curl per request would leave the proxy idle most of the time, and
    # its timers' work would count).
    local urls=()
    for _ in $(seq "$2"); do urls+=("http://$addr/v1/chat/completions"); done
    curl -s -H 'content-type: application/json' -d "$3" "${urls[@]}" >/dev/null
    # The gateway scraped once at the end, as a monitored one is: its
    # recorder folds the histogram samples it took into their buckets at a
    # scrape or at its upkeep (every second, which a short run may never
    # reach), and that work is the requests'.
    if [[ $1 == gateway-* ]]; then curl -s "http://$addr/metrics" >/dev/null; fi
    kill -INT $pid
    wait $pid 2>/dev/null || true
    local total calibration
    total=$(sed -n 's/^summary: //p' "$out")
    # The metrics recorder's clock (quanta) calibrates itself once at
    # start-up for as many rounds as it takes: 8M to 15M instructions that
    # FEW and MANY do not cancel. Its inclusive cost is left out: the
    # gateway's telemetry set-up, which holds it (under LTO the clock's
    # own frame is inlined away), or else the clock's.
    calibration=$(callgrind_annotate --inclusive=yes --threshold=100 "$out" 2>/dev/null |
        awk '/tower_llm_gateway::telemetry::Telemetry::install|quanta::Clock::new/ {
            gsub(",", "", $1); if ($1 + 0 > max) max = $1 + 0 } END { if (max) print max }')
    echo $((total - ${calibration:-0}))
}

printf '%-16s %-18s %14s\n' proxy workload 'instr/request'
for proxy in passthrough gateway-warn gateway-shipped; do
    for workload in small stream large-request; do
        body=$SMALL few_n=$FEW many_n=$MANY
        [[ $workload == stream ]] && body=$STREAM
        # A fifth of the requests: each costs about ten small ones.
        [[ $workload == large-request ]] && body=$LARGE few_n=$((FEW / 5 + 1)) many_n=$((MANY / 5 + 1))
        few=$(instructions $proxy "$few_n" "$body")
        many=$(instructions $proxy "$many_n" "$body")
        per=$(( (many - few) / (many_n - few_n) ))
        printf '%-16s %-18s %14s\n' "$proxy" "$workload" "$per"
    done
done
