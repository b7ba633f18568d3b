/*
 * Finding jobs by a combination of filters (jd_store_job_find).
 *
 * One filter drives the read: its index yields candidate jobs in the
 * listing's order, starting after the cursor, and at most JD_FIND_SCAN of
 * them per page. Every other filter becomes one boolean column computed per
 * candidate ("m"), through the jobs row (found by primary key) or the
 * job_labels primary key, so no filter ever scans a table and a page costs
 * at most JD_FIND_SCAN index steps plus that many row probes. The caller
 * keeps the matching ids and reads those jobs in the same read transaction.
 *
 * Order: newest first by id, except when a creation-time bound drives the
 * read; then by (created_ms, id) descending, which is what jobs_created
 * yields without a sort (ids and creation times agree almost always; the
 * cursor carries both so paging is exact either way).
 *
 * Threading: any thread (a pooled read connection per call).
 */
#include "storage/store_impl.h"
#include "storage/pg.h"

#include "common/alloc.h"
#include "common/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum driver { DRV_LABEL, DRV_SCHEDULE, DRV_QUEUE, DRV_HANDLER, DRV_CREATED, DRV_STATE, DRV_ALL };

static enum driver pick_driver(const struct jd_job_find *f)
{
    if (f->n_labels > 0)
        return DRV_LABEL;
    if (f->schedule)
        return DRV_SCHEDULE;
    if (f->queue)
        return DRV_QUEUE;
    if (f->handler)
        return DRV_HANDLER;
    if (f->created_after_ms > 0 || f->created_before_ms > 0)
        return DRV_CREATED;
    if (f->state >= 0)
        return DRV_STATE;
    return DRV_ALL;
}

bool jd_store_find_by_created(const struct jd_job_find *f)
{
    return pick_driver(f) == DRV_CREATED;
}

struct sqlbuf {
    char s[4096]; /* the longest shape (8 labels, every filter) is under 2 KB */
    size_t len;
};

static void put(struct sqlbuf *b, const char *t)
{
    size_t n = strlen(t);
    if (b->len + n >= sizeof b->s)
        abort(); /* a programming error: the shapes are bounded (JD_FIND_MAX_LABELS) */
    memcpy(b->s + b->len, t, n + 1);
    b->len += n;
}

static void bind_text(struct jd_find_sql *q, const char *t)
{
    q->b[q->n].text = t;
    q->b[q->n].i = 0;
    q->n++;
}

static void bind_int(struct jd_find_sql *q, int64_t i)
{
    q->b[q->n].text = NULL;
    q->b[q->n].i = i;
    q->n++;
}

static bool valid(const struct jd_job_find *f)
{
    if (f->limit < 1 || f->limit > 1000 || f->state < -1 || f->state >= JD_JOB_NSTATES ||
        f->n_labels > JD_FIND_MAX_LABELS || f->after_id < 0 || f->max_id < 0 ||
        f->created_after_ms < 0 || f->created_before_ms < 0)
        return false;
    for (size_t i = 0; i < f->n_labels; i++)
        if (!f->label_key[i] || !f->label_value[i])
            return false;
    return true;
}

/* The SQL text as PostgreSQL reads it: each "?" outside quotes numbered
 * $1, $2, ... in order (the binds are already in that order). */
static void number_placeholders(struct jd_find_sql *q)
{
    size_t len = strlen(q->sql), cap = len + 3 * (size_t)q->n + 1, k = 0;
    char *t = jd_xmalloc(cap);
    bool quoted = false;
    int next = 1;
    for (const char *p = q->sql; *p; p++) {
        if (*p == '\'')
            quoted = !quoted;
        if (*p == '?' && !quoted)
            k += (size_t)snprintf(t + k, cap - k, "$%d", next++);
        else
            t[k++] = *p;
    }
    t[k] = '\0';
    free(q->sql);
    q->sql = t;
}

/* A driver's leading key column equal to a value (text, or the integer
 * i when text is NULL): "col = ?" for SQLite; for PostgreSQL
 * "col >= ? AND col <= ?", the same rows, but a range the planner cannot
 * fold into a constant, so an ORDER BY naming col matches only the index
 * that leads with it: no plan, generic or custom, walks the primary key
 * filtering rows instead (which scans the table for a rare value). */
