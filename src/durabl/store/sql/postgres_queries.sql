-- Every statement the PostgreSQL store issues, by name, as sqlite_queries.sql is for SQLite.
-- Parameters are psycopg's named placeholders (%(run_id)s); a parameter that may be NULL where
-- the statement tests it is cast, since PostgreSQL cannot infer the type of a bare NULL.

-- name: insert_run
INSERT INTO durabl.runs (run_id, workflow, input, status, result, error, created_s, updated_s,
                         wake_at_s, watermark, lease_owner, lease_pid, lease_host, lease_started,
                         lease_expires_s, lease_token)
VALUES (%(run_id)s, %(workflow)s, %(input)s, %(status)s, NULL, NULL, %(created_s)s,
        %(updated_s)s, NULL, 0, %(lease_owner)s, %(lease_pid)s, %(lease_host)s,
        %(lease_started)s, %(lease_expires_s)s, %(lease_token)s)
ON CONFLICT (run_id) DO NOTHING;

-- name: get_run
SELECT run_id, workflow, input AS input_text, status, result AS result_text, error, created_s,
       updated_s, wake_at_s, watermark, lease_owner AS owner, lease_pid AS pid,
       lease_host AS host, lease_started AS started, lease_expires_s AS expires_s, lease_token
FROM durabl.runs WHERE run_id = %(run_id)s;

-- name: list_runs
-- Ties in created_s are ordered by run id byte for byte (COLLATE "C"), as SQLite orders them,
-- whatever the database's collation.
SELECT run_id, workflow, input AS input_text, status, result AS result_text, error, created_s,
       updated_s, wake_at_s, watermark, lease_owner AS owner, lease_pid AS pid,
       lease_host AS host, lease_started AS started, lease_expires_s AS expires_s, lease_token
