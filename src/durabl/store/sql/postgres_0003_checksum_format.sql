-- durabl on PostgreSQL, schema v3: an event's crc may name the formula that made it, as
-- SQLite's v6 (see sqlite_0006_checksum_format.sql). The column is a BIGINT already.

COMMENT ON COLUMN durabl.events.crc IS
    'CRC-32 of the row; bits above the low 32 name its format (durabl.codec.CHECKSUM_FORMAT_1)';
