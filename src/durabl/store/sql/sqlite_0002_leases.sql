-- durabl schema v2: run ownership as a lease, and a fence on every write.

ALTER TABLE runs ADD COLUMN lease_owner TEXT;
ALTER TABLE runs ADD COLUMN lease_pid INTEGER;
ALTER TABLE runs ADD COLUMN lease_host TEXT;
ALTER TABLE runs ADD COLUMN lease_started TEXT;
ALTER TABLE runs ADD COLUMN lease_expires_s REAL;
ALTER TABLE runs ADD COLUMN lease_token INTEGER NOT NULL DEFAULT 0;

ALTER TABLE events ADD COLUMN fence INTEGER;

-- A process that lost its lease (paused past expiry, then woken) cannot append: the token it
-- holds is no longer the run's. Checked inside the insert, so a runtime cannot skip it. (The
-- runtime fences every write; an unfenced write is for tools that own the file outright.)
CREATE TRIGGER events_fenced BEFORE INSERT ON events
WHEN NEW.fence IS NOT NULL
 AND NEW.fence IS NOT (SELECT lease_token FROM runs WHERE run_id = NEW.run_id)
BEGIN
    SELECT RAISE(ABORT, 'durabl: lease lost: another process owns this run now');
END;
