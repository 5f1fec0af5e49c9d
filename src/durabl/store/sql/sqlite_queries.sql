-- Every statement the SQLite store issues, by name. Store methods refer to them by name only.
-- Parameters are named after the column they set or match (:run_id, :lease_token); the columns a
-- query returns are named after the fields of the record they fill (store/base.py).

-- name: insert_run
INSERT INTO runs (run_id, workflow, input, status, result, error, created_s, updated_s,
                  wake_at_s, watermark, lease_owner, lease_pid, lease_host, lease_started,
                  lease_expires_s, lease_token)
VALUES (:run_id, :workflow, :input, :status, NULL, NULL, :created_s, :updated_s, NULL, 0,
        :lease_owner, :lease_pid, :lease_host, :lease_started, :lease_expires_s, :lease_token);

-- name: get_run
SELECT run_id, workflow, input AS input_text, status, result AS result_text, error, created_s,
       updated_s, wake_at_s, watermark, lease_owner AS owner, lease_pid AS pid,
       lease_host AS host, lease_started AS started, lease_expires_s AS expires_s, lease_token
FROM runs WHERE run_id = :run_id;

-- name: list_runs
SELECT run_id, workflow, input AS input_text, status, result AS result_text, error, created_s,
       updated_s, wake_at_s, watermark, lease_owner AS owner, lease_pid AS pid,
       lease_host AS host, lease_started AS started, lease_expires_s AS expires_s, lease_token
FROM runs
WHERE (:workflow IS NULL OR workflow = :workflow)
ORDER BY created_s DESC, run_id DESC
LIMIT :limit;

-- name: list_runs_by_status
-- list_runs for some statuses. A query of its own, with no "or no filter at all" in it, so that
-- SQLite can look the statuses up in runs_by_status instead of reading every run: a worker asks
-- for the RUNNING and HELD runs on every poll, however many finished runs the file holds.
SELECT run_id, workflow, input AS input_text, status, result AS result_text, error, created_s,
       updated_s, wake_at_s, watermark, lease_owner AS owner, lease_pid AS pid,
       lease_host AS host, lease_started AS started, lease_expires_s AS expires_s, lease_token
FROM runs
WHERE status IN (SELECT value FROM json_each(:statuses))
  AND (:workflow IS NULL OR workflow = :workflow)
ORDER BY created_s DESC, run_id DESC
LIMIT :limit;

-- name: insert_event
INSERT INTO events (run_id, seq, kind, step, fp, data, at_s, crc, fence)
VALUES (:run_id, :seq, :kind, :step, :fp, :data, :at_s, :crc, :fence);

-- name: load_log
-- The columns in the order of an Event's fields, then crc: the store unpacks them by position.
SELECT seq, kind, step, fp, data, at_s, crc FROM events
WHERE run_id = :run_id AND seq > :after_seq ORDER BY seq;

-- name: last_step
-- The position of the run's newest step event: positions only grow, so this is its step count
-- (less the steps folded into a snapshot), read from the end of the log, whatever its length.
SELECT step FROM events WHERE run_id = :run_id AND step > 0 ORDER BY seq DESC LIMIT 1;

-- name: update_run
UPDATE runs SET
    status    = COALESCE(:status, status),
    result    = COALESCE(:result, result),
    error     = CASE WHEN :error IS NOT NULL THEN :error WHEN :clear_error THEN NULL ELSE error END,
    wake_at_s = CASE WHEN :set_wake THEN :wake_at_s ELSE wake_at_s END,
    updated_s = :updated_s
WHERE run_id = :run_id AND (:fence IS NULL OR lease_token = :fence);

-- name: insert_side_effect
INSERT INTO side_effects (idempotency_key, run_id, step, tool, args_fp, result, error, at_s)
VALUES (:idempotency_key, :run_id, :step, :tool, :args_fp, :result, :error, :at_s);

