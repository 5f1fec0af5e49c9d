-- durabl schema v5: a step's event and its side effect written by one statement.
-- A finished tool call appends its event and records its side effect in one transaction. One
-- row inserted into this view inserts both, through its trigger, so that the commit is a single
-- statement (its own transaction in autocommit mode) where it was BEGIN, two inserts and
-- COMMIT. Each insert inside still goes through its table's triggers: the log's gapless and
-- fencing checks, and the side effect's key that is never written twice. The view selects no
-- rows; only its insert is used.

CREATE VIEW events_with_effects AS
SELECT e.run_id, e.seq, e.kind, e.step, e.fp, e.data, e.at_s, e.crc, e.fence,
       s.idempotency_key, s.run_id AS effect_run_id, s.step AS effect_step, s.tool, s.args_fp,
       s.result, s.error, s.at_s AS effect_at_s
FROM events AS e, side_effects AS s
WHERE 0;

CREATE TRIGGER events_with_effects_insert INSTEAD OF INSERT ON events_with_effects
BEGIN
    INSERT INTO events (run_id, seq, kind, step, fp, data, at_s, crc, fence)
    VALUES (NEW.run_id, NEW.seq, NEW.kind, NEW.step, NEW.fp, NEW.data, NEW.at_s, NEW.crc,
            NEW.fence);
    INSERT INTO side_effects (idempotency_key, run_id, step, tool, args_fp, result, error, at_s)
    VALUES (NEW.idempotency_key, NEW.effect_run_id, NEW.effect_step, NEW.tool, NEW.args_fp,
            NEW.result, NEW.error, NEW.effect_at_s);
END;
