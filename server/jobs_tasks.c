/*
 * Remote commands and their tasks (server/tasks.h): the registry of remote
 * commands, the waiting and claimed tasks, parked claims, leases.
 *
 * A remote command is one more command of the plugin registry: the
 * registry's fallback lookup (jd_registry_set_fallback) answers its name
 * with remote_cmd, whose handle() parks the call as a task and whose
 * cancel() withdraws it. So the job layer dispatches, records, retries,
 * times out and cancels a remote call exactly like a plugin's; this file
 * only decides when the call ends (a worker's complete/fail, or its lease
 * running out) and tells the registry through the host table.
 *
 * A task is in the id hash (and the call hash) from handle() until one
 * path takes it out, under tmu: that path alone ends the call (host
 * complete/fail, once). States: waiting (in its command's FIFO) ->
 * claiming (its claim row is being committed) -> claimed (lease timer
 * armed) -> taken out. Claimed tasks have a row in the tasks table so
 * that after a restart their ids still answer 409 (the replayed job
 * dispatches the call again as attempt + 1, a new task).
 *
 * Timers (the scheduler's timer heap, no polling): a lease timer per
 * claimed task, re-armed lazily when a heartbeat moved the deadline; a
 * deadline timer per parked claim. Their arguments name the task or the
 * claim by id and are looked up under tmu, so a timer that fires late
 * finds nothing and does nothing.
 *
 * Locking: tmu guards everything here. Lock order: jd_jobs.mu before tmu;
 * host complete/fail (which enter the registry and the job layer) and user
 * callbacks are called without tmu. Store and timer calls only enqueue and
 * may be made under it.
 */
#include "server/jobs_impl.h"
#include "server/tasks.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define TASK_BUCKETS 1024 /* tasks in flight are bounded by running jobs (10^4 by default) */

#define TASK_ID_LEN 32 /* 128 random bits in hex: not guessable, not enumerable */

#define NAME_MAX_LEN 64 /* as plugin command names */

#define DESCRIPTION_MAX 1024

#define WORKER_MAX 200 /* a worker's self-chosen name, e.g. "host-1/4711" */

#define TOMBSTONES                                                                                 \
    4096 /* recently ended task ids kept with why, for the 409 before the row commits */

#define MAX_WORKERS                                                                                \
    1024 /* workers tracked for GET /v1/workers; the least recently seen idle one goes */

#define PROGRESS_MAX 16384 /* a heartbeat's progress, as compact JSON */

#define PROGRESS_EVERY_MS 1000 /* at most one progress event per task per second in the history */

#define LAT_BUCKETS                                                                                \
    JD_TASK_LAT_BUCKETS /* claim-to-complete: 10,50,100,500ms,1,5,10,30,60,300,3600s,+inf */

enum tstate { TS_WAITING, TS_CLAIMING, TS_CLAIMED };

struct rcmd {
    char *name;
    char *description;
    int64_t timeout_ms;
    int64_t created_ms, updated_ms;
    bool registered;            /* false once deleted (kept for its counters) */
    struct task *whead, *wtail; /* waiting, oldest first */
    uint64_t waiting, in_flight, claimed_total, lease_expiries, completed, failed;
    uint64_t lat_hist[LAT_BUCKETS];
    uint64_t lat_ms_sum;
    struct rcmd *next;
};

struct task {
    char id[TASK_ID_LEN + 1];
    struct rcmd *cmd;
    struct jd_call *call;
    int64_t job_id;
    uint32_t tag, attempt;
    char *args, *key, *worker;
    char *traceparent; /* the job's W3C trace context, or NULL (issue 19) */
    enum tstate st;
    bool live; /* in the hashes */
    int refs;  /* the hashes; a claim being committed */
    int64_t created_ms, claimed_ms, lease_expires_ms, lease_ms;
    int64_t progress_ms; /* the last progress event recorded */
    bool timer_armed;
    uint64_t timer_id;
    struct ltimer *timer_arg;
    struct task *wprev, *wnext; /* command's waiting list */
    struct task *hnext, *cnext; /* id hash, call hash */
};

/* A parked claim. */
struct claimer {
    uint64_t id;
    struct rcmd **cmds;
    size_t ncmds;
    char *worker;
    unsigned max;
    int64_t lease_ms;
    jd_action_done_fn done;
    void *arg;
    bool timer_armed;
    uint64_t timer_id;
    struct ctimer *timer_arg;
    struct claimer *next;
};

struct ltimer {
    struct jd_jobs *j;
    char id[TASK_ID_LEN + 1];
};

struct ctimer {
    struct jd_jobs *j;
    uint64_t id;
};

struct tomb {
    char id[TASK_ID_LEN + 1];
    const char *reason;
};

struct wkr {
    char *name;
    int64_t last_seen_ms;
    unsigned in_flight;
    struct rcmd **cmds; /* the commands of its last claim */
    size_t ncmds;
    struct wkr *next;
};

/* The latest progress of a job's remote step (one per job: the latest
 * heartbeat that carried one), shown on the job until that task ends. */
struct prog {
    int64_t job_id;
    char task[TASK_ID_LEN + 1];
    char *json;
    struct prog *next;
};

struct jd_tasks {
    pthread_mutex_t mu; /* tmu */
    struct tomb tombs[TOMBSTONES];
    unsigned tomb_next;
    struct wkr *workers;
    size_t nworkers;
    struct prog *progs[TASK_BUCKETS];
    struct rcmd *cmds;
    size_t ncmds; /* registered */
    struct task *byid[TASK_BUCKETS];
    struct task *bycall[TASK_BUCKETS];
    struct claimer *claimers;
    uint64_t next_claimer;
    bool draining;
};

/* The job layer whose remote commands the registry's fallback serves:
 * handle() and cancel() get no context pointer (the plugin ABI), so there
 * is one per process, the most recently created (as the registry's
 * g_current). Set before replay, cleared by destroy. */
static struct jd_jobs *_Atomic g_jobs;

static void remote_handle(const struct jd_call_info *info);
static void remote_cancel(struct jd_call *call);

static const struct jd_command remote_cmd = {
    .name = "(remote)",
    .flags = 0,
    .default_timeout_ms = 0, /* the job layer passes the command's own */
    .validate = NULL,
    .handle = remote_handle,
    .cancel = remote_cancel,
};

/* ---- small helpers ---- */

static unsigned hash_str(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h % TASK_BUCKETS;
}

static unsigned hash_ptr(const void *p)
{
    uint64_t v = (uint64_t)(uintptr_t)p;
    v ^= v >> 33;
    v *= 0xff51afd7ed558ccdull;
    v ^= v >> 33;
    return (unsigned)(v % TASK_BUCKETS);
}

static void random_id(char out[TASK_ID_LEN + 1])
{
    uint8_t b[TASK_ID_LEN / 2];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t n = getrandom(b + got, sizeof b - got, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            jd_logf(JD_LOG_ERROR, "getrandom failed: %s", strerror(errno));
            abort(); /* an id a worker could guess is worse than stopping */
        }
        got += (size_t)n;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof b; i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[TASK_ID_LEN] = '\0';
}

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > NAME_MAX_LEN || !(s[0] >= 'a' && s[0] <= 'z'))
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
            return false;
    }
    return true;
}

