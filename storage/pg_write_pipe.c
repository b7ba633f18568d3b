/*
 * The pipelined fast path of a PostgreSQL batch (storage/pg_write_impl.h):
 * BEGIN and every record's statements are sent in one libpq pipeline and
 * their results read back in chunks (JD_PG_PIPE_CHUNK), a few round trips
 * for the whole batch. The batch's job inserts go first as one statement
 * of arrays (PS_JOB_INSERTS), and the changes of jobs that have nothing
 * else in the batch as another (PS_JOB_CHANGES), each job's records
 * folded into one update of its row. Any record that does not apply rolls the transaction back;
 * pg_write.c then redoes the batch with savepoints, one record at a time.
 *
 * Threading: the writer thread only.
 */
#include "storage/pg_write_impl.h"

#include "common/alloc.h"
#include "common/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- array literals ---- */

static void ab_put(struct jd_pgw_abuf *a, const char *v, size_t n)
{
    if (a->len + n + 1 > a->cap) {
        a->cap = 2 * (a->len + n + 1) + 256;
        a->p = jd_xrealloc(a->p, a->cap);
    }
    memcpy(a->p + a->len, v, n);
    a->len += n;
    a->p[a->len] = '\0';
}

static void ab_sep(struct jd_pgw_abuf *a)
{
    if (a->len > 1) /* past the "{" */
        ab_put(a, ",", 1);
}

static void ab_int(struct jd_pgw_abuf *a, int64_t v)
{
    char b[24];
    int n = snprintf(b, sizeof b, "%lld", (long long)v);
    ab_sep(a);
    ab_put(a, b, (size_t)n);
}

/* A text element of n bytes: NULL, or double-quoted with '"' and '\'
 * escaped. */
static void ab_textn(struct jd_pgw_abuf *a, const char *v, size_t n)
{
    ab_sep(a);
    if (!v) {
        ab_put(a, "NULL", 4);
        return;
    }
    ab_put(a, "\"", 1);
    const char *end = v + n;
    for (const char *run = v; run < end;) {
        const char *q = run;
        while (q < end && *q != '"' && *q != '\\')
            q++;
        ab_put(a, run, (size_t)(q - run));
        if (q == end)
            break;
        ab_put(a, "\\", 1);
        ab_put(a, q, 1);
        run = q + 1;
    }
    ab_put(a, "\"", 1);
}

static void ab_text(struct jd_pgw_abuf *a, const char *v)
{
    ab_textn(a, v, v ? strlen(v) : 0);
}

/* ---- the "labels" member of a definition, found without parsing it ---- */

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

/* p at a '"': past the closing one, or NULL. */
static const char *skip_string(const char *p)
{
    for (p++; *p; p++) {
        if (*p == '\\') {
            if (!*++p)
                return NULL;
        } else if (*p == '"') {
            return p + 1;
        }
    }
    return NULL;
}

/* Past one JSON value at p (whether it is valid inside is PostgreSQL's to
 * say), or NULL. */
static const char *skip_value(const char *p)
{
    if (*p == '"')
        return skip_string(p);
    if (*p != '{' && *p != '[') {
        const char *q = p;
        while (*q && !strchr(",}] \t\r\n", *q))
            q++;
        return q > p ? q : NULL;
    }
    int depth = 0;
    do {
        if (*p == '"') {
            if (!(p = skip_string(p)))
                return NULL;
            continue;
        }
        if (*p == '{' || *p == '[')
            depth++;
        else if (*p == '}' || *p == ']')
            depth--;
        else if (!*p)
            return NULL;
        p++;
    } while (depth > 0);
    return p;
}

/* The text of the top-level "labels" member of the JSON object def (the
 * last one, as jsonb keeps): 1 with [*at, *at + *len), 0 when there is
 * none, -1 when def does not scan (PostgreSQL then parses it whole). */
