/*
 * Remote tasks across cluster nodes, the storage half (storage/store.h,
 * "Remote tasks across nodes"): each node incarnation advertises the base
 * URL other nodes reach it at (jd_nodes.url, PostgreSQL migration 5), a
 * node looks a task owner's URL up by its node id (or lists the live
 * nodes, for GET /v1/workers), and a node with remote
 * tasks waiting announces their commands with a NOTIFY on
 * JD_PG_TASKS_CHANNEL (the listener in pg_cluster.c hands each one to the
 * tasks_waiting hook). Also the grants that make a queue's max_running and
 * rate hold cluster-wide (jd_store_queue_grant; store.h says how; migration
 * 8's queue_grants, queue_tokens and queue_demand), one transaction per ask.
 * And a node's row in jd_watchers (migration 9) while it wants job-change
 * notices (jd_store_watch_notices; pg.h, JD_PG_WATCH_LOCK_SQL).
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

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Run sql on nconn (connecting first if need be); the result or NULL.
 * Under node_mu. One retry on a fresh connection when the old one broke.
 * Without parameters sql may be several statements (the last one's result;
 * one that fails leaves no transaction open). */
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
        PGresult *r =
            n ? PQexecParams(pg->nconn, sql, n, NULL, v, NULL, NULL, 0) : PQexec(pg->nconn, sql);
        if (jd_pg_rc(r) == 0)
            return r;
        PQclear(r);
        if (PQstatus(pg->nconn) == CONNECTION_OK) {
            if (PQtransactionStatus(pg->nconn) != PQTRANS_IDLE)
                PQclear(PQexec(pg->nconn, "ROLLBACK"));
            break; /* the statement failed, not the connection */
        }
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