/* Under tmu. */
static struct rcmd *rcmd_find(struct jd_tasks *t, const char *name)
{
    for (struct rcmd *c = t->cmds; c; c = c->next)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

static struct task *task_find(struct jd_tasks *t, const char *id)
{
    for (struct task *k = t->byid[hash_str(id)]; k; k = k->hnext)
        if (strcmp(k->id, id) == 0)
            return k;
    return NULL;
}

static struct task *task_by_call(struct jd_tasks *t, const struct jd_call *call)
{
    for (struct task *k = t->bycall[hash_ptr(call)]; k; k = k->cnext)
        if (k->call == call)
            return k;
    return NULL;
}

/* Under tmu: workers. */
static struct wkr *worker_find(struct jd_tasks *t, const char *name)
{
    for (struct wkr *w = t->workers; w; w = w->next)
        if (strcmp(w->name, name) == 0)
            return w;
    return NULL;
}

/* Under tmu: note that worker `name` was seen (cmds: its claim's, or NULL
 * to keep what it had). Past MAX_WORKERS the least recently seen idle one
 * is forgotten; when every one is busy the newcomer is not tracked. */
static struct wkr *worker_seen(struct jd_tasks *t, const char *name, struct rcmd *const *cmds,
                               size_t ncmds)
{
    struct wkr *w = worker_find(t, name);
    if (!w) {
        if (t->nworkers >= MAX_WORKERS) {
            struct wkr **victim = NULL;
            for (struct wkr **pp = &t->workers; *pp; pp = &(*pp)->next)
                if ((*pp)->in_flight == 0 &&
                    (!victim || (*pp)->last_seen_ms < (*victim)->last_seen_ms))
                    victim = pp;
            if (!victim)
                return NULL;
            struct wkr *v = *victim;
            *victim = v->next;
            free(v->name);
            free(v->cmds);
            free(v);
            t->nworkers--;
        }
        w = jd_xcalloc(1, sizeof *w);
        w->name = jd_xstrdup(name);
        w->next = t->workers;
        t->workers = w;
        t->nworkers++;
    }
    w->last_seen_ms = jd_wall_ms();
    if (cmds) {
        free(w->cmds);
        w->cmds = jd_xcalloc(ncmds ? ncmds : 1, sizeof *w->cmds);
        memcpy(w->cmds, cmds, ncmds * sizeof *cmds);
        w->ncmds = ncmds;
    }
    return w;
}

static unsigned hash_job(int64_t id)
{
    return (unsigned)((uint64_t)id * 0x9e3779b97f4a7c15ull >> 54) % TASK_BUCKETS;
}

/* Under tmu: the job's progress entry, if k (or nobody) set it. */
static void progress_clear(struct jd_tasks *t, const struct task *k)
{
    for (struct prog **pp = &t->progs[hash_job(k->job_id)]; *pp; pp = &(*pp)->next)
        if ((*pp)->job_id == k->job_id) {
            if (strcmp((*pp)->task, k->id) == 0) {
                struct prog *g = *pp;
                *pp = g->next;
                free(g->json);
                free(g);
            }
            return;
        }
}

static void progress_set(struct jd_tasks *t, const struct task *k, const char *json)
{
    struct prog *g = NULL;
    for (struct prog *x = t->progs[hash_job(k->job_id)]; x && !g; x = x->next)
        if (x->job_id == k->job_id)
            g = x;
    if (!g) {
        g = jd_xcalloc(1, sizeof *g);
        g->job_id = k->job_id;
        unsigned h = hash_job(k->job_id);
        g->next = t->progs[h];
        t->progs[h] = g;
    }
    memcpy(g->task, k->id, sizeof g->task);
    free(g->json);
    g->json = jd_xstrdup(json);
}

char *jobs_tasks_progress(struct jd_jobs *j, int64_t job_id)
{
    struct jd_tasks *t = j->tasks;
    char *out = NULL;
    if (!t)
        return NULL;
    pthread_mutex_lock(&t->mu);
    for (struct prog *x = t->progs[hash_job(job_id)]; x && !out; x = x->next)
        if (x->job_id == job_id)
            out = jd_xstrdup(x->json);
    pthread_mutex_unlock(&t->mu);
    return out;
}

static void task_free(struct task *k)
{
    free(k->args);
    free(k->key);
    free(k->worker);
    free(k->traceparent);
    free(k);
}

static void task_unref(struct task *k)
{
    if (--k->refs == 0)
        task_free(k);
}

static void waiting_unlink(struct task *k)
{
    struct rcmd *c = k->cmd;
    if (k->wprev)
        k->wprev->wnext = k->wnext;
    else
        c->whead = k->wnext;
    if (k->wnext)
        k->wnext->wprev = k->wprev;
    else
        c->wtail = k->wprev;
    k->wprev = k->wnext = NULL;
    c->waiting--;
}

static void waiting_push(struct task *k, bool front)
{
    struct rcmd *c = k->cmd;
    if (front) {
        k->wprev = NULL;
        k->wnext = c->whead;
        if (c->whead)
            c->whead->wprev = k;
        else
            c->wtail = k;
        c->whead = k;
    } else {
        k->wnext = NULL;
        k->wprev = c->wtail;
        if (c->wtail)
            c->wtail->wnext = k;
        else
            c->whead = k;
        c->wtail = k;
    }
    c->waiting++;
}

/* Under tmu: take k out of the hashes (and its command's lists); the
 * caller now ends its call. Drops the hashes' reference (k stays valid
 * while the caller holds another, or until tmu is released). */
static struct wkr *worker_find(struct jd_tasks *t, const char *name);
static void progress_clear(struct jd_tasks *t, const struct task *k);

static void task_take_out(struct jd_jobs *j, struct task *k, const char *reason)
{
    struct jd_tasks *t = j->tasks;
    if (k->st != TS_WAITING) {
        struct tomb *tb = &t->tombs[t->tomb_next++ % TOMBSTONES];
        memcpy(tb->id, k->id, sizeof tb->id);
        tb->reason = reason;
        struct wkr *w = worker_find(t, k->worker ? k->worker : "");
        if (w && w->in_flight)
            w->in_flight--;
        progress_clear(t, k);
    }
    for (struct task **pp = &t->byid[hash_str(k->id)]; *pp; pp = &(*pp)->hnext)
        if (*pp == k) {
            *pp = k->hnext;
            break;
        }
    for (struct task **pp = &t->bycall[hash_ptr(k->call)]; *pp; pp = &(*pp)->cnext)
        if (*pp == k) {
            *pp = k->cnext;
            break;
        }
    if (k->st == TS_WAITING)
        waiting_unlink(k);
    else
        k->cmd->in_flight--;
    if (k->timer_armed && jd_sched_timer_cancel(j->sched, k->timer_id) == 0)
        free(k->timer_arg);
    k->timer_armed = false;
    k->live = false;
}

/* ---- storage records ---- */

/* A task row or command record on its way to the writer. */
struct trec {
    struct jd_write w;
    struct jd_jobs *j;
    char *s1, *s2, *s3; /* owned strings the record points at */
    jd_action_done_fn done;
    void *arg;
    char *answer; /* done's json on success */
    struct claim_op *claim;
    struct batch_op *batch;
};

static struct trec *trec_new(struct jd_jobs *j, enum jd_write_op op)
{
    struct trec *r = jd_xcalloc(1, sizeof *r);
    r->j = j;
    r->w.op = op;
    return r;
}

static void trec_free(struct trec *r)
{
    free(r->s1);
    free(r->s2);
    free(r->s3);
    free(r->answer);
    free(r);
}

static void trec_done(void *arg, struct jd_write *w, int rc);

static void trec_submit(struct trec *r)
{
    r->w.done = trec_done;
    r->w.arg = r;
    if (jd_store_submit(r->j->store, &r->w) != 0) {
        /* Closing: nothing is recorded; tell the caller as a failed commit. */
        trec_done(r, &r->w, JD_ESHUTDOWN);
    }
}

/* Under tmu (or not): a task row as k is now. */
static struct trec *task_row(struct jd_jobs *j, const struct task *k, enum jd_task_state st)
{
    struct trec *r = trec_new(j, JD_W_TASK_PUT);
    r->s1 = jd_xstrdup(k->id);
    r->s2 = jd_xstrdup(k->cmd->name);
    r->s3 = k->worker ? jd_xstrdup(k->worker) : NULL;
    r->w.task = (struct jd_task_write){.id = r->s1,
                                       .job_id = k->job_id,
                                       .tag = k->tag,
                                       .attempt = k->attempt,
                                       .command = r->s2,
                                       .state = st,
                                       .worker = r->s3,
                                       .lease_expires_ms = k->lease_expires_ms};
    return r;
}

static void claim_committed(struct jd_jobs *j, struct claim_op *op, int rc);
struct batch_op;
static void batch_committed(struct jd_jobs *j, struct batch_op *b, int rc);

static void trec_done(void *arg, struct jd_write *w, int rc)
{
    struct trec *r = arg;
    (void)w;
    if (r->claim) {
        claim_committed(r->j, r->claim, rc);
    } else if (r->batch) {
        batch_committed(r->j, r->batch, rc);
    } else if (r->done) {
        if (rc == JD_ENOENT && r->w.op == JD_W_COMMAND_DELETE)
            rc = 0; /* deleted meanwhile: the same end */
        r->done(r->arg, rc, rc == 0 ? (r->answer ? r->answer : "{}") : NULL);
    }
    trec_free(r);
}

/* ---- commands ---- */

static const struct jd_command *fallback_lookup(void *ctx, const char *name)
{
    struct jd_jobs *j = ctx;
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    struct rcmd *c = rcmd_find(t, name);
    bool ok = c && c->registered;
    pthread_mutex_unlock(&t->mu);
    return ok ? &remote_cmd : NULL;
}

/* Under tmu: render one command. */
static void render_cmd(struct jd_sbuf *b, const struct rcmd *c, int64_t now)
{
    char t1[32], t2[32];
    jd_render_time(c->created_ms, t1);
    jd_render_time(c->updated_ms, t2);
    jd_sb_puts(b, "{\"name\":");
    jd_sb_string(b, c->name);
    jd_sb_puts(b, ",\"kind\":\"remote\",\"timeout_ms\":");
    jd_sb_number(b, c->timeout_ms);
    jd_sb_puts(b, ",\"description\":");
    if (c->description)
        jd_sb_string(b, c->description);
    else
        jd_sb_puts(b, "null");
    jd_sb_puts(b, ",\"waiting\":");
    jd_sb_number(b, (int64_t)c->waiting);
    jd_sb_puts(b, ",\"in_flight\":");
    jd_sb_number(b, (int64_t)c->in_flight);
    jd_sb_puts(b, ",\"oldest_waiting_ms\":");
    if (c->whead)
        jd_sb_number(b, now - c->whead->created_ms > 0 ? now - c->whead->created_ms : 0);
    else
        jd_sb_puts(b, "null");
    jd_sb_puts(b, ",\"created_at\":\"");
    jd_sb_puts(b, t1);
    jd_sb_puts(b, "\",\"updated_at\":\"");
    jd_sb_puts(b, t2);
    jd_sb_puts(b, "\"}");
}

/* A JSON integer in [lo, hi] at o[name], or its default when absent. */
static int int_field(const cJSON *o, const char *name, int64_t lo, int64_t hi, int64_t dflt,
                     int64_t *out, struct jd_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    char ptr[64];
    snprintf(ptr, sizeof ptr, "/%s", name);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || !isfinite(v->valuedouble))
        return jd_error_set(err, JD_EINVAL, ptr, "%s must be an integer", name);
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return jd_error_set(err, JD_EINVAL, ptr, "%s must be between %" PRId64 " and %" PRId64,
                            name, lo, hi);
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* Parse a body that must be a JSON object (an empty body counts as {}
 * when empty_ok). Caller deletes. */
static cJSON *parse_object(const char *body, size_t len, bool empty_ok, struct jd_error *err)
{
    size_t i = 0;
    while (i < len && isspace((unsigned char)body[i]))
        i++;
    if (i == len) {
        if (empty_ok)
            return cJSON_CreateObject();
        jd_error_set(err, JD_EPARSE, NULL, "the body is empty; a JSON object is expected");
        return NULL;
    }
    cJSON *o = cJSON_ParseWithLength(body, len);
    if (!o) {
        jd_error_set(err, JD_EPARSE, NULL, "the body is not valid JSON");
        return NULL;
    }
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        jd_error_set(err, JD_EINVAL, "", "the body must be a JSON object");
        return NULL;
    }
    return o;
}

