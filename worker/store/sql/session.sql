-- Session checks and settings (inturn.worker.store.connect).

-- name: backend_pid
-- Which backend ran this statement (two different answers in one session: a pooler moves it).
SELECT pg_backend_pid() AS pid;

-- name: server_settings
-- The server's own values of what inturn would otherwise set per session (said when pooled).
SELECT current_setting('synchronous_commit') AS synchronous_commit;

-- name: session_settings
-- A direct session's own settings, after connecting (never startup options, never on a pooled
-- session, where they would leak into other clients): synchronous commit and the server-side
-- keepalives and user timeout (connect.SESSION_SETTINGS).
-- A NULL value keeps the session's own (a setting the DSN's options give).
SELECT set_config('synchronous_commit',
                  coalesce(%(synchronous_commit)s, current_setting('synchronous_commit')), false),
       set_config('tcp_keepalives_idle',
                  coalesce(%(tcp_keepalives_idle)s, current_setting('tcp_keepalives_idle')), false),
       set_config('tcp_keepalives_interval',
                  coalesce(%(tcp_keepalives_interval)s,
                           current_setting('tcp_keepalives_interval')), false),
       set_config('tcp_keepalives_count',
                  coalesce(%(tcp_keepalives_count)s, current_setting('tcp_keepalives_count')),
                  false),
       set_config('tcp_user_timeout',
                  coalesce(%(tcp_user_timeout)s, current_setting('tcp_user_timeout')), false);