static void key_eq(struct sqlbuf *q, struct jd_find_sql *out, const char *col, const char *text,
                   int64_t i, bool pg)
{
    put(q, col);
    put(q, pg ? " >= ?" : " = ?");
    for (int k = 0; k < (pg ? 2 : 1); k++) {
        if (k == 1) {
            put(q, " AND ");
            put(q, col);
            put(q, " <= ?");
        }
        if (text)
            bind_text(out, text);
        else
            bind_int(out, i);
    }
}

/* The SQL of a find page in SQLite's dialect, or PostgreSQL's (pg): the
 * same reads, without SQLite's INDEXED BY and CROSS JOIN ... ON (PostgreSQL
 * picks the index from the WHERE and ORDER BY; its indexes carry the id
 * column SQLite's get implicitly) and with a boolean literal. */
static int find_sql_build(const struct jd_job_find *f, struct jd_find_sql *out, bool pg)
{
    memset(out, 0, sizeof *out);
    if (!valid(f))
        return JD_EINVAL;
    enum driver d = pick_driver(f);
    /* The residual filters first: their parameters come first in the text. */
    struct sqlbuf m = {.len = 0};
    put(&m, pg ? "true" : "1");
    if (f->state >= 0 && d != DRV_STATE && !(d == DRV_QUEUE)) {
        put(&m, " AND j.state = ?");
        bind_int(out, f->state);
    }
    if (f->queue && d != DRV_QUEUE) {
        put(&m, " AND j.queue = ?");
        bind_text(out, f->queue);
    }
    if (f->schedule && d != DRV_SCHEDULE) {
        put(&m, " AND j.schedule_id = ?");
        bind_text(out, f->schedule);
    }
    if (f->handler && d != DRV_HANDLER) {
        put(&m, " AND j.handler = ?");
        bind_text(out, f->handler);
    }
    if (d != DRV_CREATED) {
        if (f->created_after_ms > 0) {
            put(&m, " AND j.created_ms >= ?");
            bind_int(out, f->created_after_ms);
        }
        if (f->created_before_ms > 0) {
            put(&m, " AND j.created_ms < ?");
            bind_int(out, f->created_before_ms);
        }
    } else if (f->max_id > 0) {
        put(&m, " AND j.id <= ?");
        bind_int(out, f->max_id);
    }
    for (size_t i = d == DRV_LABEL ? 1 : 0; i < f->n_labels; i++) {
        put(&m, " AND EXISTS (SELECT 1 FROM job_labels x WHERE x.key = ? AND x.value = ?"
                " AND x.job_id = j.id)");
        bind_text(out, f->label_key[i]);
        bind_text(out, f->label_value[i]);
    }

    struct sqlbuf q = {.len = 0};
    put(&q, "SELECT j.id, j.created_ms, j.state, j.queue, ");
    put(&q, m.s);
    if (pg)
        put(&q, " AS m"); /* pg_read.c's wrapper filters on it */
    int64_t before = f->after_id > 0 ? f->after_id : INT64_MAX;
    /* The driver: an index range in the listing's order. PostgreSQL
     * orders by the index's whole key (see key_eq); SQLite is told the
     * index (INDEXED BY). */
    const char *order = " ORDER BY j.id DESC";
    switch (d) {
    case DRV_LABEL:
        put(&q, pg ? " FROM job_labels l JOIN jobs j ON j.id = l.job_id"
                   : " FROM job_labels l CROSS JOIN jobs j ON j.id = l.job_id");
        put(&q, " WHERE ");
        key_eq(&q, out, "l.key", f->label_key[0], 0, pg);
        put(&q, " AND ");
        key_eq(&q, out, "l.value", f->label_value[0], 0, pg);
        put(&q, " AND l.job_id < ?");
        bind_int(out, before);
        if (f->max_id > 0) {
            put(&q, " AND l.job_id <= ?");
            bind_int(out, f->max_id);
        }
        put(&q,
            pg ? " ORDER BY l.key DESC, l.value DESC, l.job_id DESC" : " ORDER BY l.job_id DESC");
        break;
    case DRV_SCHEDULE:
        put(&q, pg ? " FROM jobs j WHERE " : " FROM jobs j INDEXED BY jobs_schedule WHERE ");
        key_eq(&q, out, "j.schedule_id", f->schedule, 0, pg);
        put(&q, " AND j.id < ?");
        bind_int(out, before);
        if (pg)
            order = " ORDER BY j.schedule_id DESC, j.id DESC";
        break;
    case DRV_QUEUE:
        if (f->state >= 0) {
            put(&q, pg ? " FROM jobs j WHERE " : " FROM jobs j INDEXED BY jobs_queue_state WHERE ");
            key_eq(&q, out, "j.queue", f->queue, 0, pg);
            put(&q, " AND ");
            key_eq(&q, out, "j.state", NULL, f->state, pg);
            if (pg)
                order = " ORDER BY j.queue DESC, j.state DESC, j.id DESC";
        } else {
            put(&q, pg ? " FROM jobs j WHERE " : " FROM jobs j INDEXED BY jobs_queue WHERE ");
            key_eq(&q, out, "j.queue", f->queue, 0, pg);
            if (pg)
                order = " ORDER BY j.queue DESC, j.id DESC";
        }
        put(&q, " AND j.id < ?");
        bind_int(out, before);
        break;
    case DRV_HANDLER:
        put(&q, pg ? " FROM jobs j WHERE " : " FROM jobs j INDEXED BY jobs_handler WHERE ");
        key_eq(&q, out, "j.handler", f->handler, 0, pg);
        put(&q, " AND j.id < ?");
        bind_int(out, before);
        if (pg)
            order = " ORDER BY j.handler DESC, j.id DESC";
        break;
    case DRV_CREATED: {
        put(&q, pg ? " FROM jobs j" : " FROM jobs j INDEXED BY jobs_created");
        put(&q, " WHERE j.created_ms >= ? AND j.created_ms < ?");
        bind_int(out, f->created_after_ms);
        int64_t hi = f->created_before_ms > 0 ? f->created_before_ms : INT64_MAX;
        bind_int(out, hi);
        if (f->after_id > 0) {
            put(&q, " AND (j.created_ms, j.id) < (?, ?)");
            bind_int(out, f->after_created_ms);
            bind_int(out, f->after_id);
        }
        put(&q, " ORDER BY j.created_ms DESC, j.id DESC");
        break;
    }
    case DRV_STATE:
        put(&q, pg ? " FROM jobs j WHERE " : " FROM jobs j INDEXED BY jobs_state WHERE ");
        key_eq(&q, out, "j.state", NULL, f->state, pg);
        put(&q, " AND j.id < ?");
        bind_int(out, before);
        if (pg)
            order = " ORDER BY j.state DESC, j.id DESC";
        break;
    case DRV_ALL:
        put(&q, " FROM jobs j WHERE j.id < ?");
        bind_int(out, before);
        break;
    }
    if (d != DRV_LABEL && d != DRV_CREATED) {
        if (f->max_id > 0) {
            put(&q, " AND j.id <= ?");
            bind_int(out, f->max_id);
        }
        put(&q, order);
    }
    put(&q, " LIMIT ?");
    bind_int(out, JD_FIND_SCAN);
    out->sql = jd_xstrdup(q.s);
    if (pg)
        number_placeholders(out);
    return 0;
}