-- name: insert_event_with_effect
-- One event and the side effect it records, in one statement (the view's trigger writes both).
INSERT INTO events_with_effects (run_id, seq, kind, step, fp, data, at_s, crc, fence,
                                 idempotency_key, effect_run_id, effect_step, tool, args_fp,
                                 result, error, effect_at_s)
VALUES (:run_id, :seq, :kind, :step, :fp, :data, :at_s, :crc, :fence,
        :idempotency_key, :effect_run_id, :effect_step, :tool, :args_fp,
        :result, :error, :effect_at_s);

-- name: insert_event_with_result
-- insert_event_with_effect of an effect that succeeded, its error NULL in the text: SQLite's
-- module adapts a bound None through a lookup that fails, on every finished tool call.
INSERT INTO events_with_effects (run_id, seq, kind, step, fp, data, at_s, crc, fence,
                                 idempotency_key, effect_run_id, effect_step, tool, args_fp,
                                 result, error, effect_at_s)
VALUES (:run_id, :seq, :kind, :step, :fp, :data, :at_s, :crc, :fence,
        :idempotency_key, :effect_run_id, :effect_step, :tool, :args_fp,
        :result, NULL, :effect_at_s);

-- name: get_side_effect
SELECT idempotency_key AS key, run_id, step, tool, args_fp, result AS result_text, error, at_s
FROM side_effects WHERE idempotency_key = :idempotency_key;

-- name: upsert_claim
INSERT INTO key_claims (idempotency_key, run_id, step, tool, args_fp, at_s)
VALUES (:idempotency_key, :run_id, :step, :tool, :args_fp, :at_s)
ON CONFLICT (idempotency_key) DO UPDATE SET
    run_id = excluded.run_id, step = excluded.step, tool = excluded.tool,
    args_fp = excluded.args_fp, at_s = excluded.at_s;

-- name: delete_claim
DELETE FROM key_claims WHERE idempotency_key = :idempotency_key;

-- name: get_claim
SELECT idempotency_key AS key, run_id, step, tool, args_fp FROM key_claims
WHERE idempotency_key = :idempotency_key;

-- name: due_runs
SELECT run_id FROM runs
WHERE wake_at_s IS NOT NULL AND wake_at_s <= :now_s ORDER BY wake_at_s;

-- name: next_wake
SELECT MIN(wake_at_s) FROM runs WHERE wake_at_s IS NOT NULL;

-- name: identity
-- What a file is, in one statement: (application id, schema version, number of tables).
SELECT (SELECT application_id FROM pragma_application_id()),
       (SELECT user_version FROM pragma_user_version()),
       (SELECT COUNT(*) FROM sqlite_master WHERE type = 'table');

-- name: take_lease
UPDATE runs SET lease_owner = :lease_owner, lease_pid = :lease_pid, lease_host = :lease_host,
                lease_started = :lease_started, lease_expires_s = :lease_expires_s,
                lease_token = lease_token + 1
WHERE run_id = :run_id AND lease_token = :lease_token;

-- name: renew_lease
UPDATE runs SET lease_expires_s = :lease_expires_s
WHERE run_id = :run_id AND lease_token = :lease_token AND lease_owner = :lease_owner;

-- name: release_lease
UPDATE runs SET lease_owner = NULL, lease_pid = NULL, lease_host = NULL, lease_started = NULL,
                lease_expires_s = NULL
WHERE run_id = :run_id AND lease_token = :lease_token;

-- name: compact_check
SELECT lease_token, watermark, (SELECT MAX(seq) FROM events WHERE run_id = :run_id) AS last_seq
FROM runs WHERE run_id = :run_id;

-- name: set_watermark
UPDATE runs SET watermark = :watermark WHERE run_id = :run_id;

-- name: set_snapshot
INSERT INTO snapshots (run_id, watermark, body, crc) VALUES (:run_id, :watermark, :body, :crc)
ON CONFLICT (run_id) DO UPDATE SET
    watermark = excluded.watermark, body = excluded.body, crc = excluded.crc;

-- name: delete_folded
DELETE FROM events WHERE run_id = :run_id AND seq <= :watermark;

-- name: get_snapshot
-- The checksum covers the run's watermark: a snapshot that is not the run's current one fails it.
SELECT runs.watermark, snapshots.body, snapshots.crc
FROM runs LEFT JOIN snapshots USING (run_id) WHERE run_id = :run_id;

-- name: doctor_integrity
PRAGMA integrity_check;

-- name: doctor_identity
SELECT application_id, user_version FROM pragma_application_id(), pragma_user_version();

-- name: doctor_triggers
SELECT name FROM sqlite_master WHERE type = 'trigger';

-- name: doctor_runs
SELECT run_id, status, runs.watermark, snapshots.body AS snapshot, snapshots.crc AS snapshot_crc
FROM runs LEFT JOIN snapshots USING (run_id) ORDER BY run_id;

-- name: doctor_count_events
SELECT COUNT(*) FROM events;

-- name: doctor_events
SELECT run_id, seq, kind, step, fp, data, at_s, crc FROM events ORDER BY run_id, seq;

-- name: doctor_orphans
SELECT 'side_effects', idempotency_key, run_id FROM side_effects
WHERE run_id NOT IN (SELECT run_id FROM runs)
UNION ALL
SELECT 'key_claims', idempotency_key, run_id FROM key_claims
WHERE run_id NOT IN (SELECT run_id FROM runs)
UNION ALL
SELECT 'snapshots', run_id, run_id FROM snapshots
WHERE run_id NOT IN (SELECT run_id FROM runs)
UNION ALL
SELECT 'signals', CAST(id AS TEXT), run_id FROM signals
WHERE run_id NOT IN (SELECT run_id FROM runs)
ORDER BY 1, 2;

-- name: signal_target
-- The run a signal is sent to, read first so that its status decides in the same transaction.
SELECT status FROM runs WHERE run_id = :run_id;

-- name: insert_signal
INSERT INTO signals (run_id, id, name, payload, sent_s, delivered_step)
VALUES (:run_id, (SELECT COALESCE(MAX(id), 0) + 1 FROM signals WHERE run_id = :run_id), :name,
        :payload, :sent_s, NULL)
RETURNING id;

-- name: wake_waiting
-- A run waiting for a signal is due at once when one is sent: whoever fires due timers drives it.
UPDATE runs SET wake_at_s = :sent_s WHERE run_id = :run_id AND status = 'WAITING';

-- name: pending_signal
SELECT id, payload, sent_s FROM signals
WHERE run_id = :run_id AND name = :name AND delivered_step IS NULL ORDER BY id LIMIT 1;

-- name: deliver_signal
-- A signal delivered already is refused by signals_delivered_once, which this must reach.
UPDATE signals SET delivered_step = :step WHERE run_id = :run_id AND id = :id;

-- name: wake_on_signal
-- Run last in the commit that parks a wait: a signal sent while the wait was being recorded
-- makes the run due now instead of leaving it waiting for what it already has.
UPDATE runs SET wake_at_s = :at_s
WHERE run_id = :run_id AND EXISTS (
    SELECT 1 FROM signals WHERE run_id = :run_id AND name = :name AND delivered_step IS NULL);

-- name: list_signals
SELECT id, name, payload, sent_s, delivered_step FROM signals WHERE run_id = :run_id ORDER BY id;

-- name: parent_end
-- Where a parent's log ends, read inside the commit that ends its child, so that the child's
-- outcome goes in at the parent's next seq.
SELECT status, COALESCE((SELECT MAX(seq) FROM events WHERE run_id = :run_id), watermark)
FROM runs WHERE run_id = :run_id;

-- name: wake_parent
-- A parent waiting on a child is due once the child's outcome is in its log. One being driven
-- now is left RUNNING, and due: if the process driving it dies, the next to look drives it on.
UPDATE runs SET wake_at_s = :at_s, updated_s = :at_s
WHERE run_id = :run_id AND status IN ('WAITING', 'RUNNING');

-- name: carry_signals
-- The signals no wait of a run took, handed to the run it continued as (created in the same
-- commit), in the order sent; then marked delivered where they were, by the continuing step.
INSERT INTO signals (run_id, id, name, payload, sent_s, delivered_step)
SELECT :to_run, ROW_NUMBER() OVER (ORDER BY id), name, payload, sent_s, NULL
FROM signals WHERE run_id = :run_id AND delivered_step IS NULL;

-- name: close_signals
UPDATE signals SET delivered_step = :step WHERE run_id = :run_id AND delivered_step IS NULL;