int jd_jobs_command_put(struct jd_jobs *j, const char *name, const char *body, size_t len,
                        bool *created, jd_action_done_fn done, void *arg, struct jd_error *err)
{
    struct jd_tasks *t = j->tasks;
    if (!name_ok(name))
        return jd_error_set(err, JD_EINVAL, "",
                            "a command name is 1-%d characters of a-z, 0-9, _ . - starting "
                            "with a letter",
                            NAME_MAX_LEN);
    cJSON *o = parse_object(body ? body : "", len, true, err);
    if (!o)
        return err->code;
    int64_t tmo = 0;
    int rc = int_field(o, "timeout_ms", 0, (int64_t)7 * 24 * 3600 * 1000, 0, &tmo, err);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "description");
    if (rc == 0 && d && !cJSON_IsNull(d) &&
        (!cJSON_IsString(d) || strlen(d->valuestring) > DESCRIPTION_MAX))
        rc = jd_error_set(err, JD_EINVAL, "/description",
                          "description must be a string of at most %d bytes", DESCRIPTION_MAX);
    char *desc = rc == 0 && cJSON_IsString(d) ? jd_xstrdup(d->valuestring) : NULL;
    cJSON_Delete(o);
    if (rc) {
        free(desc);
        return rc;
    }
    /* A plugin's own name stays the plugin's: the fallback is asked only
     * when no plugin has the name, so the remote one would never run. */
    const struct jd_command *pc = jd_registry_command(j->reg, name);
    if (pc && pc != &remote_cmd) {
        free(desc);
        return jd_error_set(err, JD_ECONFLICT, NULL, "the plugin command \"%s\" has this name",
                            name);
    }
    pthread_mutex_lock(&t->mu);
    if (t->draining) {
        pthread_mutex_unlock(&t->mu);
        free(desc);
        return jd_error_set(err, JD_ESHUTDOWN, NULL, "shutting down");
    }
    struct rcmd *c = rcmd_find(t, name);
    if ((!c || !c->registered) && t->ncmds >= JD_TASK_MAX_COMMANDS) {
        pthread_mutex_unlock(&t->mu);
        free(desc);
        return jd_error_set(err, JD_EFULL, NULL, "at most %d remote commands",
                            JD_TASK_MAX_COMMANDS);
    }
    int64_t now = jd_wall_ms();
    *created = !c || !c->registered;
    if (!c) {
        c = jd_xcalloc(1, sizeof *c);
        c->name = jd_xstrdup(name);
        c->created_ms = now;
        c->next = t->cmds;
        t->cmds = c;
    }
    if (!c->registered) {
        c->registered = true;
        c->created_ms = now;
        t->ncmds++;
    }
    c->timeout_ms = tmo;
    free(c->description);
    c->description = desc;
    c->updated_ms = now;
    struct trec *r = trec_new(j, JD_W_COMMAND_PUT);
    r->s1 = jd_xstrdup(name);
    r->s2 = desc ? jd_xstrdup(desc) : NULL;
    r->w.rcmd = (struct jd_rcmd_write){.name = r->s1, .description = r->s2, .timeout_ms = tmo};
    struct jd_sbuf b = {0};
    render_cmd(&b, c, now);
    r->answer = b.p;
    r->done = done;
    r->arg = arg;
    pthread_mutex_unlock(&t->mu);
    trec_submit(r);
    return 0;
}

/* Under jd_jobs.mu: does a live job's definition name the command? (A
 * plugin process type may yield anything; only its tasks count.) */
static bool jobs_use_locked(struct jd_jobs *j, const char *name)
{
    for (unsigned b = 0; b < NBUCKETS; b++)
        for (struct job *jb = j->table[b]; jb; jb = jb->hnext) {
            const struct jd_jobdef *d = jb->def;
            if (!d || jb->finished)
                continue;
            for (size_t i = 0; i < d->nsteps; i++)
                if (d->steps[i].call && strcmp(d->steps[i].call, name) == 0)
                    return true;
        }
    return false;
}

