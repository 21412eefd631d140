import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The peer `scripts/bench.sh --only peer` holds kafka-backfill against (benches/backfill/peer.rs): a
 * Kafka Streams application that materializes a log topic as a KTable, the way a user would keep a
 * table of a change topic with Kafka's own library.
 *
 * <p>Settings are Kafka Streams' defaults (RocksDB store with its changelog topic, the record cache,
 * the JVM's default heap) except three: {@code processing.guarantee=exactly_once_v2} (kafka-backfill
 * commits rows and offsets atomically; this is the like-for-like guarantee), {@code
 * auto.offset.reset=earliest}, and the state directory. The table is keyed by the message key and holds
 * each key's last value as bytes: no Avro decoding, no barrier alignment — less work than
 * kafka-backfill does per record. Barrier markers have no key and are dropped by the table, as Kafka
 * Streams drops any null-key record.
 *
 * <p>Usage: {@code KTablePeer BOOTSTRAP TOPIC APPLICATION_ID STATE_DIR RECORDS}. It counts records as
 * they enter (before the table) and, once it has seen RECORDS, closes the application (its last commit
 * included) and prints one line: {@code records=N first_to_last_s=S close_s=C}.
 */
public final class KTablePeer {
  public static void main(String[] args) throws Exception {
    if (args.length != 5) {
      System.err.println("usage: KTablePeer BOOTSTRAP TOPIC APPLICATION_ID STATE_DIR RECORDS");
      System.exit(2);
    }
    String bootstrap = args[0], topic = args[1], appId = args[2], stateDir = args[3];
    long expected = Long.parseLong(args[4]);

    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

    AtomicLong seen = new AtomicLong();
    long[] firstLast = new long[2];
    CountDownLatch done = new CountDownLatch(1);
    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(topic, Consumed.with(Serdes.Bytes(), Serdes.ByteArray()))
        .peek((k, v) -> {
          long n = seen.incrementAndGet();
          if (n == 1) firstLast[0] = System.nanoTime();
          if (n == expected) {
            firstLast[1] = System.nanoTime();
            done.countDown();
          }
        })
        .toTable(
            Materialized.<Bytes, byte[], KeyValueStore<Bytes, byte[]>>as("accounts")
                .withKeySerde(Serdes.Bytes())
                .withValueSerde(Serdes.ByteArray()));

    KafkaStreams streams = new KafkaStreams(builder.build(), p);
    streams.setUncaughtExceptionHandler(e -> {
      System.err.println("KTablePeer: stream thread failed: " + e);
      System.exit(1);
      return null;
    });
    streams.start();
    if (!done.await(30, TimeUnit.MINUTES)) {
      System.err.println("KTablePeer: saw " + seen.get() + " of " + expected + " records in 30 minutes");
      System.exit(1);
    }
    long closing = System.nanoTime();
    streams.close(Duration.ofMinutes(1));
    long closed = System.nanoTime();
    System.out.printf(
        "records=%d first_to_last_s=%.3f close_s=%.3f%n",
        seen.get(), (firstLast[1] - firstLast[0]) / 1e9, (closed - closing) / 1e9);
  }
}
