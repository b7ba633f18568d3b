/*
 * The cluster on PostgreSQL (storage/store.h, "the cluster"; storage/pg.h):
 * node leases, takeover, claims, the inbox reads and the change notices.
 *
 * A node incarnation is a jd_nodes row with expires_at = now() + lease, in
 * the database's clock (node clocks may skew). The heartbeat thread renews
 * it every lease/5 with
 *     UPDATE jd_nodes SET expires_at = now() + lease
 *     WHERE id = me AND expires_at > now()
 * and no row back means the lease is lost, for good: every job write is
 * refused from then on (the writer's fenced statements also require this
 * node's row to be alive, so even a node that has not noticed yet cannot
 * write), and hooks.lease_lost is called once. jd_pg_lease_ok is false
 * within lease/4 of the last confirmed deadline (real monotonic clock,
 * counted from before the heartbeat was sent, so it errs early).
 *
 * Takeover: every lease/2 each node deletes the expired node rows and, in
 * the same transaction, unowns their unfinished jobs, raising the crash
 * count of those that were started (a clean close gives jobs back without
 * one); the rows are locked
 * by that UPDATE, so a late fenced write of the old owner waits for it and
 * then finds owner_node changed: zero rows, JD_ESTALE). Unowned jobs are
 * claimed by jd_pg_claim: a MATERIALIZED CTE with FOR UPDATE SKIP LOCKED
 * over the partial index jobs_unowned, so two claimers never get one job.
 * Once in a while, under a transaction-scoped advisory lock (one node at a
 * time), jobs owned by an id that has no row any more are unowned too (an
 * insert that raced its node's takeover).
 *
 * Threads and connections: the heartbeat thread (heartbeats and takeover
 * passes, on its own connection), the listener thread (LISTEN jd_changes
 * on its own connection, polled with a 1 s timeout for the fallback hints),
 * and claims/adoptions on cconn under claim_mu from the caller's thread.
 * Hooks run on those two threads only and never after jd_pg_cluster_stop
 * returned (it joins them; jd_store_close calls it first).
 */
#include "storage/pg.h"
#include "storage/store_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define JD_PG_ORPHAN_EVERY 8 /* takeover passes between orphan sweeps */
#define JD_PG_LISTEN_POLL_MS 1000
#define JD_PG_RECONNECT_MAX_MS 5000
#define JD_PG_MAX_CHANGES 1024 /* (id, version) pairs one notice can carry (~7,900 bytes) */

static int64_t mono_ms(void)
{
    return (int64_t)(jd_clock_real_mono_ns() / 1000000u);
}

static void ll(char *b, size_t n, int64_t v)
{
    snprintf(b, n, "%lld", (long long)v);
}

/* Run sql with text parameters; the result (caller clears) or NULL with
 * the failure logged once per call site's what. */
static PGresult *q(PGconn *c, const char *sql, int n, const char *const *v)
{
    PGresult *r = PQexecParams(c, sql, n, NULL, v, NULL, NULL, 0);
    if (jd_pg_rc(r) == 0)
        return r;
    PQclear(r);
    return NULL;
}

static void warn(struct jd_pg *pg, const char *what, PGconn *c)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s", c ? PQerrorMessage(c) : "no connection");
    msg[strcspn(msg, "\n")] = '\0';
    jd_log(JD_LOG_WARN, what, "db", pg->display, "error", msg, NULL);
}

int64_t jd_pg_node_id(const struct jd_store *s)
{
    return s->pg->node_id;
}

/* ---- takeover ---- */

/* Fold the queue_counts slots that `which` selects ($1 its parameter)
 * into the shared slot 0, in the caller's transaction. */
#define FOLD_COUNTS(which)                                                                         \
    "WITH m AS (DELETE FROM queue_counts WHERE " which " RETURNING queue, state, n)"               \
    " INSERT INTO queue_counts(queue, state, slot, n)"                                             \
    " SELECT queue, state, 0, sum(n) FROM m GROUP BY queue, state"                                 \
    " ON CONFLICT(queue, state, slot) DO UPDATE SET n = queue_counts.n + excluded.n"

