-- durabl schema v4: signals, the answers from outside that a run waits for (WaitSignal).
-- A signal is kept from the moment it is sent, whether or not the run waits for it yet, and is
-- delivered once: delivered_step, the position of the wait that took it, is set in the same
-- transaction as that wait's completion, and never again.

CREATE TABLE signals (
    run_id         TEXT NOT NULL,
    id             INTEGER NOT NULL,
    name           TEXT NOT NULL,
    payload        TEXT NOT NULL,
    sent_s         REAL NOT NULL,
    delivered_step INTEGER,
    PRIMARY KEY (run_id, id)
) WITHOUT ROWID;
CREATE INDEX signals_pending ON signals (run_id, name, id) WHERE delivered_step IS NULL;

CREATE TRIGGER signals_delivered_once BEFORE UPDATE ON signals
WHEN OLD.delivered_step IS NOT NULL OR NEW.run_id IS NOT OLD.run_id OR NEW.id IS NOT OLD.id
  OR NEW.name IS NOT OLD.name OR NEW.payload IS NOT OLD.payload OR NEW.sent_s IS NOT OLD.sent_s
BEGIN
    SELECT RAISE(ABORT, 'durabl: a signal is delivered once and never changed');
END;

CREATE TRIGGER signals_never_deleted BEFORE DELETE ON signals
BEGIN
    SELECT RAISE(ABORT, 'durabl: a sent signal is never deleted');
END;
