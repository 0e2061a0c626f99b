#!/usr/bin/env python3
"""Records through a real serializer: Confluent's Python client (confluent-kafka, from PyPI) with
its Schema Registry serializers for Avro, Protobuf and JSON Schema, the way a producer and a
consumer of a real deployment write and read them (the Confluent wire format: a zero byte, the
schema id, for Protobuf the message indexes, then the data).

  serde.py produce --bootstrap HOST:PORT --registry URL --topic T --schema FILE
                   [--format avro|protobuf|json] [--key-schema FILE.avsc]
                   [--reference NAME=SUBJECT:VERSION ...] --count N [--start K] [--partitions P]
      writes records {"id": K..K+N-1, "name": "record-<id>", ...}; the key is the id as a string,
      or, with --key-schema (Avro only), an Avro record {"id": <id>}; record i goes to partition
      i % P.
      - avro: FILE is an .avsc; fields beyond those take their defaults.
      - protobuf: FILE is a .proto whose first message is the value; the .proto files beside it
        are its imports, compiled with grpcio-tools. Each import is registered as a subject of
        its own (named by its file), then the value's schema with references to them, all as
        .proto text; the serializer writes with the version registered last.
        A field of a message type gets {"id": <id>, "name": "<field>-<id>"} where it has those.
      - json: FILE is a JSON Schema; a property that is a "$ref" gets {"id": <id>, "name":
        "<property>-<id>"}. Each --reference names a subject registered beforehand that the
        schema's "$ref" NAME points to.
  serde.py consume --bootstrap HOST:PORT --registry URL --topic T --count N [--timeout S]
                   [--format avro|protobuf|json] [--schema FILE.proto (protobuf)]
  (both take --client-config FILE: a Java client properties file's security keys, SASL
   PLAIN/SCRAM as the harness writes them)
      reads N records from the start and prints one JSON line each: partition, offset, key,
      value, and the schema ids the key and value carry; exits 1 with fewer within S seconds.
      Values are decoded with the writer's schema fetched from the registry by the id the
      record carries (with its references), so an id the registry cannot resolve fails.

Run through `kafka-harness.sh serde ...`, which keeps the client in a virtualenv in the cache.
"""

import argparse
import base64
import glob
import importlib
import json
import os
import re
import struct
import sys
import tempfile
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import RegisteredSchema, Schema, SchemaRegistryClient
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


