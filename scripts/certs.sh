#!/usr/bin/env bash
# Test certificates for the TLS listeners of scripts/kafka.sh and scripts/postgres.sh (never for
# production): a test CA, a server certificate for 127.0.0.1/localhost signed by it, and a second,
# unrelated CA for "untrusted CA" tests. Made once with openssl; idempotent.
#
#   scripts/certs.sh [DIR]    make them (default $KB_CERT_DIR or .run/certs) and print DIR
#
# DIR/ca.crt          the test CA (what clients trust: ssl.ca.location, sslrootcert)
# DIR/server.crt/.key the server certificate (SAN IP:127.0.0.1, DNS:localhost) and its key (PKCS#8)
# DIR/server.p12      the same as a PKCS#12 keystore, password "kbtest" (Kafka)
# DIR/other-ca.crt    a CA that signed nothing here
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${1:-${KB_CERT_DIR:-$here/../.run/certs}}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
if [ -f "$dir/.complete" ]; then echo "$dir"; exit 0; fi
command -v openssl >/dev/null || { echo "openssl is not installed (apt-get install openssl)" >&2; exit 1; }
cd "$dir"
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
  -subj "/CN=kafka-backfill test CA" >/dev/null 2>&1
openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.crt -days 3650 \
  -subj "/CN=an unrelated CA" >/dev/null 2>&1
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out server.key >/dev/null 2>&1
openssl req -new -key server.key -out server.csr -subj "/CN=localhost" >/dev/null 2>&1
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt \
  -days 3650 -extfile server.ext >/dev/null 2>&1
openssl pkcs12 -export -in server.crt -inkey server.key -certfile ca.crt -out server.p12 \
  -passout pass:kbtest -name server >/dev/null 2>&1
chmod 600 server.key
touch .complete
echo "$dir"