int jd_find_sql_build(const struct jd_job_find *f, struct jd_find_sql *out)
{
    return find_sql_build(f, out, false);
}

int jd_find_sql_build_pg(const struct jd_job_find *f, struct jd_find_sql *out)
{
    return find_sql_build(f, out, true);
}

/* Prepare q on c and bind its parameters; 0 or JD_EIO. */
static int prepare_bound(struct jd_rconn *c, const struct jd_find_sql *q, sqlite3_stmt **st)
{
    if (sqlite3_prepare_v2(jd_rconn_db(c), q->sql, -1, st, NULL) != SQLITE_OK)
        return JD_EIO;
    for (int i = 0; i < q->n; i++) {
        if (q->b[i].text)
            sqlite3_bind_text(*st, i + 1, q->b[i].text, -1, SQLITE_STATIC);
        else
            sqlite3_bind_int64(*st, i + 1, q->b[i].i);
    }
    return 0;
}

int jd_store_job_find(struct jd_store *s, const struct jd_job_find *f, bool ids_only,
                      struct jd_job **rows, size_t *n, struct jd_job_find_cursor *next)
{
    if (s->pg)
        return jd_pg_job_find(s, f, ids_only, rows, n, next);
    *rows = NULL;
    *n = 0;
    *next = (struct jd_job_find_cursor){0};
    struct jd_find_sql q;
    int rc = jd_find_sql_build(f, &q);
    if (rc)
        return rc;
    struct jd_rconn *c = NULL;
    sqlite3_stmt *st = NULL;
    struct jd_job *out = jd_xcalloc(f->limit + 1, sizeof *out);
    size_t k = 0;
    bool in_tx = false;
    if ((rc = jd_rconn_get(s, &c)) != 0)
        goto done;
    if ((rc = jd_rconn_tx(c, true)) != 0)
        goto done;
    in_tx = true;
    if ((rc = prepare_bound(c, &q, &st)) != 0)
        goto done;
    /* Keep up to limit + 1 matches: the extra one says a next page exists. */
    struct jd_job_find_cursor last = {0};
    size_t scanned = 0;
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        scanned++;
        last.id = sqlite3_column_int64(st, 0);
        last.created_ms = sqlite3_column_int64(st, 1);
        if (!sqlite3_column_int(st, 4))
            continue;
        out[k].id = last.id;
        out[k].created_ms = last.created_ms;
        out[k].state = (enum jd_job_state)sqlite3_column_int(st, 2);
        const unsigned char *qn = sqlite3_column_text(st, 3);
        out[k].queue = jd_xstrdup(qn ? (const char *)qn : "");
        if (++k > f->limit)
            break;
    }
    if (src != SQLITE_ROW && src != SQLITE_DONE) {
        rc = jd_store_sqlite_rc(src) ? jd_store_sqlite_rc(src) : JD_EIO;
        goto done;
    }
    if (k > f->limit) {
        jd_job_clear(&out[--k]);
        *next = (struct jd_job_find_cursor){out[k - 1].id, out[k - 1].created_ms};
    } else if (scanned >= JD_FIND_SCAN) {
        *next = last; /* the budget ran out: go on from where it stopped */
    }
    if (!ids_only) {
        /* Read the whole rows in the same snapshot; a row the snapshot lacks
         * cannot happen (same transaction), but is skipped if it does. */
        size_t w = 0;
        for (size_t i = 0; i < k; i++) {
            struct jd_job row;
            int grc = jd_rconn_job_get(c, out[i].id, &row);
            jd_job_clear(&out[i]);
            if (grc == 0)
                out[w++] = row;
            else if (grc != JD_ENOENT) {
                rc = grc;
                for (size_t x = i + 1; x < k; x++)
                    jd_job_clear(&out[x]);
                k = w;
                goto done;
            }
        }
        k = w;
    }
