// Load - writes a benchmark backlog with one Java producer on default settings.
// Single-file source program (Java 17, Kafka client jars on the classpath):
//
//   java -cp "$(bash scripts/kafka/kafka-harness.sh classpath)" bench/Load.java \
//     --bootstrap HOST:PORT --topics t1,t2,... --records N --size BYTES \
//     [--keys K] [--compression none|gzip|snappy|lz4|zstd] [--linger-ms MS] [--create-partitions P]
//     [--every-partition P] [--schema-id ID]
//
// Why not the perf test: it writes one topic per JVM and never sets a key. Here one producer
// writes record i to topic i % topics, like an application feeding many topics at once, with
// the Java producer's defaults (batch.size 16384, linger.ms 5, acks=all) unless told otherwise.
// Without --keys (or --keys 0) records have no key, so the default partitioner fills one batch
// per topic at a time, as the perf test does; with --keys K every record gets one of K keys, so
// records spread over every partition and batches stay small, as they do in a busy keyed
// application. Values are random upper-case letters, as the perf test's payloads are. The
// producer is not idempotent (see below).
// --create-partitions P first creates the topics with P partitions each (replication factor 1)
// and waits until each partition's log exists (it answers ListOffsets); with --records 0 it
// only does that.
// --schema-id ID starts every value with the Confluent wire format naming schema ID (a zero
// byte, then ID in 4 bytes), as a Schema Registry serializer writes it; the rest stays random.
// --every-partition P writes record i to partition (i / topics) % P of its topic, so each of the
// P partitions of every topic gets the same share (records / (topics x P)), as a user seeding
// a test cluster partition by partition does; it overrides the key's partition.
// Prints "N records sent in T ms (R records/s, M MB/s)". Exit 0 done, 1 a send failed, 2 bad
// arguments.
import java.util.*;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class Load {
    public static void main(String[] argv) throws Exception {
        Map<String, String> a = new HashMap<>();
        for (int i = 0; i + 1 < argv.length; i += 2) {
            if (!argv[i].startsWith("--")) fail(2, "unexpected argument " + argv[i]);
            a.put(argv[i].substring(2), argv[i + 1]);
        }
        for (String k : List.of("bootstrap", "topics", "records", "size"))
            if (!a.containsKey(k))
                fail(2, "missing --" + k + "; usage: --bootstrap HOST:PORT --topics T1,T2 --records N --size BYTES"
                        + " [--keys K] [--compression C] [--linger-ms MS]");
        String[] topics = a.get("topics").split(",");
        long records = Long.parseLong(a.get("records"));
        int size = Integer.parseInt(a.get("size"));
        int keys = Integer.parseInt(a.getOrDefault("keys", "0"));
        int every = Integer.parseInt(a.getOrDefault("every-partition", "0"));
        if (a.containsKey("create-partitions")) {
            int partitions = Integer.parseInt(a.get("create-partitions"));
            Properties ap = new Properties();
            ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
            try (Admin admin = Admin.create(ap)) {
                // A KRaft controller refuses one request of more than 10,000 metadata records
                // (one per partition): create in chunks.
                List<NewTopic> create = new ArrayList<>();
                int metadataRecords = 0;
                for (String t : topics) {
                    if (!create.isEmpty() && metadataRecords + partitions + 1 > 5000) {
                        admin.createTopics(create).all().get(120, TimeUnit.SECONDS);
                        create.clear();
                        metadataRecords = 0;
                    }
                    create.add(new NewTopic(t, partitions, (short) 1));
                    metadataRecords += partitions + 1;
                }
                admin.createTopics(create).all().get(120, TimeUnit.SECONDS);
                // A broker creates partition logs one by one (about 40 a second here), after
                // the metadata already names a leader: wait until every partition answers
                // ListOffsets (its log exists), so what follows measures copying only.
                Map<TopicPartition, OffsetSpec> all = new HashMap<>();
                for (String t : topics)
                    for (int p = 0; p < partitions; p++) all.put(new TopicPartition(t, p), OffsetSpec.latest());
                long deadline = System.currentTimeMillis() + 300_000;
                while (true) {
                    try {
                        admin.listOffsets(all).all().get(60, TimeUnit.SECONDS);
                        break;
                    } catch (java.util.concurrent.ExecutionException e) {
                        if (System.currentTimeMillis() > deadline)
                            fail(1, "partitions still without a log after 300 s: " + e.getCause());
                        Thread.sleep(200);
                    }
                }
            }
            if (records == 0) {
                System.out.println("created " + topics.length + " topics of " + partitions + " partitions");
                return;
            }
        }
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, a.getOrDefault("compression", "none"));
        if (a.containsKey("linger-ms")) p.put(ProducerConfig.LINGER_MS_CONFIG, a.get("linger-ms"));
        // Not idempotent: on this 2-core machine, compressed loads over hundreds of partitions
        // made the Java 4.4 idempotent producer resend a partition's first sequence after the
        // broker had moved on (OUT_OF_ORDER_SEQUENCE_NUMBER until delivery.timeout.ms). A retry
        // may now duplicate a batch; the benchmark waits for at least --records, so that is
        // harmless here.
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        Random rnd = new Random(7);
        // A pool of payloads, so building values does not limit the rate measured.
        byte[][] values = new byte[1024][size];
        for (byte[] v : values) for (int i = 0; i < size; i++) v[i] = (byte) ('A' + rnd.nextInt(26));
        if (a.containsKey("schema-id")) {
            // The Confluent wire format: a zero byte and the 4-byte schema id, then the body.
            int id = Integer.parseInt(a.get("schema-id"));
            if (size < 5) fail(2, "--schema-id needs --size of at least 5");
            for (byte[] v : values) {
                v[0] = 0;
                v[1] = (byte) (id >>> 24);
                v[2] = (byte) (id >>> 16);
                v[3] = (byte) (id >>> 8);
                v[4] = (byte) id;
            }
        }
        AtomicLong acked = new AtomicLong();
        AtomicReference<Exception> failed = new AtomicReference<>();
        long t0 = System.currentTimeMillis();
        try (Producer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            for (long i = 0; i < records && failed.get() == null; i++) {
                byte[] key = keys > 0 ? ("key-" + rnd.nextInt(keys)).getBytes() : null;
                String topic = topics[(int) (i % topics.length)];
                Integer partition = every > 0 ? (int) ((i / topics.length) % every) : null;
                ProducerRecord<byte[], byte[]> r =
                        new ProducerRecord<>(topic, partition, key, values[(int) (i % values.length)]);
                producer.send(r, (md, e) -> {
                    if (e != null) failed.compareAndSet(null, e);
                    else acked.incrementAndGet();
                });
            }
            producer.flush();
        }
        if (failed.get() != null) fail(1, "a send failed after " + acked.get() + " records: " + failed.get());
        long ms = Math.max(1, System.currentTimeMillis() - t0);
        System.out.printf("%d records sent in %d ms (%.0f records/s, %.1f MB/s)%n",
                acked.get(), ms, acked.get() * 1000.0 / ms, acked.get() * (double) size / 1000.0 / ms);
    }

    private static void fail(int code, String msg) {
        System.err.println("Load: " + msg);
        System.exit(code);
    }
}