int jd_jobs_command_delete(struct jd_jobs *j, const char *name, jd_action_done_fn done, void *arg,
                           struct jd_error *err)
{
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&j->mu);
    pthread_mutex_lock(&t->mu);
    struct rcmd *c = rcmd_find(t, name);
    int rc = 0;
    if (!c || !c->registered)
        rc = jd_error_set(err, JD_ENOENT, NULL, "no such remote command");
    else if (c->waiting || c->in_flight)
        rc = jd_error_set(err, JD_ECONFLICT, NULL,
                          "tasks of \"%s\" are waiting or claimed; delete it when no job uses it",
                          name);
    else if (jobs_use_locked(j, name))
        rc = jd_error_set(err, JD_ECONFLICT, NULL,
                          "unfinished jobs call \"%s\"; delete it when no job uses it", name);
    if (rc == 0) {
        c->registered = false;
        t->ncmds--;
        struct trec *r = trec_new(j, JD_W_COMMAND_DELETE);
        r->s1 = jd_xstrdup(name);
        r->w.rcmd.name = r->s1;
        r->done = done;
        r->arg = arg;
        pthread_mutex_unlock(&t->mu);
        pthread_mutex_unlock(&j->mu);
        trec_submit(r);
        return 0;
    }
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int jd_jobs_command_get_json(struct jd_jobs *j, const char *name, char **json)
{
    struct jd_tasks *t = j->tasks;
    *json = NULL;
    pthread_mutex_lock(&t->mu);
    struct rcmd *c = rcmd_find(t, name);
    if (c && c->registered) {
        struct jd_sbuf b = {0};
        render_cmd(&b, c, jd_wall_ms());
        *json = b.p;
    }
    pthread_mutex_unlock(&t->mu);
    return *json ? 0 : JD_ENOENT;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int jd_jobs_commands_json(struct jd_jobs *j, char **json)
{
    struct jd_tasks *t = j->tasks;
    /* Plugin commands first collected, then each remote one rendered; the
     * list is sorted by name as a whole. */
    size_t n = 0, cap = 0;
    char **items = NULL;
    for (size_t i = 0;; i++) {
        const struct jd_plugin *p = jd_registry_plugin(j->reg, i);
        if (!p)
            break;
        for (size_t k = 0; k < p->ncommands; k++) {
            struct jd_sbuf b = {0};
            jd_sb_puts(&b, "{\"name\":");
            jd_sb_string(&b, p->commands[k].name);
            jd_sb_puts(&b, ",\"kind\":\"plugin\",\"plugin\":");
            jd_sb_string(&b, p->name);
            jd_sb_puts(&b, "}");
            if (n == cap) {
                cap = cap ? cap * 2 : 32;
                items = jd_xrealloc(items, cap * sizeof *items);
            }
            items[n++] = b.p;
        }
    }
    int64_t now = jd_wall_ms();
    pthread_mutex_lock(&t->mu);
    for (struct rcmd *c = t->cmds; c; c = c->next) {
        if (!c->registered)
            continue;
        struct jd_sbuf b = {0};
        render_cmd(&b, c, now);
        if (n == cap) {
            cap = cap ? cap * 2 : 32;
            items = jd_xrealloc(items, cap * sizeof *items);
        }
        items[n++] = b.p;
    }
    pthread_mutex_unlock(&t->mu);
    /* Each item starts {"name":"<name>", so sorting the text sorts by name. */
    if (n > 1)
        qsort(items, n, sizeof *items, cmp_str);
    struct jd_sbuf out = {0};
    jd_sb_puts(&out, "{\"commands\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            jd_sb_puts(&out, ",");
        jd_sb_puts(&out, items[i]);
        free(items[i]);
    }
    jd_sb_puts(&out, "]}");
    free(items);
    *json = out.p;
    return 0;
}

int64_t jobs_tasks_timeout_ms(struct jd_jobs *j, const char *name)
{
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    struct rcmd *c = rcmd_find(t, name);
    int64_t v = c && c->registered ? c->timeout_ms : 0;
    pthread_mutex_unlock(&t->mu);
    return v;
}

bool jobs_tasks_is_remote_cmd(const struct jd_command *c)
{
    return c == &remote_cmd;
}

/* ---- tasks: arrival, claims, leases ---- */

static void serve_claimers_locked(struct jd_jobs *j, struct rcmd *c);

static void remote_handle(const struct jd_call_info *info)
{
    struct jd_jobs *j = atomic_load_explicit(&g_jobs, memory_order_acquire);
    const struct jd_host *host = j ? jd_registry_host(j->reg) : NULL;
    if (!j) {
        return; /* not reached: the fallback only answers while a layer lives */
    }
    struct jd_tasks *t = j->tasks;
    int64_t job_id = 0;
    unsigned tag = 0;
    if (sscanf(info->idempotency_key, "%" SCNd64 ":%u", &job_id, &tag) != 2) {
        host->fail(info->call, "internal", "the call has no job key", 0, NULL);
        return;
    }
    struct task *k = jd_xcalloc(1, sizeof *k);
    random_id(k->id);
    k->call = info->call;
    k->job_id = job_id;
    k->tag = tag;
    k->attempt = info->attempt;
    k->args = jd_xstrdup(info->args_json ? info->args_json : "{}");
    k->key = jd_xstrdup(info->idempotency_key);
    k->traceparent = jobs_trace_of_job(j, job_id); /* takes mu: before tmu */
    k->created_ms = jd_wall_ms();
    k->refs = 1;
    pthread_mutex_lock(&t->mu);
    struct rcmd *c = rcmd_find(t, info->command);
    if (!c || !c->registered) {
        pthread_mutex_unlock(&t->mu);
        task_free(k);
        char m[200];
        snprintf(m, sizeof m, "the remote command \"%.100s\" was deleted", info->command);
        host->fail(info->call, "unknown_command", m, 0, NULL);
        return;
    }
    k->cmd = c;
    k->st = TS_WAITING;
    k->live = true;
    unsigned h = hash_str(k->id);
    k->hnext = t->byid[h];
    t->byid[h] = k;
    h = hash_ptr(k->call);
    k->cnext = t->bycall[h];
    t->bycall[h] = k;
    waiting_push(k, false);
    serve_claimers_locked(j, c);
    pthread_mutex_unlock(&t->mu);
    /* A cancel that came before the task was recorded found nothing to
     * withdraw: it is ours to end now. */
    if (host->is_cancelled(info->call)) {
        pthread_mutex_lock(&t->mu);
        bool mine = k->live;
        if (mine)
            task_take_out(j, k, "cancelled"); /* k stays valid: no one else can free it now */
        pthread_mutex_unlock(&t->mu);
        if (mine) {
            host->fail(info->call, "cancelled", "cancelled", 0, NULL);
            pthread_mutex_lock(&t->mu);
            task_unref(k);
            pthread_mutex_unlock(&t->mu);
        }
    }
}

static void remote_cancel(struct jd_call *call)
{
    struct jd_jobs *j = atomic_load_explicit(&g_jobs, memory_order_acquire);
    if (!j)
        return;
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    struct task *k = task_by_call(t, call);
    if (!k) {
        pthread_mutex_unlock(&t->mu);
        return; /* a worker's complete/fail, an expiry, or handle() ends it */
    }
    int64_t job_id = k->job_id;
    pthread_mutex_unlock(&t->mu);
    /* Was it the job's cancel, or the attempt's deadline? (mu before tmu) */
    pthread_mutex_lock(&j->mu);
    struct job *jb = jobs_job_find(j, job_id);
    bool job_cancelled = !jb || jb->cancel_requested || jb->finished;
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&t->mu);
    k = task_by_call(t, call);
    struct trec *row = NULL;
    if (k) {
        bool claimed = k->st != TS_WAITING;
        task_take_out(j, k, job_cancelled ? "cancelled" : "lease_lost");
        if (claimed)
            row = task_row(j, k, job_cancelled ? JD_TASK_CANCELLED : JD_TASK_EXPIRED);
        task_unref(k);
    }
    pthread_mutex_unlock(&t->mu);
    if (row)
        trec_submit(row);
    if (k)
        jd_registry_host(j->reg)->fail(call, "cancelled", "cancelled", 0, NULL);
}

static void lease_fire(void *arg);

/* Under tmu: arm k's lease timer for its deadline. */
static void lease_arm(struct jd_jobs *j, struct task *k)
{
    int64_t delay = k->lease_expires_ms - jd_wall_ms();
    if (delay < 0)
        delay = 0;
    struct ltimer *lt = jd_xmalloc(sizeof *lt);
    lt->j = j;
    memcpy(lt->id, k->id, sizeof lt->id);
    if (jd_sched_timer_after(j->sched, (uint64_t)delay * 1000000u + 1000000u, lease_fire, lt,
                             &k->timer_id) != 0) {
        free(lt); /* shutting down: the restart offers the task again */
        k->timer_armed = false;
        return;
    }
    k->timer_arg = lt;
    k->timer_armed = true;
}

static void lease_fire(void *arg)
{
    struct ltimer *lt = arg;
    struct jd_jobs *j = lt->j;
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    struct task *k = task_find(t, lt->id);
    if (!k || k->timer_arg != lt) {
        pthread_mutex_unlock(&t->mu);
        free(lt);
        return;
    }
    k->timer_armed = false;
    k->timer_arg = NULL;
    free(lt);
    if (jd_wall_ms() < k->lease_expires_ms) {
        lease_arm(j, k); /* a heartbeat moved the deadline */
        pthread_mutex_unlock(&t->mu);
        return;
    }
    task_take_out(j, k, "lease_lost");
    k->cmd->lease_expiries++;
    struct trec *row = task_row(j, k, JD_TASK_EXPIRED);
    struct jd_call *call = k->call;
    char m[300];
    snprintf(m, sizeof m, "the lease of worker \"%.200s\" ran out", k->worker ? k->worker : "");
    task_unref(k);
    pthread_mutex_unlock(&t->mu);
    trec_submit(row);
    jd_registry_host(j->reg)->fail(call, "lease_expired", m, 1, NULL);
}

/* One claim: the tasks taken for it, committed together. */
struct claim_op {
    struct task **tasks;
    size_t n;
    jd_action_done_fn done;
    void *arg;
    int remaining, rc;
};

/* Under tmu: take up to max waiting tasks of cmds (oldest first across
 * commands) for a claim; NULL if none. The rows are submitted by the
 * caller (claim_submit) after tmu. */
static struct claim_op *claim_take_locked(struct jd_jobs *j, struct rcmd *const *cmds, size_t ncmds,
                                          const char *worker, unsigned max, int64_t lease_ms)
{
    struct claim_op *op = NULL;
    int64_t now = jd_wall_ms();
    while (!op || op->n < max) {
        struct task *best = NULL;
        for (size_t i = 0; i < ncmds; i++) {
            struct task *k = cmds[i]->whead;
            if (k && (!best || k->created_ms < best->created_ms))
                best = k;
        }
        if (!best)
            break;
        if (!op) {
            op = jd_xcalloc(1, sizeof *op);
            op->tasks = jd_xcalloc(max, sizeof *op->tasks);
        }
        waiting_unlink(best);
        best->cmd->in_flight++;
        best->cmd->claimed_total++;
        best->st = TS_CLAIMING;
        free(best->worker);
        best->worker = jd_xstrdup(worker);
        best->claimed_ms = now;
        best->lease_expires_ms = now + lease_ms;
        best->lease_ms = lease_ms;
        best->refs++; /* the claim's */
        op->tasks[op->n++] = best;
    }
    (void)j;
    return op;
}

