#!/usr/bin/env bash
# Atomic read-modify-writes per request: the lock-prefixed instructions
# (and `xchg` with memory, which is locked without the prefix) that the
# gateway and the bare pass-through execute per small completion, counted
# exactly under valgrind's callgrind. An uncontended one costs about 20
# cycles on x86 and drains the store buffer; an instruction count weighs
# it as one. Reference counts (`Arc`, `Bytes`, wakers), locks, and
# sequentially consistent stores are what they come from.
#
# Each proxy serves one request, then instrumentation is switched on
# (`callgrind_control`), FEW or MANY requests are sent one after another
# on one connection, and it is switched off: (MANY - FEW) cancels what
# does not grow with the requests, and no start-up work (the metrics
# clock's calibration) is counted. The instructions per request are
# printed beside the atomics, measured the same way.
#
#   benches/atomics.sh [FEW MANY]     (default 50 300)
#
# Needs valgrind, curl and objdump. About a minute after the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
FEW=${1:-50}
MANY=${2:-300}
# wait_ready PID LOG REGEX [SECS] (valgrind starts slowly: 60 s);
# valgrind_bench_setup (WORK, BIN, PASSTHROUGH, TARGET_DIR, the upstream and its port)
source benches/wait_ready.sh
valgrind_bench_setup atomics.sh valgrind callgrind_control curl objdump
# ATOMICS_GATEWAY: another build of the gateway to count (an A/B).
GATEWAY=${ATOMICS_GATEWAY:-"$TARGET_DIR/release/tower-llm-gateway"}

SMALL='{"model":"bench","messages":[{"role":"user","content":"Say hello."}]}'

# The addresses of a binary's locked instructions, one per line (hex).
locked_addresses() { # binary
    objdump -d --no-show-raw-insn "$1" |
        awk '$1 ~ /^[0-9a-f]+:$/ && ($2 == "lock" || ($2 ~ /^xchg/ && $3 ~ /\(/)) { sub(":", "", $1); print $1 }'
}

# "instructions atomics" the proxy ran (binary, its kind) serving $3 requests.
count() { # binary kind requests
    local out="$WORK/cg.out" log="$WORK/proxy.log" pid addr
    rm -f "$out"
    if [[ $2 == passthrough ]]; then
        valgrind --tool=callgrind --instr-atstart=no --dump-instr=yes --callgrind-out-file="$out" \
            "$1" --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$UP_PORT" >"$log" 2>&1 &
    else
        unset RUST_LOG
        valgrind --tool=callgrind --instr-atstart=no --dump-instr=yes --callgrind-out-file="$out" \
            "$1" --config "$WORK/gateway.toml" >"$log" 2>"$WORK/stderr.log" &
    fi
    pid=$!
    addr=$(wait_ready $pid "$log" 'ready on http://127\.0\.0\.1:[0-9]+' 60)
    addr=${addr##*//}
    local url="http://$addr/v1/chat/completions" urls=()
    curl -s -H 'content-type: application/json' -d "$SMALL" "$url" >/dev/null
    callgrind_control -i on $pid >/dev/null 2>&1
    for _ in $(seq "$3"); do urls+=("$url"); done
    curl -s -H 'content-type: application/json' -d "$SMALL" "${urls[@]}" >/dev/null
    # The gateway's recorder folds its samples at a scrape: the requests'
    # work, as in callgrind.sh.
    if [[ $2 == gateway ]]; then curl -s "http://$addr/metrics" >/dev/null; fi
    callgrind_control -i off $pid >/dev/null 2>&1
    kill -INT $pid
    wait $pid 2>/dev/null || true
    # Cost lines are "address line Ir" (addresses may be relative to the
    # last: +N, -N, *); a line after `calls=` is a call's inclusive cost.
    # Only the binary's own object is matched against its addresses.
    awk -v bin="$(basename "$1")" '
        # mawk has no strtonum; addresses fit a double exactly.
        function hex(s,    n, i) { n = 0; s = tolower(s); sub(/^0x/, "", s)
            for (i = 1; i <= length(s); i++) n = n * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
            return n }
        FNR == NR { locked[hex($1)] = 1; next }
        /^ob=/ { ob = $0; sub(/^ob=\([0-9]+\) ?/, "", ob); id = $0; sub(/^ob=/, "", id); sub(/\).*/, ")", id)
                 if (ob != "") names[id] = ob; mine = (names[id] ~ ("/" bin "$")); next }
        /^calls=/ { skip = 1; next }
        /^(0x|[+*-]|[0-9])/ {
            p = $1
            if (p ~ /^0x/) a = hex(p); else if (p ~ /^\+/) a = last + substr(p, 2)
            else if (p ~ /^-/) a = last - substr(p, 2); else if (p == "*") a = last
            last = a
            if (skip) { skip = 0; next }
            total += $3
            if (mine && (a in locked)) atomics += $3
        }
        END { printf "%d %d\n", total, atomics }' <(locked_addresses "$1") "$out"
}

printf '%-12s %16s %16s\n' proxy 'instr/request' 'atomics/request'
for proxy in passthrough gateway; do
    binary=$GATEWAY
    [[ $proxy == passthrough ]] && binary="$PASSTHROUGH"
    read -r few_i few_a < <(count "$binary" $proxy "$FEW")
    read -r many_i many_a < <(count "$binary" $proxy "$MANY")
    n=$((MANY - FEW))
    awk -v p=$proxy -v i=$((many_i - few_i)) -v a=$((many_a - few_a)) -v n=$n \
        'BEGIN { printf "%-12s %16.0f %16.1f\n", p, i / n, a / n }'
done
