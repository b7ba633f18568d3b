/*
 * The PostgreSQL backend's life cycle (storage/pg.h): connect, migrate
 * (pg_schema.c), register this node incarnation, reserve job ids, start
 * the shared writer thread (writer.c, which commits through pg_write.c);
 * and close.
 *
 * Phase 1 runs one node per database, as the SQLite backend runs one
 * process per file: the writer connection holds a session advisory lock
 * (JD_PG_NODE_LOCK) for the node's life, so a second jackdawd on the same
 * database is refused with JD_EBUSY, and the lock goes with the session
 * when the process dies. At start the node adopts every unfinished job
 * (jobs.owner_node = its new id) and drops the rows of earlier
 * incarnations: one left behind means the last node did not close, which
 * is what jd_store_unclean reports. The cluster (phase 2) replaces both
 * with leases and takeover of expired nodes only.
 *
 * Threading: jd_pg_open/jd_pg_close on the opening thread (the writer is
 * not running yet / has stopped, so wconn is theirs); jd_pg_next_id on any
 * thread, under id_mu with a connection of its own.
 */
#include "storage/pg.h"
#include "storage/store_impl.h"

#include "common/alloc.h"
#include "common/error.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define JD_PG_LEASE_MS 10000           /* a node's lease (phase 2 heartbeats it; --lease) */
#define JD_PG_IDLE_TX_TIMEOUT_MS 60000 /* a stuck session never pins dead tuples for long */
#define JD_PG_CONNECT_TIMEOUT_S "10"
#define JD_PG_LOCK_WAITS 100        /* ... of JD_PG_LOCK_WAIT_NS: 2 s at most */
#define JD_PG_LOCK_WAIT_NS 20000000 /* 20 ms */

bool jd_store_path_is_pg(const char *path)
{
    return path && (strncasecmp(path, "postgres://", 11) == 0 ||
                    strncasecmp(path, "postgresql://", 13) == 0);
}

char *jd_pg_display_url(const char *url)
{
    char *out = jd_xstrdup(url);
    /* userinfo: between "://" and the last '@' before the path */
    char *auth = strstr(out, "://");
    if (auth) {
        auth += 3;
        size_t alen = strcspn(auth, "/?");
        char *at = NULL;
        for (char *p = auth; p < auth + alen; p++)
            if (*p == '@')
                at = p;
        char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
        if (colon) {
            char *rest = jd_xstrdup(at);
            *(colon + 1) = '\0';
            char *o = jd_xasprintf("%s***%s", out, rest);
            free(rest);
            free(out);
            out = o;
        }
    }
    /* a password=... query parameter */
    char *q = strchr(out, '?');
    char *pw = q ? strcasestr(q, "password=") : NULL;
    if (pw && (pw[-1] == '?' || pw[-1] == '&')) {
        char *end = pw + 9 + strcspn(pw + 9, "&");
        char *rest = jd_xstrdup(end);
        pw[9] = '\0';
        char *o = jd_xasprintf("%s***%s", out, rest);
        free(rest);
        free(out);
        out = o;
    }
    return out;
}

