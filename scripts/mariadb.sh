#!/usr/bin/env bash
# A real MariaDB (Debian's mariadb-server) for tests, CI and benchmarks, with the binary log on, as
# `kafka-backfill capture` needs it (docs/CAPTURE.md, "MariaDB").
#
#   scripts/mariadb.sh start    start (idempotent; installs the Debian package when missing), create
#                               database kafka_backfill, print its URL
#   scripts/mariadb.sh stop     stop it (start brings it back with its data)
#   scripts/mariadb.sh restart  stop and start (outage tests)
#   scripts/mariadb.sh url      print the URL of the running server
#   scripts/mariadb.sh sql S    run the statement S as root in database kafka_backfill
#
# The server: binlog_format=ROW, binlog_row_image=FULL, server_id=1, its binary logs in its data
# directory as mariadb-bin.NNNNNN; root without a password on 127.0.0.1. Durability: for tests
# innodb_flush_log_at_trx_commit=2 and sync_binlog=0 (nothing here survives a power loss);
# KB_MARIADB_DURABLE=1 (benchmarks) starts it with 1 and 1, restarting a running non-durable server.
# Data lives in $KB_MARIADB_DIR (default /tmp/kafka-backfill-mariadb); the port is $KB_MARIADB_PORT
# (default 13306).
set -euo pipefail
port="${KB_MARIADB_PORT:-13306}"
dir="${KB_MARIADB_DIR:-/tmp/kafka-backfill-mariadb}"
sock="$dir/mariadb.sock"
url="mariadb://root@127.0.0.1:$port/kafka_backfill"

install() {
  command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] && return 0
  [ "$(id -u)" = 0 ] || { echo "MariaDB is not installed (apt-get install mariadb-server)" >&2; exit 1; }
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >/dev/null
}

client() { mariadb --no-defaults -h 127.0.0.1 -P "$port" -u root "$@"; }

ready() { mariadb-admin --no-defaults -h 127.0.0.1 -P "$port" -u root --connect-timeout=2 ping >/dev/null 2>&1; }

setting() { client -N -B -e "SELECT @@$1"; }

stop() {
  ready || return 0
  mariadb-admin --no-defaults -h 127.0.0.1 -P "$port" -u root shutdown >/dev/null 2>&1 || true
  for _ in $(seq 1 300); do ready || return 0; sleep 0.1; done
  echo "MariaDB on port $port did not stop" >&2; exit 1
}

start() {
  install
  local durable="${KB_MARIADB_DURABLE:-0}"
  if ready; then
    if [ "$durable" = 1 ] && [ "$(setting sync_binlog)" != 1 ]; then stop; else echo "$url"; return 0; fi
  fi
  local flush=2 sync=0
  [ "$durable" = 1 ] && { flush=1; sync=1; }
  local user=()
  [ "$(id -u)" = 0 ] && user=(--user=root)
  if [ ! -d "$dir/mysql" ]; then
    mkdir -p "$dir"
    mariadb-install-db --no-defaults "${user[@]}" --datadir="$dir" --auth-root-authentication-method=normal \
      --skip-test-db >"$dir/install.log" 2>&1 || { cat "$dir/install.log" >&2; exit 1; }
  fi
  (setsid /usr/sbin/mariadbd --no-defaults "${user[@]}" --datadir="$dir" --port="$port" --socket="$sock" \
    --bind-address=127.0.0.1 --pid-file="$dir/mariadbd.pid" --log-error="$dir/server.log" \
    --log-bin=mariadb-bin --binlog-format=ROW --binlog-row-image=FULL --server-id=1 \
    --innodb-flush-log-at-trx-commit="$flush" --sync-binlog="$sync" --max-connections=200 \
    --skip-name-resolve </dev/null >/dev/null 2>&1 &)
  for _ in $(seq 1 600); do ready && break; sleep 0.1; done
  ready || { tail -n 30 "$dir/server.log" >&2; echo "MariaDB did not start on port $port" >&2; exit 1; }
  client -e "CREATE DATABASE IF NOT EXISTS kafka_backfill"
  echo "$url"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) stop; start >/dev/null ;;
  url) ready && echo "$url" ;;
  sql) shift; client kafka_backfill -N -B -e "$*" ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