static int labels_member(const char *def, const char **at, size_t *len)
{
    const char *p = skip_ws(def);
    int found = 0;
    if (*p++ != '{')
        return -1;
    for (p = skip_ws(p); *p != '}';) {
        if (*p != '"')
            return -1;
        const char *k = p + 1, *ke = skip_string(p);
        if (!ke || memchr(k, '\\', (size_t)(ke - k)))
            return -1; /* an escaped key could spell "labels" */
        bool is_labels = ke - k == 7 && memcmp(k, "labels\"", 7) == 0;
        p = skip_ws(ke);
        if (*p++ != ':')
            return -1;
        const char *vs = skip_ws(p);
        if (!(p = skip_value(vs)))
            return -1;
        if (is_labels) {
            *at = vs;
            *len = (size_t)(p - vs);
            found = 1;
        }
        p = skip_ws(p);
        if (*p == ',')
            p = skip_ws(p + 1);
        else if (*p != '}')
            return -1;
    }
    return found;
}

/* Queue the batch's job rows as one statement (PS_JOB_INSERTS), before
 * every other record's statements: a record about a job comes after the
 * job's insert in the batch, so it still finds the row. apply_insert then
 * only takes the inserts' keys; a key taken after a release earlier in the
 * batch fails here and sends the batch the slow way, in order. 0, or
 * JD_EINVAL for a record apply_insert would
 * refuse (the slow path says which). */
static int emit_inserts(struct jd_pgw_ctx *c)
{
    struct jd_pg_wscratch *ws = c->ws;
    size_t nins = 0;
    for (size_t i = 0; i < c->nb; i++)
        nins += c->b[i]->op == JD_W_JOB_INSERT;
    if (nins == 0)
        return 0;
    const size_t na = 15; /* PS_JOB_INSERTS's array parameters */
    for (size_t k = 0; k < na; k++) {
        ws->arr[k].len = 0;
        ab_put(&ws->arr[k], "{", 1);
    }
    struct jd_write *first = NULL;
    for (size_t i = 0; i < c->nb; i++) {
        struct jd_write *w = c->b[i];
        if (w->op != JD_W_JOB_INSERT)
            continue;
        int64_t created = 0;
        if (jd_write_insert_check(w, c->now, &created) != 0)
            return JD_EINVAL;
        const struct jd_job *j = w->job;
        int64_t id = w->job_id;
        char data[48];
        snprintf(data, sizeof data, "{\"state\":\"%s\"}", jd_job_state_name(j->state));
        ab_int(&ws->arr[0], id);
        ab_text(&ws->arr[1], j->queue);
        ab_int(&ws->arr[2], j->priority);
        ab_int(&ws->arr[3], j->state);
        ab_int(&ws->arr[4], j->run_at_ms);
        ab_int(&ws->arr[5], created);
        ab_int(&ws->arr[6], jd_job_state_terminal(j->state) ? created : 0);
        ab_text(&ws->arr[7], j->idempotency_key);
        ab_text(&ws->arr[8], j->schedule_id);
        ab_text(&ws->arr[9], j->handler);
        ab_text(&ws->arr[10], j->definition);
        ab_text(&ws->arr[11], data);
        const char *lat = NULL;
        size_t llen = 0;
        int lm =
            strstr(j->definition, "\"labels\":") ? labels_member(j->definition, &lat, &llen) : 0;
        if (lm < 0)
            ab_text(&ws->arr[12], j->definition);
        else
            ab_textn(&ws->arr[12], lm ? lat : NULL, llen);
        ab_sep(&ws->arr[13]);
        ab_put(&ws->arr[13], lm < 0 ? "t" : "f", 1);
        ab_sep(&ws->arr[14]);
        ab_put(&ws->arr[14], w->unowned ? "t" : "f", 1); /* the queued-job window */
        if (!first)
            first = w;
    }
    struct jd_pgw_prm p = {0};
    for (size_t k = 0; k < 12; k++) {
        ab_put(&ws->arr[k], "}", 1);
        p_text(&p, ws->arr[k].p);
    }
    p_int(&p, c->s->pg->node_id);
    p_int(&p, c->now);
    for (size_t k = 12; k < na; k++) {
        ab_put(&ws->arr[k], "}", 1);
        p_text(&p, ws->arr[k].p);
    }
    c->hoisted = true;
    return jd_pgw_emit(c, first, jd_pgw_stmt(PS_JOB_INSERTS), &p, RK_INSERTS);
}