FROM durabl.runs
WHERE (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
ORDER BY created_s DESC, run_id COLLATE "C" DESC
LIMIT %(limit)s::bigint;

-- name: list_runs_by_status
SELECT run_id, workflow, input AS input_text, status, result AS result_text, error, created_s,
       updated_s, wake_at_s, watermark, lease_owner AS owner, lease_pid AS pid,
       lease_host AS host, lease_started AS started, lease_expires_s AS expires_s, lease_token
FROM durabl.runs
WHERE status = ANY(%(statuses)s::text[])
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
ORDER BY created_s DESC, run_id COLLATE "C" DESC
LIMIT %(limit)s::bigint;

-- name: insert_events_head
INSERT INTO durabl.events (run_id, seq, kind, step, fp, data, at_s, crc, fence) VALUES

-- name: events_landed
-- What a commit whose outcome is unknown left behind: its events' seqs and checksums.
SELECT seq, crc FROM durabl.events
WHERE run_id = %(run_id)s AND seq BETWEEN %(first)s AND %(last)s ORDER BY seq;

-- name: load_log
SELECT seq, kind, step, fp, data, at_s, crc FROM durabl.events
WHERE run_id = %(run_id)s AND seq > %(after_seq)s ORDER BY seq;

-- name: last_step
SELECT step FROM durabl.events WHERE run_id = %(run_id)s AND step > 0 ORDER BY seq DESC LIMIT 1;

-- name: update_run
UPDATE durabl.runs SET
    status    = COALESCE(%(status)s::text, status),
    result    = COALESCE(%(result)s::text, result),
    error     = CASE WHEN %(error)s::text IS NOT NULL THEN %(error)s::text
                     WHEN %(clear_error)s THEN NULL ELSE error END,
    wake_at_s = CASE WHEN %(set_wake)s THEN %(wake_at_s)s::double precision ELSE wake_at_s END,
    updated_s = %(updated_s)s
WHERE run_id = %(run_id)s AND (%(fence)s::bigint IS NULL OR lease_token = %(fence)s::bigint);

-- name: insert_side_effect
INSERT INTO durabl.side_effects (idempotency_key, run_id, step, tool, args_fp, result, error,
                                 at_s)
VALUES (%(idempotency_key)s, %(run_id)s, %(step)s, %(tool)s, %(args_fp)s, %(result)s,
        %(error)s, %(at_s)s);

-- name: get_side_effect
SELECT idempotency_key AS key, run_id, step, tool, args_fp, result AS result_text, error, at_s
FROM durabl.side_effects WHERE idempotency_key = %(idempotency_key)s;

-- name: upsert_claim
INSERT INTO durabl.key_claims (idempotency_key, run_id, step, tool, args_fp, at_s)
VALUES (%(idempotency_key)s, %(run_id)s, %(step)s, %(tool)s, %(args_fp)s, %(at_s)s)
ON CONFLICT (idempotency_key) DO UPDATE SET
    run_id = EXCLUDED.run_id, step = EXCLUDED.step, tool = EXCLUDED.tool,
    args_fp = EXCLUDED.args_fp, at_s = EXCLUDED.at_s;

-- name: delete_claim
DELETE FROM durabl.key_claims WHERE idempotency_key = %(idempotency_key)s;

-- name: get_claim
SELECT idempotency_key AS key, run_id, step, tool, args_fp FROM durabl.key_claims
WHERE idempotency_key = %(idempotency_key)s;

-- name: due_runs
SELECT run_id FROM durabl.runs
WHERE wake_at_s IS NOT NULL AND wake_at_s <= %(now_s)s ORDER BY wake_at_s;

-- name: next_wake
SELECT MIN(wake_at_s) FROM durabl.runs WHERE wake_at_s IS NOT NULL;

-- name: take_lease
UPDATE durabl.runs SET lease_owner = %(lease_owner)s, lease_pid = %(lease_pid)s,
                       lease_host = %(lease_host)s, lease_started = %(lease_started)s,
                       lease_expires_s = %(lease_expires_s)s, lease_token = lease_token + 1
WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s;

-- name: renew_lease
UPDATE durabl.runs SET lease_expires_s = %(lease_expires_s)s
WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s AND lease_owner = %(lease_owner)s;

-- name: release_lease
UPDATE durabl.runs SET lease_owner = NULL, lease_pid = NULL, lease_host = NULL,
                       lease_started = NULL, lease_expires_s = NULL
WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s;

-- name: claim_runs
-- Workers on several hosts claiming RUNNING runs nobody holds at once (no lease, an expired one,
-- or one whose process has no session left on the server): each row locked by one claim is
-- skipped by the others, so they divide the runs between them instead of racing for the same
-- ones. The lease is taken in the same statement (the token grows by one). A missing session
-- proves nothing while the server is young: its restart ended every session, and a live owner's
-- come back only at its next write.
UPDATE durabl.runs SET lease_owner = %(lease_owner)s, lease_pid = %(lease_pid)s,
                       lease_host = %(lease_host)s, lease_started = %(lease_started)s,
                       lease_expires_s = %(lease_expires_s)s, lease_token = lease_token + 1
WHERE run_id IN (
    SELECT run_id FROM durabl.runs
    WHERE status = 'RUNNING'
      AND (lease_owner IS NULL OR lease_expires_s <= %(now_s)s OR (
          pg_postmaster_start_time() < clock_timestamp() - make_interval(secs => %(grace_s)s)
          AND NOT EXISTS (
              SELECT 1 FROM pg_stat_activity
              WHERE application_name = 'durabl:' || lease_host || ':' || lease_pid)))
    ORDER BY created_s
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING run_id, lease_token;

-- name: compact_check
SELECT lease_token, watermark,
       (SELECT MAX(seq) FROM durabl.events WHERE run_id = %(run_id)s) AS last_seq
FROM durabl.runs WHERE run_id = %(run_id)s FOR UPDATE;

-- name: set_watermark
UPDATE durabl.runs SET watermark = %(watermark)s WHERE run_id = %(run_id)s;

-- name: set_snapshot
INSERT INTO durabl.snapshots (run_id, watermark, body, crc)
VALUES (%(run_id)s, %(watermark)s, %(body)s, %(crc)s)
ON CONFLICT (run_id) DO UPDATE SET
    watermark = EXCLUDED.watermark, body = EXCLUDED.body, crc = EXCLUDED.crc;

-- name: delete_folded
DELETE FROM durabl.events WHERE run_id = %(run_id)s AND seq <= %(watermark)s;

-- name: get_snapshot
SELECT runs.watermark, snapshots.body, snapshots.crc
FROM durabl.runs LEFT JOIN durabl.snapshots USING (run_id) WHERE run_id = %(run_id)s;

-- name: owner_alive
-- Whether the process that holds a lease still has a session open on this server: every store
-- names its sessions 'durabl:<host>:<pid>', and a killed process's sessions end with it. While
-- the server is young (see claim_runs), every owner counts as alive.
SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = %(name)s)
    OR pg_postmaster_start_time() >= clock_timestamp() - make_interval(secs => %(grace_s)s);

-- name: clock
-- The server's clock, when it started, and how often its WAL writer flushes by itself (ms).
SELECT EXTRACT(EPOCH FROM clock_timestamp())::double precision,
       pg_postmaster_start_time(),
       (SELECT setting::int FROM pg_settings WHERE name = 'wal_writer_delay');

-- name: server_started
SELECT pg_postmaster_start_time();

-- name: identity
-- What the database's durabl schema is: whether it exists, its tables, and its meta row.
SELECT (SELECT COUNT(*) FROM pg_namespace WHERE nspname = 'durabl') AS has_schema,
       (SELECT COALESCE(array_agg(tablename::text ORDER BY tablename), '{}')
        FROM pg_tables WHERE schemaname = 'durabl') AS tables;

-- name: schema_version
SELECT schema_version FROM durabl.meta WHERE application = 'durabl';

-- name: doctor_triggers
-- durabl's triggers that are in force: a disabled one guards nothing, so it counts as missing.
SELECT t.tgname FROM pg_trigger t
JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'durabl' AND NOT t.tgisinternal AND t.tgenabled <> 'D';

-- name: doctor_page_checksums
SHOW data_checksums;

-- name: doctor_runs
SELECT run_id, status, runs.watermark, snapshots.body AS snapshot, snapshots.crc AS snapshot_crc
FROM durabl.runs LEFT JOIN durabl.snapshots USING (run_id) ORDER BY run_id;

-- name: doctor_count_events
SELECT COUNT(*) FROM durabl.events;

-- name: doctor_events
SELECT run_id, seq, kind, step, fp, data, at_s, crc FROM durabl.events ORDER BY run_id, seq;

-- name: doctor_orphans
SELECT 'side_effects', idempotency_key, run_id FROM durabl.side_effects
WHERE run_id NOT IN (SELECT run_id FROM durabl.runs)
UNION ALL
SELECT 'key_claims', idempotency_key, run_id FROM durabl.key_claims
WHERE run_id NOT IN (SELECT run_id FROM durabl.runs)
UNION ALL
SELECT 'snapshots', run_id, run_id FROM durabl.snapshots
WHERE run_id NOT IN (SELECT run_id FROM durabl.runs)
UNION ALL
SELECT 'signals', CAST(id AS TEXT), run_id FROM durabl.signals
WHERE run_id NOT IN (SELECT run_id FROM durabl.runs)
ORDER BY 1, 2;

-- name: signal_target
-- Locks the run's row: a wait being parked and a signal being sent are put in order, so that
-- one of them always sees the other (see wake_on_signal).
SELECT status FROM durabl.runs WHERE run_id = %(run_id)s FOR UPDATE;

-- name: insert_signal
INSERT INTO durabl.signals (run_id, id, name, payload, sent_s, delivered_step)
VALUES (%(run_id)s,
        (SELECT COALESCE(MAX(id), 0) + 1 FROM durabl.signals WHERE run_id = %(run_id)s),
        %(name)s, %(payload)s, %(sent_s)s, NULL)
RETURNING id;

-- name: wake_waiting
UPDATE durabl.runs SET wake_at_s = %(sent_s)s
WHERE run_id = %(run_id)s AND status = 'WAITING';

-- name: pending_signal
SELECT id, payload, sent_s FROM durabl.signals
WHERE run_id = %(run_id)s AND name = %(name)s AND delivered_step IS NULL ORDER BY id LIMIT 1;

-- name: deliver_signal
-- A signal delivered already is refused by signals_delivered_once, which this must reach.
UPDATE durabl.signals SET delivered_step = %(step)s WHERE run_id = %(run_id)s AND id = %(id)s;

-- name: wake_on_signal
UPDATE durabl.runs SET wake_at_s = %(at_s)s
WHERE run_id = %(run_id)s AND EXISTS (
    SELECT 1 FROM durabl.signals
    WHERE run_id = %(run_id)s AND name = %(name)s AND delivered_step IS NULL);

-- name: list_signals
SELECT id, name, payload, sent_s, delivered_step FROM durabl.signals
WHERE run_id = %(run_id)s ORDER BY id;

-- name: parent_end
-- Where a parent's log ends, read inside the commit that ends its child (the parent's row
-- locked, so that no other child's end takes the same seq).
SELECT status, COALESCE((SELECT max(seq) FROM durabl.events WHERE run_id = %(run_id)s), watermark)
FROM durabl.runs WHERE run_id = %(run_id)s FOR UPDATE;

-- name: wake_parent
UPDATE durabl.runs SET wake_at_s = %(at_s)s, updated_s = %(at_s)s
WHERE run_id = %(run_id)s AND status IN ('WAITING', 'RUNNING');

-- name: carry_signals
INSERT INTO durabl.signals (run_id, id, name, payload, sent_s, delivered_step)
SELECT %(to_run)s, ROW_NUMBER() OVER (ORDER BY id), name, payload, sent_s, NULL
FROM durabl.signals WHERE run_id = %(run_id)s AND delivered_step IS NULL;

-- name: close_signals
UPDATE durabl.signals SET delivered_step = %(step)s
WHERE run_id = %(run_id)s AND delivered_step IS NULL;
