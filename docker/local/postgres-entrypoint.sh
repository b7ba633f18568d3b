#!/bin/sh
# The entrypoint of docker/local/postgres.Dockerfile: on the first start
# (an empty PGDATA) make the cluster with POSTGRES_USER as its superuser
# and POSTGRES_PASSWORD as its password, then the database POSTGRES_DB;
# then run the server as the postgres user with the arguments given after
# "postgres" (e.g. -c max_connections=200). Anything else runs as given.
set -eu
if [ "${1:-}" != postgres ]; then
    exec "$@"
fi
shift
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "docker-entrypoint: POSTGRES_PASSWORD must be set" >&2
    exit 1
fi
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
# setpriv execs (runuser would stay as PID 1 and not pass SIGINT on).
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    chown postgres "$pwfile"
    as_pg initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        echo "CREATE DATABASE \"$POSTGRES_DB\";" |
            as_pg postgres --single -D "$PGDATA" postgres >/dev/null
    fi
    echo "docker-entrypoint: made the cluster in $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" "$@"