enum { PIPE_OK = 0, PIPE_FAULT = 1, PIPE_FATAL = 2 };

/* Sync the pipeline and read every queued statement's result, checking
 * each against its record. Returns the worst outcome seen. */
static int pipe_drain(struct jd_pgw_ctx *c)
{
    PGconn *conn = c->s->pg->wconn;
    struct jd_pg_wscratch *ws = c->ws;
    int out = PIPE_OK;
    if (!PQpipelineSync(conn))
        return PIPE_FATAL;
    for (size_t k = 0; k < ws->npq; k++) {
        PGresult *r = PQgetResult(conn);
        if (!r)
            return PIPE_FATAL; /* the connection is gone */
        if (PQresultStatus(r) == PGRES_PIPELINE_ABORTED) {
            /* an earlier statement failed: already counted */
        } else if (!ws->pq[k].w) {
            if (jd_pgw_rc(r) != 0)
                out = PIPE_FATAL; /* the BEGIN or the watch lock */
        } else {
            int rc = jd_pgw_take(c, ws->pq[k].w, ws->pq[k].kind, r);
            if (rc == NOROW || jd_pgw_record_fault(rc))
                out = out > PIPE_FAULT ? out : PIPE_FAULT;
            else if (rc)
                out = PIPE_FATAL;
        }
        PQclear(r);
        r = PQgetResult(conn); /* NULL: the end of this statement's results */
        if (r) {
            PQclear(r);
            return PIPE_FATAL;
        }
    }
    ws->npq = 0;
    PGresult *r = PQgetResult(conn);
    bool synced = r && PQresultStatus(r) == PGRES_PIPELINE_SYNC;
    PQclear(r);
    return synced ? out : PIPE_FATAL;
}

static struct jd_pgw_jslot *jslot(struct jd_pg_wscratch *ws, int64_t id)
{
    size_t i = jd_idtab_home(id, ws->jcap);
    while (ws->jt[i].id != 0 && ws->jt[i].id != id)
        i = (i + 1) & (ws->jcap - 1);
    return &ws->jt[i];
}

/* A job change the grouped statement can take: one that runs no other
 * statement (no inbox request to take, no unique key to release) and
 * expects no version (the grouped update checks only the owner). Field
 * changes only when sets (see emit_changes). */
static bool groupable(const struct jd_write *w, bool sets)
{
    return w->op == JD_W_JOB_CHANGE && !w->release_unique && w->request_id == 0 &&
           w->expect_version == 0 && (w->set == 0 || sets) && jd_pgw_change_valid(w);
}

/* Fold w, the next grouped record of its job, into js (the job's fields
 * as its records leave them, in batch order, as the single change
 * statement would set them one after the other). */
static void fold(struct jd_pgw_jslot *js, const struct jd_write *w, int64_t now)
{
    js->set |= w->set;
    if (w->set & JD_SET_STATE)
        js->state = w->state;
    if (w->set & JD_SET_OUTPUT)
        js->output = w->output;
    if (w->set & JD_SET_ERROR)
        js->error = w->error;
    if (w->set & JD_SET_RUN_AT)
        js->run_at_ms = w->run_at_ms;
    if (w->set & JD_SET_ATTEMPTS)
        js->attempts = w->attempts;
    if (w->set & JD_SET_STARTED)
        js->started_ms = w->started_ms;
    if (w->set & JD_SET_FINISHED) {
        js->fmode = 2;
        js->finished_ms = w->finished_ms;
    } else if ((w->set & JD_SET_STATE) && w->state >= JD_JOB_SUCCEEDED) {
        /* a move to a terminal state stamps a finish time not yet set */
        if (js->fmode == 2 && js->finished_ms == 0)
            js->finished_ms = now;
        else if (js->fmode == 0)
            js->fmode = 1;
    }
}

/* The event of w (data: its data, or the state's), the rank-th grouped
 * record of js's job: it joins the job's newest row while that row's run
 * has room (store_impl.h, packed runs), else starts a row. */
