-- durabl on PostgreSQL, schema v1: the tables of SQLite's v3 (runs with their leases, the
-- append-only event log, side effects, key claims, compaction snapshots), in a schema of their
-- own, "durabl", so that they can share a database with the application's tables.
--
-- Each refusal raises its own SQLSTATE (class DB, "durabl"), so that the store tells them apart
-- by code, never by their words:
--   DB001 lease lost       DB002 log gap        DB003 history rewritten
--   DB004 watermark moved back

CREATE TABLE durabl.meta (
    application TEXT PRIMARY KEY CHECK (application = 'durabl'),
    schema_version INTEGER NOT NULL,
    migrated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE durabl.runs (
    run_id          TEXT PRIMARY KEY,
    workflow        TEXT NOT NULL,
    input           TEXT NOT NULL,
    status          TEXT NOT NULL,
    result          TEXT,
    error           TEXT,
    created_s       DOUBLE PRECISION NOT NULL,
    updated_s       DOUBLE PRECISION NOT NULL,
    wake_at_s       DOUBLE PRECISION,
    watermark       BIGINT NOT NULL DEFAULT 0,
    lease_owner     TEXT,
    lease_pid       BIGINT,
    lease_host      TEXT,
    lease_started   TEXT,
    lease_expires_s DOUBLE PRECISION,
    lease_token     BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX runs_by_wake ON durabl.runs (wake_at_s) WHERE wake_at_s IS NOT NULL;
CREATE INDEX runs_by_status ON durabl.runs (status, created_s);
CREATE INDEX runs_by_created ON durabl.runs (created_s);

CREATE TABLE durabl.events (
    run_id TEXT NOT NULL,
    seq    BIGINT NOT NULL,
    kind   TEXT NOT NULL,
    step   BIGINT NOT NULL,
    fp     TEXT,
    data   TEXT,
    at_s   DOUBLE PRECISION NOT NULL,
    crc    BIGINT NOT NULL,
    fence  BIGINT,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE durabl.side_effects (
    idempotency_key TEXT PRIMARY KEY,
    run_id  TEXT NOT NULL,
    step    BIGINT NOT NULL,
    tool    TEXT NOT NULL,
    args_fp TEXT NOT NULL,
    result  TEXT,
    error   TEXT,
    at_s    DOUBLE PRECISION NOT NULL
);

CREATE TABLE durabl.key_claims (
    idempotency_key TEXT PRIMARY KEY,
    run_id  TEXT NOT NULL,
    step    BIGINT NOT NULL,
    tool    TEXT NOT NULL,
    args_fp TEXT NOT NULL,
    at_s    DOUBLE PRECISION NOT NULL
);

CREATE TABLE durabl.snapshots (
    run_id    TEXT PRIMARY KEY,
    watermark BIGINT NOT NULL,
    body      TEXT NOT NULL,
    crc       BIGINT NOT NULL
);

-- An event must extend its run's log by exactly one, and carry the run's current lease token
-- when it carries one. The run's row is locked first (FOR UPDATE): two transactions appending
-- to one run, or an append racing a takeover, are put in order by the database, so neither
-- check can be passed by two writers at once.
CREATE FUNCTION durabl.events_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    mark  BIGINT;
    token BIGINT;
    last  BIGINT;
BEGIN
    SELECT watermark, lease_token INTO mark, token
    FROM durabl.runs WHERE run_id = NEW.run_id FOR UPDATE;
    IF NEW.fence IS NOT NULL AND NEW.fence IS DISTINCT FROM token THEN
        RAISE EXCEPTION 'durabl: lease lost: another process owns this run now'
            USING ERRCODE = 'DB001';
    END IF;
    SELECT MAX(seq) INTO last FROM durabl.events WHERE run_id = NEW.run_id;
    IF NEW.seq < 1 OR NEW.seq <> 1 + COALESCE(last, mark, -1) THEN
        RAISE EXCEPTION 'durabl: an event seq must extend an existing run''s log by exactly one'
            USING ERRCODE = 'DB002';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER events_guard BEFORE INSERT ON durabl.events
    FOR EACH ROW EXECUTE FUNCTION durabl.events_guard();

CREATE FUNCTION durabl.refuse_rewrite() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'durabl: %', TG_ARGV[0] USING ERRCODE = 'DB003';
END $$;
CREATE TRIGGER events_append_only BEFORE UPDATE ON durabl.events
    FOR EACH ROW EXECUTE FUNCTION durabl.refuse_rewrite('the event log is append-only');
CREATE TRIGGER events_never_truncated BEFORE TRUNCATE ON durabl.events
    FOR EACH STATEMENT EXECUTE FUNCTION durabl.refuse_rewrite('the event log is append-only');
CREATE TRIGGER side_effects_never_overwritten BEFORE UPDATE ON durabl.side_effects
    FOR EACH ROW EXECUTE FUNCTION durabl.refuse_rewrite('a recorded side effect is never overwritten');
CREATE TRIGGER side_effects_never_deleted BEFORE DELETE ON durabl.side_effects
    FOR EACH ROW EXECUTE FUNCTION durabl.refuse_rewrite('a recorded side effect is never deleted');
CREATE TRIGGER side_effects_never_truncated BEFORE TRUNCATE ON durabl.side_effects
    FOR EACH STATEMENT EXECUTE FUNCTION durabl.refuse_rewrite('a recorded side effect is never deleted');

CREATE FUNCTION durabl.events_delete_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.seq > COALESCE((SELECT watermark FROM durabl.runs WHERE run_id = OLD.run_id), 0) THEN
        RAISE EXCEPTION 'durabl: only a compacted prefix of a log may be deleted'
            USING ERRCODE = 'DB003';
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER events_delete_only_compacted BEFORE DELETE ON durabl.events
    FOR EACH ROW EXECUTE FUNCTION durabl.events_delete_guard();

CREATE FUNCTION durabl.watermark_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.watermark < OLD.watermark THEN
        RAISE EXCEPTION 'durabl: a compaction watermark only moves forward'
            USING ERRCODE = 'DB004';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER runs_watermark_only_grows BEFORE UPDATE OF watermark ON durabl.runs
    FOR EACH ROW EXECUTE FUNCTION durabl.watermark_guard();

-- Workers sleep on LISTEN durabl_work instead of polling. A run tells them when it has work
-- nobody holds (RUNNING with no lease: created unowned, or parked by a stopping worker) and when
-- its timer is armed or moved, so that a sleeping worker works out its next deadline again.
-- pg_notify is transactional: the wake-up is sent when the change commits, never before.
CREATE FUNCTION durabl.notify_work() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('durabl_work', NEW.run_id);
    RETURN NEW;
END $$;
CREATE TRIGGER runs_notify_insert AFTER INSERT ON durabl.runs
    FOR EACH ROW WHEN (NEW.lease_owner IS NULL OR NEW.wake_at_s IS NOT NULL)
    EXECUTE FUNCTION durabl.notify_work();
CREATE TRIGGER runs_notify_update AFTER UPDATE ON durabl.runs
    FOR EACH ROW WHEN (
        (NEW.status = 'RUNNING' AND NEW.lease_owner IS NULL AND OLD.lease_owner IS NOT NULL)
        OR NEW.wake_at_s IS DISTINCT FROM OLD.wake_at_s
        OR (NEW.status IS DISTINCT FROM OLD.status AND NEW.lease_owner IS NULL)
    )
    EXECUTE FUNCTION durabl.notify_work();
