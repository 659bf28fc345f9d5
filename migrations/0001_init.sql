-- 0001_init.sql: conversations kept on the server, and the persistent tier of
-- the prefix cache (issue 7).  Applied in one transaction; PRAGMA user_version
-- becomes 1.

-- A conversation.  id: unguessable (random, hex); owner: a digest of the API
-- key that made it ('' without keys).
CREATE TABLE sessions (
    id      TEXT PRIMARY KEY,
    owner   TEXT NOT NULL DEFAULT '',
    title   TEXT NOT NULL DEFAULT '',
    created INTEGER NOT NULL,          -- Unix seconds
    updated INTEGER NOT NULL
);
CREATE INDEX sessions_owner ON sessions(owner, updated);

-- Its messages, in order.  status: 'done', or 'partial' for the reply of a
-- cancelled request.
CREATE TABLE messages (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL,
    role       TEXT NOT NULL,
    content    TEXT NOT NULL,
    status     TEXT NOT NULL DEFAULT 'done',
    created    INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
);

-- Full KV blocks: hash = H(parent hash, token ids, model fingerprint), so a
-- prompt's cached prefix is found block by block.  checksum covers tokens and
-- kv, so a torn block is never loaded.
CREATE TABLE blocks (
    hash        BLOB PRIMARY KEY,
    parent      BLOB,
    fingerprint BLOB NOT NULL,
    tokens      BLOB NOT NULL,
    kv          BLOB NOT NULL,
    checksum    INTEGER NOT NULL,
    bytes       INTEGER NOT NULL,
    last_used   INTEGER NOT NULL
);
CREATE INDEX blocks_lru ON blocks(last_used);
