/*
 * Queue controls (PUT /v1/queues/{q}): a queue's own max_running, its rate
 * limit on starts (a token bucket, common/bucket.h) and its retention per
 * terminal state. Parsing and validation (problem+json pointers), the
 * durable record (JD_W_QUEUE_CONFIG; applied to struct queue once it
 * commits), loading them at start, and rendering them with the queue
 * counts.
 *
 * Rules: a PUT replaces the whole set (a field left out is unset). A rate
 * that is new starts with a full bucket; a changed one keeps the tokens it
 * had (capped); after a restart the bucket starts empty, since the starts
 * just before the restart are not known, so the starts stay within the
 * rate across it. Admission (jobs_admit.c) reads max_running and the
 * bucket; the store's retention pass reads the retention columns.
 *
 * On a cluster node max_running and the rate hold for the whole cluster:
 * jobs_queue_pooled says so, and admission then starts only jobs the
 * database granted (jobs_cluster.c), so the bucket here is not used.
 *
 * Threading: entry points from any thread; struct queue fields under
 * jd_jobs.mu.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"
#include "common/clock.h"

#include <limits.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QCTL_MAX_RUNNING 1000000     /* more than any box runs at once */
#define QCTL_MAX_RATE 1000000        /* starts per period; the admission path does ~10^5/s */
#define QCTL_MAX_PER_MS (86400000LL) /* a day: longer periods are a schedule */
#define QCTL_MIN_RETAIN_MS 1000LL    /* below a second, a waiter misses the end */
#define QCTL_MAX_RETAIN_MS (36500LL * 86400000LL) /* a century */

static const char *const retain_names[3] = {"succeeded", "failed", "cancelled"};

