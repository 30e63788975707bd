#!/bin/bash
# Registers the Citus workers with the coordinator, stores the passwords Citus nodes use to
# connect to one another (pg_dist_authinfo; nodeid 0 = every node, -1 = loopback), and creates
# the two service roles with their passwords (as CloudNativePG's managed roles do in the other
# overlays: `effect-ledger migrate` then finds them present and, since the runtime and reader
# URLs are explicit, leaves their passwords alone). Citus propagates the roles to the workers.
# Idempotent: safe to re-run after adding workers or rotating passwords. Passwords come from
# the environment (Secrets), reach psql as variables and never appear on a command line.
set -euo pipefail

coordinator="citus-coordinator-0.citus-coordinator"
workers=()
for ((i = 0; i < CITUS_WORKER_COUNT; i++)); do
  workers+=("citus-worker-${i}.citus-worker")
done

for host in "$coordinator" "${workers[@]}"; do
  until pg_isready -h "$host" -p 5432 -q; do
    echo "waiting for ${host}"
    sleep 2
  done
done

# Same rows on every node: a worker also opens connections (to other workers, and to the
# coordinator when metadata is synced).
for host in "$coordinator" "${workers[@]}"; do
  psql -h "$host" -v ON_ERROR_STOP=1 \
    -v superuser_pw="$PGPASSWORD" \
    -v runtime_pw="$RUNTIME_PASSWORD" \
    -v reader_pw="$READER_PASSWORD" <<'SQL'
BEGIN;
CREATE TEMP TABLE wanted (rolename name, pw text) ON COMMIT DROP;
INSERT INTO wanted VALUES
  ('postgres', :'superuser_pw'),
  ('effect_ledger_runtime', :'runtime_pw'),
  ('effect_ledger_diag_reader', :'reader_pw');
DELETE FROM pg_dist_authinfo a USING wanted w
  WHERE a.rolename = w.rolename AND a.nodeid IN (0, -1);
-- authinfo is a libpq conninfo string: quote the value, escape \ and '.
INSERT INTO pg_dist_authinfo (nodeid, rolename, authinfo)
  SELECT n.nodeid, w.rolename,
         'password=''' || replace(replace(w.pw, '\', '\\'), '''', '\''') || ''''
  FROM wanted w CROSS JOIN (VALUES (0), (-1)) AS n(nodeid);
COMMIT;
SQL
done

psql -h "$coordinator" -v ON_ERROR_STOP=1 -v coordinator="$coordinator" <<'SQL'
SELECT citus_set_coordinator_host(:'coordinator', 5432);
SQL

for worker in "${workers[@]}"; do
  psql -h "$coordinator" -v ON_ERROR_STOP=1 -v worker="$worker" <<'SQL'
SELECT citus_add_node(:'worker', 5432)
WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node WHERE nodename = :'worker' AND nodeport = 5432);
SQL
done

psql -h "$coordinator" -v ON_ERROR_STOP=1 \
  -v runtime_pw="$RUNTIME_PASSWORD" \
  -v reader_pw="$READER_PASSWORD" <<'SQL'
SELECT format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS NOINHERIT', r)
FROM (VALUES ('effect_ledger_runtime'), ('effect_ledger_diag_reader')) AS wanted(r)
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) \gexec
SELECT format('ALTER ROLE %I WITH LOGIN PASSWORD %L', r, pw)
FROM (VALUES ('effect_ledger_runtime', :'runtime_pw'), ('effect_ledger_diag_reader', :'reader_pw')) AS wanted(r, pw) \gexec
SQL

psql -h "$coordinator" -v ON_ERROR_STOP=1 -c "SELECT nodename, nodeport, isactive FROM pg_dist_node ORDER BY nodeid;"