done:
    sqlite3_finalize(st);
    if (in_tx)
        jd_rconn_tx(c, false);
    if (c)
        jd_rconn_put(s, c);
    free(q.sql);
    if (rc) {
        jd_jobs_free(out, k);
        *next = (struct jd_job_find_cursor){0};
        return rc;
    }
    *rows = out;
    *n = k;
    return 0;
}

/* ---- the global event stream ---- */

/* As find_sql_build, for the event stream: rows of events (a row holds a
 * run of a job's events, store_impl.h), m says whether the row's job
 * passes the filters and the row may hold a state event. The state filter
 * is applied per event by jd_stream_row_add, which reads the state from
 * each state event's JSON. The scan starts JD_EV_RUN_MAX - 1 ids back:
 * the row that holds after_id + 1 begins at most that far before it. */
static int event_sql_build(const struct jd_event_find *f, struct jd_find_sql *out, bool pg)
{
    memset(out, 0, sizeof *out);
    if (f->limit < 1 || f->limit > 1000 || f->after_id < 0 || f->n_labels > JD_FIND_MAX_LABELS ||
        f->state_mask >= (1u << JD_JOB_NSTATES))
        return JD_EINVAL;
    struct sqlbuf q = {.len = 0};
    /* m: a state event of a job that still exists, and the filters */
    put(&q, "SELECT e.id, e.job_id, e.seq, e.time_ms, e.data, j.queue, j.state,"
            " ((e.kind = 0 OR e.more IS NOT NULL) AND j.id IS NOT NULL");
    if (f->queue) {
        put(&q, " AND j.queue = ?");
        bind_text(out, f->queue);
    }
    for (size_t i = 0; i < f->n_labels; i++) {
        if (!f->label_key[i] || !f->label_value[i])
            return JD_EINVAL;
        put(&q, " AND EXISTS (SELECT 1 FROM job_labels x WHERE x.key = ? AND x.value = ?"
                " AND x.job_id = e.job_id)");
        bind_text(out, f->label_key[i]);
        bind_text(out, f->label_value[i]);
    }
    put(&q, pg ? ") AS m, " : "), ");
    put(&q, "e.more, e.kind FROM events e LEFT JOIN jobs j ON j.id = e.job_id WHERE e.id > ?");
    /* PostgreSQL, a cluster: only ids below the horizon (storage/pg.h) */
    put(&q,
        pg ? " AND e.id < " JD_PG_HORIZON_SQL " ORDER BY e.id LIMIT ?" : " ORDER BY e.id LIMIT ?");
    bind_int(out, f->after_id - (JD_EV_RUN_MAX - 1));
    bind_int(out, JD_FIND_SCAN);
    out->sql = jd_xstrdup(q.s);
    if (pg)
        number_placeholders(out);
    return 0;
}