static void ev_add(struct jd_pg_wscratch *ws, struct jd_pgw_jslot *js, const struct jd_write *w,
                   const char *data, int64_t rank)
{
    if (js->evrow) {
        struct jd_pgw_evrow *r = &ws->evr[js->evrow - 1];
        if (r->more.n < JD_EV_RUN_MAX) {
            jd_evpack_put(&r->more, w->kind, w->tag, 0, data);
            return;
        }
    }
    if (ws->nevr == ws->capevr) {
        size_t cap = ws->capevr ? 2 * ws->capevr : 64;
        ws->evr = jd_xrealloc(ws->evr, cap * sizeof *ws->evr);
        memset(ws->evr + ws->capevr, 0, (cap - ws->capevr) * sizeof *ws->evr);
        ws->capevr = cap;
    }
    struct jd_pgw_evrow *r = &ws->evr[ws->nevr++];
    struct jd_evpack keep = r->more;
    *r = (struct jd_pgw_evrow){.job_id = w->job_id,
                               .off = rank,
                               .tag = w->tag,
                               .kind = w->kind,
                               .data = data,
                               .more = {.p = keep.p, .cap = keep.cap, .n = 1}};
    js->evrow = ws->nevr;
}

/* Queue the changes of jobs that have nothing but groupable changes (and
 * their insert) in the batch as one statement (PS_JOB_CHANGES), after the
 * inserts: each job's records are folded into one update of its row (one
 * new row version instead of one per record) and its events inserted in
 * batch order (the rank keeps it). Nothing else in the batch touches
 * those jobs, so their order against other records does not matter, with
 * one exception: a unique key taken by an insert depends on whether its
 * holder is terminal, so when the batch takes keys only history appends
 * (no field changes) are grouped. ws->grp[i] marks the records it took.
 * Only for two or more records; never after this node's lease was lost
 * (each record then fails alone). */
static int emit_changes(struct jd_pgw_ctx *c)
{
    struct jd_pg_wscratch *ws = c->ws;
    size_t n = c->nb;
    if (n > ws->capgrp) {
        ws->capgrp = 2 * n;
        ws->grp = jd_xrealloc(ws->grp, ws->capgrp);
        ws->rank = jd_xrealloc(ws->rank, ws->capgrp * sizeof *ws->rank);
    }
    memset(ws->grp, 0, n);
    if (atomic_load(&c->s->pg->lease_lost))
        return 0;
    ws->jt = jd_idtab_reset(ws->jt, &ws->jcap, sizeof *ws->jt, n);
    bool sets = true;
    for (size_t i = 0; i < n; i++)
        if (c->b[i]->op == JD_W_JOB_INSERT && c->b[i]->unique_key)
            sets = false;
    for (size_t i = 0; i < n; i++) {
        struct jd_write *w = c->b[i];
        /* Every record kind that reads or writes a job's row (a state
         * check included) must be listed here, or its order against the
         * job's grouped changes is lost; a new kind joins this list. */
        bool job_record = w->op == JD_W_JOB_CHANGE || w->op == JD_W_JOB_CRASHES ||
                          w->op == JD_W_JOB_DELETE || w->op == JD_W_JOB_REQUEST;
        if (!job_record || w->job_id <= 0)
            continue;
        struct jd_pgw_jslot *js = jslot(ws, w->job_id);
        js->id = w->job_id;
        if (!groupable(w, sets))
            js->busy = true;
    }
    size_t ng = 0;
    for (size_t i = 0; i < n; i++) {
        struct jd_write *w = c->b[i];
        struct jd_pgw_jslot *js;
        if (!groupable(w, sets) || (js = jslot(ws, w->job_id))->busy)
            continue;
        ws->grp[i] = 1;
        ws->rank[i] = ++js->records;
        fold(js, w, c->now);
        ng++;
    }
    if (ng < 2) {
        memset(ws->grp, 0, n);
        return 0;
    }
    for (size_t k = 0; k < 17; k++) {
        ws->arr[k].len = 0;
        ab_put(&ws->arr[k], "{", 1);
    }
    struct jd_write *first = NULL;
    ws->nevr = 0;
    for (size_t i = 0; i < n; i++) {
        if (!ws->grp[i])
            continue;
        struct jd_write *w = c->b[i];
        w->version = 0;
        w->time_ms = c->now;
        const char *data = w->data;
        if (!data && w->kind == JD_EVK_STATE && (w->set & JD_SET_STATE))
            data = jd_state_event_data[w->state];
        if (!first)
            first = w;
        struct jd_pgw_jslot *js = jslot(ws, w->job_id);
        ev_add(ws, js, w, data, ws->rank[i]);
        if (ws->rank[i] != js->records)
            continue; /* the job's row once, at its last record */
        ab_int(&ws->arr[4], js->id);
        ab_int(&ws->arr[5], js->records);
        ab_int(&ws->arr[6], js->set);
        ab_int(&ws->arr[7], js->state);
        ab_text(&ws->arr[8], js->output);
        ab_text(&ws->arr[9], js->error);
        ab_int(&ws->arr[10], js->run_at_ms);
        ab_int(&ws->arr[11], js->attempts);
        ab_int(&ws->arr[12], js->started_ms);
        ab_int(&ws->arr[13], js->finished_ms);
        ab_int(&ws->arr[14], js->fmode);
    }
    /* the event rows: arrays 0-3, 15 and 16 */
    for (size_t k = 0; k < ws->nevr; k++) {
        const struct jd_pgw_evrow *e = &ws->evr[k];
        ab_int(&ws->arr[0], e->job_id);
        ab_int(&ws->arr[1], e->kind);
        ab_int(&ws->arr[2], e->tag);
        ab_text(&ws->arr[3], e->data);
        ab_textn(&ws->arr[15], e->more.n > 1 ? e->more.p : NULL, e->more.len);
        ab_int(&ws->arr[16], e->off);
    }
    struct jd_pgw_prm p = {0};
    for (size_t k = 0; k < 4; k++) {
        ab_put(&ws->arr[k], "}", 1);
        p_text(&p, ws->arr[k].p);
    }
    p_int(&p, c->now);
    p_int(&p, c->s->pg->node_id);
    for (size_t k = 4; k < 17; k++) {
        ab_put(&ws->arr[k], "}", 1);
        p_text(&p, ws->arr[k].p);
    }
    return jd_pgw_emit(c, first, jd_pgw_stmt(PS_JOB_CHANGES), &p, RK_CHANGES);
}

