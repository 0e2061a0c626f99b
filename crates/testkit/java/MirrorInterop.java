// MirrorMaker 2's own Java classes (connect-mirror, connect-mirror-client), driven from the
// tests to prove kmirror's byte compatibility: run with the harness's MM2 classpath as a
// single-file program (java -cp "<mm2-libs>/*" MirrorInterop.java MODE ...).
//
//   encode                          Heartbeat, Checkpoint and OffsetSync bytes, as hex lines
//   decode TYPE KEYHEX VALUEHEX     the fields Java reads from bytes kmirror wrote
//   translate BOOTSTRAP ALIAS GROUP RemoteClusterUtils.translateOffsets, one line per partition

import java.lang.reflect.Method;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.TreeMap;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.connect.mirror.Checkpoint;
import org.apache.kafka.connect.mirror.Heartbeat;
import org.apache.kafka.connect.mirror.OffsetSync;
import org.apache.kafka.connect.mirror.RemoteClusterUtils;

public class MirrorInterop {
    static String hex(byte[] b) {
        StringBuilder s = new StringBuilder();
        for (byte x : b) s.append(String.format("%02x", x));
        return s.toString();
    }

    static byte[] unhex(String h) {
        byte[] b = new byte[h.length() / 2];
        for (int i = 0; i < b.length; i++) b[i] = (byte) Integer.parseInt(h.substring(2 * i, 2 * i + 2), 16);
        return b;
    }

    // recordKey()/recordValue() are package-private: the bytes MM2 writes, reached reflectively.
    static String bytes(Object o) throws Exception {
        Method k = o.getClass().getDeclaredMethod("recordKey");
        Method v = o.getClass().getDeclaredMethod("recordValue");
        k.setAccessible(true);
        v.setAccessible(true);
        return hex((byte[]) k.invoke(o)) + " " + hex((byte[]) v.invoke(o));
    }

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "encode" -> {
                System.out.println("heartbeat " + bytes(new Heartbeat("source-1", "target-2", 1234567890L)));
                System.out.println("heartbeat " + bytes(new Heartbeat("é-ü", "B", -1L)));
                System.out.println("checkpoint " + bytes(new Checkpoint("group1", new TopicPartition("A.topic1", 3), 100L, 95L, "")));
                System.out.println("checkpoint " + bytes(new Checkpoint("g", new TopicPartition("t", 0), 1L << 40, 7L, "meta")));
                System.out.println("offsetsync " + bytes(new OffsetSync(new TopicPartition("topic1", 3), 100L, 95L)));
                System.out.println("offsetsync " + bytes(new OffsetSync(new TopicPartition("x", 2147483647), 0L, 0L)));
            }
            case "decode" -> {
                ConsumerRecord<byte[], byte[]> r = new ConsumerRecord<>("t", 0, 0L, unhex(args[2]), unhex(args[3]));
                switch (args[1]) {
                    case "heartbeat" -> {
                        Heartbeat h = Heartbeat.deserializeRecord(r);
                        System.out.println(h.sourceClusterAlias() + "|" + h.targetClusterAlias() + "|" + h.timestamp());
                    }
                    case "checkpoint" -> {
                        Checkpoint c = Checkpoint.deserializeRecord(r);
                        System.out.println(c.consumerGroupId() + "|" + c.topicPartition() + "|" + c.upstreamOffset() + "|"
                            + c.downstreamOffset() + "|" + c.metadata());
                    }
                    case "offsetsync" -> {
                        OffsetSync s = OffsetSync.deserializeRecord(r);
                        System.out.println(s.topicPartition() + "|" + s.upstreamOffset() + "|" + s.downstreamOffset());
                    }
                    default -> throw new IllegalArgumentException(args[1]);
                }
            }
            case "translate" -> {
                Map<String, Object> props = new HashMap<>();
                props.put("bootstrap.servers", args[1]);
                Map<TopicPartition, OffsetAndMetadata> m =
                    RemoteClusterUtils.translateOffsets(props, args[2], args[3], Duration.ofSeconds(30));
                Map<String, Long> sorted = new TreeMap<>();
                m.forEach((tp, om) -> sorted.put(tp.topic() + " " + tp.partition(), om.offset()));
                sorted.forEach((k, v) -> System.out.println(k + " " + v));
            }
            default -> throw new IllegalArgumentException(args[0]);
        }
    }
}