/* The state a state event's data names, or -1. */
static int event_state(const char *data, size_t len)
{
    const char *v;
    size_t vl;
    if (!data || !jd_json_member(data, len, "state", &v, &vl) || vl < 2 || v[0] != '"' ||
        v[vl - 1] != '"')
        return -1;
    char name[16];
    if (vl - 2 >= sizeof name)
        return -1;
    memcpy(name, v + 1, vl - 2);
    name[vl - 2] = '\0';
    return jd_job_state_parse(name);
}

/* One event of a stream row: examined (it moves *last) unless the page is
 * full; added when it is a state event the filters pass. */
static void stream_event(const struct jd_event_find *f, const struct jd_stream_row *r, int64_t i,
                         int kind, const char *data, int64_t dl, struct jd_stream_event *out,
                         size_t *k, int64_t *last)
{
    int64_t id = r->id + i;
    if (id <= f->after_id || *k >= f->limit)
        return;
    *last = id;
    if (!r->match || kind != JD_EVK_STATE)
        return;
    int ps = event_state(data, dl < 0 ? 0 : (size_t)dl);
    if (f->state_mask && (ps < 0 || !(f->state_mask & (1u << ps))))
        return;
    struct jd_stream_event *e = &out[(*k)++];
    e->id = id;
    e->job_id = r->job_id;
    e->seq = r->seq + i;
    e->time_ms = r->time_ms;
    e->data = data && dl >= 0 ? jd_xstrndup(data, (size_t)dl) : jd_xstrdup("{}");
    e->queue = jd_xstrdup(r->queue ? r->queue : "");
    e->state = ps >= 0 ? (enum jd_job_state)ps : r->job_state;
}

void jd_stream_row_add(const struct jd_event_find *f, const struct jd_stream_row *r,
                       struct jd_stream_event *out, size_t *k, int64_t *last)
{
    stream_event(f, r, 0, r->kind, r->data, r->data ? (int64_t)strlen(r->data) : -1, out, k, last);
    const char *p = r->more, *end = r->more ? r->more + r->more_len : NULL, *d;
    int64_t fl[3], dl;
    for (int64_t i = 1; r->more && jd_evpack_next(&p, end, fl, &d, &dl); i++) {
        size_t before = *k;
        stream_event(f, r, i, (int)fl[0], d, dl, out, k, last);
        if (*k > before)
            out[before].time_ms = r->time_ms + fl[2];
    }
}

int jd_event_sql_build(const struct jd_event_find *f, struct jd_find_sql *out)
{
    return event_sql_build(f, out, false);
}

int jd_event_sql_build_pg(const struct jd_event_find *f, struct jd_find_sql *out)
{
    return event_sql_build(f, out, true);
}

void jd_stream_events_free(struct jd_stream_event *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(rows[i].queue);
        free(rows[i].data);
        free(rows[i].traceparent);
    }
    free(rows);
}

/* The traceparent of each matched event's job: one key lookup per job (the
 * instr keeps jobs without one from paying for a JSON parse), after the
 * scan, so skipped events cost nothing. */
