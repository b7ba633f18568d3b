/*
 * The event horizon of a PostgreSQL node's writer (the rule is in
 * storage/pg.h, "The event horizon"): before a batch that may insert
 * events, jd_nodes.pending_event_id is set on the writer's second,
 * autocommit connection (hzconn) so it is visible at once; the batch's
 * COMMIT sets the next bound (jd_pgw_commit, pg_write.c), and a writer
 * that then finds no records for JD_PG_HZ_LINGER_US clears it here, as
 * does a batch that did not commit.
 *
 * Threading: the writer thread only.
 */
#include "storage/pg_write_impl.h"

#include "common/error.h"

#include <stdio.h>
#include <string.h>

/* sql with this node's id as $1 on hzconn, (re)connected once if the
 * connection is gone. The result, or NULL. */
static PGresult *hz_exec(struct jd_store *s, const char *sql)
{
    struct jd_pg *pg = s->pg;
    char me[24];
    snprintf(me, sizeof me, "%lld", (long long)pg->node_id);
    const char *v[] = {me};
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!pg->hzconn || PQstatus(pg->hzconn) != CONNECTION_OK) {
            PQfinish(pg->hzconn);
            /* synchronous_commit=off: visible at once, the batch's own
             * COMMIT (later in the WAL) makes it durable */
            pg->hzconn = jd_pg_connect(pg->url, pg->display, false, NULL);
            if (!pg->hzconn)
                return NULL;
        }
        PGresult *r = PQexecParams(pg->hzconn, sql, 1, NULL, v, NULL, NULL, 0);
        if (jd_pg_rc(r) == 0)
            return r;
        PQclear(r);
        if (PQstatus(pg->hzconn) == CONNECTION_OK)
            return NULL; /* the statement failed, not the connection */
    }
    return NULL;
}

/* Records that never insert into events need no horizon. */
bool jd_pgw_needs_horizon(struct jd_write **b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        switch ((int)b[i]->op) {
        case JD_W_SYNC_:
        case JD_W_QUEUE:
        case JD_W_QUEUE_CONFIG:
        case JD_W_JOB_CRASHES:
        case JD_W_JOB_DELETE:
        case JD_W_COMMAND_PUT:
        case JD_W_COMMAND_DELETE:
        case JD_W_TASK_PUT:
        case JD_W_JOB_REQUEST:
            break;
        default:
            return true;
        }
    return false;
}

int jd_pgw_hz_publish(struct jd_store *s)
{
    PGresult *r = hz_exec(s, HZ_NEXT_SQL);
    if (!r)
        return JD_EIO;
    /* no row: this incarnation's lease is lost (it starts over) */
    s->pg->hz_pending = strcmp(PQcmdTuples(r), "1") == 0;
    PQclear(r);
    return 0;
}

uint64_t jd_pg_hz_linger_ns(struct jd_store *s)
{
    bool lost = atomic_load(&s->pg->lease_lost); /* the bound stays (jd_pgw_hz_clear) */
    return s->pg->hz_pending && !lost ? (uint64_t)JD_PG_HZ_LINGER_US * 1000u : 0;
}

void jd_pg_hz_idle(struct jd_store *s)
{
    jd_pgw_hz_clear(s);
}

void jd_pgw_hz_clear(struct jd_store *s)
{
    /* Once the lease is lost (given up after a COMMIT lost in flight, or
     * lapsed), that COMMIT, or one that raced the loss, may still land with
     * event ids above the bound: the bound stays until a takeover deletes
     * the row. */
    if (!s->pg->hz_pending || atomic_load(&s->pg->lease_lost))
        return;
    PGresult *r = hz_exec(s, HZ_CLEAR_SQL);
    if (r)
        s->pg->hz_pending = false;
    PQclear(r);
}
