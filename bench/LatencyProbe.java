// LatencyProbe - end-to-end replication latency of a replicator (kmirror, MirrorMaker 2, ...)
// between two Kafka clusters. Single-file source program (Java 17, Kafka client jars on the
// classpath):
//
//   java -cp "$(bash scripts/kafka/kafka-harness.sh classpath)" bench/LatencyProbe.java \
//     --source HOST:PORT --target HOST:PORT --topic lat --remote-topic A.lat \
//     [--rate 5000] [--seconds 60] [--size 1024] [--drain-seconds 60] [--warmup-seconds 5]
//     [--isolation read_uncommitted|read_committed]
//
// Produces --rate records/s to --topic on the source for --seconds, each stamped with its send
// wall-clock time (CreateTime), and reads --remote-topic on the target. The target must use
// log.message.timestamp.type=LogAppendTime: a record read there then carries the time the
// target broker appended it, so latency = target append time - the time the source acknowledged
// the record (acks=1: right after its append), independent of when our own consumer happens to
// fetch it (consumer delay is not part of the measurement). send_* is measured from the send
// instead, so it adds the source's produce latency. Both clusters must share one clock (same
// host), as timestamps from two clocks are compared.
//
// --isolation read_committed (for an exactly-once replicator) reads as a read_committed consumer
// and takes the time a record was received instead of its append time: a transaction's records
// are appended as they come but readable only once it commits, so the append time would leave
// out the wait a real consumer sees. The consumer's own fetch delay (fetch.max.wait.ms 100, a
// poll) is then part of the figure.
//
// stdout: one line "latency records=N p50= p90= p99= p999= max= mean= send_p50= send_p99=
// send_max= produce_p50= produce_p99= sent_rate=" (ms, except records and sent_rate in
// records/s); everything else goes to stderr.
// Exit: 0 ok; 1 records missing after the drain, send errors, topic not found, client failure;
// 2 bad arguments or a target record without LogAppendTime; 3 watchdog (run took too long).
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.locks.LockSupport;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.record.TimestampType;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class LatencyProbe {
    // The summary line is the only thing written to the real stdout; System.out is pointed at
    // stderr in main, so a logging backend's default console appender cannot pollute it.
    private static final PrintStream SUMMARY = System.out;

    // Shared state. The consumer thread is the only writer of targetTs/seen/dups; seen is
    // volatile and written after targetTs[seq], so a reader that sees seen == total sees all.
    private static long nonce;
    private static int total;
    private static long[] sendMs, ackMs, targetTs;
    private static volatile int seen;
    private static volatile long dups;
    private static volatile boolean stopConsumer;
    private static boolean readCommitted;

    public static void main(String[] argv) throws Exception {
        System.setOut(System.err);
        Map<String, String> a = parseArgs(argv);
        String source = req(a, "source"), target = req(a, "target");
        String topic = req(a, "topic"), remoteTopic = req(a, "remote-topic");
        int rate = num(a, "rate", 5000), seconds = num(a, "seconds", 60), size = num(a, "size", 1024);
        int drainSeconds = num(a, "drain-seconds", 60), warmupSeconds = num(a, "warmup-seconds", 5);
        String isolation = a.getOrDefault("isolation", "read_uncommitted");
        if (!isolation.equals("read_uncommitted") && !isolation.equals("read_committed")) die(2, "--isolation wants read_uncommitted or read_committed, got %s", isolation);
        readCommitted = isolation.equals("read_committed");
        if (rate < 1 || seconds < 1 || drainSeconds < 0 || warmupSeconds < 0) die(2, "--rate and --seconds must be >= 1, drain/warmup >= 0");
        if (size < 16) die(2, "--size must be >= 16 (8 bytes nonce + 8 bytes sequence)");
        if (warmupSeconds >= seconds) die(2, "--warmup-seconds must be below --seconds");
        if ((long) rate * seconds > 50_000_000L) die(2, "rate*seconds too large (max 50M records)");

        // Watchdog: whatever hangs (a broker, the replicator, a blocked client call), end the run.
        long budgetSeconds = seconds + drainSeconds + 90L;
        Thread watchdog = new Thread(() -> {
            try { Thread.sleep(budgetSeconds * 1000L); } catch (InterruptedException e) { return; }
            System.err.printf("latency-probe: ERROR: watchdog: no result after %d s, giving up%n", budgetSeconds);
            System.err.flush();
            Runtime.getRuntime().halt(3);  // halt, not exit: nothing may block the way out
        }, "watchdog");
        watchdog.setDaemon(true);
        watchdog.start();

        total = rate * seconds;
        sendMs = new long[total];
        ackMs = new long[total];
        targetTs = new long[total];
        // A random per-run nonce at the start of every value: seeking the target topic to its
        // beginning also returns records of earlier runs, whose sequence numbers would collide.
        nonce = ThreadLocalRandom.current().nextLong();

        // 1. Target consumer first, so it is in place before the first record can arrive.
        KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps(target));
        List<TopicPartition> parts = waitForTopic(consumer, remoteTopic, 60);
        consumer.assign(parts);
        // Beginning rather than end: a lazily resolved "end" could lie after our first records.
        consumer.seekToBeginning(parts);
        log("target %s: %s has %d partitions; nonce %016x", target, remoteTopic, parts.size(), nonce);
        Thread consumerThread = new Thread(() -> consumeLoop(consumer), "target-consumer");
        consumerThread.setDaemon(true);
        consumerThread.start();

        // 2. Paced producer on the source.
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps(source));
        producer.partitionsFor(topic);  // fetch metadata now, not inside the paced schedule
        AtomicLong sendErrors = new AtomicLong();
        AtomicReference<Exception> firstError = new AtomicReference<>();
        ThreadLocalRandom rnd = ThreadLocalRandom.current();
        log("sending %d records/s x %d s (%d records of %d bytes) to %s on %s", rate, seconds, total, size, topic, source);
        long t0 = System.nanoTime(), lastLog = t0;
        int next = 0;
        while (next < total) {
            long elapsed = System.nanoTime() - t0;
            // Record i is due at t0 + i/rate s; send every record that is due (a burst per tick).
            int due = (int) Math.min(total, elapsed * rate / 1_000_000_000L + 1);
            while (next < due) {
                final int seq = next++;
                byte[] value = new byte[size];
                rnd.nextBytes(value);  // random padding: incompressible, like real payloads
                ByteBuffer.wrap(value).putLong(0, nonce).putLong(8, seq);
                long now = System.currentTimeMillis();
                sendMs[seq] = now;
                producer.send(new ProducerRecord<>(topic, null, now, null, value), (md, ex) -> {
                    if (ex == null) ackMs[seq] = System.currentTimeMillis();
                    else if (sendErrors.incrementAndGet() == 1) firstError.set(ex);
                });
            }
            if (next < total) {
                long wait = t0 + (long) next * 1_000_000_000L / rate - System.nanoTime();
                if (wait > 0) LockSupport.parkNanos(Math.min(wait, 1_000_000L));
            }
            if (System.nanoTime() - lastLog > 5_000_000_000L) {
                lastLog = System.nanoTime();
                log("sent %d/%d, seen on target %d", next, total, seen);
            }
        }
        long sendNanos = System.nanoTime() - t0;
        producer.flush();  // all callbacks have run once flush returns
        producer.close(Duration.ofSeconds(5));
        if (sendErrors.get() > 0) die(1, "%d sends failed, first: %s", sendErrors.get(), firstError.get());
        double sentRate = total > 1 ? (total - 1) * 1e9 / Math.max(1, sendNanos) : total;

        // 3. Drain: every record, warm-up included, must arrive on the target.
        long drainEnd = System.nanoTime() + drainSeconds * 1_000_000_000L;
        lastLog = System.nanoTime();
        while (seen < total && System.nanoTime() < drainEnd) {
            Thread.sleep(20);
            if (System.nanoTime() - lastLog > 5_000_000_000L) {
                lastLog = System.nanoTime();
                log("draining: seen %d/%d", seen, total);
            }
        }
        stopConsumer = true;
        int seenNow = seen;
        if (seenNow < total) {
            int firstMissing = 0;
            while (firstMissing < total - 1 && targetTs[firstMissing] != 0) firstMissing++;
            die(1, "%d of %d records missing on the target after a %d s drain (first missing seq %d)",
                total - seenNow, total, drainSeconds, firstMissing);
        }
        consumerThread.join(3000);

        // 4. Statistics over the records sent after the warm-up.
        int warm = (int) Math.min(total, (long) warmupSeconds * rate);
        int n = total - warm;
        // The source append time is taken as the moment the source acknowledged the record
        // (acks=1: the leader answers right after appending; a CreateTime topic keeps no append
        // time, and a LogAppendTime source would change what a replicator does with the
        // batches). The send-based figures add the source's own produce latency on top.
        long[] lat = new long[n], prod = new long[n], fromSend = new long[n];
        double sum = 0;
        for (int i = warm; i < total; i++) {
            lat[i - warm] = targetTs[i] - ackMs[i];
            fromSend[i - warm] = targetTs[i] - sendMs[i];
            prod[i - warm] = ackMs[i] - sendMs[i];
            sum += lat[i - warm];
        }
        Arrays.sort(lat);
        Arrays.sort(prod);
        Arrays.sort(fromSend);
        log("done: %d records (%d warm-up excluded), %d duplicates on the target, min latency %d ms", total, warm, dups, lat[0]);
        SUMMARY.printf(Locale.ROOT,
            "latency records=%d p50=%d p90=%d p99=%d p999=%d max=%d mean=%.1f send_p50=%d send_p99=%d send_max=%d produce_p50=%d produce_p99=%d sent_rate=%.1f%n",
            n, pct(lat, 0.50), pct(lat, 0.90), pct(lat, 0.99), pct(lat, 0.999), lat[n - 1], sum / n,
            pct(fromSend, 0.50), pct(fromSend, 0.99), fromSend[n - 1],
            pct(prod, 0.50), pct(prod, 0.99), sentRate);
        SUMMARY.flush();
        System.exit(0);
    }

    private static void consumeLoop(KafkaConsumer<byte[], byte[]> consumer) {
        try {
            while (!stopConsumer) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(100))) {
                    // Without LogAppendTime the timestamp is just our own send time copied over,
                    // and every "latency" would be 0: refuse to report anything in that case.
                    if (r.timestampType() != TimestampType.LOG_APPEND_TIME)
                        die(2, "record %s-%d@%d on the target has timestamp type %s, not LogAppendTime: start the "
                            + "target with log.message.timestamp.type=LogAppendTime (and do not let the replicator set "
                            + "message.timestamp.type on the remote topic)", r.topic(), r.partition(), r.offset(), r.timestampType());
                    byte[] v = r.value();
                    if (v == null || v.length < 16) continue;
                    ByteBuffer b = ByteBuffer.wrap(v);
                    long seq = b.getLong(8);
                    if (b.getLong(0) != nonce || seq < 0 || seq >= total) continue;  // another run's record
                    if (targetTs[(int) seq] != 0) { dups++; continue; }  // at-least-once redelivery: keep the first
                    targetTs[(int) seq] = readCommitted ? System.currentTimeMillis() : r.timestamp();
                    seen++;  // single writer, so ++ on the volatile is safe
                }
            }
        } catch (Exception e) {
            if (!stopConsumer) die(1, "target consumer failed: %s", e);
        } finally {
            consumer.close();
        }
    }

    private static List<TopicPartition> waitForTopic(KafkaConsumer<?, ?> c, String topic, int timeoutSeconds) throws InterruptedException {
        long end = System.nanoTime() + timeoutSeconds * 1_000_000_000L;
        while (true) {
            try {
                List<PartitionInfo> infos = c.listTopics(Duration.ofSeconds(5)).get(topic);
                if (infos != null && !infos.isEmpty()) {
                    List<TopicPartition> parts = new ArrayList<>();
                    for (PartitionInfo p : infos) parts.add(new TopicPartition(topic, p.partition()));
                    return parts;
                }
            } catch (org.apache.kafka.common.errors.TimeoutException e) {
                log("target not answering yet: %s", e.getMessage());
            }
            if (System.nanoTime() > end) die(1, "topic %s does not exist on the target after %d s", topic, timeoutSeconds);
            Thread.sleep(250);
        }
    }

    private static Properties consumerProps(String bootstrap) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "latency-probe-target");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.FETCH_MIN_BYTES_CONFIG, "1");
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, readCommitted ? "read_committed" : "read_uncommitted");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");  // no group: assign() only
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.ALLOW_AUTO_CREATE_TOPICS_CONFIG, "false");
        return p;
    }

    private static Properties producerProps(String bootstrap) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, "latency-probe-source");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.ACKS_CONFIG, "1");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "0");
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "none");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");  // idempotence requires acks=all
        return p;
    }

    /** Nearest-rank percentile of a sorted array. */
    private static long pct(long[] sorted, double q) {
        int rank = (int) Math.ceil(q * sorted.length);
        return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1];
    }

    private static Map<String, String> parseArgs(String[] argv) {
        Set<String> known = Set.of("source", "target", "topic", "remote-topic", "rate", "seconds", "size",
            "drain-seconds", "warmup-seconds", "isolation");
        Map<String, String> m = new HashMap<>();
        for (int i = 0; i < argv.length; i += 2) {
            String k = argv[i].startsWith("--") ? argv[i].substring(2) : "";
            if (!known.contains(k) || i + 1 >= argv.length) die(2, "bad argument %s (known: --%s, each with a value)", argv[i], String.join(" --", known));
            m.put(k, argv[i + 1]);
        }
        return m;
    }

    private static String req(Map<String, String> a, String k) {
        String v = a.get(k);
        if (v == null || v.isEmpty()) die(2, "--%s is required", k);
        return v;
    }

    private static int num(Map<String, String> a, String k, int dflt) {
        try { return a.containsKey(k) ? Integer.parseInt(a.get(k)) : dflt; }
        catch (NumberFormatException e) { die(2, "--%s wants an integer, got %s", k, a.get(k)); return 0; }
    }

    private static void log(String fmt, Object... args) {
        System.err.println("latency-probe: " + String.format(Locale.ROOT, fmt, args));
    }

    private static void die(int code, String fmt, Object... args) {
        System.err.println("latency-probe: ERROR: " + String.format(Locale.ROOT, fmt, args));
        System.err.flush();
        System.exit(code);
    }
}
