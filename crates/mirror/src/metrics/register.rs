//! Each family's name and help as Prometheus shows them, registered in four groups: the copy's
//! series, the control work's, the runtime's, schema sync's.

use super::Metrics;
use prometheus_client::registry::Registry;

/// The copy's series: records, bytes, age, latency, lag, stops, batches, topics, partitions.
pub(crate) fn register_copy(registry: &mut Registry, m: &Metrics) {
    registry.register(
        "record_count",
        "Records replicated and acknowledged by the target (MM2 record-count)",
        m.record_count.clone(),
    );
    registry.register(
        "byte_count",
        "Record batch bytes replicated (MM2 byte-count counts values only)",
        m.byte_count.clone(),
    );
    registry.register(
        "record_age_ms",
        "Age of the newest record fetched, in milliseconds (MM2 record-age-ms)",
        m.record_age_ms.clone(),
    );
    registry.register(
        "replication_latency_ms",
        "Now minus the timestamp of the newest record acknowledged, in milliseconds (MM2 replication-latency-ms)",
        m.replication_latency_ms.clone(),
    );
    registry.register(
        "replication_lag_records",
        "Source end offset minus the next offset to copy",
        m.lag_records.clone(),
    );
    registry.register(
        "source_truncated_offsets",
        "Offsets deleted on the source before they were copied",
        m.truncated_offsets.clone(),
    );
    registry.register(
        "partition_stopped",
        "1 while a partition is stopped by an error that needs an operator",
        m.partition_stopped.clone(),
    );
    registry.register(
        "records_already_on_target",
        "Records a starting partition found on the target already, after its stored position (not copied again)",
        m.records_already_on_target.clone(),
    );
    registry.register(
        "partitions_waiting",
        "Partitions assigned and not copying for longer than 30 s, by what they wait for: assigned, start_lookup, resume, target_partition, fetch, send, retrying",
        m.partitions_waiting.clone(),
    );
    registry.register(
        "partitions_reported_waiting",
        "Partitions reported (logged once each) as assigned and not copying for longer than 30 s, by what they waited for then",
        m.partitions_reported_waiting.clone(),
    );
    registry.register(
        "resume_fallbacks",
        "Starting partitions that copy from the stored position, unable to tell what the target holds, by reason",
        m.resume_fallbacks.clone(),
    );
    registry.register(
        "batches",
        "Record batches sent, by mode: batch (forwarded as fetched) or record (re-encoded)",
        m.batches.clone(),
    );
    registry.register("errors", "Errors, by kind", m.errors.clone());
    registry.register(
        "topics",
        "Source topics this process copies partitions of",
        m.topics.clone(),
    );
    registry.register(
        "partitions",
        "Source partitions this process copies (with sharing, the processes' values add up to the flow's)",
        m.partitions.clone(),
    );
    registry.register(
        "flow_topics",
        "Source topics the flow replicates, over every process sharing it",
        m.flow_topics.clone(),
    );
    registry.register(
        "flow_partitions",
        "Source partitions the flow replicates, over every process sharing it",
        m.flow_partitions.clone(),
    );
}

/// The control work's series: heartbeats, positions, checkpoints, transactions, syncs.
pub(crate) fn register_control(registry: &mut Registry, m: &Metrics) {
    registry.register(
        "heartbeats",
        "Heartbeats written to the target",
        m.heartbeats.clone(),
    );
    registry.register(
        "positions_stored",
        "Source positions written to the target's positions topic",
        m.positions_stored.clone(),
    );
    registry.register(
        "checkpoints",
        "Checkpoints written to the target (MM2 format)",
        m.checkpoints.clone(),
    );
    registry.register(
        "checkpoint_translations",
        "Group offsets translated for checkpoints, by how: runs copied here or published by another process of the flow (exact), or offset syncs (MM2's rule)",
        m.checkpoint_translations.clone(),
    );
    registry.register(
        "transactions_committed",
        "Exactly-once transactions committed (data and positions together)",
        m.transactions_committed.clone(),
    );
    registry.register(
        "exactly_once_slots",
        "Exactly-once slots (transactional ids, each with its partitions) this process holds",
        m.exactly_once_slots.clone(),
    );
    registry.register(
        "exactly_once_orphans_fenced",
        "Open transactions of transactional ids no exactly-once slot has (above the slot count) that the flow's leader aborted",
        m.orphans_fenced.clone(),
    );
    registry.register(
        "transactions_aborted",
        "Exactly-once transactions aborted, by reason; their partitions copy again from the last commit",
        m.transactions_aborted.clone(),
    );
    registry.register(
        "hanging_transactions",
        "Partitions on which an exactly-once transaction stayed open after its coordinator completed it (a dropped marker), by outcome: found, then settled with the transaction's own result",
        m.hanging_transactions.clone(),
    );
    registry.register(
        "transaction_commit_ms",
        "Milliseconds exactly-once slots spent committing (gate closed to commit answered)",
        m.transaction_commit_ms.clone(),
    );
    registry.register(
        "group_offsets_synced",
        "Group partition offsets committed into the target",
        m.group_offsets_synced.clone(),
    );
    registry.register(
        "topic_configs_synced",
        "Topic config changes applied to remote topics",
        m.configs_synced.clone(),
    );
    registry.register(
        "acls_created",
        "ACL bindings created on the target",
        m.acls_created.clone(),
    );
}

