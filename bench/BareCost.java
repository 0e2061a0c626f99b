// BareCost - what a target broker itself needs before records land in partitions just created:
// creates topics the way kmirror creates remote topics (at most 100 topics and 5,000 partitions
// per CreateTopics request, not waiting for the logs), then at once sends one record into every
// partition with a plain Java producer (acks=all; it retries NOT_LEADER_OR_FOLLOWER until the
// partition's log exists). No replicator is involved, so its times are the floor for any.
//
//   java -cp "$(bash scripts/kafka/kafka-harness.sh classpath)" bench/BareCost.java \
//     --bootstrap HOST:PORT --topics T1,T2 --partitions P
//
// Prints "bare first_s=<first record acknowledged> last_s=<every partition holds one> created_s=<creation
// requests answered>", seconds from the first CreateTopics request. Exit 1 when a record fails.
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class BareCost {
    public static void main(String[] argv) throws Exception {
        Map<String, String> a = new HashMap<>();
        for (int i = 0; i + 1 < argv.length; i += 2) a.put(argv[i].substring(2), argv[i + 1]);
        String bootstrap = a.get("bootstrap");
        List<String> topics = Arrays.asList(a.get("topics").split(","));
        int partitions = Integer.parseInt(a.get("partitions"));
        Properties ap = new Properties();
        ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        long t0 = System.nanoTime();
        List<KafkaFuture<Void>> pending = new ArrayList<>();
        try (Admin admin = Admin.create(ap)) {
            List<NewTopic> chunk = new ArrayList<>();
            int records = 0;
            for (String t : topics) {
                if (!chunk.isEmpty() && (chunk.size() >= 100 || records + partitions + 1 > 5000)) {
                    pending.add(admin.createTopics(chunk).all());
                    chunk = new ArrayList<>();
                    records = 0;
                }
                chunk.add(new NewTopic(t, partitions, (short) 1));
                records += partitions + 1;
            }
            pending.add(admin.createTopics(chunk).all());
            for (KafkaFuture<Void> f : pending) f.get(300, TimeUnit.SECONDS);
        }
        double created = (System.nanoTime() - t0) / 1e9;
        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "300000");
        pp.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "30000");
        pp.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "300000");
        AtomicLong first = new AtomicLong(0);
        AtomicReference<Exception> failed = new AtomicReference<>();
        int n = topics.size() * partitions;
        CountDownLatch done = new CountDownLatch(n);
        byte[] value = new byte[100];
        try (Producer<byte[], byte[]> p = new KafkaProducer<>(pp, new ByteArraySerializer(), new ByteArraySerializer())) {
            for (String t : topics)
                for (int i = 0; i < partitions; i++)
                    p.send(new ProducerRecord<>(t, i, null, value), (md, e) -> {
                        if (e != null) failed.compareAndSet(null, e);
                        else first.compareAndSet(0, System.nanoTime());
                        done.countDown();
                    });
            if (!done.await(300, TimeUnit.SECONDS)) fail("not every record acknowledged in 300 s");
        }
        if (failed.get() != null) fail("a record failed: " + failed.get());
        double last = (System.nanoTime() - t0) / 1e9;
        System.out.printf("bare first_s=%.1f last_s=%.1f created_s=%.1f%n", (first.get() - t0) / 1e9, last, created);
    }

    static void fail(String why) {
        System.err.println("BareCost: " + why);
        System.exit(1);
    }
}
