/*
 * Finding and acting on many jobs: the filters of GET /v1/jobs and of the
 * bulk actions, the bulk actions themselves (POST /v1/jobs/cancel|retry),
 * their operations (GET /v1/operations/{id}), and deleting a finished job.
 *
 * A bulk action pages through its filter with jd_store_job_find (ids only,
 * JD_BULK_CHUNK a page, never past the newest id at its start), acts on
 * each job with the one-job entry point (jd_jobs_cancel, jd_jobs_retry),
 * which takes jd_jobs.mu for that job only, then waits for the chunk's
 * commits before reading the next page: memory and the writer's queue stay
 * bounded by one chunk whatever the number of jobs, and requests from
 * clients interleave with the chunks.
 *
 * Operations live in memory only (a restart forgets them; the jobs they
 * changed are durable one by one): at most JD_BULK_OPS_KEEP, the oldest
 * finished one evicted for a new one; when all are still running a new
 * one is refused (JD_EFULL).
 *
 * Threading: entry points from HTTP threads; one bulk thread (started with
 * the first operation) runs operations in order; commit callbacks on the
 * store's completion thread. struct jobs_bulk.mu guards the operations
 * and is never held while calling into the layer (which takes jd_jobs.mu);
 * the ids being deleted are guarded by jd_jobs.mu (retry checks them).
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- filters ---- */

int jobs_filter_parse(const struct jd_jobs_list_query *q, struct jd_job_find *f,
                      char lab[][JOBS_LABEL_BUF], struct jd_error *err)
{
    *f = (struct jd_job_find){.state = -1,
                              .queue = q->queue,
                              .schedule = q->schedule,
                              .handler = q->handler,
                              .limit = q->limit ? q->limit : 50};
    if (f->limit > 1000)
        f->limit = 1000;
    if (q->schedule && q->queue)
        return jd_error_set(err, JD_EINVAL, "/schedule", "give schedule or queue, not both");
    if (q->state && (f->state = jd_job_state_parse(q->state)) < 0)
        return jd_error_set(err, JD_EINVAL, "/state",
                            "unknown state \"%.64s\" (queued, running, waiting, succeeded, "
                            "failed, cancelled)",
                            q->state);
    if (q->n_labels > JD_JOBS_LABEL_FILTERS)
        return jd_error_set(err, JD_EINVAL, "/label", "at most %d label filters",
                            JD_JOBS_LABEL_FILTERS);
    for (size_t i = 0; i < q->n_labels; i++) {
        char p[32];
        snprintf(p, sizeof p, "/label/%zu", i);
        const char *l = q->labels[i];
        const char *colon = l ? strchr(l, ':') : NULL;
        size_t kn = colon ? (size_t)(colon - l) : 0;
        if (!colon || kn == 0 || kn > 64 || strlen(colon + 1) > JD_LABEL_VALUE_MAX)
            return jd_error_set(err, JD_EINVAL, p,
                                "a label filter is key:value (key 1 to 64 characters, value at "
                                "most %d)",
                                JD_LABEL_VALUE_MAX);
        memcpy(lab[i], l, kn);
        lab[i][kn] = '\0';
        strcpy(lab[i] + kn + 1, colon + 1);
        f->label_key[i] = lab[i];
        f->label_value[i] = lab[i] + kn + 1;
    }
    f->n_labels = q->n_labels;
    static const char *const names[2] = {"created_after", "created_before"};
    const char *vals[2] = {q->created_after, q->created_before};
    int64_t *outs[2] = {&f->created_after_ms, &f->created_before_ms};
    for (int i = 0; i < 2; i++) {
        char p[32];
        snprintf(p, sizeof p, "/%s", names[i]);
        if (vals[i] && (jd_time_parse(vals[i], outs[i]) != 0 || *outs[i] <= 0))
            return jd_error_set(err, JD_EINVAL, p,
                                "%s must be an RFC 3339 time such as 2026-11-26T10:00:00Z",
                                names[i]);
    }
    if (q->cursor && q->cursor[0]) {
        /* "<id>", or "<created_ms>.<id>" when creation time orders the list */
        const char *dot = strchr(q->cursor, '.');
        char a[24];
        if (dot && (size_t)(dot - q->cursor) < sizeof a) {
            memcpy(a, q->cursor, (size_t)(dot - q->cursor));
            a[dot - q->cursor] = '\0';
        }
        if ((dot && ((size_t)(dot - q->cursor) >= sizeof a ||
                     jd_jobs_parse_id(a, &f->after_created_ms) != 0 ||
                     jd_jobs_parse_id(dot + 1, &f->after_id) != 0)) ||
            (!dot && jd_jobs_parse_id(q->cursor, &f->after_id) != 0) ||
            (dot != NULL) != jd_store_find_by_created(f))
            return jd_error_set(err, JD_EINVAL, "/cursor", "bad cursor");
    }
    return 0;
}

