-- moe-studio server registry, version 1. Applied by backend/src/server/db.rs
-- when PRAGMA user_version < 1. Times are Unix milliseconds.

CREATE TABLE uploads (
    id              TEXT PRIMARY KEY,          -- UUID, also the directory uploads/{id}/
    file_name       TEXT NOT NULL,             -- validated [A-Za-z0-9][A-Za-z0-9._-]*
    size            INTEGER NOT NULL,
    sha256          TEXT NOT NULL,             -- announced whole-file hash
    chunk_size      INTEGER NOT NULL,
    chunks_received INTEGER NOT NULL DEFAULT 0, -- chunks 0..n verified and synced
    state           TEXT NOT NULL,             -- uploading | complete | consumed
    checkpoint_id   TEXT,
    created_at      INTEGER NOT NULL
);

CREATE TABLE upload_chunks (
    upload_id TEXT NOT NULL REFERENCES uploads(id) ON DELETE CASCADE,
    idx       INTEGER NOT NULL,
    sha256    TEXT NOT NULL,
    PRIMARY KEY (upload_id, idx)
);

CREATE TABLE checkpoints (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    dir         TEXT NOT NULL,   -- relative to the data dir: checkpoints/{id} or jobs/{job}/out[/final]
    entry       TEXT NOT NULL,   -- '' (the directory is the model) or the model file's name inside dir
    format      TEXT NOT NULL,
    parameters  INTEGER NOT NULL,
    architecture TEXT NOT NULL,
    summary     TEXT NOT NULL,   -- ModelSummary JSON
    source_job  TEXT,
    created_at  INTEGER NOT NULL
);

CREATE TABLE checkpoint_files (
    checkpoint_id TEXT NOT NULL REFERENCES checkpoints(id) ON DELETE CASCADE,
    name          TEXT NOT NULL,
    size          INTEGER NOT NULL,
    sha256        TEXT NOT NULL,
    PRIMARY KEY (checkpoint_id, name)
);

CREATE TABLE jobs (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT, -- submission order
    id                TEXT NOT NULL UNIQUE,
    name              TEXT,
    kind              TEXT NOT NULL,
    spec              TEXT NOT NULL,   -- JobSpec JSON
    backend           TEXT NOT NULL,
    state             TEXT NOT NULL,   -- queued | running | succeeded | failed | cancelled | interrupted
    error             TEXT,
    progress          TEXT,            -- Progress JSON
    output_checkpoint TEXT,
    pid               INTEGER,         -- of the running child process
    attempts          INTEGER NOT NULL DEFAULT 0,
    resume            INTEGER NOT NULL DEFAULT 0, -- next start continues from the last checkpoint
    created_at        INTEGER NOT NULL,
    started_at        INTEGER,
    finished_at       INTEGER
);

CREATE INDEX jobs_state ON jobs(state);
