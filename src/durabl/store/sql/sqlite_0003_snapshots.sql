-- durabl schema v3: compaction. A run's folded prefix lives in runs.snapshot, checksummed.

ALTER TABLE runs ADD COLUMN snapshot_crc INTEGER;

-- A watermark only moves forward: history that was folded cannot come back, and a prefix
-- already deleted cannot be claimed again by a smaller snapshot.
CREATE TRIGGER runs_watermark_only_grows BEFORE UPDATE OF watermark ON runs
WHEN NEW.watermark < OLD.watermark
BEGIN
    SELECT RAISE(ABORT, 'durabl: a compaction watermark only moves forward');
END;
