// WaitEnds - waits until topics on a cluster hold a number of records, for the benchmark.
// Single-file source program (Java 17, Kafka client jars on the classpath):
//
//   java -cp "$(bash scripts/kafka/kafka-harness.sh classpath)" bench/WaitEnds.java \
//     --bootstrap HOST:PORT --topics A.plain,A.lz4 --records N [--timeout-seconds 900]
//
// Polls the sum of the topics' end offsets every 100 ms with one admin client (a JVM start per
// look, as with the get-offsets tool, would cost 1-2 s and blur the wall times measured), and
// prints "done first_ms=<when the first record was there> epoch_ms=<when the sum first reached N>"
// on stdout (Unix milliseconds); with --baseline B the first record is the first beyond B (the
// topics held B before, e.g. before a restart). Topics that do not exist yet count as 0. Exit 0 done, 1 timeout (with the count reached), 2 bad arguments.
//
// With --positions-topic T --source-topics S1,S2 it counts instead what the source positions
// stored in T (MM2's Connect offsets topic, read read_committed) say is copied: the sum over the
// source topics' partitions of position + 1. An exactly-once replicator commits positions with
// their data, so this is when a read_committed reader can see every record; end offsets would
// count transaction markers and aborted batches as records.
import java.util.*;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.TopicPartition;

public class WaitEnds {
    public static void main(String[] argv) throws Exception {
        Map<String, String> a = new HashMap<>();
        for (int i = 0; i + 1 < argv.length; i += 2) {
            if (!argv[i].startsWith("--")) fail(2, "unexpected argument " + argv[i]);
            a.put(argv[i].substring(2), argv[i + 1]);
        }
        if (!a.containsKey("bootstrap") || !a.containsKey("topics") || !a.containsKey("records"))
            fail(2, "usage: --bootstrap HOST:PORT --topics T1,T2 --records N [--timeout-seconds S]");
        List<String> topics = Arrays.asList(a.get("topics").split(","));
        long want = Long.parseLong(a.get("records"));
        long deadline = System.currentTimeMillis() + 1000L * Long.parseLong(a.getOrDefault("timeout-seconds", "900"));
        if (a.containsKey("positions-topic")) {
            waitPositions(a.get("bootstrap"), a.get("positions-topic"),
                new HashSet<>(Arrays.asList(a.getOrDefault("source-topics", "").split(","))), want, deadline);
            return;
        }
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "5000");
        long have = 0, first = 0, baseline = Long.parseLong(a.getOrDefault("baseline", "0"));
        try (Admin admin = Admin.create(p)) {
            List<TopicPartition> parts = new ArrayList<>();
            while (System.currentTimeMillis() < deadline) {
                if (parts.isEmpty() || parts.stream().map(TopicPartition::topic).distinct().count() < topics.size()) {
                    parts = partitions(admin, topics);
                }
                if (!parts.isEmpty()) {
                    Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
                    for (TopicPartition tp : parts) latest.put(tp, OffsetSpec.latest());
                    // Partition by partition: while a target broker still creates logs, some
                    // partitions answer NOT_LEADER_OR_FOLLOWER, and one failed answer must not
                    // hide the records the others hold (the first record was seen only once
                    // every log existed). Bounded to 0.5 s a round, however many partitions
                    // have no log yet (the admin client retries those until its timeout), so
                    // the first record is seen at most that late.
                    ListOffsetsResult asked = admin.listOffsets(latest, new ListOffsetsOptions().timeoutMs(500));
                    boolean complete = true;
                    try {
                        asked.all().get(2, TimeUnit.SECONDS);
                    } catch (Exception e) {
                        complete = false; // no leader or no log yet somewhere: look again
                    }
                    have = 0;
                    for (TopicPartition tp : parts) {
                        KafkaFuture<ListOffsetsResult.ListOffsetsResultInfo> f = asked.partitionResult(tp);
                        if (f.isDone() && !f.isCompletedExceptionally()) have += f.get().offset();
                        else complete = false;
                    }
                    long now = System.currentTimeMillis();
                    if (have > baseline && first == 0) first = now;
                    if (have >= want && complete) {
                        System.out.println("done first_ms=" + (first == 0 ? now : first) + " epoch_ms=" + now);
                        return;
                    }
                }
                Thread.sleep(100);
            }
        }
        fail(1, "timed out with " + have + " of " + want + " records in " + topics);
    }

    private static final java.util.regex.Pattern KEY =
        java.util.regex.Pattern.compile("\\[\"MirrorSourceConnector\",\\{.*\"partition\":(\\d+).*\"topic\":\"([^\"]*)\"");
    private static final java.util.regex.Pattern VALUE = java.util.regex.Pattern.compile("\"offset\":(\\d+)");

    private static void waitPositions(String bootstrap, String topic, Set<String> sources, long want, long deadline)
            throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("isolation.level", "read_committed");
        p.put("enable.auto.commit", "false");
        // The replicator creates the topic (compacted): a metadata request must not create it first.
        p.put("allow.auto.create.topics", "false");
        p.put("key.deserializer", "org.apache.kafka.common.serialization.StringDeserializer");
        p.put("value.deserializer", "org.apache.kafka.common.serialization.StringDeserializer");
        Map<String, Long> positions = new HashMap<>();
        long have = 0, first = 0;
        try (var consumer = new org.apache.kafka.clients.consumer.KafkaConsumer<String, String>(p)) {
            boolean assigned = false;
            while (System.currentTimeMillis() < deadline) {
                if (!assigned) {
                    List<org.apache.kafka.common.PartitionInfo> infos = null;
                    try {
                        infos = consumer.partitionsFor(topic, java.time.Duration.ofSeconds(5));
                    } catch (org.apache.kafka.common.errors.TimeoutException e) {
                        // not there yet
                    }
                    if (infos == null || infos.isEmpty()) { Thread.sleep(100); continue; }
                    List<TopicPartition> parts = new ArrayList<>();
                    infos.forEach(i -> parts.add(new TopicPartition(topic, i.partition())));
                    consumer.assign(parts);
                    consumer.seekToBeginning(parts);
                    assigned = true;
                }
                for (var r : consumer.poll(java.time.Duration.ofMillis(100))) {
                    if (r.key() == null || r.value() == null) continue;
                    var k = KEY.matcher(r.key());
                    var v = VALUE.matcher(r.value());
                    if (k.find() && v.find() && sources.contains(k.group(2))) {
                        positions.put(k.group(2) + "-" + k.group(1), Long.parseLong(v.group(1)));
                    }
                }
                have = positions.values().stream().mapToLong(o -> o + 1).sum();
                long now = System.currentTimeMillis();
                if (have > 0 && first == 0) first = now;
                if (have >= want) {
                    System.out.println("done first_ms=" + first + " epoch_ms=" + now);
                    return;
                }
            }
        }
        fail(1, "timed out with positions covering " + have + " of " + want + " records in " + sources);
    }

    private static List<TopicPartition> partitions(Admin admin, List<String> topics) {
        List<TopicPartition> out = new ArrayList<>();
        for (String t : topics) {
            try {
                var d = admin.describeTopics(List.of(t)).allTopicNames().get(5, TimeUnit.SECONDS).get(t);
                d.partitions().forEach(pi -> out.add(new TopicPartition(t, pi.partition())));
            } catch (Exception e) {
                // not created yet
            }
        }
        return out;
    }

    private static void fail(int code, String msg) {
        System.err.println("WaitEnds: " + msg);
        System.exit(code);
    }
}
