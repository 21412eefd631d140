#!/usr/bin/env bash
# A real single-node Apache Kafka broker (KRaft) for development, tests, CI and benchmarks.
#
#   scripts/kafka.sh start       start (idempotent), wait until ready, print the bootstrap address
#   scripts/kafka.sh stop        stop it and wait
#   scripts/kafka.sh status      exit 0 if running
#   scripts/kafka.sh bootstrap   print the bootstrap address of the running broker (PLAINTEXT)
#   scripts/kafka.sh sasl-bootstrap  print the SASL_SSL listener's address: TLS with the test CA
#        (scripts/certs.sh; `scripts/kafka.sh ca` prints its path), SCRAM-SHA-512 user "kb",
#        password "kb-test-secret" (test credentials, made at format time)
#   scripts/kafka.sh ca          print the path of the CA certificate the SASL_SSL listener chains to
#   scripts/kafka.sh tool CLASS [ARGS]   run a Kafka tool class with the broker's classpath, e.g.
#        scripts/kafka.sh tool org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --describe ...
#   scripts/kafka.sh ktable BOOTSTRAP TOPIC APP_ID STATE_DIR RECORDS   run the Kafka Streams KTable
#        peer of the benchmark (scripts/ktable/KTablePeer.java; built once) with the JVM's defaults
#   scripts/kafka.sh ktable-build   fetch its jars and compile it (once)
#   scripts/kafka.sh clean       stop and delete its data
#   scripts/kafka.sh halt / resume   stop the broker keeping its data and ports, start it again
#
# Jars come from Maven Central via scripts/kafka/pom.xml (once). State lives in $KB_RUN_DIR
# (default .run/kafka): data/, kafka.log, server.properties, pid, bootstrap. The port is $KB_KAFKA_PORT
# (default 19092); if it is taken by something else, a free port is picked.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
run="${KB_RUN_DIR:-$root/.run/kafka}"
lib="$here/kafka/lib"
mkdir -p "$run"

jars() {
  if [ ! -f "$lib/.complete" ]; then
    echo "fetching Kafka jars from Maven Central (once)..." >&2
    (cd "$here/kafka" && mvn -q -B dependency:copy-dependencies -DoutputDirectory=lib >&2)
    touch "$lib/.complete"
  fi
}

classpath() { echo "$lib/*"; }

# The KTable peer (scripts/ktable): its jars from Maven Central and its one class, once.
ktable_build() {
  local k="$here/ktable"
  if [ ! -f "$k/classes/KTablePeer.class" ] || [ "$k/KTablePeer.java" -nt "$k/classes/KTablePeer.class" ]; then
    if [ ! -f "$k/lib/.complete" ]; then
      echo "fetching Kafka Streams jars from Maven Central (once)..." >&2
      (cd "$k" && mvn -q -B dependency:copy-dependencies -DoutputDirectory=lib >&2)
      touch "$k/lib/.complete"
    fi
    javac -nowarn -d "$k/classes" -cp "$k/lib/*" "$k/KTablePeer.java" >&2
  fi
}

java_run() {
  java -Xms256m -Xmx1g -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" -Dkafka.logs.file="$run/kafka.log" \
    -cp "$(classpath)" "$@"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

is_running() {
  [ -f "$run/pid" ] && kill -0 "$(cat "$run/pid")" 2>/dev/null && [ -f "$run/bootstrap" ] || return 1
  local b; b="$(cat "$run/bootstrap")"
  port_open "${b##*:}"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start() {
  if is_running; then cat "$run/bootstrap"; return 0; fi
  jars
  local port="${KB_KAFKA_PORT:-19092}"
  if port_open "$port"; then port="$(free_port)"; fi
  local cport; cport="$(free_port)"
  local sport; sport="$(free_port)"
  local certs; certs="$("$here/certs.sh")"
  rm -rf "$run/data"; mkdir -p "$run/data"
  cat > "$run/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$sport,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$sport
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location=$certs/server.p12
ssl.keystore.password=kbtest
ssl.key.password=kbtest
ssl.client.auth=none
inter.broker.listener.name=PLAINTEXT
log.dirs=$run/data
num.partitions=4
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=1000
group.consumer.heartbeat.interval.ms=1000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.session.timeout.ms=10000
group.consumer.min.session.timeout.ms=6000
group.min.session.timeout.ms=1000
auto.create.topics.enable=false
log.retention.hours=-1
PROPS
  java_run kafka.tools.StorageTool format --standalone -t "$(java_run kafka.tools.StorageTool random-uuid)" \
    -c "$run/server.properties" --add-scram 'SCRAM-SHA-512=[name=kb,password=kb-test-secret]' \
    >"$run/format.log" 2>&1
  echo "127.0.0.1:$port" > "$run/bootstrap"
  echo "127.0.0.1:$sport" > "$run/sasl_bootstrap"
  echo "$certs/ca.crt" > "$run/ca"
  launch
}

# Runs the broker on the existing data and properties; waits until it serves.
launch() {
  local port; port="$(cat "$run/bootstrap")"; port="${port##*:}"
  : > "$run/kafka.log"
  nohup java -Xms256m -Xmx1g -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" -Dkafka.logs.file="$run/kafka.log" \
    -cp "$(classpath)" kafka.Kafka "$run/server.properties" >"$run/stdout.log" 2>&1 &
  echo $! > "$run/pid"
  for _ in $(seq 1 120); do
    if grep -q "Kafka Server started" "$run/kafka.log" 2>/dev/null && port_open "$port"; then
      cat "$run/bootstrap"; return 0
    fi
    if ! kill -0 "$(cat "$run/pid")" 2>/dev/null; then
      echo "kafka exited; see $run/kafka.log and $run/stdout.log" >&2; tail -20 "$run/stdout.log" >&2; return 1
    fi
    sleep 0.5
  done
  echo "kafka did not become ready in 60 s; see $run/kafka.log" >&2
  return 1
}

stop() {
  if [ -f "$run/pid" ]; then
    local pid; pid="$(cat "$run/pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$run/pid"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) is_running ;;
  bootstrap) is_running && cat "$run/bootstrap" ;;
  sasl-bootstrap) is_running && cat "$run/sasl_bootstrap" ;;
  ca) is_running && cat "$run/ca" ;;
  tool) shift; jars; java -Xmx512m -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" \
          -Dkafka.logs.file="$run/tools.log" -cp "$(classpath)" "$@" ;;
  ktable-build) ktable_build ;;
  ktable) shift; ktable_build; exec java -cp "$here/ktable/classes:$here/ktable/lib/*" KTablePeer "$@" ;;
  clean) stop; rm -rf "$run" ;;
  halt) stop ;;   # stop the broker, keeping its data, ports and topics (outage tests)
  resume) is_running && cat "$run/bootstrap" || launch ;;   # start it again after halt
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
