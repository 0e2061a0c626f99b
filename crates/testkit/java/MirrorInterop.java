// MirrorMaker 2's own Java classes (connect-mirror, connect-mirror-client), driven from the
// tests to prove kmirror's byte compatibility: run with the harness's MM2 classpath as a
// single-file program (java -cp "<mm2-libs>/*" MirrorInterop.java MODE ...).
//
//   encode                          Heartbeat, Checkpoint and OffsetSync bytes, as hex lines
//   decode TYPE KEYHEX VALUEHEX     the fields Java reads from bytes kmirror wrote
//   position CLUSTER TOPIC PARTITION OFFSET
//                                   the key and value bytes Connect stores for MirrorSourceTask's
//                                   source position (MirrorUtils + the worker's JsonConverter)
//   translate BOOTSTRAP ALIAS GROUP RemoteClusterUtils.translateOffsets, one line per partition
//   regex FILE                      java.util.regex on a sample: FILE holds blocks of one line
//                                   "P <hex pattern>" then lines "S <hex subject>"; per pattern one
//                                   line, "ERR" if Pattern.compile refuses it, else one 0/1 per
//                                   subject for Matcher.matches() (how MM2's filters match names)

import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Pattern;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.TreeMap;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.connect.mirror.Checkpoint;
import org.apache.kafka.connect.mirror.Heartbeat;
import org.apache.kafka.connect.mirror.OffsetSync;
import org.apache.kafka.connect.json.JsonConverter;
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
            case "position" -> {
                // MirrorUtils is package-private: its wrappers are what MirrorSourceTask hands to
                // Connect, which stores [connector name, partition map] -> offset map through a
                // JsonConverter without schemas (the worker's internal converter).
                Class<?> u = Class.forName("org.apache.kafka.connect.mirror.MirrorUtils");
                Method wp = u.getDeclaredMethod("wrapPartition", TopicPartition.class, String.class);
                Method wo = u.getDeclaredMethod("wrapOffset", long.class);
                wp.setAccessible(true);
                wo.setAccessible(true);
                Object partition = wp.invoke(null, new TopicPartition(args[2], Integer.parseInt(args[3])), args[1]);
                Object offset = wo.invoke(null, Long.parseLong(args[4]));
                JsonConverter keys = new JsonConverter();
                keys.configure(Map.of("schemas.enable", "false"), true);
                JsonConverter values = new JsonConverter();
                values.configure(Map.of("schemas.enable", "false"), false);
                byte[] k = keys.fromConnectData("", null, Arrays.asList("MirrorSourceConnector", partition));
                byte[] v = values.fromConnectData("", null, offset);
                System.out.println("position " + hex(k) + " " + hex(v));
            }
            case "regex" -> {
                List<String> lines = Files.readAllLines(Path.of(args[1]), StandardCharsets.UTF_8);
                StringBuilder out = new StringBuilder();
                Pattern current = null;
                boolean open = false;
                for (String line : lines) {
                    String text = new String(unhex(line.substring(2)), StandardCharsets.UTF_8);
                    if (line.startsWith("P ")) {
                        if (open) out.append('\n');
                        open = true;
                        try {
                            current = Pattern.compile(text);
                        } catch (Exception e) {
                            // PatternSyntaxException, and StackOverflowError is not an Exception:
                            // a pattern Java itself cannot compile fails the whole run loudly.
                            current = null;
                            out.append("ERR");
                        }
                    } else if (current != null) {
                        out.append(current.matcher(text).matches() ? '1' : '0');
                    }
                }
                if (open) out.append('\n');
                System.out.print(out);
            }
            default -> throw new IllegalArgumentException(args[0]);
        }
    }
}