class ApicurioSafeClient(SchemaRegistryClient):
    """The Python Protobuf serdes ask for schemas with `format=serialized` (a base64
    FileDescriptorProto whose imports are the references' names). Apicurio's Confluent API
    answers that with raw bytes, imports renamed after their packages, and text when
    `deleted=true`: here Protobuf schemas are fetched as text (what Apicurio keeps, and what
    kmirror copies) and compiled to that form locally with protoc, references beside them."""

    def _serialized(self, schema, fmt):
        if fmt != "serialized" or schema.schema_type != "PROTOBUF":
            return schema
        with tempfile.TemporaryDirectory(prefix="serde-fetched-") as d:
            return self._compiled(d, schema)

    def _compiled(self, d, schema):
        from google.protobuf import descriptor_pb2
        from grpc_tools import protoc

        def write(name, sch):
            path = os.path.join(d, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(sch.schema_str)
            for ref in sch.references or []:
                write(ref.name, SchemaRegistryClient.get_version(self, ref.subject, ref.version, True).schema)

        write("fetched.proto", schema)
        out = os.path.join(d, "set.pb")
        if protoc.main(["protoc", f"-I{d}", f"--descriptor_set_out={out}", os.path.join(d, "fetched.proto")]) != 0:
            raise SystemExit(f"serde.py: protoc failed on a schema from the registry:\n{schema.schema_str}")
        files = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            files.ParseFromString(f.read())
        encoded = base64.b64encode(files.file[0].SerializeToString()).decode("ascii")
        return Schema(encoded, schema.schema_type, schema.references, schema.metadata, schema.rule_set)

    def get_schema(self, schema_id, subject_name=None, fmt=None, reference_format=None):
        text = super().get_schema(schema_id, subject_name, None, reference_format)
        return self._serialized(text, fmt)

    def get_version(self, subject_name, version="latest", deleted=False, fmt=None):
        r = super().get_version(subject_name, version, deleted, None)
        return RegisteredSchema(r.subject, r.version, r.schema_id, r.guid, self._serialized(r.schema, fmt))

    def get_latest_version(self, subject_name, fmt=None):
        r = super().get_latest_version(subject_name, None)
        return RegisteredSchema(r.subject, r.version, r.schema_id, r.guid, self._serialized(r.schema, fmt))


def registry_client(url):
    return ApicurioSafeClient({"url": url, "timeout": 30})


def proto_message(path):
    """The first message of a .proto file, its directory's .proto files compiled with protoc."""
    from grpc_tools import protoc

    src = os.path.dirname(os.path.abspath(path))
    out = tempfile.mkdtemp(prefix="serde-proto-")
    protos = sorted(glob.glob(os.path.join(src, "*.proto")))
    if protoc.main(["protoc", f"-I{src}", f"--python_out={out}", *protos]) != 0:
        raise SystemExit(f"serde.py: protoc failed on {protos}")
    sys.path.insert(0, out)
    module = importlib.import_module(os.path.basename(path)[: -len(".proto")] + "_pb2")
    return next(iter(module.DESCRIPTOR.message_types_by_name.values()))._concrete_class


def register_proto(registry, src, file, subject):
    """Registers `file` (a FileDescriptor) under `subject` as its .proto text from `src`, each
    import first under a subject named by its file; returns the version registered."""
    from confluent_kafka.schema_registry import Schema, SchemaReference

    refs = []
    for dep in file.dependencies:
        refs.append(SchemaReference(dep.name, dep.name, register_proto(registry, src, dep, dep.name)))
    with open(os.path.join(src, file.name)) as f:
        schema = Schema(f.read(), "PROTOBUF", refs)
    registry.register_schema(subject, schema)
    return registry.lookup_schema(subject, schema).version


def proto_value(cls, i):
    from google.protobuf.descriptor import FieldDescriptor

    msg = cls(id=i, name=f"record-{i}")
    for field in cls.DESCRIPTOR.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            sub = getattr(msg, field.name)
            names = {f.name for f in field.message_type.fields}
            if "id" in names:
                sub.id = i
            if "name" in names:
                sub.name = f"{field.name}-{i}"
    return msg


def json_value(schema, i):
    value = {"id": i, "name": f"record-{i}"}
    for prop, spec in json.loads(schema).get("properties", {}).items():
        if isinstance(spec, dict) and "$ref" in spec:
            value[prop] = {"id": i, "name": f"{prop}-{i}"}
    return value


def value_serializer(a, registry):
    """The value's serializer and how record i's value is made, by format."""
    with open(a.schema) as f:
        text = f.read()
    if a.format == "avro":
        return AvroSerializer(registry, text, conf=SERDE_CONF), lambda i: {
            "id": i,
            "name": f"record-{i}",
        }
    if a.format == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        cls = proto_message(a.schema)
        # Registered here as .proto text, imports first: the serializer would register base64
        # descriptors, which Apicurio keeps as text and then cannot parse.
        register_proto(registry, os.path.dirname(os.path.abspath(a.schema)), cls.DESCRIPTOR.file,
                       f"{a.topic}-value")
        conf = {**SERDE_CONF, "auto.register.schemas": False, "use.latest.version": True}
        return ProtobufSerializer(cls, registry, conf=conf), lambda i: proto_value(cls, i)
    from confluent_kafka.schema_registry import Schema, SchemaReference
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    refs = []
    for r in a.reference or []:
        name, _, at = r.partition("=")
        subject, _, version = at.rpartition(":")
        refs.append(SchemaReference(name, subject, int(version)))
    ser = JSONSerializer(Schema(text, "JSON", refs), registry, conf=SERDE_CONF)
    return ser, lambda i: json_value(text, i)


def value_deserializer(a, registry):
    if a.format == "avro":
        de = AvroDeserializer(registry, conf=SERDE_CONF)
        return de
    if a.format == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
        from google.protobuf.json_format import MessageToDict

        if not a.schema:
            raise SystemExit("serde.py: consume --format protobuf needs --schema FILE.proto")
        de = ProtobufDeserializer(proto_message(a.schema), schema_registry_client=registry)
        return lambda data, ctx: MessageToDict(
            de(data, ctx), preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer

    return JSONDeserializer(None, schema_registry_client=registry)


def produce(a):
    registry = registry_client(a.registry)
    value_ser, make_value = value_serializer(a, registry)
    key_ser = StringSerializer()
    if a.key_schema:
        with open(a.key_schema) as f:
            key_ser = AvroSerializer(registry, f.read(), conf=SERDE_CONF)
    p = Producer({**client_settings(a), "linger.ms": 5, "acks": "all"})
    failed = []
    for i in range(a.start, a.start + a.count):
        key = {"id": i} if a.key_schema else str(i)
        value = make_value(i)
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
    value_de = value_deserializer(a, registry)
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
    ap = argparse.ArgumentParser(description="Records through Confluent's serializers")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("produce", "consume"):
        s = sub.add_parser(name)
        s.add_argument("--bootstrap", required=True)
        s.add_argument("--registry", required=True)
        s.add_argument("--topic", required=True)
        s.add_argument("--count", type=int, required=True)
        s.add_argument("--client-config", help="a Java client properties file (security keys)")
        s.add_argument("--format", choices=("avro", "protobuf", "json"), default="avro")
    pp = sub.choices["produce"]
    pp.add_argument("--schema", required=True)
    pp.add_argument("--reference", action="append", help="NAME=SUBJECT:VERSION (json)")
    pp.add_argument("--key-schema")
    pp.add_argument("--start", type=int, default=0)
    pp.add_argument("--partitions", type=int, default=1)
    sub.choices["consume"].add_argument("--timeout", type=float, default=60)
    sub.choices["consume"].add_argument("--schema", help="the value's .proto file (protobuf)")
    a = ap.parse_args()
    return produce(a) if a.cmd == "produce" else consume(a)


if __name__ == "__main__":
    sys.exit(main())
