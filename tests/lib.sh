# Shell helpers shared by the integration tests in this folder (sourced, not run): waiting for
# farmemd's ready line. Callers define fail() and run under `set -euo pipefail`.

# Waits up to $2 seconds for the ready line in file $1 while process $3 lives; prints the line.
wait_ready() {
  local file=$1 secs=$2 pid=$3 line
  for _ in $(seq $((secs * 10))); do
    line="$(grep -m1 '^farmemd ready: ' "$file" 2>/dev/null || true)"
    if [[ -n "$line" ]]; then echo "$line"; return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