int jd_store_watch_notices(struct jd_store *s, bool on)
{
    struct jd_pg *pg = s->pg;
    if (!pg)
        return JD_EINVAL;
    /* On: the row under the watch lock exclusive, which waits for the
     * batches holding it shared to commit, and holds new ones until this
     * commits (pg.h, JD_PG_WATCH_LOCK_SQL). lock_timeout bounds what a
     * stalled node's open batch can cost the cluster's writers queued
     * behind this request. */
    char sql[384];
    if (on)
        snprintf(sql, sizeof sql,
                 "BEGIN; SET LOCAL lock_timeout = %d;"
                 " SELECT pg_advisory_xact_lock(" JD_PG_WATCH_LOCK_SQL ");"
                 " INSERT INTO jd_watchers(node) VALUES (%lld) ON CONFLICT DO NOTHING; COMMIT",
                 JD_STORE_WATCH_LOCK_MS, (long long)pg->node_id);
    else
        snprintf(sql, sizeof sql, "DELETE FROM jd_watchers WHERE node = %lld",
                 (long long)pg->node_id);
    PGresult *r = nq_locked(pg, sql, 0, NULL);
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

/* ---- cluster-wide queue limits ---- */

#define QGRANT_FRESH_S "2"          /* a node's demand counts this long after its last ask */
#define QGRANT_LOCK_CLASS_S "19012" /* pg_advisory_xact_lock(class, hashtext(queue)): "JD" */

/* One statement of the grant transaction on c; NULL (after logging) on
 * failure. */
static PGresult *gq(struct jd_pg *pg, PGconn *c, const char *sql, int n, const char *const *v)
{
    PGresult *r = PQexecParams(c, sql, n, NULL, v, NULL, NULL, 0);
    if (jd_pg_rc(r) == 0)
        return r;
    PQclear(r);
    char msg[200];
    snprintf(msg, sizeof msg, "%s", PQerrorMessage(c));
    msg[strcspn(msg, "\n")] = '\0';
    jd_log(JD_LOG_WARN, "storage: a queue grant failed", "db", pg->display, "error", msg, NULL);
    return NULL;
}

/* "{1,2,3}" of ids (caller frees). */
/* Append r's first column (job ids) to out[*n..cap) and free r. */
static void take_ids(PGresult *r, int64_t *out, size_t *n, size_t cap)
{
    for (int i = 0; i < PQntuples(r) && *n < cap; i++)
        out[(*n)++] = strtoll(PQgetvalue(r, i, 0), NULL, 10);
    PQclear(r);
}

static char *id_array(const int64_t *ids, size_t n)
{
    char *out = jd_xmalloc(n * 21 + 3);
    size_t k = 0;
    out[k++] = '{';
    for (size_t i = 0; i < n; i++)
        k += (size_t)snprintf(out + k, 22, "%s%lld", i ? "," : "", (long long)ids[i]);
    out[k++] = '}';
    out[k] = '\0';
    return out;
}

/* Under node_mu, inside BEGIN on c: the grant itself (see store.h). */
static int grant_tx(struct jd_pg *pg, PGconn *c, const struct jd_queue_grant_ask *a,
                    int64_t *granted, size_t *ng, int64_t *retry_ms, bool *others)
{
    char me[24], now[24], lim[24];
    snprintf(me, sizeof me, "%lld", (long long)pg->node_id);
    snprintf(now, sizeof now, "%lld", (long long)a->now_ms);
    const char *q1[] = {a->queue};
    /* One round trip: the transaction, the queue's lock, then (a statement
     * of its own, so after the lock) the stored controls, which must be
     * the ones this node applies: a PUT on another node is followed within
     * a second (jobs_queue_controls_sync). */
    char *lit = PQescapeLiteral(c, a->queue, strlen(a->queue));
    if (!lit)
        return JD_EIO;
    /* A node that stalls inside this transaction (SIGSTOP) holds the
     * queue's lock: PostgreSQL ends its session after the idle timeout (a
     * lease, as the heartbeat's), and the others wait at most half a lease
     * for the lock, then ask again (JD_EIO: a second later). */
    long long idle = (long long)jd_pg_idle_tx_ms(pg), wait = (long long)pg->lease_ms / 2;
    char *head = jd_xasprintf("BEGIN; SET LOCAL idle_in_transaction_session_timeout = %lld;"
                              " SET LOCAL lock_timeout = %lld;"
                              " SELECT pg_advisory_xact_lock(" QGRANT_LOCK_CLASS_S
                              ", hashtext(%s)); SELECT config FROM queues WHERE name = %s",
                              idle, wait, lit, lit);
    PQfreemem(lit);
    PGresult *r = PQexec(c, head);
    free(head);
    if (jd_pg_rc(r) != 0) {
        PQclear(r);
        char msg[200];
        snprintf(msg, sizeof msg, "%s", PQerrorMessage(c));
        msg[strcspn(msg, "\n")] = '\0';
        jd_log(JD_LOG_WARN, "storage: a queue grant failed", "db", pg->display, "error", msg, NULL);
        return JD_EIO;
    }
    const char *have = PQntuples(r) == 1 && !PQgetisnull(r, 0, 0) ? PQgetvalue(r, 0, 0) : NULL;
    bool same = (!have && !a->config) || (have && a->config && strcmp(have, a->config) == 0);
    PQclear(r);
    if (!same)
        return JD_ESTALE;
    /* Grants whose job started, ended, or changed hands are spent; held:
     * the queue's running jobs plus the grants left (the statement's
     * snapshot still has the deleted ones: counted off). */
    if (!(r = gq(pg, c,
                 "WITH d AS (DELETE FROM queue_grants g WHERE g.queue = $1 AND NOT EXISTS"
                 " (SELECT 1 FROM jobs j WHERE j.id = g.job_id AND j.owner_node = g.node"
                 " AND j.state = 0) RETURNING 1)"
                 " SELECT (SELECT count(*) FROM jobs WHERE queue = $1 AND state = 1)"
                 " + (SELECT count(*) FROM queue_grants WHERE queue = $1)"
                 " - (SELECT count(*) FROM d)",
                 1, q1)))
        return JD_EIO;
    long long held = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    /* want: how far down the queue's waiting jobs the free slots and
     * tokens reach (this node gets its offered ones among them; any other
     * node's there are told by a notice). Bounded: a rate alone with a
     * large bucket looks no further than this node can use plus a page. */
    long long want = (long long)a->nids + 256;
    if (a->max_running) {
        long long free_ = (long long)a->max_running - held;
        if (free_ < want)
            want = free_ > 0 ? free_ : 0;
    }
    double tokens = 0;
    bool rate_short = false, bucket = false;
    if (a->rate_limit && want > 0) {
        char rl[24], per[24];
        snprintf(rl, sizeof rl, "%u", a->rate_limit);
        snprintf(per, sizeof per, "%lld", (long long)a->rate_per_ms);
        const char *v[] = {a->queue, rl, per};
        /* A new bucket starts full, as on one node; the refill is counted
         * in the database's clock, so node clocks may differ. */
        if (!(r = gq(pg, c,
                     "INSERT INTO queue_tokens(queue, tokens, at) VALUES ($1, $2::float8, now())"
                     " ON CONFLICT (queue) DO NOTHING",
                     2, v)))
            return JD_EIO;
        PQclear(r);
        if (!(r = gq(pg, c,
                     "SELECT least($2::float8, tokens + greatest(0, extract(epoch FROM"
                     " (now() - at))) * 1000 * $2::float8 / $3::float8)"
                     " FROM queue_tokens WHERE queue = $1 FOR UPDATE",
                     3, v)))
            return JD_EIO;
        tokens = strtod(PQgetvalue(r, 0, 0), NULL);
        bucket = true;
        PQclear(r);
        long long whole = (long long)(tokens + 1e-9);
        if (whole < want) {
            rate_short = whole < (long long)a->nids; /* this node's jobs wait for tokens */
            want = whole;
        }
    }
    *ng = 0;
    if (a->nids > 0) {
        /* Offered jobs this node holds grants for already (granted before
         * and then read out of memory and back in): granted again, already
         * counted. */
        char *arr = id_array(a->ids, a->nids);
        const char *v[] = {me, arr};
        r = gq(pg, c,
               "SELECT job_id FROM queue_grants WHERE node = $1::bigint"
               " AND job_id = ANY($2::bigint[])",
               2, v);
        free(arr);
        if (!r)
            return JD_EIO;
        take_ids(r, granted, ng, a->nids);
    }
    size_t again = *ng;
    /* This node's demand: the rank of its best ready job (its ready list's
     * head), kept fresh by its asks (every second while it has ready jobs
     * and room); a node with none ready removes it when a job ends. */
    char head_p[24], head_c[24], head_id[24];
    snprintf(head_p, sizeof head_p, "%lld", (long long)a->head_priority);
    snprintf(head_c, sizeof head_c, "%lld", (long long)a->head_created_ms);
    snprintf(head_id, sizeof head_id, "%lld", a->nids ? (long long)a->ids[0] : 0LL);
    {
        const char *v[] = {a->queue, me, head_p, head_c, head_id};
        r = a->nids ? gq(pg, c,
                         "INSERT INTO queue_demand(queue, node, priority, created_ms, job_id, at)"
                         " VALUES ($1, $2::bigint, $3::bigint, $4::bigint, $5::bigint, now())"
                         " ON CONFLICT (queue, node) DO UPDATE SET priority = excluded.priority,"
                         " created_ms = excluded.created_ms, job_id = excluded.job_id, at = now()",
                         5, v)
                    : gq(pg, c, "DELETE FROM queue_demand WHERE queue = $1 AND node = $2::bigint",
                         2, v);
        if (!r)
            return JD_EIO;
        PQclear(r);
    }
    if (want > 0) {
        /* Turns: the free starts go round the nodes with ready jobs of
         * the queue (fresh demand, live node), in the order of their best
         * jobs (priority desc, submission time, id), so that the oldest
         * waiting job anywhere goes first and no node's jobs wait while
         * another node's later ones start. */
        r = gq(pg, c,
               "WITH gone AS (DELETE FROM queue_demand WHERE queue = $1"
               " AND (at < now() - interval '1 minute' OR node NOT IN (SELECT id FROM jd_nodes)))"
               " SELECT node FROM queue_demand WHERE queue = $1"
               " AND at > now() - interval '" QGRANT_FRESH_S " seconds'"
               " AND node IN (SELECT id FROM jd_nodes WHERE expires_at > now())"
               " ORDER BY priority DESC, created_ms, job_id",
               1, q1);
        if (!r)
            return JD_EIO;
        long long m = PQntuples(r), pos = -1;
        for (int i = 0; i < PQntuples(r) && pos < 0; i++)
            if (strtoll(PQgetvalue(r, i, 0), NULL, 10) == pg->node_id)
                pos = i;
        PQclear(r);
        long long quota = 0;
        if (a->take_any)
            quota = want;
        else if (pos >= 0)
            quota = want / m + (pos < want % m ? 1 : 0);
        long long left = (long long)(a->nids - again);
        if (quota > left)
            quota = left;
        *others = want > quota && m > (pos >= 0 ? 1 : 0);
        if (quota > 0) {
            /* This node's offered jobs that are still queued, its own and
             * due, in the order offered. */
            char *arr = id_array(a->ids, a->nids);
            snprintf(lim, sizeof lim, "%lld", quota);
            const char *v[] = {arr, me, now, lim};
            r = gq(pg, c,
                   "SELECT j.id FROM unnest($1::bigint[]) WITH ORDINALITY AS o(id, k)"
                   " JOIN jobs j ON j.id = o.id WHERE j.owner_node = $2::bigint"
                   " AND j.state = 0 AND j.run_at_ms <= $3::bigint"
                   " AND NOT EXISTS (SELECT 1 FROM queue_grants g WHERE g.job_id = j.id)"
                   " ORDER BY o.k LIMIT $4::bigint",
                   4, v);
            free(arr);
            if (!r)
                return JD_EIO;
            take_ids(r, granted, ng, a->nids);
        }
    }
    size_t fresh = *ng - again;
    if (fresh > 0) {
        char *arr = id_array(granted + again, fresh);
        const char *v[] = {a->queue, me, arr};
        r = gq(pg, c,
               "INSERT INTO queue_grants(job_id, queue, node)"
               " SELECT unnest($3::bigint[]), $1, $2::bigint"
               " WHERE EXISTS (SELECT 1 FROM jd_nodes WHERE id = $2::bigint"
               " AND expires_at > now())",
               3, v);
        free(arr);
        if (!r)
            return JD_EIO;
        bool alive = strtoll(PQcmdTuples(r), NULL, 10) == (long long)fresh;
        PQclear(r);
        if (!alive)
            return JD_ESTALE; /* this node's lease lapsed: nothing granted */
    }
    if (bucket && (fresh > 0 || rate_short)) {
        char left[48];
        snprintf(left, sizeof left, "%.9f", tokens - (double)fresh);
        const char *v[] = {a->queue, left};
        if (!(r = gq(pg, c,
                     "UPDATE queue_tokens SET tokens = $2::float8, at = now()"
                     " WHERE queue = $1",
                     2, v)))
            return JD_EIO;
        PQclear(r);
        if (rate_short) {
            double rest = tokens - (double)fresh;
            double need = 1.0 - (rest - (double)(long long)rest);
            *retry_ms = (int64_t)(need * (double)a->rate_per_ms / (double)a->rate_limit) + 1;
        }
    }
    if (*others) {
        if (!(r = gq(pg, c, "SELECT pg_notify('" JD_PG_NOTIFY_CHANNEL "', 'c')", 0, NULL)))
            return JD_EIO;
        PQclear(r);
    }
    return 0;
}

int jd_store_queue_grant(struct jd_store *s, const struct jd_queue_grant_ask *ask, int64_t *granted,
                         size_t *ngranted, int64_t *retry_ms, bool *others)
{
    struct jd_pg *pg = s->pg;
    *ngranted = 0;
    *retry_ms = 0;
    *others = false;
    if (!pg)
        return JD_EINVAL;
    if (atomic_load(&pg->lease_lost))
        return JD_ESTALE;
    pthread_mutex_lock(&pg->node_mu);
    if (pg->nconn && PQstatus(pg->nconn) != CONNECTION_OK) {
        PQfinish(pg->nconn);
        pg->nconn = NULL;
    }
    if (!pg->nconn)
        pg->nconn = jd_pg_connect(pg->url, pg->display, pg->sync_full, NULL);
    PGconn *c = pg->nconn;
    int rc = JD_EIO;
    if (c) {
        PGresult *r;
        rc = grant_tx(pg, c, ask, granted, ngranted, retry_ms, others);
        r = gq(pg, c, rc == 0 ? "COMMIT" : "ROLLBACK", 0, NULL);
        if (!r && rc == 0)
            rc = JD_EIO;
        PQclear(r);
        if (rc != 0)
            *ngranted = 0;
    }
    pthread_mutex_unlock(&pg->node_mu);
    return rc;
}

int jd_store_queue_tokens(struct jd_store *s, const char *queue, uint32_t rate_limit,
                          int64_t rate_per_ms, long long *tokens)
{
    struct jd_pg *pg = s->pg;
    *tokens = 0;
    if (!pg || rate_limit == 0 || rate_per_ms <= 0)
        return JD_EINVAL;
    char rl[24], per[24];
    snprintf(rl, sizeof rl, "%u", rate_limit);
    snprintf(per, sizeof per, "%lld", (long long)rate_per_ms);
    const char *v[] = {queue, rl, per};
    PGresult *r = nq_locked(pg,
                            "SELECT coalesce((SELECT least($2::float8, tokens + greatest(0,"
                            " extract(epoch FROM (now() - at))) * 1000 * $2::float8 / $3::float8)"
                            " FROM queue_tokens WHERE queue = $1), $2::float8)",
                            3, v);
    if (!r)
        return JD_EIO;
    *tokens = (long long)(strtod(PQgetvalue(r, 0, 0), NULL) + 1e-9);
    PQclear(r);
    return 0;
}
