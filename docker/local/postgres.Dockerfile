# A stand-in for the official postgres:15 image, built from Debian's own
# postgresql-15 package where no registry can be reached (docker/
# cluster_smoke.sh builds it on the local debootstrap base). It keeps the
# official image's contract that docker/compose.postgres.yaml relies on:
# POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB make the role and the
# database on the first start, the data lives in /var/lib/postgresql/data
# (PGDATA), extra arguments after "postgres" go to the server, pg_isready
# is on PATH for the healthcheck, and it listens on 5432 with password
# (scram-sha-256) authentication from other containers.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive
# No "main" cluster from the package: the entrypoint makes one in PGDATA.
RUN mkdir -p /etc/postgresql-common/createcluster.d \
 && echo 'create_main_cluster = false' >/etc/postgresql-common/createcluster.d/no-main.conf \
 && apt-get update -q \
 && apt-get install -y -q --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql \
 && chmod 700 /var/lib/postgresql/data
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
VOLUME ["/var/lib/postgresql/data"]
EXPOSE 5432
# SIGINT: a fast shutdown (as the official image).
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
CMD ["postgres"]
