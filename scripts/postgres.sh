#!/usr/bin/env bash
# A real PostgreSQL (Debian package) for tests, CI and benchmarks, run as the `postgres` user.
#
#   scripts/postgres.sh start   start (idempotent), create database kafka_backfill, print its URL
#   scripts/postgres.sh stop    stop it (start brings it back with its data)
#   scripts/postgres.sh restart pg_ctl restart (outage tests)
#   scripts/postgres.sh url     print the URL of the running server
#   scripts/postgres.sh tls-url print a URL that connects with sslmode=verify-full to the test CA
#
# The server has ssl=on with a certificate from scripts/certs.sh (127.0.0.1/localhost, signed by
# the test CA); plain connections are accepted too.
#
# Durability: for tests the server runs with fsync=off and synchronous_commit=off (nothing here
# survives a power loss, and tests need not). KB_PG_DURABLE=1 (what scripts/bench.sh uses) starts it
# with fsync=on and synchronous_commit=on, restarting a running non-durable server; the other mode
# keeps whatever is running.
# wal_level=logical (capture's slots and publications; a running server without it is restarted).
# Data lives in $KB_PG_DIR (default /tmp/kafka-backfill-pg); the port is $KB_PG_PORT (default 15432).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
port="${KB_PG_PORT:-15432}"
dir="${KB_PG_DIR:-/tmp/kafka-backfill-pg}"
bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
url="postgresql://postgres@127.0.0.1:$port/kafka_backfill"
[ -n "$bin" ] || { echo "PostgreSQL is not installed (apt-get install postgresql)" >&2; exit 1; }

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

ready() { as_pg "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"; }

setting() { as_pg "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -tAc "SHOW $1"; }

start() {
  local durable="${KB_PG_DURABLE:-0}"
  if ready; then
    if { [ "$durable" = 1 ] && [ "$(setting fsync)" != on ]; } || [ "$(setting wal_level)" != logical ]; then
      as_pg "$bin/pg_ctl" -D "$dir" -m fast -w stop >/dev/null
    else
      echo "$url"; return 0
    fi
  fi
  local sync=off
  [ "$durable" = 1 ] && sync=on
  if [ ! -f "$dir/PG_VERSION" ]; then
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
    as_pg "$bin/initdb" -D "$dir" -A trust -U postgres >/dev/null
  fi
  local certs; certs="$("$here/certs.sh")"
  install -m 600 "$certs/server.key" "$dir/server.key"
  install -m 644 "$certs/server.crt" "$dir/server.crt"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir/server.key" "$dir/server.crt"
  as_pg "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 \
    -o "-p $port -k /tmp -c listen_addresses=127.0.0.1 -c fsync=$sync -c synchronous_commit=$sync -c max_connections=200 -c wal_level=logical -c max_replication_slots=32 -c max_wal_senders=32 -c wal_sender_timeout=10s -c ssl=on -c ssl_cert_file=$dir/server.crt -c ssl_key_file=$dir/server.key" start >/dev/null
  as_pg "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='kafka_backfill'" | grep -q 1 \
    || as_pg "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres kafka_backfill
  echo "$url"
}

case "${1:-}" in
  start) start ;;
  stop) as_pg "$bin/pg_ctl" -D "$dir" -m fast -w stop >/dev/null 2>&1 || true ;;
  restart) as_pg "$bin/pg_ctl" -D "$dir" -m fast -w -t 60 restart >/dev/null ;;
  url) ready && echo "$url" ;;
  tls-url) ready && echo "$url?sslmode=verify-full&sslrootcert=$("$here/certs.sh")/ca.crt" ;;
  *) sed -n '2,8p' "$0"; exit 2 ;;
esac
