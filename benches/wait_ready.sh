# Sourced by the bench scripts.
# wait_ready PID LOG REGEX [SECS]: prints the first match of REGEX in LOG,
# waiting up to SECS (10) while PID lives; otherwise shows LOG and exits.
wait_ready() {
    local deadline=$((SECONDS + ${4:-10})) match
    while ((SECONDS < deadline)); do
        match=$(grep -oE "$3" "$2" | head -1 || true)
        [[ -n $match ]] && { echo "$match"; return 0; }
        kill -0 "$1" 2>/dev/null || break
        sleep 0.1
    done
    cat "$2" >&2
    echo "$(basename "$0"): process $1 did not get ready (log above)" >&2
    exit 1
}