/* Without tmu: record every task of op as claimed (one commit); done
 * fires from claim_committed. */
static void claim_submit(struct jd_jobs *j, struct claim_op *op)
{
    struct trec **rs = jd_xcalloc(op->n, sizeof *rs);
    struct jd_write **ws = jd_xcalloc(op->n, sizeof *ws);
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < op->n; i++) {
        rs[i] = task_row(j, op->tasks[i], JD_TASK_CLAIMED);
        rs[i]->claim = op;
        rs[i]->w.done = trec_done;
        rs[i]->w.arg = rs[i];
        ws[i] = &rs[i]->w;
    }
    op->remaining = (int)op->n;
    pthread_mutex_unlock(&t->mu);
    if (jd_store_submit_many(j->store, ws, op->n) != 0)
        for (size_t i = 0; i < op->n; i++)
            trec_done(rs[i], ws[i], JD_ESHUTDOWN);
    free(ws);
    free(rs);
}

static void render_task(struct jd_sbuf *b, const struct task *k)
{
    char t[32];
    jd_render_time(k->lease_expires_ms, t);
    jd_sb_puts(b, "{\"id\":\"");
    jd_sb_puts(b, k->id);
    jd_sb_puts(b, "\",\"command\":");
    jd_sb_string(b, k->cmd->name);
    jd_sb_puts(b, ",\"args\":");
    jd_sb_json(b, k->args, "{}");
    jd_sb_puts(b, ",\"job_id\":\"");
    jd_sb_number(b, k->job_id);
    jd_sb_puts(b, "\",\"tag\":");
    jd_sb_number(b, k->tag);
    jd_sb_puts(b, ",\"attempt\":");
    jd_sb_number(b, k->attempt);
    jd_sb_puts(b, ",\"idempotency_key\":");
    jd_sb_string(b, k->key);
    if (k->traceparent) { /* the job's, unchanged: child spans are the worker's */
        jd_sb_puts(b, ",\"traceparent\":");
        jd_sb_string(b, k->traceparent);
    }
    jd_sb_puts(b, ",\"lease_expires_at\":\"");
    jd_sb_puts(b, t);
    jd_sb_puts(b, "\"}");
}

/* The store's completion thread: one record of op committed (or not). */
static void claim_committed(struct jd_jobs *j, struct claim_op *op, int rc)
{
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    if (rc && !op->rc)
        op->rc = rc;
    if (--op->remaining > 0) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    struct jd_sbuf b = {0};
    jd_sb_puts(&b, "{\"tasks\":[");
    size_t shown = 0;
    for (size_t i = 0; i < op->n; i++) {
        struct task *k = op->tasks[i];
        if (k->live && k->st == TS_CLAIMING) {
            if (op->rc) {
                /* Not recorded: nobody holds it; it waits again, first. */
                k->st = TS_WAITING;
                k->cmd->in_flight--;
                k->cmd->claimed_total--;
                waiting_push(k, true);
            } else {
                k->st = TS_CLAIMED;
                lease_arm(j, k);
                struct wkr *w = worker_seen(t, k->worker ? k->worker : "", NULL, 0);
                if (w)
                    w->in_flight++;
                if (shown++)
                    jd_sb_puts(&b, ",");
                render_task(&b, k);
            }
        }
        task_unref(k);
    }
    jd_sb_puts(&b, "]}");
    pthread_mutex_unlock(&t->mu);
    op->done(op->arg, op->rc == JD_ESHUTDOWN ? 0 : op->rc,
             op->rc == JD_ESHUTDOWN ? "{\"tasks\":[]}" : b.p);
    free(b.p);
    free(op->tasks);
    free(op);
}

static void claimer_free(struct claimer *cl)
{
    free(cl->cmds);
    free(cl->worker);
    free(cl);
}

/* Under tmu: a task of c arrived: hand it to the oldest parked claim that
 * wants c (one claim per arrival: the rest stay parked). */
static void serve_claimers_locked(struct jd_jobs *j, struct rcmd *c)
{
    struct jd_tasks *t = j->tasks;
    /* The list is newest first; serve the oldest: the last match. */
    struct claimer **match = NULL;
    for (struct claimer **pp = &t->claimers; *pp; pp = &(*pp)->next)
        for (size_t i = 0; i < (*pp)->ncmds; i++)
            if ((*pp)->cmds[i] == c)
                match = pp;
    if (!match)
        return;
    struct claimer *cl = *match;
    *match = cl->next;
    if (cl->timer_armed && jd_sched_timer_cancel(j->sched, cl->timer_id) == 0)
        free(cl->timer_arg);
    struct claim_op *op =
        claim_take_locked(j, cl->cmds, cl->ncmds, cl->worker, cl->max, cl->lease_ms);
    op->done = cl->done;
    op->arg = cl->arg;
    claimer_free(cl);
    struct jd_write **ws = jd_xcalloc(op->n, sizeof *ws);
    op->remaining = (int)op->n;
    for (size_t i = 0; i < op->n; i++) {
        struct trec *r = task_row(j, op->tasks[i], JD_TASK_CLAIMED);
        r->claim = op;
        r->w.done = trec_done;
        r->w.arg = r;
        ws[i] = &r->w;
    }
    if (jd_store_submit_many(j->store, ws, op->n) != 0) {
        /* Closing: the claim's done must not run under tmu; the waiting
         * tasks go back and the claim answers empty from drain instead. */
        for (size_t i = 0; i < op->n; i++) {
            struct task *k = op->tasks[i];
            k->st = TS_WAITING;
            k->cmd->in_flight--;
            k->cmd->claimed_total--;
            waiting_push(k, true);
            k->refs--;
            trec_free(ws[i]->arg);
        }
        /* Only while the store closes, after every request was answered
         * or dropped: the one user callback made under tmu. */
        op->done(op->arg, 0, "{\"tasks\":[]}");
        free(op->tasks);
        free(op);
    }
    free(ws);
}

static void claim_deadline(void *arg)
{
    struct ctimer *ct = arg;
    struct jd_jobs *j = ct->j;
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    struct claimer *cl = NULL;
    for (struct claimer **pp = &t->claimers; *pp; pp = &(*pp)->next)
        if ((*pp)->id == ct->id) {
            cl = *pp;
            *pp = cl->next;
            break;
        }
    pthread_mutex_unlock(&t->mu);
    free(ct);
    if (cl) {
        cl->done(cl->arg, 0, "{\"tasks\":[]}");
        claimer_free(cl);
    }
}

