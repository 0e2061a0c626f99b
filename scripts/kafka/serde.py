#!/usr/bin/env python3
"""Avro records through a real serializer: Confluent's Python client (confluent-kafka, from PyPI)
with its Schema Registry serializers, the way a producer and a consumer of a real deployment
write and read them (the Confluent wire format: a zero byte, the schema id, the Avro data).

  serde.py produce --bootstrap HOST:PORT --registry URL --topic T --schema FILE.avsc
                   [--key-schema FILE.avsc] --count N [--start K] [--partitions P]
      writes records {"id": K..K+N-1, "name": "record-<id>", ...} (fields the schema has beyond
      those take their defaults), the key the id as a string, or, with --key-schema, an Avro
      record {"id": <id>}; record i goes to partition i % P.
  serde.py consume --bootstrap HOST:PORT --registry URL --topic T --count N [--timeout S]
  (both take --client-config FILE: a Java client properties file's security keys, SASL
   PLAIN/SCRAM as the harness writes them)
      reads N records from the start and prints one JSON line each: partition, offset, key,
      value, and the schema ids the key and value carry; exits 1 with fewer within S seconds.

Run through `kafka-harness.sh serde ...`, which keeps the client in a virtualenv in the cache.
"""

import argparse
import json
import re
import struct
import sys
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext, StringSerializer


def schema_id(payload):
    if payload is None or len(payload) < 5 or payload[0] != 0:
        return None
    return struct.unpack(">I", payload[1:5])[0]


# Subjects named after the topic (`<topic>-key`, `<topic>-value`), as producers have always named
# them. The client's default looks subjects up through an "associations" API first, which not
# every registry serves (Apicurio's ccompat API can leave that request unanswered).
SERDE_CONF = {"subject.name.strategy.type": "TOPIC"}


def client_settings(a):
    """The Kafka connection: --bootstrap, plus the security keys of a Java client file
    (--client-config, as the harness writes them: security.protocol, SASL PLAIN or SCRAM through
    sasl.jaas.config) in librdkafka's names."""
    conf = {"bootstrap.servers": a.bootstrap}
    if not a.client_config:
        return conf
    props = {}
    with open(a.client_config) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                props[k.strip()] = v.strip()
    if "security.protocol" in props:
        conf["security.protocol"] = props["security.protocol"]
    if "sasl.mechanism" in props:
        conf["sasl.mechanism"] = props["sasl.mechanism"]
    jaas = props.get("sasl.jaas.config", "")
    for key, name in (("sasl.username", "username"), ("sasl.password", "password")):
        m = re.search(name + r'="([^"]*)"', jaas)
        if m:
            conf[key] = m.group(1)
    return conf


def registry_client(url):
    return SchemaRegistryClient({"url": url, "timeout": 30})


def produce(a):
    registry = registry_client(a.registry)
    with open(a.schema) as f:
        value_ser = AvroSerializer(registry, f.read(), conf=SERDE_CONF)
    key_ser = StringSerializer()
    if a.key_schema:
        with open(a.key_schema) as f:
            key_ser = AvroSerializer(registry, f.read(), conf=SERDE_CONF)
    p = Producer({**client_settings(a), "linger.ms": 5, "acks": "all"})
    failed = []
    for i in range(a.start, a.start + a.count):
        key = {"id": i} if a.key_schema else str(i)
        value = {"id": i, "name": f"record-{i}"}
        p.produce(
            a.topic,
            key=key_ser(key, SerializationContext(a.topic, MessageField.KEY)),
            value=value_ser(value, SerializationContext(a.topic, MessageField.VALUE)),
            partition=i % a.partitions,
            on_delivery=lambda err, _msg: err and failed.append(str(err)),
        )
        p.poll(0)
    left = p.flush(60)
    if left or failed:
        print(f"serde.py: {left} records undelivered, errors: {failed[:3]}", file=sys.stderr)
        return 1
    return 0


def consume(a):
    registry = registry_client(a.registry)
    value_de = AvroDeserializer(registry, conf=SERDE_CONF)
    key_de = AvroDeserializer(registry, conf=SERDE_CONF)
    c = Consumer(
        {
            **client_settings(a),
            "group.id": f"serde-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([a.topic])
    got = 0
    deadline = time.time() + a.timeout
    try:
        while got < a.count and time.time() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                print(f"serde.py: {m.error()}", file=sys.stderr)
                continue
            key = m.key()
            key_id = schema_id(key)
            if key_id is not None:
                key = key_de(key, SerializationContext(a.topic, MessageField.KEY))
            else:
                key = key.decode() if key is not None else None
            value = value_de(m.value(), SerializationContext(a.topic, MessageField.VALUE))
            print(
                json.dumps(
                    {
                        "partition": m.partition(),
                        "offset": m.offset(),
                        "key": key,
                        "value": value,
                        "key_schema_id": key_id,
                        "value_schema_id": schema_id(m.value()),
                    },
                    sort_keys=True,
                ),
                flush=True,
            )
            got += 1
    finally:
        c.close()
    if got < a.count:
        print(f"serde.py: {got} of {a.count} records within {a.timeout} s", file=sys.stderr)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description="Avro records through Confluent's serializers")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("produce", "consume"):
        s = sub.add_parser(name)
        s.add_argument("--bootstrap", required=True)
        s.add_argument("--registry", required=True)
        s.add_argument("--topic", required=True)
        s.add_argument("--count", type=int, required=True)
        s.add_argument("--client-config", help="a Java client properties file (security keys)")
    pp = sub.choices["produce"]
    pp.add_argument("--schema", required=True)
    pp.add_argument("--key-schema")
    pp.add_argument("--start", type=int, default=0)
    pp.add_argument("--partitions", type=int, default=1)
    sub.choices["consume"].add_argument("--timeout", type=float, default=60)
    a = ap.parse_args()
    return produce(a) if a.cmd == "produce" else consume(a)


if __name__ == "__main__":
    sys.exit(main())