PGconn *jd_pg_connect(const char *url, const char *display, bool sync_full, struct jd_error *err)
{
    char options[160];
    snprintf(options, sizeof options,
             "-c synchronous_commit=%s -c idle_in_transaction_session_timeout=%d",
             sync_full ? "on" : "off", JD_PG_IDLE_TX_TIMEOUT_MS);
    /* dbname (the URL) last: what the URL itself says wins. */
    const char *const keys[] = {"fallback_application_name", "options", "connect_timeout", "dbname",
                                NULL};
    const char *const vals[] = {"jackdawd", options, JD_PG_CONNECT_TIMEOUT_S, url, NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (c && PQstatus(c) == CONNECTION_OK)
        return c;
    char msg[256];
    snprintf(msg, sizeof msg, "%s", c ? PQerrorMessage(c) : "out of memory");
    msg[strcspn(msg, "\n")] = '\0';
    PQfinish(c);
    jd_error_set(err, JD_EIO, NULL, "cannot connect to PostgreSQL database %s: %s", display, msg);
    return NULL;
}

int jd_pg_rc(const PGresult *r)
{
    if (!r)
        return JD_EIO; /* out of memory, or the query could not be sent */
    switch (PQresultStatus(r)) {
    case PGRES_COMMAND_OK:
    case PGRES_TUPLES_OK:
    case PGRES_SINGLE_TUPLE:
    case PGRES_PIPELINE_SYNC:
        return 0;
    default:
        break;
    }
    const char *code = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    if (!code)
        return JD_EIO;
    if (strncmp(code, "23", 2) == 0)
        return JD_EEXIST; /* integrity constraint, as SQLITE_CONSTRAINT */
    if (strncmp(code, "40", 2) == 0 || strcmp(code, "55P03") == 0)
        return JD_EBUSY; /* serialization failure, deadlock, lock not available */
    if (strcmp(code, "53200") == 0)
        return JD_ENOMEM;
    if (strcmp(code, "XX001") == 0 || strcmp(code, "XX002") == 0)
        return JD_ECORRUPT;
    return JD_EIO;
}

/* Run sql (no parameters) on c: 0 or err set. Rows, if any, in *res
 * (caller PQclears) when res is not NULL. */
static int pg_exec(PGconn *c, const char *display, const char *sql, PGresult **res,
                   struct jd_error *err)
{
    PGresult *r = PQexec(c, sql);
    int rc = jd_pg_rc(r);
    if (rc) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", PQerrorMessage(c));
        msg[strcspn(msg, "\n")] = '\0';
        PQclear(r);
        return jd_error_set(err, rc, NULL, "PostgreSQL database %s: %s", display, msg);
    }
    if (res)
        *res = r;
    else
        PQclear(r);
    return 0;
}

/* Reserve the next block of ids on idconn; under id_mu. 0 or JD_EIO. */
static int id_refill(struct jd_pg *pg)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (PQstatus(pg->idconn) != CONNECTION_OK)
            PQreset(pg->idconn);
        PGresult *r = PQexec(pg->idconn, "SELECT nextval('jd_job_ids')");
        if (jd_pg_rc(r) == 0 && PQntuples(r) == 1) {
            pg->id_next = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
            pg->id_end = pg->id_next + JD_PG_ID_BLOCK;
            PQclear(r);
            return 0;
        }
        PQclear(r);
    }
    jd_log(JD_LOG_ERROR, "storage: reserving job ids failed", "db", pg->display, "error",
           PQerrorMessage(pg->idconn), NULL);
    return JD_EIO;
}

int64_t jd_pg_next_id(struct jd_store *s)
{
    struct jd_pg *pg = s->pg;
    pthread_mutex_lock(&pg->id_mu);
    int64_t id = 0;
    if (pg->id_next < pg->id_end || id_refill(pg) == 0)
        id = pg->id_next++;
    pthread_mutex_unlock(&pg->id_mu);
    return id;
}

/* Register this incarnation (a fresh jd_nodes row) and, phase 1, adopt
 * the database: refuse if another node holds it, take every unfinished
 * job, drop the rows of earlier incarnations (their presence: unclean). */