/* The grouped changes' answer: each job's old version, so each record's
 * version is that plus its rank, and its queue and old and new state for
 * the counts. NOROW if a job did not answer (missing or fenced: the slow
 * path says which). */
int jd_pgw_take_changes(struct jd_pgw_ctx *c, const PGresult *r)
{
    struct jd_pg_wscratch *ws = c->ws;
    for (int k = 0; k < PQntuples(r); k++) {
        struct jd_pgw_jslot *js = jslot(ws, strtoll(PQgetvalue(r, k, 0), NULL, 10));
        if (js->id == 0)
            return JD_EIO; /* a row for a job we did not send: cannot be */
        js->found = true;
        js->base = strtoll(PQgetvalue(r, k, 1), NULL, 10);
        int old_state = atoi(PQgetvalue(r, k, 3)), new_state = atoi(PQgetvalue(r, k, 4));
        if (old_state != new_state) {
            jd_pgw_count(ws, PQgetvalue(r, k, 2), old_state, -1);
            jd_pgw_count(ws, PQgetvalue(r, k, 2), new_state, 1);
        }
    }
    for (size_t i = 0; i < c->nb; i++) {
        if (!ws->grp[i])
            continue;
        struct jd_pgw_jslot *js = jslot(ws, c->b[i]->job_id);
        if (!js->found)
            return NOROW;
        c->b[i]->version = js->base + ws->rank[i];
    }
    return 0;
}

/* ---- the queue counts ---- */

