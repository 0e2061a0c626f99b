#!/usr/bin/env python3
"""Topics and records through librdkafka (Confluent's Python client), as a user of a non-Java
client makes them: the admin client creates the topics a few per CreateTopics request and returns
as soon as the controller accepted them (it does not wait for the partitions' logs), then one
producer writes a number of records into every partition by number.

  rdkafka_load.py --bootstrap HOST:PORT --topics T1,T2,... [--create-partitions P]
                  [--per-request N] [--every-partition P --per-partition R] [--size B]
                  [--linger-ms MS] [--compression none|gzip|snappy|lz4|zstd]

Prints one line: "created N topics in S s; wrote R records in S s". Exit 1 on any error (a topic
that exists already counts as an error: the shape under test is a fresh cluster).

Run through `kafka-harness.sh rdkafka-load ...`, which keeps the client in a virtualenv.
"""

import argparse
import sys
import time

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def listed(admin, topics, partitions, timeout=300):
    """Waits until the broker's metadata lists every topic with a leader for each partition (a
    producer told a topic is unknown refuses it for a while)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        md = admin.list_topics(timeout=30)
        ready = all(
            t in md.topics
            and md.topics[t].error is None
            and len(md.topics[t].partitions) == partitions
            and all(p.leader >= 0 for p in md.topics[t].partitions.values())
            for t in topics
        )
        if ready:
            return
        time.sleep(0.5)
    sys.exit(f"rdkafka_load: topics not listed with leaders within {timeout} s")


def create(admin, topics, partitions, per_request):
    for i in range(0, len(topics), per_request):
        chunk = [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics[i : i + per_request]]
        for name, fut in admin.create_topics(chunk, request_timeout=120).items():
            try:
                fut.result(timeout=180)
            except Exception as e:  # noqa: BLE001 - every failure ends the run
                sys.exit(f"rdkafka_load: creating {name} failed: {e}")


def produce(bootstrap, topics, partitions, per_partition, size, linger_ms, compression):
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": linger_ms,
            "compression.type": compression,
            # A fresh partition answers NOT_LEADER until its log exists: librdkafka retries.
            "message.timeout.ms": 300000,
        }
    )
    value = b"x" * size
    # (topic, partition) -> records still to write; a topic the broker does not list yet fails
    # its records at once (UNKNOWN_TOPIC_OR_PART), and they are written again, as a user would.
    todo = {(t, part): per_partition for t in topics for part in range(partitions)}
    written = 0
    for _ in range(20):
        failed = []

        def report(err, msg, failed=failed):
            if err is not None:
                failed.append((msg.topic(), msg.partition(), err))

        for _ in range(max(todo.values(), default=0)):
            for (t, part), n in todo.items():
                if n <= 0:
                    continue
                while True:
                    try:
                        p.produce(t, value=value, partition=part, on_delivery=report)
                        todo[(t, part)] = n - 1
                        break
                    except BufferError:
                        p.poll(0.05)
                    except KafkaException:  # a topic this producer was told is unknown
                        break
            p.poll(0)
        left = p.flush(300)
        if left:
            sys.exit(f"rdkafka_load: {left} records unsent after 300 s")
        for t, part, _ in failed:
            todo[(t, part)] += 1
        if any(todo.values()) and not failed:
            failed.append(("?", -1, "refused locally"))
        written = sum(per_partition for _ in todo) - sum(todo.values())
        if not failed:
            return written
        time.sleep(1)
    sys.exit(f"rdkafka_load: records still failing after 20 rounds: {failed[:3]}")


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--bootstrap", required=True)
    a.add_argument("--topics", required=True)
    a.add_argument("--create-partitions", type=int)
    a.add_argument("--per-request", type=int, default=10)
    a.add_argument("--every-partition", type=int)
    a.add_argument("--per-partition", type=int, default=0)
    a.add_argument("--size", type=int, default=100)
    a.add_argument("--linger-ms", type=int, default=50)
    a.add_argument("--compression", default="none")
    o = a.parse_args()
    topics = o.topics.split(",")
    admin = AdminClient({"bootstrap.servers": o.bootstrap})
    t0 = time.time()
    if o.create_partitions:
        create(admin, topics, o.create_partitions, o.per_request)
    t1 = time.time()
    written = 0
    if o.per_partition:
        parts = o.every_partition or o.create_partitions
        listed(admin, topics, parts)
        written = produce(o.bootstrap, topics, parts, o.per_partition, o.size, o.linger_ms, o.compression)
    t2 = time.time()
    print(f"created {len(topics) if o.create_partitions else 0} topics in {t1 - t0:.1f} s; wrote {written} records in {t2 - t1:.1f} s")


if __name__ == "__main__":
    main()
