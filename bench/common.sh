# Shared by the bench scripts that start servers (sourced, not run).

# wait_ready PID LOG URL: returns once URL answers (a server's /health); exits with the server's
# log when it dies first, or after 10 minutes.
wait_ready() {
  local pid="$1" log="$2" url="$3"
  for _ in $(seq 1 1200); do
    curl -sf "$url" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.5
  done
  echo "the server at $url did not start (log: $log)" >&2
  exit 1
}
