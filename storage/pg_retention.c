/*
 * Retention on PostgreSQL: on the writer thread when it is idle, one
 * bounded step at a time (JD_PG_RETENTION_BATCH jobs), by one node at a
 * time (a transaction-scoped advisory lock: another node's pass now, ours
 * next time). Each deleted job is counted out of this node's queue_counts
 * slot in the same statement.
 */
#include "storage/pg_write_impl.h"

#include "common/clock.h"

#include <stdlib.h>

#define JD_PG_RETENTION_BATCH 128 /* jobs per retention transaction, as for SQLite */

bool jd_pg_retention_step(struct jd_store *s)
{
    int64_t now = jd_wall_ms();
    int64_t deleted = 0;
    PGresult *qs = NULL;
    if (jd_pgw_session(s) != 0 || jd_pgw_exec(s, "BEGIN") != 0)
        goto fail;
    /* one node at a time: another node's pass now, ours next time */
    PGresult *lk =
        PQexec(s->pg->wconn, "SELECT pg_try_advisory_xact_lock(" JD_PG_CHORE_LOCK_SQL ")");
    bool mine = jd_pg_rc(lk) == 0 && PQntuples(lk) == 1 && PQgetvalue(lk, 0, 0)[0] == 't';
    PQclear(lk);
    if (!mine) {
        jd_pgw_exec(s, "ROLLBACK");
        return false;
    }
    struct jd_pgw_prm none = {0};
    if (jd_pgw_xq(s, jd_pgw_stmt(PS_RET_QUEUES), &none, &qs) != 0)
        goto fail;
    for (int i = 0; i < PQntuples(qs) && deleted < JD_PG_RETENTION_BATCH; i++) {
        int64_t keep = strtoll(PQgetvalue(qs, i, 2), NULL, 10);
        if (keep <= 0)
            keep = s->retention_ms;
        if (keep <= 0)
            continue; /* kept forever */
        struct jd_pgw_prm p = {0};
        p_text(&p, PQgetvalue(qs, i, 0));
        p_int(&p, strtoll(PQgetvalue(qs, i, 1), NULL, 10));
        p_int(&p, now - keep);
        p_int(&p, JD_PG_RETENTION_BATCH - deleted);
        p_int(&p, s->pg->node_id);
        int64_t k = 0;
        bool found = false;
        if (jd_pgw_xint(s, PS_RET_DELETE, &p, &k, &found) != 0)
            goto fail;
        deleted += k;
    }
    PQclear(qs);
    qs = NULL;
    if (!jd_pgw_commit(s, NULL, NULL, NULL, HZ_KEEP))
        goto fail;
    atomic_fetch_add_explicit(&s->st_retention_deleted, (uint64_t)deleted,
                              memory_order_relaxed); /* a statistic */
    return deleted >= JD_PG_RETENTION_BATCH;

fail:
    jd_pgw_log_failure(s, "retention");
    PQclear(qs);
    if (PQstatus(s->pg->wconn) == CONNECTION_OK &&
        PQtransactionStatus(s->pg->wconn) != PQTRANS_IDLE)
        jd_pgw_exec(s, "ROLLBACK");
    return false;
}
