-- durabl schema v3: compaction. A run's folded prefix lives in its own row of snapshots,
-- checksummed, apart from the runs row: that row is rewritten on every lease and status change,
-- and a snapshot inside it would be rewritten with it.

CREATE TABLE snapshots (
    run_id    TEXT PRIMARY KEY,
    watermark INTEGER NOT NULL,
    body      TEXT NOT NULL,
    crc       INTEGER NOT NULL
);

ALTER TABLE runs DROP COLUMN snapshot;

-- A watermark only moves forward: history that was folded cannot come back, and a prefix
-- already deleted cannot be claimed again by a smaller snapshot.
CREATE TRIGGER runs_watermark_only_grows BEFORE UPDATE OF watermark ON runs
WHEN NEW.watermark < OLD.watermark
BEGIN
    SELECT RAISE(ABORT, 'durabl: a compaction watermark only moves forward');
END;