int jd_jobs_task_claim(struct jd_jobs *j, const char *body, size_t len, jd_action_done_fn done,
                       void *arg, struct jd_error *err)
{
    struct jd_tasks *t = j->tasks;
    cJSON *o = parse_object(body ? body : "", len, false, err);
    if (!o)
        return err->code;
    int rc = 0;
    int64_t max = 1, wait_ms = 0, lease_ms = JD_TASK_DEFAULT_LEASE_MS;
    const char *worker = "";
    struct rcmd **cmds = NULL;
    size_t ncmds = 0;
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(o, "commands");
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(o, "worker");
    if (!cJSON_IsArray(cs) || cJSON_GetArraySize(cs) < 1)
        rc = jd_error_set(err, JD_EINVAL, "/commands",
                          "commands must be a non-empty array of command names");
    else if (cJSON_GetArraySize(cs) > JD_TASK_MAX_CLAIM_COMMANDS)
        rc = jd_error_set(err, JD_EINVAL, "/commands", "at most %d commands per claim",
                          JD_TASK_MAX_CLAIM_COMMANDS);
    if (rc == 0 && w && !cJSON_IsNull(w) &&
        (!cJSON_IsString(w) || strlen(w->valuestring) > WORKER_MAX))
        rc = jd_error_set(err, JD_EINVAL, "/worker", "worker must be a string of at most %d bytes",
                          WORKER_MAX);
    if (rc == 0 && cJSON_IsString(w))
        worker = w->valuestring;
    if (rc == 0)
        rc = int_field(o, "max", 1, JD_TASK_MAX_CLAIM, 1, &max, err);
    if (rc == 0)
        rc = int_field(o, "wait_ms", 0, JD_TASK_MAX_WAIT_MS, 0, &wait_ms, err);
    if (rc == 0)
        rc = int_field(o, "lease_ms", JD_TASK_MIN_LEASE_MS, JD_TASK_MAX_LEASE_MS,
                       JD_TASK_DEFAULT_LEASE_MS, &lease_ms, err);
    if (rc) {
        cJSON_Delete(o);
        return rc;
    }
    cmds = jd_xcalloc((size_t)cJSON_GetArraySize(cs), sizeof *cmds);
    pthread_mutex_lock(&t->mu);
    const cJSON *c;
    int i = 0;
    cJSON_ArrayForEach(c, cs)
    {
        char ptr[32];
        snprintf(ptr, sizeof ptr, "/commands/%d", i++);
        struct rcmd *rc_ = cJSON_IsString(c) ? rcmd_find(t, c->valuestring) : NULL;
        if (!cJSON_IsString(c)) {
            rc = jd_error_set(err, JD_EINVAL, ptr, "a command name must be a string");
            break;
        }
        if (!rc_ || !rc_->registered) {
            rc = jd_error_set(err, JD_EINVAL, ptr,
                              "no remote command \"%.100s\" (PUT "
                              "/v1/commands/{name} registers one)",
                              c->valuestring);
            break;
        }
        bool dup = false;
        for (size_t k = 0; k < ncmds; k++)
            dup |= cmds[k] == rc_;
        if (!dup)
            cmds[ncmds++] = rc_;
    }
    if (rc == 0 && t->draining)
        rc = jd_error_set(err, JD_ESHUTDOWN, NULL, "shutting down");
    if (rc) {
        pthread_mutex_unlock(&t->mu);
        cJSON_Delete(o);
        free(cmds);
        return rc;
    }
    worker_seen(t, worker, cmds, ncmds);
    struct claim_op *op = claim_take_locked(j, cmds, ncmds, worker, (unsigned)max, lease_ms);
    if (op || wait_ms == 0) {
        pthread_mutex_unlock(&t->mu);
        cJSON_Delete(o);
        free(cmds);
        if (!op) {
            done(arg, 0, "{\"tasks\":[]}");
            return 0;
        }
        op->done = done;
        op->arg = arg;
        claim_submit(j, op);
        return 0;
    }
    struct claimer *cl = jd_xcalloc(1, sizeof *cl);
    cl->id = ++t->next_claimer;
    cl->cmds = cmds;
    cl->ncmds = ncmds;
    cl->worker = jd_xstrdup(worker);
    cl->max = (unsigned)max;
    cl->lease_ms = lease_ms;
    cl->done = done;
    cl->arg = arg;
    struct ctimer *ct = jd_xmalloc(sizeof *ct);
    ct->j = j;
    ct->id = cl->id;
    if (jd_sched_timer_after(j->sched, (uint64_t)wait_ms * 1000000u, claim_deadline, ct,
                             &cl->timer_id) != 0) {
        pthread_mutex_unlock(&t->mu);
        free(ct);
        claimer_free(cl);
        cJSON_Delete(o);
        return jd_error_set(err, JD_ESHUTDOWN, NULL, "shutting down");
    }
    cl->timer_armed = true;
    cl->timer_arg = ct;
    cl->next = t->claimers;
    t->claimers = cl;
    pthread_mutex_unlock(&t->mu);
    cJSON_Delete(o);
    return 0;
}

/* ---- ending a claimed task ---- */

/* Why a task that is not (or no longer) claimed refuses: JD_ENOENT for an
 * id never handed out, else JD_ECONFLICT with *reason. */
static int gone_reason(struct jd_jobs *j, const char *id, const char **reason, struct jd_error *err)
{
    int st = 0;
    int64_t job_id = 0;
    struct jd_tasks *t = j->tasks;
    const char *why = NULL;
    pthread_mutex_lock(&t->mu);
    for (unsigned i = 0; i < TOMBSTONES && !why; i++)
        if (t->tombs[i].reason && strcmp(t->tombs[i].id, id) == 0)
            why = t->tombs[i].reason;
    pthread_mutex_unlock(&t->mu);
    if (why) {
        *reason = why;
        return jd_error_set(err, JD_ECONFLICT, NULL,
                            strcmp(why, "completed") == 0 ? "the task was already completed"
                            : strcmp(why, "cancelled") == 0
                                ? "the task's job was cancelled"
                                : "the task's lease was lost; its call is offered again as a "
                                  "new task");
    }
    if (strlen(id) != TASK_ID_LEN || jd_store_task_state(j->store, id, &st, &job_id) != 0)
        return jd_error_set(err, JD_ENOENT, NULL, "no such task");
    switch (st) {
    case JD_TASK_COMPLETED:
        *reason = "completed";
        return jd_error_set(err, JD_ECONFLICT, NULL, "the task was already completed");
    case JD_TASK_CANCELLED:
        *reason = "cancelled";
        return jd_error_set(err, JD_ECONFLICT, NULL, "the task's job was cancelled");
    default:
        *reason = "lease_lost";
        return jd_error_set(err, JD_ECONFLICT, NULL,
                            "the task's lease was lost; its call is offered again as a new task");
    }
}

/* Take claimed task id out for its worker to end, or refuse. Returns the
 * task (caller ends its call and unrefs under tmu) with *row its
 * "completed" record, or NULL with the error. */
static struct task *take_claimed(struct jd_jobs *j, const char *id, const char **reason,
                                 struct jd_error *err, int *rc)
{
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    struct task *k = task_find(t, id);
    if (k && k->st == TS_CLAIMED) {
        task_take_out(j, k, "completed");
        int64_t d = jd_wall_ms() - k->claimed_ms;
        static const int64_t bounds[LAT_BUCKETS - 1] = {10,    50,    100,   500,    1000,   5000,
                                                        10000, 30000, 60000, 300000, 3600000};
        int b = 0;
        while (b < LAT_BUCKETS - 1 && d > bounds[b])
            b++;
        k->cmd->lat_hist[b]++;
        k->cmd->lat_ms_sum += (uint64_t)(d > 0 ? d : 0);
        worker_seen(t, k->worker ? k->worker : "", NULL, 0);
        pthread_mutex_unlock(&t->mu);
        *rc = 0;
        return k;
    }
    bool unseen = k != NULL; /* waiting or being claimed: never handed out yet */
    pthread_mutex_unlock(&t->mu);
    *rc = unseen ? jd_error_set(err, JD_ENOENT, NULL, "no such task")
                 : gone_reason(j, id, reason, err);
    return NULL;
}

/* What a worker reported for one task: a result or an error. */
struct outcome_in {
    bool ok;
    char *result;               /* ok: compact JSON (owned) */
    const char *kind, *message; /* !ok: borrowed from the parsed body */
    bool retryable;
    char *details; /* !ok: compact JSON or NULL (owned) */
};

static void outcome_clear(struct outcome_in *oi)
{
    free(oi->result);
    free(oi->details);
}

/* Read o (an object) as {"result": any} or, with want_error, as {"error":
 * {"message","kind","retryable","details"}}; base prefixes the pointers
 * ("" for a single task, "/tasks/3" in a batch). */