/* One takeover pass on c: expired node rows deleted and their unfinished
 * jobs unowned, in one transaction; orphans too when sweep says. The
 * number of jobs unowned, or -1 on failure. */
static int64_t takeover_pass(struct jd_pg *pg, PGconn *c, bool sweep)
{
    int64_t n = 0;
    /* Never wait long on a row a stalled node holds: the heartbeat runs on
     * this thread after the pass. The next pass tries again (by then
     * PostgreSQL has ended the stalled transaction: jd_pg_idle_tx_ms). */
    char begin[96];
    snprintf(begin, sizeof begin, "BEGIN; SET LOCAL lock_timeout = %lld",
             (long long)(pg->lease_ms / 10 > 50 ? pg->lease_ms / 10 : 50));
    PGresult *r = PQexec(c, begin);
    if (jd_pg_rc(r) != 0) {
        PQclear(r);
        warn(pg, "storage: a takeover pass failed", c);
        return -1;
    }
    PQclear(r);
    r = q(c,
          "WITH d AS (DELETE FROM jd_nodes WHERE expires_at < now() RETURNING id)"
          " SELECT coalesce(array_agg(id), '{}') FROM d",
          0, NULL);
    if (!r)
        goto fail;
    char ids[4096];
    snprintf(ids, sizeof ids, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    if (strcmp(ids, "{}") != 0) {
        const char *v[] = {ids};
        r = q(c,
              "UPDATE jobs SET owner_node = NULL,"
              " crashes = crashes + CASE WHEN state IN (1, 2) THEN 1 ELSE 0 END"
              " WHERE state < 3 AND owner_node = ANY($1::bigint[])",
              1, v);
        if (!r)
            goto fail;
        n += strtoll(PQcmdTuples(r), NULL, 10);
        PQclear(r);
        if (!(r = q(c, FOLD_COUNTS("slot = ANY($1::bigint[])"), 1, v)))
            goto fail;
        PQclear(r);
        jd_log(JD_LOG_WARN, "storage: took over the jobs of nodes whose lease lapsed", "nodes", ids,
               NULL);
    }
    if (sweep) {
        char lock[64];
        snprintf(lock, sizeof lock, "SELECT pg_try_advisory_xact_lock(%lld)",
                 (long long)JD_PG_CHORE_LOCK);
        r = q(c, lock, 0, NULL);
        if (!r)
            goto fail;
        bool mine = PQgetvalue(r, 0, 0)[0] == 't';
        PQclear(r);
        if (mine) {
            r = q(c,
                  "UPDATE jobs j SET owner_node = NULL,"
                  " crashes = crashes + CASE WHEN state IN (1, 2) THEN 1 ELSE 0 END"
                  " WHERE state < 3 AND owner_node IS NOT NULL"
                  " AND NOT EXISTS (SELECT 1 FROM jd_nodes n WHERE n.id = j.owner_node)",
                  0, NULL);
            if (!r)
                goto fail;
            n += strtoll(PQcmdTuples(r), NULL, 10);
            PQclear(r);
            r = q(c,
                  FOLD_COUNTS("slot <> 0 AND NOT EXISTS"
                              " (SELECT 1 FROM jd_nodes n WHERE n.id = queue_counts.slot)"),
                  0, NULL);
            if (!r)
                goto fail;
            PQclear(r);
        }
    }
    if (n > 0) {
        r = q(c, "SELECT pg_notify('" JD_PG_NOTIFY_CHANNEL "', 'c')", 0, NULL);
        if (!r)
            goto fail;
        PQclear(r);
    }
    r = q(c, "COMMIT", 0, NULL);
    if (!r)
        goto fail;
    PQclear(r);
    atomic_fetch_add_explicit(&pg->st_takeovers, (uint64_t)n, memory_order_relaxed);
    return n;

fail:
    warn(pg, "storage: a takeover pass failed", c);
    PQclear(PQexec(c, "ROLLBACK"));
    return -1;
}

int jd_pg_node_register(struct jd_store *s, struct jd_error *err)
{
    struct jd_pg *pg = s->pg;
    char host[128] = "?";
    gethostname(host, sizeof host - 1);
    char name[160];
    snprintf(name, sizeof name, "%s:%ld", host, (long)getpid());
    char lease[32];
    ll(lease, sizeof lease, pg->lease_ms);
    const char *vals[] = {name, lease};
    int64_t t0 = mono_ms();
    PGresult *r = q(pg->wconn,
                    "INSERT INTO jd_nodes(name, started_at, expires_at)"
                    " VALUES ($1, now(), now() + $2::bigint * interval '1 millisecond')"
                    " RETURNING id",
                    2, vals);
    if (!r || PQntuples(r) != 1) {
        PQclear(r);
        return jd_error_set(err, JD_EIO, NULL, "PostgreSQL database %s: registering the node: %s",
                            pg->display, PQerrorMessage(pg->wconn));
    }
    pg->node_id = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    atomic_store(&pg->deadline_ms, t0 + pg->lease_ms);
    int64_t n = takeover_pass(pg, pg->wconn, true);
    if (n < 0)
        return jd_error_set(err, JD_EIO, NULL, "PostgreSQL database %s: taking over jobs: %s",
                            pg->display, PQerrorMessage(pg->wconn));
    s->unclean = n > 0;
    return 0;
}

void jd_pg_node_unregister(struct jd_store *s)
{
    struct jd_pg *pg = s->pg;
    if (!pg->wconn || pg->node_id <= 0 || PQstatus(pg->wconn) != CONNECTION_OK)
        return;
    char me[24];
    ll(me, sizeof me, pg->node_id);
    const char *v[] = {me};
    PGresult *r = q(pg->wconn, "BEGIN", 0, NULL);
    PQclear(r);
    bool ok = r != NULL;
    if (ok && (r = q(pg->wconn,
                     "WITH j AS (UPDATE jobs SET owner_node = NULL WHERE state < 3"
                     " AND owner_node = $1 RETURNING 1),"
                     " n AS (DELETE FROM jd_nodes WHERE id = $1)"
                     " SELECT pg_notify('" JD_PG_NOTIFY_CHANNEL "', 'c') FROM j LIMIT 1",
                     1, v)) != NULL)
        PQclear(r);
    ok = ok && r != NULL;
    if (ok && (r = q(pg->wconn, FOLD_COUNTS("slot = $1"), 1, v)) != NULL)
        PQclear(r);
    ok = ok && r != NULL;
    if (ok && (r = q(pg->wconn, "COMMIT", 0, NULL)) != NULL)
        PQclear(r);
    if (!ok || !r) {
        warn(pg,
             "storage: giving back this node's jobs failed (they are taken over when its "
             "lease lapses)",
             pg->wconn);
        PQclear(PQexec(pg->wconn, "ROLLBACK"));
    }
}

/* ---- claims ---- */

/* cconn, connected; under claim_mu. */
static PGconn *claim_conn(struct jd_pg *pg)
{
    if (pg->cconn && PQstatus(pg->cconn) != CONNECTION_OK)
        PQreset(pg->cconn);
    if (!pg->cconn)
        pg->cconn = jd_pg_connect(pg->url, pg->display, pg->sync_full, NULL);
    return pg->cconn && PQstatus(pg->cconn) == CONNECTION_OK ? pg->cconn : NULL;
}

/* Up to limit unowned unfinished jobs made this node's (limit 0: all of
 * them); their ids (caller frees) in *ids. */
static int take_unowned(struct jd_store *s, unsigned limit, int64_t **ids, size_t *n)
{
    struct jd_pg *pg = s->pg;
    *ids = NULL;
    *n = 0;
    if (atomic_load(&pg->lease_lost))
        return 0;
    char me[24], lim[24];
    ll(me, sizeof me, pg->node_id);
    ll(lim, sizeof lim, limit);
    const char *v[] = {me, lim};
    pthread_mutex_lock(&pg->claim_mu);
    PGconn *c = claim_conn(pg);
    PGresult *r = NULL;
    if (c && limit > 0)
        /* Never IN (subquery) with LIMIT: it may lock more rows than it
         * takes. Best-effort priority order across nodes. */
        r = q(c,
              "WITH c AS MATERIALIZED (SELECT id FROM jobs"
              " WHERE owner_node IS NULL AND state < 3"
              " AND EXISTS (SELECT 1 FROM jd_nodes WHERE id = $1 AND expires_at > now())"
              " ORDER BY priority DESC, id LIMIT $2 FOR UPDATE SKIP LOCKED)"
              " UPDATE jobs j SET owner_node = $1 FROM c WHERE j.id = c.id RETURNING j.id",
              2, v);
    else if (c)
        r = q(c,
              "UPDATE jobs SET owner_node = $1 WHERE owner_node IS NULL AND state < 3"
              " AND EXISTS (SELECT 1 FROM jd_nodes WHERE id = $1 AND expires_at > now())"
              " RETURNING id",
              1, v);
    if (!r)
        warn(pg, "storage: claiming jobs failed", c);
    pthread_mutex_unlock(&pg->claim_mu);
    if (!r)
        return JD_EIO;
    *n = (size_t)PQntuples(r);
    *ids = jd_xcalloc(*n ? *n : 1, sizeof **ids);
    for (size_t i = 0; i < *n; i++)
        (*ids)[i] = strtoll(PQgetvalue(r, (int)i, 0), NULL, 10);
    PQclear(r);
    return 0;
}

int jd_pg_adopt_unowned(struct jd_store *s)
{
    int64_t *ids;
    size_t n;
    int rc = take_unowned(s, 0, &ids, &n);
    free(ids);
    return rc;
}

int jd_pg_claim(struct jd_store *s, unsigned limit, jd_store_job_fn fn, void *arg, size_t *n)
{
    int64_t *ids;
    size_t got;
    *n = 0;
    int rc = take_unowned(s, limit, &ids, &got);
    if (rc == 0 && got > 0) {
        atomic_fetch_add_explicit(&s->pg->st_claims, got, memory_order_relaxed);
        rc = jd_pg_jobs_hand(s, ids, got, fn, arg, n);
    }
    free(ids);
    return rc;
}

/* The queued-job window (server/jobs_window.c): a cancel or message for
 * a queued job waiting unowned takes that job for this node first. */
int jd_pg_claim_id(struct jd_store *s, int64_t id)
{
    struct jd_pg *pg = s->pg;
    if (atomic_load(&pg->lease_lost))
        return JD_ESTALE;
    char me[24], jid[24];
    ll(me, sizeof me, pg->node_id);
    ll(jid, sizeof jid, id);
    const char *v[] = {me, jid};
    pthread_mutex_lock(&pg->claim_mu);
    PGconn *c = claim_conn(pg);
    PGresult *r = c ? q(c,
                        "UPDATE jobs SET owner_node = $1 WHERE id = $2 AND owner_node IS NULL"
                        " AND state = 0" /* queued: a started one is resumed by a claim */
                        " AND EXISTS (SELECT 1 FROM jd_nodes WHERE id = $1 AND expires_at > now())"
                        " RETURNING id",
                        2, v)
                    : NULL;
    if (!r)
        warn(pg, "storage: claiming a job failed", c);
    pthread_mutex_unlock(&pg->claim_mu);
    if (!r)
        return JD_EIO;
    int rc = PQntuples(r) == 1 ? 0 : JD_ENOENT;
    PQclear(r);
    if (rc == 0)
        atomic_fetch_add_explicit(&pg->st_claims, 1, memory_order_relaxed);
    return rc;
}

/* ---- the inbox ---- */

int jd_pg_requests(struct jd_store *s, int64_t after_id, unsigned limit,
                   struct jd_job_request **rows, size_t *n)
{
    struct jd_pg_rconn *rc_;
    int rc = jd_pg_rconn_get(s, &rc_);
    if (rc)
        return rc;
    char a[24], me[24], lim[24];
    ll(a, sizeof a, after_id);
    ll(me, sizeof me, s->pg->node_id);
    ll(lim, sizeof lim, limit);
    const char *v[] = {a, me, lim};
    PGconn *c = jd_pg_rconn_conn(rc_);
    PGresult *r = q(c,
                    "SELECT r.id, r.job_id, r.kind, r.data FROM job_requests r"
                    " JOIN jobs j ON j.id = r.job_id"
                    " WHERE r.id > $1 AND j.owner_node = $2 AND j.state < 3"
                    " ORDER BY r.id LIMIT $3",
                    3, v);
    if (!r) {
        warn(s->pg, "storage: reading inbox requests failed", c);
        jd_pg_rconn_put(s, rc_);
        return JD_EIO;
    }
    *n = (size_t)PQntuples(r);
    *rows = jd_xcalloc(*n ? *n : 1, sizeof **rows);
    for (size_t i = 0; i < *n; i++) {
        struct jd_job_request *q_ = &(*rows)[i];
        q_->id = strtoll(PQgetvalue(r, (int)i, 0), NULL, 10);
        q_->job_id = strtoll(PQgetvalue(r, (int)i, 1), NULL, 10);
        q_->kind = (enum jd_event_kind)atoi(PQgetvalue(r, (int)i, 2));
        q_->data = PQgetisnull(r, (int)i, 3) ? NULL : jd_xstrdup(PQgetvalue(r, (int)i, 3));
    }
    PQclear(r);
    jd_pg_rconn_put(s, rc_);
    return 0;
}

/* ---- the heartbeat thread ---- */

bool jd_pg_lease_ok(struct jd_store *s)
{
    struct jd_pg *pg = s->pg;
    return !atomic_load(&pg->lease_lost) &&
           mono_ms() < atomic_load(&pg->deadline_ms) - pg->lease_ms / 4;
}

bool jd_pg_is_leader(struct jd_store *s)
{
    return atomic_load(&s->pg->leader) && jd_pg_lease_ok(s);
}

bool jd_pg_healthy(struct jd_store *s)
{
    return atomic_load(&s->pg->healthy);
}

void jd_pg_test_pause_heartbeat(struct jd_store *s, bool pause)
{
    atomic_store(&s->pg->hb_paused, pause);
}

static void lose_lease_because(struct jd_pg *pg, const char *why)
{
    if (atomic_exchange(&pg->lease_lost, true))
        return;
    atomic_store(&pg->leader, false);
    atomic_fetch_add_explicit(&pg->st_lease_lost, 1, memory_order_relaxed);
    char me[24];
    ll(me, sizeof me, pg->node_id);
    jd_log(JD_LOG_ERROR, "storage: this node lost its lease; its job writes are refused", "node",
           me, "why", why, NULL);
    if (atomic_load(&pg->hooks_ready) && pg->hooks.lease_lost)
        pg->hooks.lease_lost(pg->hooks.arg);
}

static void lose_lease(struct jd_pg *pg)
{
    lose_lease_because(pg, "its row lapsed or was taken over");
}

void jd_pg_give_up_lease(struct jd_pg *pg, const char *why)
{
    lose_lease_because(pg, why);
}

static void heartbeat(struct jd_pg *pg, PGconn **c)
{
    if (!*c || PQstatus(*c) != CONNECTION_OK) {
        if (*c)
            PQreset(*c);
        else
            *c = jd_pg_connect(pg->url, pg->display, pg->sync_full, NULL);
        if (!*c || PQstatus(*c) != CONNECTION_OK) {
            atomic_store(&pg->healthy, false);
            return;
        }
        char set[96];
        snprintf(set, sizeof set, "SET idle_in_transaction_session_timeout = %lld",
                 (long long)jd_pg_idle_tx_ms(pg));
        PQclear(PQexec(*c, set)); /* best effort: the connection's default (60 s) else */
    }
    char me[24], lease[24];
    ll(me, sizeof me, pg->node_id);
    ll(lease, sizeof lease, pg->lease_ms);
    const char *v[] = {me, lease};
    int64_t t0 = mono_ms();
    uint64_t n0 = jd_clock_real_mono_ns();
    PGresult *r = q(*c,
                    "UPDATE jd_nodes SET expires_at = now() + $2::bigint * interval '1 millisecond'"
                    " WHERE id = $1 AND expires_at > now()"
                    " RETURNING (SELECT min(id) FROM jd_nodes WHERE expires_at > now())",
                    2, v);
    uint64_t us = (jd_clock_real_mono_ns() - n0) / 1000u;
    if (!r) {
        if (atomic_exchange(&pg->healthy, false))
            warn(pg, "storage: a heartbeat failed", *c);
        return;
    }
    atomic_store(&pg->healthy, true);
    atomic_fetch_add_explicit(&pg->st_hb, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pg->st_hb_us_sum, us, memory_order_relaxed);
    uint64_t mx = atomic_load_explicit(&pg->st_hb_us_max, memory_order_relaxed);
    while (us > mx && !atomic_compare_exchange_weak(&pg->st_hb_us_max, &mx, us)) {
    }
    if (PQntuples(r) == 0) {
        PQclear(r);
        lose_lease(pg);
        return;
    }
    atomic_store(&pg->leader, strtoll(PQgetvalue(r, 0, 0), NULL, 10) == pg->node_id);
    atomic_store(&pg->deadline_ms, t0 + pg->lease_ms);
    PQclear(r);
}

/* Sleep until mono ms `until` or stop; true: stop. */
static bool nap(struct jd_pg *pg, int64_t until)
{
    pthread_mutex_lock(&pg->cl_mu);
    while (!pg->cl_stop) {
        int64_t left = until - mono_ms();
        if (left <= 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + (left % 1000) * 1000000;
        ts.tv_sec += left / 1000 + ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&pg->cl_cv, &pg->cl_mu, &ts);
    }
    bool stop = pg->cl_stop;
    pthread_mutex_unlock(&pg->cl_mu);
    return stop;
}

static void *heartbeat_main(void *arg)
{
    struct jd_pg *pg = arg;
    PGconn *c = NULL;
    int64_t next_hb = mono_ms(), next_to = next_hb + pg->lease_ms / 2;
    for (;;) {
        int64_t now = mono_ms();
        if (now >= next_hb) {
            if (!atomic_load(&pg->hb_paused) && !atomic_load(&pg->lease_lost))
                heartbeat(pg, &c);
            next_hb = now + pg->lease_ms / 5;
        }
        if (now >= next_to) {
            /* a node that is not sure of its own lease takes over nobody's
             * jobs (a stalled node, or one a test stalls, does nothing) */
            if (!atomic_load(&pg->hb_paused) && !atomic_load(&pg->lease_lost) &&
                mono_ms() < atomic_load(&pg->deadline_ms) - pg->lease_ms / 4 && c &&
                PQstatus(c) == CONNECTION_OK) {
                bool sweep = ++pg->passes % JD_PG_ORPHAN_EVERY == 0;
                if (takeover_pass(pg, c, sweep) > 0 && atomic_load(&pg->hooks_ready) &&
                    pg->hooks.claimable)
                    pg->hooks.claimable(pg->hooks.arg);
            }
            next_to = now + pg->lease_ms / 2;
        }
        if (nap(pg, next_hb < next_to ? next_hb : next_to))
            break;
    }
    PQfinish(c);
    return NULL;
}

/* ---- the listener thread ---- */

/* One notice's payload: "id:version" pairs, "*", "r", "c", "s:<id>", "s",
 * comma-separated. */
static void dispatch(struct jd_pg *pg, char *payload, struct jd_job_change *buf)
{
    const struct jd_store_cluster_hooks *h = &pg->hooks;
    size_t n = 0;
    bool all = false, req = false, claim = false;
    for (char *save = NULL, *e = strtok_r(payload, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
        if (strcmp(e, "*") == 0) {
            all = true;
        } else if (strcmp(e, "r") == 0) {
            req = true;
        } else if (strcmp(e, "c") == 0) {
            claim = true;
        } else if (e[0] == 's' && (e[1] == ':' || e[1] == '\0')) {
            if (h->schedule_changed)
                h->schedule_changed(h->arg, e[1] ? e + 2 : NULL);
        } else if (n < JD_PG_MAX_CHANGES) {
            char *colon = strchr(e, ':');
            buf[n].id = strtoll(e, NULL, 10);
            buf[n].version = colon ? strtoll(colon + 1, NULL, 10) : 0;
            if (buf[n].id > 0)
                n++;
        }
    }
    if (h->changed && (all || n > 0))
        h->changed(h->arg, all ? NULL : buf, all ? 0 : n);
    if (req && h->requests)
        h->requests(h->arg);
    if (claim && h->claimable)
        h->claimable(h->arg);
}

static PGconn *listen_connect(struct jd_pg *pg)
{
    PGconn *c = jd_pg_connect(pg->url, pg->display, pg->sync_full, NULL);
    if (!c)
        return NULL;
    PGresult *r = q(c, "LISTEN " JD_PG_NOTIFY_CHANNEL, 0, NULL);
    if (r) {
        PQclear(r);
        r = q(c, "LISTEN " JD_PG_TASKS_CHANNEL, 0, NULL); /* remote tasks (pg_nodes.c) */
    }
    if (!r) {
        PQfinish(c);
        return NULL;
    }
    PQclear(r);
    return c;
}

static void *listener_main(void *arg)
{
    struct jd_pg *pg = arg;
    const struct jd_store_cluster_hooks *h = &pg->hooks;
    struct jd_job_change *buf = jd_xcalloc(JD_PG_MAX_CHANGES, sizeof *buf);
    PGconn *c = listen_connect(pg);
    int64_t backoff = 100, next_hint = mono_ms() + pg->lease_ms / 2;
    for (;;) {
        if (!c) {
            if (nap(pg, mono_ms() + backoff))
                break;
            backoff = backoff * 2 > JD_PG_RECONNECT_MAX_MS ? JD_PG_RECONNECT_MAX_MS : backoff * 2;
            if (!(c = listen_connect(pg)))
                continue;
            backoff = 100;
            jd_log(JD_LOG_INFO, "storage: change listener reconnected", "db", pg->display, NULL);
            /* notices may have been missed: everything may have changed */
            if (h->changed)
                h->changed(h->arg, NULL, 0);
            if (h->schedule_changed)
                h->schedule_changed(h->arg, NULL);
        }
        struct pollfd fds[2] = {{.fd = PQsocket(c), .events = POLLIN},
                                {.fd = pg->wake[0], .events = POLLIN}};
        int pr = poll(fds, 2, JD_PG_LISTEN_POLL_MS);
        pthread_mutex_lock(&pg->cl_mu);
        bool stop = pg->cl_stop;
        pthread_mutex_unlock(&pg->cl_mu);
        if (stop)
            break;
        if (pr > 0 && (fds[0].revents & (POLLIN | POLLERR | POLLHUP))) {
            if (!PQconsumeInput(c)) {
                warn(pg, "storage: the change listener lost its connection", c);
                PQfinish(c);
                c = NULL;
                continue;
            }
            PGnotify *nt;
            while ((nt = PQnotifies(c)) != NULL) {
                atomic_fetch_add_explicit(&pg->st_notices, 1, memory_order_relaxed);
                if (strcmp(nt->relname, JD_PG_TASKS_CHANNEL) != 0)
                    dispatch(pg, nt->extra, buf);
                else if (h->tasks_waiting)
                    h->tasks_waiting(h->arg, nt->extra);
                PQfreemem(nt);
            }
        }
        if (mono_ms() >= next_hint) {
            /* the fallback: notices are hints and may be lost */
            if (h->requests)
                h->requests(h->arg);
            if (h->claimable)
                h->claimable(h->arg);
            next_hint = mono_ms() + pg->lease_ms / 2;
        }
    }
    PQfinish(c);
    free(buf);
    return NULL;
}

/* ---- start, stop, stats ---- */

int jd_pg_heartbeat_start(struct jd_store *s)
{
    struct jd_pg *pg = s->pg;
    if (pthread_create(&pg->hb_thr, NULL, heartbeat_main, pg) != 0)
        return JD_EIO;
    pg->hb_started = true;
    return 0;
}

int jd_pg_cluster_start(struct jd_store *s, const struct jd_store_cluster_hooks *h)
{
    struct jd_pg *pg = s->pg;
    if (pg->cl_started || !h)
        return JD_EINVAL;
    pg->hooks = *h;
    atomic_store(&pg->hooks_ready, true); /* seq_cst: orders the hooks before the heartbeat's use */
    if (pipe(pg->wake) != 0)
        return JD_EIO;
    fcntl(pg->wake[0], F_SETFL, O_NONBLOCK);
    if (pthread_create(&pg->ln_thr, NULL, listener_main, pg) != 0) {
        close(pg->wake[0]);
        close(pg->wake[1]);
        pg->wake[0] = pg->wake[1] = -1;
        return JD_EIO;
    }
    pg->cl_started = true;
    return 0;
}

void jd_pg_cluster_stop(struct jd_store *s)
{
    struct jd_pg *pg = s->pg;
    if (!pg)
        return;
    pthread_mutex_lock(&pg->cl_mu);
    pg->cl_stop = true;
    pthread_cond_broadcast(&pg->cl_cv);
    pthread_mutex_unlock(&pg->cl_mu);
    if (pg->hb_started)
        pthread_join(pg->hb_thr, NULL);
    pg->hb_started = false;
    if (!pg->cl_started)
        return;
    ssize_t w = write(pg->wake[1], "x", 1);
    (void)w; /* a full pipe wakes the poll as well */
    pthread_join(pg->ln_thr, NULL);
    close(pg->wake[0]);
    close(pg->wake[1]);
    pg->wake[0] = pg->wake[1] = -1;
    pg->cl_started = false;
}

void jd_pg_cluster_stats(struct jd_store *s, struct jd_cluster_stats *out)
{
    struct jd_pg *pg = s->pg;
    /* relaxed: independent counters read for /metrics */
    out->claims = atomic_load_explicit(&pg->st_claims, memory_order_relaxed);
    out->takeovers = atomic_load_explicit(&pg->st_takeovers, memory_order_relaxed);
    out->fenced = atomic_load_explicit(&pg->st_fenced, memory_order_relaxed);
    out->requests = atomic_load_explicit(&pg->st_requests, memory_order_relaxed);
    out->notices = atomic_load_explicit(&pg->st_notices, memory_order_relaxed);
    out->lease_lost = atomic_load_explicit(&pg->st_lease_lost, memory_order_relaxed);
    out->heartbeats = atomic_load_explicit(&pg->st_hb, memory_order_relaxed);
    out->heartbeat_us_sum = atomic_load_explicit(&pg->st_hb_us_sum, memory_order_relaxed);
    out->heartbeat_us_max = atomic_load_explicit(&pg->st_hb_us_max, memory_order_relaxed);
    out->read_waits = atomic_load_explicit(&pg->st_read_waits, memory_order_relaxed);
    out->read_wait_us = atomic_load_explicit(&pg->st_read_wait_us, memory_order_relaxed);
    out->read_timeouts = atomic_load_explicit(&pg->st_read_timeouts, memory_order_relaxed);
    if (pg->readers_opened)
        jd_pg_read_pool_count(s, &out->read_open, &out->read_idle);
    out->read_max = pg->pool_max;
}