bool jobs_queue_name_ok(const char *q)
{
    size_t n = q ? strlen(q) : 0;
    if (n == 0 || n > 64)
        return false;
    for (const char *p = q; *p; p++)
        if (!(*p == '_' || *p == '-' || *p == '.' || (*p >= '0' && *p <= '9') ||
              (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')))
            return false;
    return true;
}

/* An integer in [1, max] at pointer ptr. */
static int get_count(const cJSON *v, long long max, const char *ptr, long long *out,
                     struct jd_error *err)
{
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 ||
        v->valuedouble > (double)max)
        return jd_error_set(err, JD_EINVAL, ptr, "must be an integer from 1 to %lld", max);
    *out = (long long)v->valuedouble;
    return 0;
}

/* A duration string in [min_ms, max_ms] at ptr; its text is kept in txt. */
static int get_duration(const cJSON *v, int64_t min_ms, int64_t max_ms, const char *ptr,
                        int64_t *ms, char txt[24], struct jd_error *err)
{
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= 24 ||
        jd_duration_parse(v->valuestring, ms) != 0)
        return jd_error_set(err, JD_EINVAL, ptr,
                            "must be a duration such as \"500ms\", \"1s\", \"2m\", \"1h\", \"7d\"");
    if (*ms < min_ms || *ms > max_ms)
        return jd_error_set(err, JD_EINVAL, ptr,
                            "must be from %" PRId64 " ms to %" PRId64 " ms (it is %" PRId64 " ms)",
                            min_ms, max_ms, *ms);
    snprintf(txt, 24, "%s", v->valuestring);
    return 0;
}

/* Parse {"max_running":N,"rate":{"limit":N,"per":"1s"},"retention":{...}},
 * each optional and each may be null (unset). */
static int qctl_parse(const char *body, size_t len, struct qctl *c, struct jd_error *err)
{
    memset(c, 0, sizeof *c);
    cJSON *o = cJSON_ParseWithLength(body, len);
    int rc = 0;
    long long n;
    if (!o) {
        rc = jd_error_set(err, JD_EPARSE, "", "malformed JSON");
        goto out;
    }
    if (!cJSON_IsObject(o)) {
        rc = jd_error_set(err, JD_EINVAL, "", "the queue's controls must be a JSON object");
        goto out;
    }
    for (const cJSON *f = o->child; f; f = f->next) {
        char ptr[48];
        snprintf(ptr, sizeof ptr, "/%.40s", f->string);
        if (cJSON_IsNull(f))
            continue;
        if (strcmp(f->string, "max_running") == 0) {
            if ((rc = get_count(f, QCTL_MAX_RUNNING, ptr, &n, err)))
                goto out;
            c->max_running = (unsigned)n;
        } else if (strcmp(f->string, "rate") == 0) {
            if (!cJSON_IsObject(f)) {
                rc = jd_error_set(err, JD_EINVAL, ptr,
                                  "must be an object {\"limit\": N, \"per\": \"1s\"} or null");
                goto out;
            }
            const cJSON *lim = cJSON_GetObjectItemCaseSensitive(f, "limit");
            const cJSON *per = cJSON_GetObjectItemCaseSensitive(f, "per");
            for (const cJSON *g = f->child; g; g = g->next)
                if (strcmp(g->string, "limit") != 0 && strcmp(g->string, "per") != 0) {
                    snprintf(ptr, sizeof ptr, "/rate/%.30s", g->string);
                    rc = jd_error_set(err, JD_EINVAL, ptr, "unknown field (limit, per)");
                    goto out;
                }
            if ((rc = get_count(lim, QCTL_MAX_RATE, "/rate/limit", &n, err)))
                goto out;
            c->rate_limit = (uint32_t)n;
            if ((rc = get_duration(per, 1, QCTL_MAX_PER_MS, "/rate/per", &c->rate_per_ms,
                                   c->rate_per, err)))
                goto out;
        } else if (strcmp(f->string, "retention") == 0) {
            if (!cJSON_IsObject(f)) {
                rc = jd_error_set(err, JD_EINVAL, ptr,
                                  "must be an object such as {\"succeeded\": \"1d\"} or null");
                goto out;
            }
            for (const cJSON *g = f->child; g; g = g->next) {
                int k = 0;
                while (k < 3 && strcmp(g->string, retain_names[k]) != 0)
                    k++;
                snprintf(ptr, sizeof ptr, "/retention/%.30s", g->string);
                if (k == 3) {
                    rc = jd_error_set(err, JD_EINVAL, ptr,
                                      "unknown state (succeeded, failed, cancelled)");
                    goto out;
                }
                if (cJSON_IsNull(g))
                    continue;
                if ((rc = get_duration(g, QCTL_MIN_RETAIN_MS, QCTL_MAX_RETAIN_MS, ptr,
                                       &c->retain_ms[k], c->retain[k], err)))
                    goto out;
            }
        } else {
            rc = jd_error_set(err, JD_EINVAL, ptr, "unknown field (max_running, rate, retention)");
            goto out;
        }
    }
out:
    cJSON_Delete(o);
    return rc;
}

/* The controls as a cJSON object, every field present (null when unset). */
static cJSON *qctl_render(const struct qctl *c)
{
    cJSON *o = cJSON_CreateObject();
    if (c->max_running)
        cJSON_AddNumberToObject(o, "max_running", c->max_running);
    else
        cJSON_AddNullToObject(o, "max_running");
    if (c->rate_limit) {
        cJSON *r = cJSON_AddObjectToObject(o, "rate");
        cJSON_AddNumberToObject(r, "limit", c->rate_limit);
        cJSON_AddStringToObject(r, "per", c->rate_per);
    } else {
        cJSON_AddNullToObject(o, "rate");
    }
    if (c->retain_ms[0] || c->retain_ms[1] || c->retain_ms[2]) {
        cJSON *r = cJSON_AddObjectToObject(o, "retention");
        for (int k = 0; k < 3; k++)
            if (c->retain_ms[k])
                cJSON_AddStringToObject(r, retain_names[k], c->retain[k]);
    } else {
        cJSON_AddNullToObject(o, "retention");
    }
    return o;
}

bool jobs_queue_pooled(const struct jd_jobs *j, const struct queue *q)
{
    return j->cl && (q->ctl.max_running || q->ctl.rate_limit);
}

char *jobs_queue_controls_text_locked(const struct queue *q)
{
    cJSON *o = qctl_render(&q->ctl);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

struct queue *jobs_queue_find(struct jd_jobs *j, const char *name)
{
    for (struct queue *q = j->queues; q; q = q->next)
        if (strcmp(q->name, name) == 0)
            return q;
    return NULL;
}

/* Under mu: make c the queue's controls. at_start: after a restart (the
 * bucket starts empty). */
static void qctl_apply_locked(struct jd_jobs *j, struct queue *q, const struct qctl *c,
                              bool at_start)
{
    (void)j;
    int64_t now = jobs_mono_ms();
    if (!c->rate_limit)
        jd_bucket_init(&q->rate, 0, 0, now, false);
    else if (!q->ctl.rate_limit || at_start)
        jd_bucket_init(&q->rate, c->rate_limit, c->rate_per_ms, now, !at_start);
    else
        jd_bucket_set(&q->rate, c->rate_limit, c->rate_per_ms, now);
    q->ctl = *c;
}

void jobs_queue_controls_load(struct jd_jobs *j)
{
    char **pairs = NULL;
    size_t n = 0;
    if (jd_store_queue_configs(j->store, &pairs, &n) != 0)
        return;
    for (size_t i = 0; i + 1 < n; i += 2) {
        struct qctl c;
        struct jd_error err = {0};
        if (!pairs[i] || !pairs[i + 1] ||
            qctl_parse(pairs[i + 1], strlen(pairs[i + 1]), &c, &err) != 0)
            continue; /* written by this code after the same checks: not reached */
        qctl_apply_locked(j, jobs_queue_get(j, pairs[i]), &c, true);
    }
    jd_strings_free(pairs, n);
}

void jobs_queue_controls_sync(struct jd_jobs *j)
{
    char **pairs = NULL;
    size_t n = 0;
    if (jd_store_queue_configs(j->store, &pairs, &n) != 0)
        return;
    struct job *start = NULL;
    pthread_mutex_lock(&j->mu);
    for (size_t i = 0; i + 1 < n; i += 2) {
        struct qctl c;
        struct jd_error err = {0};
        if (!pairs[i] || !pairs[i + 1] ||
            qctl_parse(pairs[i + 1], strlen(pairs[i + 1]), &c, &err) != 0)
            continue;
        struct queue *q = jobs_queue_get(j, pairs[i]);
        cJSON *a = qctl_render(&c), *b = qctl_render(&q->ctl);
        bool same = cJSON_Compare(a, b, true);
        cJSON_Delete(a);
        cJSON_Delete(b);
        if (!same)
            qctl_apply_locked(j, q, &c, false);
    }
    if (!j->draining)
        jobs_admit_locked(j, &start);
    pthread_mutex_unlock(&j->mu);
    jd_strings_free(pairs, n);
    jobs_start_list(j, start);
}

void jobs_queue_controls_committed_locked(struct jd_jobs *j, const char *queue, const char *text)
{
    struct qctl c;
    struct jd_error err = {0};
    if (qctl_parse(text, strlen(text), &c, &err) == 0)
        qctl_apply_locked(j, jobs_queue_get(j, queue), &c, false);
}

int jd_jobs_queue_configure(struct jd_jobs *j, const char *queue, const char *body, size_t len,
                            jd_action_done_fn done, void *arg, struct jd_error *err)
{
    jd_error_clear(err);
    if (!jobs_queue_name_ok(queue))
        return jd_error_set(err, JD_ENOENT, NULL, "no such queue (names are [A-Za-z0-9._-]{1,64})");
    struct qctl c;
    int rc = qctl_parse(body, len, &c, err);
    if (rc)
        return rc;
    cJSON *o = qctl_render(&c);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    pthread_mutex_lock(&j->mu);
    if (j->draining) {
        pthread_mutex_unlock(&j->mu);
        free(text);
        return jd_error_set(err, JD_ESHUTDOWN, NULL, "the server is shutting down");
    }
    struct wrec *r = jobs_wrec_new(j, NULL, JD_W_QUEUE_CONFIG);
    r->queue_name = jd_xstrdup(queue);
    r->data = text;
    r->w.queue = r->queue_name;
    r->w.queue_config = r->data;
    for (int k = 0; k < 3; k++)
        r->w.retain_ms[k] = c.retain_ms[k];
    r->after = AFTER_QUEUE_CONFIG;
    r->action_done = done;
    r->user_arg = arg;
    jobs_record(r);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

/* Under mu: add the queue's controls and live numbers to its rendered
 * object o (from jd_render_queues). */
static void decorate_locked(struct jd_jobs *j, cJSON *o)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    struct queue *q = cJSON_IsString(name) ? jobs_queue_find(j, name->valuestring) : NULL;
    struct qctl none = {0};
    cJSON *c = qctl_render(q ? &q->ctl : &none);
    for (cJSON *f = c->child; f;) {
        cJSON *next = f->next;
        cJSON_AddItemToObject(o, f->string, cJSON_DetachItemViaPointer(c, f));
        f = next;
    }
    cJSON_Delete(c);
    /* Jobs of the queue holding a running slot now (a job waiting for a
     * message holds none), what max_running caps; on a cluster node, the
     * ones this node runs. */
    cJSON_AddNumberToObject(o, "active", q ? q->running : 0);
    if (q && q->ctl.rate_limit && !jobs_queue_pooled(j, q)) {
        /* Whole starts the bucket allows now (a cluster's bucket is in
         * the database: queues_json reads it). */
        jd_bucket_ready(&q->rate, jobs_mono_ms());
        cJSON_AddNumberToObject(o, "rate_available", floor(q->rate.tokens + 1e-9));
    }
}

struct bucket_ask {
    cJSON *o;
    const char *name;
    uint32_t limit;
    int64_t per_ms;
};

/* {"queues":[...]} with controls, or one queue's object (only: its name). */
static int queues_json(struct jd_jobs *j, const char *only, char **json)
{
    struct jd_queue_counts *rows = NULL;
    size_t n = 0;
    int rc = jd_store_queue_counts(j->store, &rows, &n);
    if (rc)
        return rc;
    size_t k = n;
    if (only) { /* a queue with no jobs and no row is a queue all the same */
        k = 0;
        while (k < n && strcmp(rows[k].queue, only) != 0)
            k++;
    }
    struct jd_queue_counts empty = {.queue = (char *)only};
    cJSON *o = only ? jd_render_queues(k < n ? &rows[k] : &empty, 1) : jd_render_queues(rows, n);
    jd_queue_counts_free(rows, n);
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "queues");
    pthread_mutex_lock(&j->mu);
    cJSON *found = NULL;
    size_t nb = 0, nq = (size_t)cJSON_GetArraySize(arr);
    struct bucket_ask *buckets = jd_xcalloc(nq ? nq : 1, sizeof *buckets);
    for (cJSON *q = arr ? arr->child : NULL; q; q = q->next) {
        decorate_locked(j, q);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(q, "name");
        if (only && cJSON_IsString(name) && strcmp(name->valuestring, only) == 0)
            found = q;
        struct queue *qq = cJSON_IsString(name) ? jobs_queue_find(j, name->valuestring) : NULL;
        if (qq && qq->ctl.rate_limit && jobs_queue_pooled(j, qq) && nb < nq)
            buckets[nb++] =
                (struct bucket_ask){q, qq->name, qq->ctl.rate_limit, qq->ctl.rate_per_ms};
    }
    pthread_mutex_unlock(&j->mu);
    /* A cluster's bucket is in the database (read without mu; queues and
     * their names live until destroy). */
    for (size_t i = 0; i < nb; i++) {
        long long t = 0;
        if (jd_store_queue_tokens(j->store, buckets[i].name, buckets[i].limit, buckets[i].per_ms,
                                  &t) == 0)
            cJSON_AddNumberToObject(buckets[i].o, "rate_available", (double)t);
    }
    free(buckets);
    *json = cJSON_PrintUnformatted(only ? found : o);
    cJSON_Delete(o);
    return 0;
}

int jd_jobs_queues_json(struct jd_jobs *j, char **json)
{
    return queues_json(j, NULL, json);
}

int jd_jobs_queue_json(struct jd_jobs *j, const char *queue, char **json)
{
    if (!jobs_queue_name_ok(queue))
        return JD_ENOENT;
    return queues_json(j, queue, json);
}

int jd_jobs_limits(struct jd_jobs *j, struct jd_jobs_queue_limit **queues, size_t *nq,
                   struct jd_jobs_command_limit **commands, size_t *nc)
{
    *queues = NULL;
    *commands = NULL;
    *nq = *nc = 0;
    pthread_mutex_lock(&j->mu);
    size_t n = 0;
    for (struct queue *q = j->queues; q; q = q->next)
        n++;
    struct jd_jobs_queue_limit *qv = jd_xcalloc(n ? n : 1, sizeof *qv);
    size_t k = 0;
    for (struct queue *q = j->queues; q; q = q->next) {
        struct jd_jobs_queue_limit *l = &qv[k++];
        snprintf(l->name, sizeof l->name, "%s", q->name);
        l->max_running = q->ctl.max_running;
        l->active = q->running;
        l->rate_limit = q->ctl.rate_limit;
        l->rate_per_ms = q->ctl.rate_per_ms;
        l->rate_waits = q->rate_waits;
    }
    *queues = qv;
    *nq = k;
    n = 0;
    for (struct cmd_limit *c = j->cmd_limits; c; c = c->next)
        n += c->limit != UINT_MAX;
    struct jd_jobs_command_limit *cv = jd_xcalloc(n ? n : 1, sizeof *cv);
    k = 0;
    for (struct cmd_limit *c = j->cmd_limits; c; c = c->next) {
        if (c->limit == UINT_MAX) /* a remote command's cap, lifted */
            continue;
        struct jd_jobs_command_limit *l = &cv[k++];
        snprintf(l->name, sizeof l->name, "%s", c->name);
        l->limit = c->limit;
        l->active = c->active;
        l->waiting = c->waiting;
    }
    *commands = cv;
    *nc = k;
    pthread_mutex_unlock(&j->mu);
    return 0;
}