bool jd_pgw_counts_prm(struct jd_pgw_ctx *c, struct jd_pgw_prm *p)
{
    struct jd_pg_wscratch *ws = c->ws;
    bool any = false;
    for (size_t k = 0; k < 3; k++) {
        ws->arr[k].len = 0;
        ab_put(&ws->arr[k], "{", 1);
    }
    for (size_t i = 0; i < ws->nq; i++)
        for (int k = 0; k < JD_JOB_NSTATES; k++) {
            if (ws->q[i].d[k] == 0)
                continue;
            ab_text(&ws->arr[0], ws->q[i].queue);
            ab_int(&ws->arr[1], k);
            ab_int(&ws->arr[2], ws->q[i].d[k]);
            any = true;
        }
    *p = (struct jd_pgw_prm){0};
    for (size_t k = 0; k < 3; k++) {
        ab_put(&ws->arr[k], "}", 1);
        p_text(p, ws->arr[k].p);
    }
    p_int(p, c->s->pg->node_id);
    return any;
}

/* ---- the batch ---- */

int jd_pgw_apply_pipelined(struct jd_pgw_ctx *c, struct jd_write **b, int *rcs, size_t n)
{
    struct jd_pg_wscratch *ws = c->ws;
    PGconn *conn = c->s->pg->wconn;
    if (n > ws->capids) {
        ws->capids = 2 * n;
        ws->ids = jd_xrealloc(ws->ids, ws->capids * sizeof *ws->ids);
    }
    jd_pgw_counts_clear(ws);
    ws->npq = 0;
    if (ws->grp)
        memset(ws->grp, 0, n < ws->capgrp ? n : ws->capgrp);
    for (size_t i = 0; i < n; i++) {
        ws->ids[i] = b[i]->job_id;
        rcs[i] = 0;
        /* statements cannot be prepared inside the pipeline */
        if (b[i]->op == JD_W_JOB_CHANGE && jd_pgw_change_valid(b[i]) &&
            !jd_pgw_change_stmt(c->s, b[i]->set))
            return -1;
    }
    if (!PQenterPipelineMode(conn))
        return -1;
    c->pipe = true;
    int out = PIPE_OK;
    /* BEGIN, then the watch lock shared (pg.h, JD_PG_WATCH_LOCK_SQL) */
    if (!PQsendQueryParams(conn, "BEGIN", 0, NULL, NULL, NULL, NULL, 0) ||
        !PQsendQueryPrepared(conn, jd_pgw_stmt(PS_WATCH_SHARED), 0, NULL, NULL, NULL, 0)) {
        out = PIPE_FATAL;
    } else {
        if (ws->cappq == 0) {
            ws->cappq = 2 * JD_PG_PIPE_CHUNK;
            ws->pq = jd_xrealloc(ws->pq, ws->cappq * sizeof *ws->pq);
        }
        ws->pq[ws->npq++] = (struct jd_pgw_pend){0}; /* w NULL: the BEGIN */
        ws->pq[ws->npq++] = (struct jd_pgw_pend){0}; /* and the lock */
        c->b = b;
        c->nb = n;
        int rc = emit_inserts(c);
        if (rc == 0)
            rc = emit_changes(c);
        if (rc)
            out = jd_pgw_record_fault(rc) ? PIPE_FAULT : PIPE_FATAL;
    }
    for (size_t i = 0; i < n && out == PIPE_OK; i++) {
        if (b[i]->op == JD_W_SYNC_ || (ws->grp && i < ws->capgrp && ws->grp[i]))
            continue;
        int rc = jd_pgw_apply(c, b[i]);
        if (rc)
            out = jd_pgw_record_fault(rc) ? PIPE_FAULT : PIPE_FATAL;
        else if (ws->npq >= JD_PG_PIPE_CHUNK)
            out = pipe_drain(c);
    }
    if (ws->npq > 0 && out != PIPE_FATAL) {
        int d = pipe_drain(c);
        out = d > out ? d : out;
    }
    c->pipe = c->hoisted = false;
    if (out == PIPE_FATAL || !PQexitPipelineMode(conn))
        return -1;
    if (out == PIPE_FAULT) {
        jd_pgw_counts_clear(ws);
        if (jd_pgw_exec(c->s, "ROLLBACK") != 0)
            return -1;
        for (size_t k = 0; k < n; k++) {
            b[k]->job_id = ws->ids[k];
            b[k]->version = 0;
        }
        return 1;
    }
    return 0;
}
