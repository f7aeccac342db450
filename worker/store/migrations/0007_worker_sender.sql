-- What each destination's worker last sent with: a digest of its sender settings (address,
-- TLS, headers, the content of the files they name). A worker that starts with other settings
-- than the last one makes the destination's backing-off head due at once: the backoff was
-- earned by the old settings. Digests only; no setting or credential is stored.
CREATE TABLE inturn_worker_sender (
    destination  text        PRIMARY KEY,      -- "namespace/name"
    fingerprint  text        NOT NULL,         -- hex SHA-256 of the sender settings
    changed_at   timestamptz NOT NULL DEFAULT now()
);