static int parse_outcome(struct jd_jobs *j, const cJSON *o, bool want_error, const char *base,
                         struct outcome_in *oi, struct jd_error *err)
{
    char ptr[64];
    memset(oi, 0, sizeof *oi);
    if (!want_error) {
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(o, "result");
        oi->ok = true;
        oi->result = res ? cJSON_PrintUnformatted(res) : jd_xstrdup("null");
        snprintf(ptr, sizeof ptr, "%s/result", base);
        if (!oi->result)
            return jd_error_set(err, JD_EINVAL, ptr, "the result cannot be printed");
        if (strlen(oi->result) > j->limits.max_definition_bytes)
            return jd_error_set(err, JD_ETOOBIG, ptr, "the result is larger than %zu bytes",
                                j->limits.max_definition_bytes);
        return 0;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(e, "kind");
    const cJSON *retry = cJSON_GetObjectItemCaseSensitive(e, "retryable");
    const cJSON *det = cJSON_GetObjectItemCaseSensitive(e, "details");
    const char *bad = NULL, *why = NULL;
    if (!cJSON_IsObject(e))
        bad = "/error",
        why = "error must be an object {\"message\",\"kind\",\"retryable\",\"details\"}";
    else if (msg && !cJSON_IsNull(msg) &&
             (!cJSON_IsString(msg) || strlen(msg->valuestring) > j->limits.max_string))
        bad = "/error/message", why = "message must be a string (at most max_string bytes)";
    else if (kind && !cJSON_IsNull(kind) && (!cJSON_IsString(kind) || !name_ok(kind->valuestring)))
        bad = "/error/kind",
        why = "kind must be a short word: a-z, 0-9, _ . - starting with a letter";
    else if (retry && !cJSON_IsNull(retry) && !cJSON_IsBool(retry))
        bad = "/error/retryable", why = "retryable must be true or false";
    if (bad) {
        snprintf(ptr, sizeof ptr, "%s%s", base, bad);
        return jd_error_set(err, JD_EINVAL, ptr, "%s", why);
    }
    oi->kind = cJSON_IsString(kind) ? kind->valuestring : "error";
    oi->message = cJSON_IsString(msg) ? msg->valuestring : "the worker reported a failure";
    oi->retryable = cJSON_IsTrue(retry);
    oi->details = det ? cJSON_PrintUnformatted(det) : NULL;
    if (oi->details && strlen(oi->details) > j->limits.max_definition_bytes) {
        snprintf(ptr, sizeof ptr, "%s/error/details", base);
        return jd_error_set(err, JD_ETOOBIG, ptr, "details are larger than %zu bytes",
                            j->limits.max_definition_bytes);
    }
    return 0;
}

/* End claimed task id as oi says: through the host (the registry records
 * the completion, or retries), then its row. Returns 0 with *row (the
 * caller submits it, with its callback) or the refusal (JD_ENOENT, or
 * JD_ECONFLICT with *reason; a call that had already ended, by a cancel
 * or a timeout racing the worker, is "cancelled"). */
static int end_task(struct jd_jobs *j, const char *id, const struct outcome_in *oi,
                    struct trec **row, const char **reason, struct jd_error *err)
{
    struct jd_tasks *t = j->tasks;
    int rc;
    *row = NULL;
    struct task *k = take_claimed(j, id, reason, err, &rc);
    if (!k)
        return rc;
    const struct jd_host *host = jd_registry_host(j->reg);
    int hrc = oi->ok ? host->complete(k->call, oi->result)
                     : host->fail(k->call, oi->kind, oi->message, oi->retryable, oi->details);
    pthread_mutex_lock(&t->mu);
    if (hrc == 0) {
        if (oi->ok)
            k->cmd->completed++;
        else
            k->cmd->failed++;
    }
    struct trec *r = task_row(j, k, hrc == 0 ? JD_TASK_COMPLETED : JD_TASK_CANCELLED);
    task_unref(k);
    pthread_mutex_unlock(&t->mu);
    if (hrc != 0) {
        trec_submit(r); /* no callback */
        *reason = "cancelled";
        return jd_error_set(err, JD_ECONFLICT, NULL,
                            "the task's job was cancelled or its attempt timed out");
    }
    *row = r;
    return 0;
}

static int task_end_one(struct jd_jobs *j, const char *id, const char *body, size_t len,
                        bool want_error, jd_action_done_fn done, void *arg, const char **reason,
                        struct jd_error *err)
{
    cJSON *o = parse_object(body ? body : "", len, !want_error, err);
    if (!o)
        return err->code;
    struct outcome_in oi;
    int rc = parse_outcome(j, o, want_error, "", &oi, err);
    struct trec *row = NULL;
    if (rc == 0)
        rc = end_task(j, id, &oi, &row, reason, err);
    outcome_clear(&oi);
    cJSON_Delete(o);
    if (rc)
        return rc;
    row->done = done;
    row->arg = arg;
    row->answer = jd_xstrdup("{\"ok\":true}");
    trec_submit(row);
    return 0;
}

int jd_jobs_task_complete(struct jd_jobs *j, const char *id, const char *body, size_t len,
                          jd_action_done_fn done, void *arg, const char **reason,
                          struct jd_error *err)
{
    return task_end_one(j, id, body, len, false, done, arg, reason, err);
}

int jd_jobs_task_fail(struct jd_jobs *j, const char *id, const char *body, size_t len,
                      jd_action_done_fn done, void *arg, const char **reason, struct jd_error *err)
{
    return task_end_one(j, id, body, len, true, done, arg, reason, err);
}

/* A batch of ends: answered once every row has committed. */
struct batch_op {
    int remaining, rc;
    char *answer;
    jd_action_done_fn done;
    void *arg;
};

static void batch_committed(struct jd_jobs *j, struct batch_op *b, int rc)
{
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    if (rc && !b->rc)
        b->rc = rc;
    bool last = --b->remaining == 0;
    pthread_mutex_unlock(&t->mu);
    if (!last)
        return;
    b->done(b->arg, b->rc, b->rc ? NULL : b->answer);
    free(b->answer);
    free(b);
}

int jd_jobs_task_end_batch(struct jd_jobs *j, const char *body, size_t len, jd_action_done_fn done,
                           void *arg, struct jd_error *err)
{
    cJSON *o = parse_object(body ? body : "", len, false, err);
    if (!o)
        return err->code;
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "tasks");
    int n = cJSON_IsArray(ts) ? cJSON_GetArraySize(ts) : -1;
    int rc = 0;
    if (n < 1 || n > JD_TASK_MAX_BATCH)
        rc = jd_error_set(err, JD_EINVAL, "/tasks",
                          "tasks must be an array of 1 to %d {\"id\", \"result\" or \"error\"}",
                          JD_TASK_MAX_BATCH);
    struct outcome_in *ois = rc ? NULL : jd_xcalloc((size_t)n, sizeof *ois);
    const char **ids = rc ? NULL : jd_xcalloc((size_t)n, sizeof *ids);
    /* Every item is checked before any task ends: all or nothing for bad
     * input; ends that are refused (gone tasks) are reported per item. */
    for (int i = 0; rc == 0 && i < n; i++) {
        const cJSON *it = cJSON_GetArrayItem(ts, i);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        char base[32];
        snprintf(base, sizeof base, "/tasks/%d", i);
        if (!cJSON_IsObject(it) || !cJSON_IsString(id)) {
            char p[48];
            snprintf(p, sizeof p, "%s%s", base, cJSON_IsObject(it) ? "/id" : "");
            rc = jd_error_set(err, JD_EINVAL, p,
                              "each task is {\"id\": \"...\", \"result\": ...} "
                              "or {\"id\": \"...\", \"error\": {...}}");
            break;
        }
        ids[i] = id->valuestring;
        rc = parse_outcome(j, it, cJSON_GetObjectItemCaseSensitive(it, "error") != NULL, base,
                           &ois[i], err);
    }
    if (rc) {
        for (int i = 0; ois && i < n; i++)
            outcome_clear(&ois[i]);
        free(ois);
        free(ids);
        cJSON_Delete(o);
        return rc;
    }
    struct batch_op *b = jd_xcalloc(1, sizeof *b);
    b->done = done;
    b->arg = arg;
    struct trec **rows = jd_xcalloc((size_t)n, sizeof *rows);
    struct jd_write **ws = jd_xcalloc((size_t)n, sizeof *ws);
    size_t nrows = 0;
    struct jd_sbuf out = {0};
    jd_sb_puts(&out, "{\"results\":[");
    for (int i = 0; i < n; i++) {
        const char *reason = NULL;
        struct jd_error e;
        jd_error_clear(&e);
        struct trec *row = NULL;
        int erc = end_task(j, ids[i], &ois[i], &row, &reason, &e);
        jd_sb_puts(&out, i ? ",{\"id\":" : "{\"id\":");
        jd_sb_string(&out, ids[i]);
        jd_sb_puts(&out, ",\"status\":");
        jd_sb_number(&out, erc == 0 ? 200 : jd_error_http_status(erc));
        if (reason) {
            jd_sb_puts(&out, ",\"reason\":");
            jd_sb_string(&out, reason);
        }
        jd_sb_puts(&out, "}");
        if (row) {
            row->batch = b;
            row->w.done = trec_done;
            row->w.arg = row;
            rows[nrows] = row;
            ws[nrows++] = &row->w;
        }
        outcome_clear(&ois[i]);
    }
    jd_sb_puts(&out, "]}");
    b->answer = out.p;
    b->remaining = (int)nrows + 1; /* + this function's own, so it cannot finish early */
    if (nrows && jd_store_submit_many(j->store, ws, nrows) != 0)
        for (size_t i = 0; i < nrows; i++)
            trec_done(rows[i], ws[i], JD_ESHUTDOWN);
    free(ws);
    free(rows);
    free(ois);
    free(ids);
    cJSON_Delete(o);
    batch_committed(j, b, 0);
    return 0;
}

