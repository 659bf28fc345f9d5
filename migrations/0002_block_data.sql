-- 0002_block_data.sql: the persistent tier keyed by (fingerprint, hash), with
-- the K/V bytes in a table of their own, so that marking a block used rewrites
-- a small row, not its K/V.  The tier is a cache: blocks written under 0001
-- are dropped.  PRAGMA user_version becomes 2.

DROP TABLE blocks;

-- A full KV block.  fingerprint: the model and the backend's KV layout (a
-- block of another model, or of a backend that stores K/V differently, never
-- matches); hash = H(parent hash, token ids, model fingerprint); tokens: the
-- block's token ids (little-endian 32-bit); checksum: over tokens and K/V, so
-- that a damaged block is never loaded; bytes: tokens + K/V; last_used: a
-- counter that grows with every write and load (the least recently used go
-- first when the tier is over its bound).
CREATE TABLE blocks (
    id          INTEGER PRIMARY KEY,
    fingerprint BLOB NOT NULL,
    hash        BLOB NOT NULL,
    parent      BLOB NOT NULL,
    tokens      BLOB NOT NULL,
    checksum    INTEGER NOT NULL,
    bytes       INTEGER NOT NULL,
    last_used   INTEGER NOT NULL,
    UNIQUE (fingerprint, hash)
);
CREATE INDEX blocks_lru ON blocks(last_used);

CREATE TABLE block_data (
    id INTEGER PRIMARY KEY REFERENCES blocks(id) ON DELETE CASCADE,
    kv BLOB NOT NULL
);