/// The runtime's series: connectivity, rate limits, buffers, rounds, client requests, sharing.
pub(crate) fn register_runtime(registry: &mut Registry, m: &Metrics) {
    registry.register(
        "flow_connected",
        "1 while both clusters of the flow answer a metadata request (probed every 2 s), else 0",
        m.flow_connected.clone(),
    );
    registry.register(
        "rate_limit_bytes_per_second",
        "The flow's kmirror.rate.limit.bytes.per.second (0: no limit)",
        m.rate_limit.clone(),
    );
    registry.register(
        "throttled_ms",
        "Milliseconds the flow waited for its rate limit",
        m.throttled_ms.clone(),
    );
    registry.register(
        "buffered_bytes",
        "Bytes fetched from the source and not yet acknowledged by the target (at most the producer's buffer.memory)",
        m.buffered_bytes.clone(),
    );
    registry.register(
        "process_rate_limit_bytes_per_second",
        "kmirror.process.rate.limit.bytes.per.second (0: no limit)",
        m.process_rate_limit.clone(),
    );
    registry.register(
        "process_throttled_ms",
        "Milliseconds the process's flows waited for the process-wide rate limit",
        m.process_throttled_ms.clone(),
    );
    registry.register(
        "checkpoint_timestamp_seconds",
        "Unix time of the last completed checkpoint round (checkpoints current as of then)",
        m.checkpoint_timestamp.clone(),
    );
    registry.register(
        "rounds",
        "Rounds of a flow's periodic work completed, by kind: topic_refresh (topic discovery), config_sync, acl_sync",
        m.rounds.clone(),
    );
    registry.register(
        "fetch_requests",
        "Fetch requests sent to the source, by kind: full or incremental (KIP-227 fetch sessions); one request per broker carries all its partitions",
        m.fetch_requests.clone(),
    );
    registry.register(
        "fetch_session_fallbacks",
        "Fetch sessions the source broker lost or refused (a restart, a full session cache), each followed by a full fetch request",
        m.fetch_session_fallbacks.clone(),
    );
    registry.register(
        "fetch_max_partitions_per_request",
        "The most partitions one fetch request carried",
        m.fetch_max_partitions.clone(),
    );
    registry.register(
        "produce_requests",
        "Produce requests sent to the target; one request per connection carries the batches of many partitions",
        m.produce_requests.clone(),
    );
    registry.register(
        "produce_batches",
        "Partition batches written to the target (produce_batches / produce_requests: batches per request)",
        m.produce_batches.clone(),
    );
    registry.register(
        "produce_max_batches_per_request",
        "The most partition batches one produce request carried",
        m.produce_max_batches.clone(),
    );
    registry.register(
        "producer_new_ids",
        "Times a target partition started its sequences over under a new producer id (the target lost or fenced its producer state)",
        m.producer_new_ids.clone(),
    );
    registry.register(
        "producer_ids_registered",
        "Loop prevention: producer ids this flow registered in the target's kmirror-producers.internal before writing with them",
        m.producer_ids_registered.clone(),
    );
    registry.register(
        "loop_records_skipped",
        "Loop prevention: source records not copied because kmirror copied them into the source from this flow's target",
        m.loop_records_skipped.clone(),
    );
    registry.register(
        "checkpoints_both_ways",
        "1 while this flow emits no checkpoints and syncs no group offsets because its target also copies into its source under identity names",
        m.checkpoints_both_ways.clone(),
    );
    registry.register(
        "target_truncated_offsets",
        "Offsets the target acknowledged and later lost, its log truncated below them (an unclean leader election); not copied again",
        m.target_truncated_offsets.clone(),
    );
    registry.register(
        "rebalances",
        "Assignments this process received from the flow's group (sharing: docs/sharing.md)",
        m.rebalances.clone(),
    );
    registry.register(
        "assigned_partitions",
        "Source partitions the flow's group assigned to this process (sharing; exactly-once flows: slots)",
        m.assigned_partitions.clone(),
    );
    registry.register(
        "group_leader",
        "1 while this process leads the flow's group and does its control work (sharing)",
        m.group_leader.clone(),
    );
    registry.register(
        "group_members",
        "On the group's leader: the processes sharing the flow (0 elsewhere)",
        m.group_members.clone(),
    );
    registry.register(
        "rebalance_ms",
        "Milliseconds spent in rebalances, from rejoining to the new assignment applied (sharing)",
        m.rebalance_ms.clone(),
    );
    registry.register(
        "partitions_added",
        "Partitions this process was given in rebalances (sharing)",
        m.partitions_added.clone(),
    );
    registry.register(
        "partitions_revoked",
        "Partitions this process handed over in rebalances (sharing)",
        m.partitions_revoked.clone(),
    );
}

/// Schema sync's series (docs/schemas.md).
pub(crate) fn register_schemas(registry: &mut Registry, m: &Metrics) {
    registry.register(
        "schema_registrations",
        "Schema versions registered on the target registry",
        m.schema_registrations.clone(),
    );
    registry.register(
        "schema_ids_translated",
        "Schema ids rewritten to the target registry's in record keys and values",
        m.schema_ids_translated.clone(),
    );
    registry.register(
        "schema_ids_unknown",
        "Record keys and values that start like the Confluent wire format but name an id the source registry does not know (copied as they are)",
        m.schema_ids_unknown.clone(),
    );
    registry.register(
        "records_waiting_for_schema",
        "Records held back until the schemas they name are on the target registry",
        m.records_waiting_for_schema.clone(),
    );
    registry.register(
        "schema_registry_errors",
        "Schema registry calls that failed, by kind: unreachable, refused, bad_answer, target_lost",
        m.schema_registry_errors.clone(),
    );
}
