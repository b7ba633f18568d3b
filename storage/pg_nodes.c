/*
 * Remote tasks across cluster nodes, the storage half (storage/store.h,
 * "Remote tasks across nodes"): each node incarnation advertises the base
 * URL other nodes reach it at (jd_nodes.url, PostgreSQL migration 5), a
 * node looks a task owner's URL up by its node id (or lists the live
 * nodes, for GET /v1/workers), and a node with remote
 * tasks waiting announces their commands with a NOTIFY on
 * JD_PG_TASKS_CHANNEL (the listener in pg_cluster.c hands each one to the
 * tasks_waiting hook).
 *
 * A lookup answers only for a live row (expires_at > now(), the database's
 * clock, as the heartbeat's test): a node whose lease lapsed cannot renew
 * it, so "no live row" is final for that incarnation.
 *
 * Threads and connections: any thread, on one connection of its own
 * (nconn, under node_mu, connected lazily and once more after a failure),
 * so neither the writer nor the read pool (read-only sessions, where a
 * NOTIFY does not belong) is involved. Callers are off the HTTP event
 * threads (api/forward.c).
 */
#include "storage/pg.h"
#include "storage/store_impl.h"

#include "common/alloc.h"
#include "common/error.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Run sql on nconn (connecting first if need be); the result or NULL.
 * Under node_mu. One retry on a fresh connection when the old one broke. */
static PGresult *nq(struct jd_pg *pg, const char *sql, int n, const char *const *v)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (pg->nconn && PQstatus(pg->nconn) != CONNECTION_OK) {
            PQfinish(pg->nconn);
            pg->nconn = NULL;
        }
        if (!pg->nconn)
            pg->nconn = jd_pg_connect(pg->url, pg->display, pg->sync_full, NULL);
        if (!pg->nconn)
            return NULL;
        PGresult *r = PQexecParams(pg->nconn, sql, n, NULL, v, NULL, NULL, 0);
        if (jd_pg_rc(r) == 0)
            return r;
        PQclear(r);
        if (PQstatus(pg->nconn) == CONNECTION_OK)
            break; /* the statement failed, not the connection */
    }
    char msg[200];
    snprintf(msg, sizeof msg, "%s", pg->nconn ? PQerrorMessage(pg->nconn) : "no connection");
    msg[strcspn(msg, "\n")] = '\0';
    jd_log(JD_LOG_WARN, "storage: a node-table statement failed", "db", pg->display, "error", msg,
           NULL);
    return NULL;
}

/* nq under node_mu. */
static PGresult *nq_locked(struct jd_pg *pg, const char *sql, int n, const char *const *v)
{
    pthread_mutex_lock(&pg->node_mu);
    PGresult *r = nq(pg, sql, n, v);
    pthread_mutex_unlock(&pg->node_mu);
    return r;
}

int jd_store_node_advertise(struct jd_store *s, const char *url)
{
    struct jd_pg *pg = s->pg;
    if (!pg || !url)
        return JD_EINVAL;
    char me[24];
    snprintf(me, sizeof me, "%lld", (long long)pg->node_id);
    const char *v[] = {me, url};
    PGresult *r = nq_locked(pg, "UPDATE jd_nodes SET url = $2 WHERE id = $1", 2, v);
    if (!r)
        return JD_EIO;
    PQclear(r);
    return 0;
}

int jd_store_node_url(struct jd_store *s, int64_t node, char **url)
{
    struct jd_pg *pg = s->pg;
    *url = NULL;
    if (!pg)
        return JD_EINVAL;
    if (node <= 0)
        return JD_ENOENT;
    char id[24];
    snprintf(id, sizeof id, "%lld", (long long)node);
    const char *v[] = {id};
    PGresult *r = nq_locked(pg,
                            "SELECT url FROM jd_nodes WHERE id = $1 AND expires_at > now()"
                            " AND url IS NOT NULL",
                            1, v);
    if (!r)
        return JD_EIO;
    int rc = JD_ENOENT;
    if (PQntuples(r) == 1) {
        *url = jd_xstrdup(PQgetvalue(r, 0, 0));
        rc = 0;
    }
    PQclear(r);
    return rc;
}

int jd_store_tasks_announce(struct jd_store *s, const char *payload)
{
    struct jd_pg *pg = s->pg;
    if (!pg || !payload || strlen(payload) > JD_STORE_ANNOUNCE_MAX)
        return JD_EINVAL;
    const char *v[] = {payload};
    PGresult *r = nq_locked(pg, "SELECT pg_notify('" JD_PG_TASKS_CHANNEL "', $1)", 1, v);
    if (!r)
        return JD_EIO;
    PQclear(r);
    return 0;
}

int jd_store_nodes_live(struct jd_store *s, unsigned limit, int64_t **ids, char ***urls, size_t *n)
{
    struct jd_pg *pg = s->pg;
    *ids = NULL;
    *urls = NULL;
    *n = 0;
    if (!pg)
        return JD_EINVAL;
    char lim[24];
    snprintf(lim, sizeof lim, "%u", limit);
    const char *v[] = {lim};
    PGresult *r =
        nq_locked(pg,
                  "SELECT id, url FROM jd_nodes WHERE expires_at > now() AND url IS NOT NULL"
                  " ORDER BY id LIMIT $1",
                  1, v);
    if (!r)
        return JD_EIO;
    size_t k = (size_t)PQntuples(r);
    *ids = jd_xcalloc(k ? k : 1, sizeof **ids);
    *urls = jd_xcalloc(k ? k : 1, sizeof **urls);
    for (size_t i = 0; i < k; i++) {
        (*ids)[i] = strtoll(PQgetvalue(r, (int)i, 0), NULL, 10);
        (*urls)[i] = jd_xstrdup(PQgetvalue(r, (int)i, 1));
    }
    *n = k;
    PQclear(r);
    return 0;
}

void jd_store_nodes_free(int64_t *ids, char **urls, size_t n)
{
    for (size_t i = 0; i < n && urls; i++)
        free(urls[i]);
    free(urls);
    free(ids);
}
