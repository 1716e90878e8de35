#!/usr/bin/env bash
# Start a local Redis for the tests unless one already answers on SLICEX_REDIS_URL's port (default 6379).
set -euo pipefail
port=${SLICEX_REDIS_PORT:-6379}
if redis-cli -p "$port" ping >/dev/null 2>&1; then exit 0; fi
redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --save '' --appendonly no \
  --logfile /tmp/slicex-redis-$port.log
for _ in $(seq 50); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && exit 0
  sleep 0.1
done
echo "redis-server did not answer on port $port" >&2
exit 1