static void cursor_text(const struct jd_job_find *f, const struct jd_job_find_cursor *c, char *buf,
                        size_t len)
{
    if (jd_store_find_by_created(f))
        snprintf(buf, len, "%" PRId64 ".%" PRId64, c->created_ms, c->id);
    else
        snprintf(buf, len, "%" PRId64, c->id);
}

int jd_jobs_list_json(struct jd_jobs *j, const struct jd_jobs_list_query *q, char **json,
                      struct jd_error *err)
{
    jd_error_clear(err);
    struct jd_job_find f;
    char lab[JD_JOBS_LABEL_FILTERS][JOBS_LABEL_BUF];
    int rc = jobs_filter_parse(q, &f, lab, err);
    if (rc)
        return rc;
    struct jd_job *rows = NULL;
    size_t n = 0;
    struct jd_job_find_cursor next;
    rc = jd_store_job_find(j->store, &f, false, &rows, &n, &next);
    if (rc)
        return jd_error_set(err, rc, NULL, "listing jobs failed: %s", jd_strerror(rc));
    struct jd_sbuf b = {0};
    jd_sb_puts(&b, "{\"jobs\":[");
    for (size_t i = 0; i < n; i++) {
        char *t = jd_render_job_json(&rows[i]);
        if (i)
            jd_sb_puts(&b, ",");
        jd_sb_puts(&b, t);
        free(t);
    }
    jd_sb_puts(&b, "],\"next_cursor\":");
    if (next.id > 0) {
        char c[48];
        cursor_text(&f, &next, c, sizeof c);
        jd_sb_string(&b, c);
    } else {
        jd_sb_puts(&b, "null");
    }
    jd_sb_puts(&b, "}");
    jd_jobs_free(rows, n);
    *json = b.p;
    return 0;
}

/* ---- operations ---- */

enum op_state { OP_RUNNING, OP_SUCCEEDED, OP_INTERRUPTED, OP_FAILED };
static const char *const op_state_names[] = {"running", "succeeded", "interrupted", "failed"};
static const char *const kind_names[] = {"cancel", "retry"};

struct op {
    struct jobs_bulk *b; /* for the commit callbacks */
    uint64_t id;
    enum jd_bulk_kind kind;
    enum op_state state;
    int64_t matched, applied, skipped, failed;
    int64_t created_ms, finished_ms;
    /* the filter, owning its strings (q's point into strs) */
    struct jd_jobs_list_query q;
    char *strs[6 + JD_JOBS_LABEL_FILTERS];
    int64_t max_id; /* the newest job at the start */
    int pending;    /* actions of the current chunk not yet committed */
    char *error;    /* why it failed, or NULL */
};

struct jobs_bulk {
    pthread_mutex_t mu;
    pthread_cond_t cv;                /* a new operation, a chunk's last commit, or stop */
    struct op *ops[JD_BULK_OPS_KEEP]; /* creation order; NULL past n */
    size_t n;
    uint64_t next_id;
    pthread_t thread;
    bool started, stop;
    /* ids whose delete is being committed: under jd_jobs.mu, not mu */
    int64_t *deleting;
    size_t n_deleting, cap_deleting;
};

