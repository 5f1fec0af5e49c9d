-- durabl on PostgreSQL, schema v2: signals, as SQLite's v4 (see sqlite_0004_signals.sql).

CREATE TABLE durabl.signals (
    run_id         TEXT NOT NULL,
    id             BIGINT NOT NULL,
    name           TEXT NOT NULL,
    payload        TEXT NOT NULL,
    sent_s         DOUBLE PRECISION NOT NULL,
    delivered_step BIGINT,
    PRIMARY KEY (run_id, id)
);
CREATE INDEX signals_pending ON durabl.signals (run_id, name, id) WHERE delivered_step IS NULL;

CREATE FUNCTION durabl.signals_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.delivered_step IS NOT NULL OR NEW.run_id IS DISTINCT FROM OLD.run_id
       OR NEW.id IS DISTINCT FROM OLD.id OR NEW.name IS DISTINCT FROM OLD.name
       OR NEW.payload IS DISTINCT FROM OLD.payload OR NEW.sent_s IS DISTINCT FROM OLD.sent_s THEN
        RAISE EXCEPTION 'durabl: a signal is delivered once and never changed'
            USING ERRCODE = 'DB003';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER signals_delivered_once BEFORE UPDATE ON durabl.signals
    FOR EACH ROW EXECUTE FUNCTION durabl.signals_guard();
CREATE TRIGGER signals_never_deleted BEFORE DELETE ON durabl.signals
    FOR EACH ROW EXECUTE FUNCTION durabl.refuse_rewrite('a sent signal is never deleted');
CREATE TRIGGER signals_never_truncated BEFORE TRUNCATE ON durabl.signals
    FOR EACH STATEMENT EXECUTE FUNCTION durabl.refuse_rewrite('a sent signal is never deleted');