static int register_node(struct jd_store *s, struct jd_error *err)
{
    struct jd_pg *pg = s->pg;
    PGresult *r = NULL;
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT pg_try_advisory_lock(%lld)", (long long)JD_PG_NODE_LOCK);
    bool locked = false;
    int rc;
    /* A node killed a moment ago holds the lock until the server has seen
     * its connections close: give that a moment rather than refuse a
     * restart (as the SQLite lock file does for an orphaned lock). */
    for (int i = 0; !locked && i < JD_PG_LOCK_WAITS; i++) {
        if (i > 0) {
            struct timespec ts = {0, JD_PG_LOCK_WAIT_NS};
            nanosleep(&ts, NULL);
        }
        if ((rc = pg_exec(pg->wconn, pg->display, sql, &r, err)) != 0)
            return rc;
        locked = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
        PQclear(r);
    }
    if (!locked)
        return jd_error_set(err, JD_EBUSY, NULL,
                            "PostgreSQL database %s is in use by another running Jackdaw node; "
                            "refusing to open it twice (a cluster of nodes is not supported yet)",
                            pg->display);

    char host[128] = "?";
    gethostname(host, sizeof host - 1);
    char name[160];
    snprintf(name, sizeof name, "%s:%ld", host, (long)getpid());
    char lease[32];
    snprintf(lease, sizeof lease, "%lld", (long long)pg->lease_ms);
    const char *vals[] = {name, lease};
    r = PQexecParams(pg->wconn,
                     "INSERT INTO jd_nodes(name, started_at, expires_at)"
                     " VALUES ($1, now(), now() + $2::bigint * interval '1 millisecond')"
                     " RETURNING id",
                     2, NULL, vals, NULL, NULL, 0);
    if (jd_pg_rc(r) || PQntuples(r) != 1) {
        rc = jd_error_set(err, JD_EIO, NULL, "PostgreSQL database %s: registering the node: %s",
                          pg->display, PQerrorMessage(pg->wconn));
        PQclear(r);
        return rc;
    }
    pg->node_id = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);

    snprintf(sql, sizeof sql,
             "BEGIN;"
             " UPDATE jobs SET owner_node = %lld WHERE state < 3"
             " AND owner_node IS DISTINCT FROM %lld;"
             " DELETE FROM jd_nodes WHERE id <> %lld RETURNING id;",
             (long long)pg->node_id, (long long)pg->node_id, (long long)pg->node_id);
    if ((rc = pg_exec(pg->wconn, pg->display, sql, &r, err)) != 0) {
        PQclear(PQexec(pg->wconn, "ROLLBACK"));
        return rc;
    }
    s->unclean = PQntuples(r) > 0;
    PQclear(r);
    return pg_exec(pg->wconn, pg->display, "COMMIT", NULL, err);
}

int jd_pg_open(struct jd_store *s, const struct jd_store_config *cfg, struct jd_error *err)
{
    struct jd_pg *pg = jd_xcalloc(1, sizeof *pg);
    s->pg = pg;
    pg->url = jd_xstrdup(cfg->path);
    pg->display = jd_pg_display_url(cfg->path);
    pg->lease_ms = JD_PG_LEASE_MS;
    pthread_mutex_init(&pg->id_mu, NULL);

    pg->wconn = jd_pg_connect(pg->url, pg->display, cfg->sync_full, err);
    if (!pg->wconn)
        return err ? err->code : JD_EIO;
    int rc = jd_pg_schema_migrate(pg->wconn, pg->display, err);
    if (rc == 0)
        rc = register_node(s, err);
    if (rc)
        return rc;
    pg->idconn = jd_pg_connect(pg->url, pg->display, cfg->sync_full, err);
    if (!pg->idconn)
        return err ? err->code : JD_EIO;
    if (id_refill(pg) != 0)
        return jd_error_set(err, JD_EIO, NULL, "PostgreSQL database %s: reserving job ids failed",
                            pg->display);
    PGresult *r = NULL;
    rc = pg_exec(pg->wconn, pg->display,
                 "SELECT 1 FROM queues WHERE retain_succeeded_ms > 0 OR"
                 " retain_failed_ms > 0 OR retain_cancelled_ms > 0 LIMIT 1",
                 &r, err);
    if (rc)
        return rc;
    bool queue_retention = PQntuples(r) > 0;
    PQclear(r);
    s->queue_retention = queue_retention; /* before the writer starts: then it is the writer's */
    if ((rc = jd_pg_readers_open(s, err)) != 0)
        return rc;
    pg->readers_opened = true;
    return jd_writer_start(s, err);
}

void jd_pg_close(struct jd_store *s)
{
    struct jd_pg *pg = s->pg;
    if (!pg)
        return;
    if (pg->wconn && pg->node_id > 0 && PQstatus(pg->wconn) == CONNECTION_OK) {
        char sql[96];
        snprintf(sql, sizeof sql, "DELETE FROM jd_nodes WHERE id = %lld", (long long)pg->node_id);
        PGresult *r = PQexec(pg->wconn, sql);
        if (jd_pg_rc(r))
            jd_log(JD_LOG_WARN, "storage: marking the node gone failed", "db", pg->display, "error",
                   PQerrorMessage(pg->wconn), NULL);
        PQclear(r);
    }
    if (pg->readers_opened)
        jd_pg_readers_close(s);
    jd_pg_write_free(pg);
    PQfinish(pg->wconn);
    PQfinish(pg->idconn);
    pthread_mutex_destroy(&pg->id_mu);
    free(pg->url);
    free(pg->display);
    free(pg);
    s->pg = NULL;
}
