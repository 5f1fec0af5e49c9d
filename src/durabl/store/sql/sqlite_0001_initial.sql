-- durabl schema v1: runs, the append-only event log, side effects and key claims.

CREATE TABLE runs (
    run_id     TEXT PRIMARY KEY,
    workflow   TEXT NOT NULL,
    input      TEXT NOT NULL,
    status     TEXT NOT NULL,
    result     TEXT,
    error      TEXT,
    created_s  REAL NOT NULL,
    updated_s  REAL NOT NULL,
    wake_at_s  REAL,
    watermark  INTEGER NOT NULL DEFAULT 0,
    snapshot   TEXT
);
CREATE INDEX runs_by_wake ON runs (wake_at_s) WHERE wake_at_s IS NOT NULL;
CREATE INDEX runs_by_status ON runs (status, created_s);
CREATE INDEX runs_by_created ON runs (created_s);

CREATE TABLE events (
    run_id  TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    step    INTEGER NOT NULL,
    fp      TEXT,
    data    TEXT,
    at_s    REAL NOT NULL,
    crc     INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

-- The log's invariants live in the database, not in the process that crashes.
CREATE TRIGGER events_gapless BEFORE INSERT ON events
BEGIN
    SELECT RAISE(ABORT, 'durabl: an event seq must extend an existing run''s log by exactly one')
    WHERE NEW.seq < 1 OR NEW.seq != 1 + COALESCE(
        (SELECT MAX(seq) FROM events WHERE run_id = NEW.run_id),
        (SELECT watermark FROM runs WHERE run_id = NEW.run_id),
        -1);
END;

CREATE TRIGGER events_append_only BEFORE UPDATE ON events
BEGIN
    SELECT RAISE(ABORT, 'durabl: the event log is append-only');
END;

CREATE TRIGGER events_delete_only_compacted BEFORE DELETE ON events
WHEN OLD.seq > COALESCE((SELECT watermark FROM runs WHERE run_id = OLD.run_id), 0)
BEGIN
    SELECT RAISE(ABORT, 'durabl: only a compacted prefix of a log may be deleted');
END;

CREATE TABLE side_effects (
    idempotency_key TEXT PRIMARY KEY,
    run_id   TEXT NOT NULL,
    step     INTEGER NOT NULL,
    tool     TEXT NOT NULL,
    args_fp  TEXT NOT NULL,
    result   TEXT,
    error    TEXT,
    at_s     REAL NOT NULL
) WITHOUT ROWID;

CREATE TRIGGER side_effects_never_overwritten BEFORE UPDATE ON side_effects
BEGIN
    SELECT RAISE(ABORT, 'durabl: a recorded side effect is never overwritten');
END;

CREATE TRIGGER side_effects_never_deleted BEFORE DELETE ON side_effects
BEGIN
    SELECT RAISE(ABORT, 'durabl: a recorded side effect is never deleted');
END;

CREATE TABLE key_claims (
    idempotency_key TEXT PRIMARY KEY,
    run_id   TEXT NOT NULL,
    step     INTEGER NOT NULL,
    tool     TEXT NOT NULL,
    args_fp  TEXT NOT NULL,
    at_s     REAL NOT NULL
);