int jd_jobs_task_heartbeat(struct jd_jobs *j, const char *id, const char *body, size_t len,
                           jd_action_done_fn done, void *arg, const char **reason,
                           struct jd_error *err)
{
    struct jd_tasks *t = j->tasks;
    cJSON *o = parse_object(body ? body : "", len, true, err);
    if (!o)
        return err->code;
    int64_t lease_ms = 0;
    int rc =
        int_field(o, "lease_ms", JD_TASK_MIN_LEASE_MS, JD_TASK_MAX_LEASE_MS, 0, &lease_ms, err);
    const cJSON *pg = cJSON_GetObjectItemCaseSensitive(o, "progress");
    char *progress = rc == 0 && pg && !cJSON_IsNull(pg) ? cJSON_PrintUnformatted(pg) : NULL;
    if (rc == 0 && progress && strlen(progress) > PROGRESS_MAX)
        rc = jd_error_set(err, JD_ETOOBIG, "/progress", "progress is larger than %d bytes",
                          PROGRESS_MAX);
    if (rc) {
        free(progress);
        cJSON_Delete(o);
        return rc;
    }
    /* The job first (mu before tmu): a cancelled job's worker hears so
     * here, before its task is withdrawn, and can stop early. */
    pthread_mutex_lock(&t->mu);
    struct task *k = task_find(t, id);
    int64_t job_id = k ? k->job_id : 0;
    bool claimed = k && k->st == TS_CLAIMED;
    pthread_mutex_unlock(&t->mu);
    if (!claimed) {
        free(progress);
        cJSON_Delete(o);
        return k ? jd_error_set(err, JD_ENOENT, NULL, "no such task")
                 : gone_reason(j, id, reason, err);
    }
    pthread_mutex_lock(&j->mu);
    struct job *jb = jobs_job_find(j, job_id);
    if (!jb || jb->cancel_requested || jb->finished || j->stopping) {
        pthread_mutex_unlock(&j->mu);
        free(progress);
        cJSON_Delete(o);
        *reason = "cancelled";
        return jd_error_set(err, JD_ECONFLICT, NULL, "the task's job was cancelled");
    }
    pthread_mutex_lock(&t->mu);
    k = task_find(t, id);
    if (!k || k->st != TS_CLAIMED) {
        pthread_mutex_unlock(&t->mu);
        pthread_mutex_unlock(&j->mu);
        free(progress);
        cJSON_Delete(o);
        return gone_reason(j, id, reason, err);
    }
    int64_t now = jd_wall_ms();
    if (lease_ms)
        k->lease_ms = lease_ms;
    k->lease_expires_ms = now + k->lease_ms;
    worker_seen(t, k->worker ? k->worker : "", NULL, 0);
    if (progress) {
        progress_set(t, k, progress);
        if (now - k->progress_ms >= PROGRESS_EVERY_MS) {
            /* In the history too, at most once a second per task. */
            k->progress_ms = now;
            cJSON *d = cJSON_CreateObject();
            cJSON_AddItemToObject(d, "progress", cJSON_Duplicate(pg, true));
            cJSON_AddStringToObject(d, "task", k->id);
            cJSON_AddStringToObject(d, "worker", k->worker ? k->worker : "");
            struct wrec *r = jobs_wrec_new(j, jb, JD_W_JOB_CHANGE);
            r->data = jobs_with_run(d, jb->run);
            r->w.kind = JD_EVK_PROGRESS;
            r->w.tag = k->tag;
            r->w.data = r->data;
            jobs_record(r);
        }
    }
    struct trec *row = task_row(j, k, JD_TASK_CLAIMED);
    char when[32];
    jd_render_time(k->lease_expires_ms, when);
    row->answer = jd_xasprintf("{\"lease_expires_at\":\"%s\"}", when);
    row->done = done;
    row->arg = arg;
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_unlock(&j->mu);
    free(progress);
    cJSON_Delete(o);
    trec_submit(row);
    return 0;
}

int jd_jobs_workers_json(struct jd_jobs *j, int64_t within_ms, char **json)
{
    struct jd_tasks *t = j->tasks;
    int64_t since = jd_wall_ms() - within_ms;
    struct jd_sbuf b = {0};
    jd_sb_puts(&b, "{\"workers\":[");
    size_t n = 0;
    pthread_mutex_lock(&t->mu);
    for (struct wkr *w = t->workers; w; w = w->next) {
        if (w->last_seen_ms < since)
            continue;
        char when[32];
        jd_render_time(w->last_seen_ms, when);
        jd_sb_puts(&b, n++ ? ",{\"name\":" : "{\"name\":");
        jd_sb_string(&b, w->name);
        jd_sb_puts(&b, ",\"commands\":[");
        for (size_t i = 0; i < w->ncmds; i++) {
            if (i)
                jd_sb_puts(&b, ",");
            jd_sb_string(&b, w->cmds[i]->name);
        }
        jd_sb_puts(&b, "],\"in_flight\":");
        jd_sb_number(&b, w->in_flight);
        jd_sb_puts(&b, ",\"last_seen_at\":\"");
        jd_sb_puts(&b, when);
        jd_sb_puts(&b, "\"}");
    }
    pthread_mutex_unlock(&t->mu);
    jd_sb_puts(&b, "]}");
    *json = b.p;
    return 0;
}

int jd_jobs_task_stats(struct jd_jobs *j, struct jd_task_stats **out, size_t *n)
{
    struct jd_tasks *t = j->tasks;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&t->mu);
    size_t k = 0;
    for (struct rcmd *c = t->cmds; c; c = c->next)
        k += c->registered;
    struct jd_task_stats *v = jd_xcalloc(k ? k : 1, sizeof *v);
    size_t i = 0;
    for (struct rcmd *c = t->cmds; c; c = c->next) {
        if (!c->registered)
            continue;
        struct jd_task_stats *s_ = &v[i++];
        s_->command = jd_xstrdup(c->name);
        s_->waiting = c->waiting;
        s_->in_flight = c->in_flight;
        s_->claimed = c->claimed_total;
        s_->lease_expiries = c->lease_expiries;
        s_->completed = c->completed;
        s_->failed = c->failed;
        memcpy(s_->latency_hist, c->lat_hist, sizeof s_->latency_hist);
        s_->latency_ms_sum = c->lat_ms_sum;
    }
    pthread_mutex_unlock(&t->mu);
    *out = v;
    *n = k;
    return 0;
}

void jd_task_stats_free(struct jd_task_stats *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i].command);
    free(v);
}

/* ---- lifecycle ---- */

int jobs_tasks_create(struct jd_jobs *j, struct jd_error *err)
{
    struct jd_tasks *t = jd_xcalloc(1, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    j->tasks = t;
    struct jd_rcmd_row *rows = NULL;
    size_t n = 0;
    int rc = jd_store_commands(j->store, &rows, &n);
    if (rc)
        return jd_error_set(err, rc, NULL, "reading the remote commands failed: %s",
                            jd_strerror(rc));
    for (size_t i = 0; i < n; i++) {
        struct rcmd *c = jd_xcalloc(1, sizeof *c);
        c->name = rows[i].name;
        c->description = rows[i].description;
        rows[i].name = rows[i].description = NULL;
        c->timeout_ms = rows[i].timeout_ms;
        c->created_ms = rows[i].created_ms;
        c->updated_ms = rows[i].updated_ms;
        c->registered = true;
        c->next = t->cmds;
        t->cmds = c;
        t->ncmds++;
    }
    jd_rcmd_rows_free(rows, n);
    atomic_store_explicit(&g_jobs, j, memory_order_release); /* handle() sees a built table */
    jd_registry_set_fallback(j->reg, fallback_lookup, j);
    return 0;
}

void jobs_tasks_drain(struct jd_jobs *j)
{
    struct jd_tasks *t = j->tasks;
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->draining = true;
    struct claimer *list = t->claimers;
    t->claimers = NULL;
    for (struct claimer *cl = list; cl; cl = cl->next)
        if (cl->timer_armed && jd_sched_timer_cancel(j->sched, cl->timer_id) == 0)
            free(cl->timer_arg);
    pthread_mutex_unlock(&t->mu);
    while (list) {
        struct claimer *cl = list;
        list = cl->next;
        cl->done(cl->arg, 0, "{\"tasks\":[]}");
        claimer_free(cl);
    }
}

unsigned jobs_tasks_count(struct jd_jobs *j)
{
    struct jd_tasks *t = j->tasks;
    uint64_t n = 0;
    pthread_mutex_lock(&t->mu);
    for (struct rcmd *c = t->cmds; c; c = c->next)
        n += c->waiting + c->in_flight;
    pthread_mutex_unlock(&t->mu);
    return (unsigned)n;
}

void jobs_tasks_destroy(struct jd_jobs *j)
{
    struct jd_tasks *t = j->tasks;
    if (!t)
        return;
    struct jd_jobs *me = j;
    atomic_compare_exchange_strong(&g_jobs, &me, NULL);
    for (unsigned b = 0; b < TASK_BUCKETS; b++)
        for (struct task *k = t->byid[b], *nx; k; k = nx) {
            nx = k->hnext;
            if (k->timer_armed)
                free(k->timer_arg); /* the scheduler is gone: it never fires */
            task_free(k);           /* its call was freed with the registry's attempts */
        }
    for (struct wkr *w = t->workers, *nx; w; w = nx) {
        nx = w->next;
        free(w->name);
        free(w->cmds);
        free(w);
    }
    for (unsigned b = 0; b < TASK_BUCKETS; b++)
        for (struct prog *g = t->progs[b], *nx; g; g = nx) {
            nx = g->next;
            free(g->json);
            free(g);
        }
    for (struct rcmd *c = t->cmds, *nx; c; c = nx) {
        nx = c->next;
        free(c->name);
        free(c->description);
        free(c);
    }
    pthread_mutex_destroy(&t->mu);
    free(t);
    j->tasks = NULL;
}