static void op_free(struct op *o)
{
    if (!o)
        return;
    for (size_t i = 0; i < sizeof o->strs / sizeof o->strs[0]; i++)
        free(o->strs[i]);
    free(o->error);
    free(o);
}

void jobs_bulk_init(struct jd_jobs *j)
{
    struct jobs_bulk *b = jd_xcalloc(1, sizeof *b);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    /* Ids unlikely to repeat across restarts, so a client holding an old
     * one gets 404 rather than another operation. */
    b->next_id = (uint64_t)jd_wall_ms() * 1000;
    j->bulk = b;
}

void jobs_bulk_fini(struct jd_jobs *j)
{
    struct jobs_bulk *b = j->bulk;
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->stop = true;
    pthread_cond_broadcast(&b->cv);
    bool started = b->started;
    pthread_mutex_unlock(&b->mu);
    if (started)
        pthread_join(b->thread, NULL);
    for (size_t i = 0; i < b->n; i++)
        op_free(b->ops[i]);
    free(b->deleting);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b);
    j->bulk = NULL;
}

static void op_action_done(void *arg, int rc, const char *json)
{
    (void)json;
    struct op *o = arg;
    /* The op outlives its pending actions: the bulk thread waits for them
     * before it touches the next chunk, and eviction takes finished ops only. */
    struct jobs_bulk *b = o->b;
    pthread_mutex_lock(&b->mu);
    if (rc == 0)
        o->applied++;
    else if (rc == JD_ECONFLICT || rc == JD_ENOENT)
        o->skipped++;
    else
        o->failed++;
    if (--o->pending == 0)
        pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* Run one operation to its end (bulk thread, without any lock). */
static void op_run(struct jd_jobs *j, struct op *o)
{
    struct jobs_bulk *b = j->bulk;
    struct jd_job_find f;
    char lab[JD_JOBS_LABEL_FILTERS][JOBS_LABEL_BUF];
    struct jd_error err;
    enum op_state end = OP_SUCCEEDED;
    if (jobs_filter_parse(&o->q, &f, lab, &err) != 0) { /* checked at start: cannot happen */
        end = OP_FAILED;
        goto out;
    }
    f.limit = JD_BULK_CHUNK;
    f.max_id = o->max_id;
    for (;;) {
        struct jd_job *rows = NULL;
        size_t n = 0;
        struct jd_job_find_cursor next;
        int rc = jd_store_job_find(j->store, &f, true, &rows, &n, &next);
        if (rc) {
            end = OP_FAILED;
            pthread_mutex_lock(&b->mu);
            o->error = jd_xasprintf("reading jobs failed: %s", jd_strerror(rc));
            pthread_mutex_unlock(&b->mu);
            break;
        }
        pthread_mutex_lock(&b->mu);
        o->matched += (int64_t)n;
        o->pending += (int)n + 1; /* +1: ours, so the count cannot reach 0 mid-chunk */
        pthread_mutex_unlock(&b->mu);
        for (size_t i = 0; i < n && end == OP_SUCCEEDED; i++) {
            rc = o->kind == JD_BULK_CANCEL ? jd_jobs_cancel(j, rows[i].id, op_action_done, o)
                                           : jd_jobs_retry(j, rows[i].id, op_action_done, o);
            if (rc == 0)
                continue;
            pthread_mutex_lock(&b->mu);
            if (rc == JD_ESHUTDOWN) {
                end = OP_INTERRUPTED;
                o->pending -= (int)(n - i); /* this one and the rest never start */
                o->matched -= (int64_t)(n - i);
            } else {
                o->pending--;
                if (rc == JD_ECONFLICT || rc == JD_ENOENT)
                    o->skipped++;
                else
                    o->failed++;
            }
            pthread_mutex_unlock(&b->mu);
        }
        jd_jobs_free(rows, n);
        pthread_mutex_lock(&b->mu);
        o->pending--;
        while (o->pending > 0)
            pthread_cond_wait(&b->cv, &b->mu);
        bool stop = b->stop;
        pthread_mutex_unlock(&b->mu);
        if (end != OP_SUCCEEDED || next.id == 0)
            break;
        if (stop) {
            end = OP_INTERRUPTED;
            break;
        }
        f.after_id = next.id;
        f.after_created_ms = next.created_ms;
    }
out:
    pthread_mutex_lock(&b->mu);
    o->state = end;
    o->finished_ms = jd_wall_ms();
    pthread_mutex_unlock(&b->mu);
    jd_log(JD_LOG_INFO, "bulk operation finished", "kind", kind_names[o->kind], "state",
           op_state_names[end], NULL);
}

static void *bulk_main(void *arg)
{
    struct jd_jobs *j = arg;
    struct jobs_bulk *b = j->bulk;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        struct op *next = NULL;
        for (size_t i = 0; i < b->n && !next; i++)
            if (b->ops[i]->state == OP_RUNNING)
                next = b->ops[i];
        if (!next) {
            if (b->stop)
                break;
            pthread_cond_wait(&b->cv, &b->mu);
            continue;
        }
        if (b->stop) { /* not begun: it ends interrupted */
            next->state = OP_INTERRUPTED;
            next->finished_ms = jd_wall_ms();
            continue;
        }
        pthread_mutex_unlock(&b->mu);
        op_run(j, next);
        pthread_mutex_lock(&b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* Under b->mu: render one operation. */
static char *op_json_locked(const struct op *o)
{
    cJSON *r = cJSON_CreateObject();
    char id[24];
    snprintf(id, sizeof id, "%" PRIu64, o->id);
    cJSON_AddStringToObject(r, "id", id);
    cJSON_AddStringToObject(r, "kind", kind_names[o->kind]);
    cJSON_AddStringToObject(r, "state", op_state_names[o->state]);
    cJSON_AddNumberToObject(r, "matched", (double)o->matched);
    cJSON_AddNumberToObject(r, "applied", (double)o->applied);
    cJSON_AddNumberToObject(r, "skipped", (double)o->skipped);
    cJSON_AddNumberToObject(r, "failed", (double)o->failed);
    jd_render_add_time(r, "created_at", o->created_ms);
    jd_render_add_time(r, "finished_at", o->finished_ms);
    if (o->error)
        cJSON_AddStringToObject(r, "error", o->error);
    char *t = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return t;
}

/* The filter members of a bulk body, as a list query over the op's own
 * copies of the strings. */
static int body_filter(const cJSON *root, struct op *o, struct jd_error *err)
{
    static const char *const members[] = {"state", "queue",         "schedule",       "handler",
                                          "label", "created_after", "created_before", NULL};
    const char **slots[] = {&o->q.state, &o->q.queue,         &o->q.schedule,      &o->q.handler,
                            NULL,        &o->q.created_after, &o->q.created_before};
    size_t ns = 0;
    if (!cJSON_IsObject(root))
        return jd_error_set(err, JD_EINVAL, "", "the body is an object of filters");
    for (const cJSON *c = root->child; c; c = c->next) {
        int k = -1;
        for (int i = 0; members[i]; i++)
            if (strcmp(c->string, members[i]) == 0)
                k = i;
        char p[JD_ERROR_PTR_MAX] = "";
        jd_ptr_append(p, sizeof p, c->string);
        if (k < 0)
            return jd_error_set(err, JD_EINVAL, p,
                                "unknown filter \"%.64s\" (state, queue, schedule, handler, "
                                "label, created_after, created_before)",
                                c->string);
        if (slots[k]) {
            if (!cJSON_IsString(c) || strlen(c->valuestring) > 1024)
                return jd_error_set(err, JD_EINVAL, p, "must be a string");
            o->strs[ns] = jd_xstrdup(c->valuestring);
            *slots[k] = o->strs[ns++];
            continue;
        }
        /* label: one "key:value" string or an array of them */
        if (cJSON_IsString(c)) {
            o->strs[ns] = jd_xstrdup(c->valuestring);
            o->q.labels[o->q.n_labels++] = o->strs[ns++];
            continue;
        }
        if (!cJSON_IsArray(c))
            return jd_error_set(err, JD_EINVAL, p, "label is a \"key:value\" string or an array");
        int i = 0;
        for (const cJSON *l = c->child; l; l = l->next, i++) {
            char lp[JD_ERROR_PTR_MAX];
            snprintf(lp, sizeof lp, "/label/%d", i);
            if (i >= JD_JOBS_LABEL_FILTERS)
                return jd_error_set(err, JD_EINVAL, lp, "at most %d label filters",
                                    JD_JOBS_LABEL_FILTERS);
            if (!cJSON_IsString(l) || strlen(l->valuestring) > 1024)
                return jd_error_set(err, JD_EINVAL, lp, "a label filter is a \"key:value\" string");
            o->strs[ns] = jd_xstrdup(l->valuestring);
            o->q.labels[o->q.n_labels++] = o->strs[ns++];
        }
    }
    if (ns == 0)
        return jd_error_set(err, JD_EINVAL, "",
                            "give at least one filter (an empty one would act on every job)");
    return 0;
}

int jd_jobs_bulk_start(struct jd_jobs *j, enum jd_bulk_kind kind, const char *body, size_t len,
                       char **json, bool *started, struct jd_error *err)
{
    jd_error_clear(err);
    *json = NULL;
    *started = false;
    struct jobs_bulk *b = j->bulk;
    int rc = jd_jobdef_check_text(body, len, &j->limits, err);
    if (rc)
        return rc;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root)
        return jd_error_set(err, JD_EPARSE, "", "malformed JSON");
    struct op *o = jd_xcalloc(1, sizeof *o);
    o->b = b;
    o->kind = kind;
    rc = body_filter(root, o, err);
    cJSON_Delete(root);
    struct jd_job_find f;
    char lab[JD_JOBS_LABEL_FILTERS][JOBS_LABEL_BUF];
    if (rc == 0)
        rc = jobs_filter_parse(&o->q, &f, lab, err);
    if (rc) {
        op_free(o);
        return rc;
    }
    /* The snapshot: jobs created from now on are not the operation's. An
     * id from the store's counter is above every job inserted so far. */
    o->max_id = jd_store_next_id(j->store);
    o->created_ms = jd_wall_ms();
    f.limit = 1;
    f.max_id = o->max_id;
    struct jd_job *rows = NULL;
    size_t n = 0;
    struct jd_job_find_cursor next;
    if ((rc = jd_store_job_find(j->store, &f, true, &rows, &n, &next)) != 0) {
        op_free(o);
        return jd_error_set(err, rc, NULL, "reading jobs failed: %s", jd_strerror(rc));
    }
    jd_jobs_free(rows, n);
    if (n == 0 && next.id == 0) { /* nothing matches: done already */
        o->state = OP_SUCCEEDED;
        o->finished_ms = o->created_ms;
        pthread_mutex_lock(&b->mu);
        o->id = ++b->next_id;
        *json = op_json_locked(o);
        pthread_mutex_unlock(&b->mu);
        op_free(o);
        return 0;
    }
    pthread_mutex_lock(&b->mu);
    if (b->stop) {
        pthread_mutex_unlock(&b->mu);
        op_free(o);
        return jd_error_set(err, JD_ESHUTDOWN, NULL, "the server is stopping");
    }
    if (b->n == JD_BULK_OPS_KEEP) { /* evict the oldest finished operation */
        size_t i = 0;
        while (i < b->n && b->ops[i]->state == OP_RUNNING)
            i++;
        if (i == b->n) {
            pthread_mutex_unlock(&b->mu);
            op_free(o);
            return jd_error_set(err, JD_EFULL, NULL,
                                "%d bulk operations are still running; try again later",
                                JD_BULK_OPS_KEEP);
        }
        op_free(b->ops[i]);
        memmove(&b->ops[i], &b->ops[i + 1], (b->n - i - 1) * sizeof b->ops[0]);
        b->n--;
    }
    if (!b->started) {
        if (pthread_create(&b->thread, NULL, bulk_main, j) != 0) {
            pthread_mutex_unlock(&b->mu);
            op_free(o);
            return jd_error_set(err, JD_EFULL, NULL, "cannot start the bulk thread");
        }
        b->started = true;
    }
    o->id = ++b->next_id;
    o->state = OP_RUNNING;
    b->ops[b->n++] = o;
    *json = op_json_locked(o);
    *started = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

uint64_t jobs_bulk_running(struct jd_jobs *j)
{
    struct jobs_bulk *b = j->bulk;
    uint64_t n = 0;
    pthread_mutex_lock(&b->mu);
    for (size_t i = 0; i < b->n; i++)
        n += b->ops[i]->state == OP_RUNNING;
    pthread_mutex_unlock(&b->mu);
    return n;
}

int jd_jobs_operation_json(struct jd_jobs *j, const char *id, char **json)
{
    struct jobs_bulk *b = j->bulk;
    int64_t v;
    if (jd_jobs_parse_id(id, &v) != 0)
        return JD_ENOENT;
    int rc = JD_ENOENT;
    pthread_mutex_lock(&b->mu);
    for (size_t i = 0; i < b->n; i++)
        if (b->ops[i]->id == (uint64_t)v) {
            *json = op_json_locked(b->ops[i]);
            rc = 0;
        }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* ---- delete ---- */

struct delrec {
    struct jd_write w;
    struct jd_jobs *j;
    jd_action_done_fn done;
    void *arg;
};

/* Under mu. */
bool jobs_deleting_locked(struct jd_jobs *j, int64_t id)
{
    struct jobs_bulk *b = j->bulk;
    for (size_t i = 0; i < b->n_deleting; i++)
        if (b->deleting[i] == id)
            return true;
    return false;
}

static void delete_done(void *arg, struct jd_write *w, int rc)
{
    struct delrec *d = arg;
    struct jobs_bulk *b = d->j->bulk;
    pthread_mutex_lock(&d->j->mu);
    for (size_t i = 0; i < b->n_deleting; i++)
        if (b->deleting[i] == w->job_id) {
            b->deleting[i] = b->deleting[--b->n_deleting];
            break;
        }
    pthread_mutex_unlock(&d->j->mu);
    if (d->done)
        d->done(d->arg, rc, NULL);
    free(d);
}

int jd_jobs_delete(struct jd_jobs *j, int64_t id, jd_action_done_fn done, void *arg)
{
    struct jobs_bulk *b = j->bulk;
    pthread_mutex_lock(&j->mu);
    int rc = 0;
    if (j->draining)
        rc = JD_ESHUTDOWN;
    else if (jobs_job_find(j, id) || jobs_deleting_locked(j, id))
        rc = JD_ECONFLICT; /* live (or being retried or deleted) */
    if (rc) {
        pthread_mutex_unlock(&j->mu);
        return rc;
    }
    struct delrec *d = jd_xcalloc(1, sizeof *d);
    d->w = (struct jd_write){.op = JD_W_JOB_DELETE, .job_id = id, .done = delete_done, .arg = d};
    d->j = j;
    d->done = done;
    d->arg = arg;
    if (b->n_deleting == b->cap_deleting) {
        b->cap_deleting = b->cap_deleting ? 2 * b->cap_deleting : 16;
        b->deleting = jd_xrealloc(b->deleting, b->cap_deleting * sizeof *b->deleting);
    }
    b->deleting[b->n_deleting++] = id;
    /* Enqueued under mu, so a retry of this id (which checks `deleting`
     * under mu) is refused until the delete has committed or failed. */
    rc = jd_store_submit(j->store, &d->w);
    if (rc) {
        b->n_deleting--;
        free(d);
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}
