-- Named queries of inturn.worker.store.logins: a destination's own worker login (migration 0036).

-- name: login
-- Make (or re-key) the login of one destination's worker; returns its role name.
SELECT inturn_worker_login(%(destination)s, %(verifier)s) AS login;

-- name: logout
-- Drop a destination's worker login and its mapping (false: it had none).
SELECT inturn_worker_logout(%(destination)s) AS dropped;

-- name: scope
-- The destination this session's login works for ('*': not scoped).
SELECT inturn_worker_destination() AS scope;

-- name: logins
-- Every destination login, oldest first.
SELECT role::text AS login, destination, created_at FROM inturn_worker_scope ORDER BY created_at;