static int add_traceparents(struct jd_rconn *c, struct jd_stream_event *ev, size_t n)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(jd_rconn_db(c),
                           "SELECT json_extract(definition, '$.traceparent') FROM job_definitions"
                           " WHERE job_id = ?1 AND instr(definition, '\"traceparent\":') > 0",
                           -1, &st, NULL) != SQLITE_OK)
        return JD_EIO;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && ev[i].job_id == ev[i - 1].job_id) {
            ev[i].traceparent = jd_xstrdup(ev[i - 1].traceparent);
            continue;
        }
        sqlite3_bind_int64(st, 1, ev[i].job_id);
        if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
            ev[i].traceparent = jd_xstrdup((const char *)sqlite3_column_text(st, 0));
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    return 0;
}

int jd_store_event_stream(struct jd_store *s, const struct jd_event_find *f,
                          struct jd_stream_event **rows, size_t *n, int64_t *next_after)
{
    if (s->pg)
        return jd_pg_event_stream(s, f, rows, n, next_after);
    *rows = NULL;
    *n = 0;
    *next_after = f->after_id;
    struct jd_find_sql q;
    int rc = jd_event_sql_build(f, &q);
    if (rc)
        return rc;
    struct jd_rconn *c = NULL;
    sqlite3_stmt *st = NULL;
    struct jd_stream_event *out = jd_xcalloc(f->limit, sizeof *out);
    size_t k = 0;
    int64_t last = f->after_id;
    if ((rc = jd_rconn_get(s, &c)) != 0)
        goto done;
    if ((rc = prepare_bound(c, &q, &st)) != 0)
        goto done;
    int src;
    while (k < f->limit && (src = sqlite3_step(st)) == SQLITE_ROW) {
        struct jd_stream_row r = {
            .id = sqlite3_column_int64(st, 0),
            .job_id = sqlite3_column_int64(st, 1),
            .seq = sqlite3_column_int64(st, 2),
            .time_ms = sqlite3_column_int64(st, 3),
            .data = (const char *)sqlite3_column_text(st, 4),
            .queue = (const char *)sqlite3_column_text(st, 5),
            .job_state = (enum jd_job_state)sqlite3_column_int(st, 6),
            .match = sqlite3_column_int(st, 7) != 0,
            .more = (const char *)sqlite3_column_text(st, 8),
            .more_len = (size_t)sqlite3_column_bytes(st, 8),
            .kind = sqlite3_column_int(st, 9),
        };
        jd_stream_row_add(f, &r, out, &k, &last);
    }
    if (k < f->limit && src != SQLITE_DONE) {
        rc = jd_store_sqlite_rc(src) ? jd_store_sqlite_rc(src) : JD_EIO;
        goto done;
    }
    *next_after = last;
    rc = add_traceparents(c, out, k);
done:
    sqlite3_finalize(st);
    if (c)
        jd_rconn_put(s, c);
    free(q.sql);
    if (rc) {
        jd_stream_events_free(out, k);
        *next_after = f->after_id;
        return rc;
    }
    *rows = out;
    *n = k;
    return 0;
}

int jd_store_event_last_id(struct jd_store *s, int64_t *id)
{
    if (s->pg)
        return jd_pg_event_last_id(s, id);
    *id = 0;
    struct jd_rconn *c = NULL;
    int rc = jd_rconn_get(s, &c);
    if (rc)
        return rc;
    sqlite3_stmt *st = NULL;
    int src = SQLITE_ERROR;
    if (sqlite3_prepare_v2(jd_rconn_db(c), "SELECT id, more FROM events ORDER BY id DESC LIMIT 1",
                           -1, &st, NULL) == SQLITE_OK)
        src = sqlite3_step(st);
    if (src == SQLITE_ROW) /* a packed row holds ids id .. id + n - 1 */
        *id = sqlite3_column_int64(st, 0) +
              jd_evpack_count((const char *)sqlite3_column_text(st, 1),
                              (size_t)sqlite3_column_bytes(st, 1)) -
              1;
    else if (src != SQLITE_DONE)
        rc = JD_EIO;
    sqlite3_finalize(st);
    jd_rconn_put(s, c);
    return rc;
}
