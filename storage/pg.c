/*
 * The PostgreSQL backend's life cycle (storage/pg.h): connect, migrate
 * (pg_schema.c), register this node incarnation, reserve job ids, start
 * the shared writer thread (writer.c, which commits through pg_write.c);
 * and close.
 *
 * Any number of nodes share a database (the cluster, pg_cluster.c): at
 * open the node registers a fresh incarnation with a lease and takes over
 * only the jobs of nodes whose lease lapsed; at close it gives its own
 * unfinished jobs back (unowned) and deletes its row.
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

#define JD_PG_IDLE_TX_TIMEOUT_MS 60000 /* a stuck session never pins dead tuples for long */
#define JD_PG_CONNECT_TIMEOUT_S "10"

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

int jd_pg_open(struct jd_store *s, const struct jd_store_config *cfg, struct jd_error *err)
{
    struct jd_pg *pg = jd_xcalloc(1, sizeof *pg);
    s->pg = pg;
    pg->url = jd_xstrdup(cfg->path);
    pg->display = jd_pg_display_url(cfg->path);
    pg->lease_ms = cfg->lease_ms > 0 ? cfg->lease_ms : JD_PG_LEASE_MS;
    pg->sync_full = cfg->sync_full;
    atomic_init(&pg->healthy, true);
    atomic_init(&pg->leader, false);
    pg->wake[0] = pg->wake[1] = -1;
    pthread_mutex_init(&pg->id_mu, NULL);
    pthread_mutex_init(&pg->cl_mu, NULL);
    pthread_mutex_init(&pg->claim_mu, NULL);
    pthread_mutex_init(&pg->node_mu, NULL);
    pthread_cond_init(&pg->cl_cv, NULL);

    pg->wconn = jd_pg_connect(pg->url, pg->display, cfg->sync_full, err);
    if (!pg->wconn)
        return err ? err->code : JD_EIO;
    int rc = jd_pg_schema_migrate(pg->wconn, pg->display, err);
    if (rc == 0)
        rc = jd_pg_node_register(s, err);
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
    if ((rc = jd_pg_readers_open(s, cfg, err)) != 0)
        return rc;
    pg->readers_opened = true;
    if (jd_pg_heartbeat_start(s) != 0)
        return jd_error_set(err, JD_EIO, NULL, "starting the heartbeat thread failed");
    return jd_writer_start(s, err);
}

void jd_pg_close(struct jd_store *s)
{
    struct jd_pg *pg = s->pg;
    if (!pg)
        return;
    jd_pg_cluster_stop(s);
    jd_pg_node_unregister(s);
    if (pg->readers_opened)
        jd_pg_readers_close(s);
    jd_pg_write_free(pg);
    PQfinish(pg->wconn);
    PQfinish(pg->idconn);
    pthread_mutex_destroy(&pg->id_mu);
    pthread_mutex_destroy(&pg->cl_mu);
    pthread_mutex_destroy(&pg->claim_mu);
    PQfinish(pg->cconn);
    pthread_mutex_destroy(&pg->node_mu);
    PQfinish(pg->nconn);
    pthread_cond_destroy(&pg->cl_cv);
    free(pg->url);
    free(pg->display);
    free(pg);
    s->pg = NULL;
}
