/*
 * Remote commands and their tasks (server/tasks.h), part 1 of 5: the
 * registry fallback, the shared helpers and records, the durable command
 * registry (PUT/DELETE), a task's arrival and withdrawal, create and destroy.
 * The other parts: jobs_tasks_claim.c (claims, parked claims),
 * jobs_tasks_end.c (complete, fail, batch, heartbeat, lease timers),
 * jobs_tasks_read.c (commands list, workers, statistics) and
 * jobs_tasks_cluster.c (claims across cluster nodes). Their shared
 * types, states and locking rules are in server/jobs_tasks_impl.h.
 *
 * A remote command is one more command of the plugin registry: the
 * registry's fallback lookup (jd_registry_set_fallback) answers its name
 * with remote_cmd, whose handle() parks the call as a task and whose
 * cancel() withdraws it. So the job layer dispatches, records, retries,
 * times out and cancels a remote call exactly like a plugin's; these files
 * only decide when the call ends (a worker's complete/fail, or its lease
 * running out) and tell the registry through the host table.
 *
 * Threads: create and destroy run on the thread that creates the job layer,
 * before replay and after every other thread stopped. remote_handle and
 * remote_cancel run on whichever thread the registry dispatches or cancels
 * a call on (a scheduler worker, a timer, an HTTP thread cancelling a job);
 * the command routes on HTTP threads; tasks_trec_done on the store's
 * completion thread. Each takes tmu for its table work and ends calls
 * without it.
 */
#include "server/jobs_impl.h"
#include "server/jobs_tasks_impl.h"
#include "server/tasks.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* The job layer whose remote commands the registry's fallback serves:
 * handle() and cancel() get no context pointer (the plugin ABI), so there
 * is one per process, the most recently created (as the registry's
 * g_current). Set before replay, cleared by destroy. */
static struct jd_jobs *_Atomic g_jobs;

/* "<job_id>:<tag>" (jobs_run.c writes it) -> true and the two numbers;
 * without sscanf, which cost ~1 % of the server's CPU at one call per task. */
static bool parse_job_key(const char *key, int64_t *job_id, unsigned *tag)
{
    if (!key || !isdigit((unsigned char)key[0]))
        return false;
    char *end;
    errno = 0;
    long long id = strtoll(key, &end, 10);
    if (errno || *end != ':' || !isdigit((unsigned char)end[1]))
        return false;
    unsigned long t = strtoul(end + 1, &end, 10);
    if (errno || *end != '\0' || t > UINT32_MAX)
        return false;
    *job_id = id;
    *tag = (unsigned)t;
    return true;
}

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

/* A new task id: "<job>-" and 128 random bits in hex, after "<node>." on
 * a cluster node (node > 0) so that any node can tell which one answers
 * for it. The job id lets the store find a task without a row of its own:
 * a claim records only the job's `dispatch` event, which names the task
 * (jd_task_stored_state). */
static void random_id(char out[TASK_ID_MAX + 1], int64_t node, int64_t job)
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
    size_t at = node > 0 ? (size_t)snprintf(out, TASK_ID_MAX + 1, "%" PRId64 ".", node) : 0;
    at += (size_t)snprintf(out + at, TASK_ID_MAX + 1 - at, "%" PRId64 "-", job);
    for (size_t i = 0; i < sizeof b; i++) {
        out[at + 2 * i] = hex[b[i] >> 4];
        out[at + 2 * i + 1] = hex[b[i] & 15];
    }
    out[at + TASK_ID_LEN] = '\0';
}

/* A positive decimal of 1-19 digits, no leading zero, at most INT64_MAX,
 * ending at end; 0 if it is not one. */
static int64_t id_number(const char *p, const char *end)
{
    size_t nd = (size_t)(end - p);
    if (nd < 1 || nd > 19 || p[0] == '0')
        return 0;
    for (size_t i = 0; i < nd; i++)
        if (!isdigit((unsigned char)p[i]))
            return 0;
    errno = 0;
    long long v = strtoll(p, NULL, 10);
    if (errno || v <= 0)
        return 0; /* past INT64_MAX */
    return v;
}

/* The shape "[<node>.][<job>-[<seq>-]]<32 hex>": false if id is not one. */
static bool id_parse(const char *id, int64_t *node, int64_t *job, int64_t *seq)
{
    *node = *job = *seq = 0;
    if (!id)
        return false;
    const char *dot = strchr(id, '.');
    const char *rest = id;
    if (dot) {
        if ((*node = id_number(id, dot)) == 0)
            return false;
        rest = dot + 1;
    }
    const char *dash = strchr(rest, '-');
    const char *hex = rest;
    if (dash) {
        if ((*job = id_number(rest, dash)) == 0)
            return false;
        hex = dash + 1;
        const char *dash2 = strchr(hex, '-');
        if (dash2) {
            if ((*seq = id_number(hex, dash2)) == 0)
                return false;
            hex = dash2 + 1;
        }
    }
    size_t n = 0;
    for (; hex[n]; n++)
        if (!((hex[n] >= '0' && hex[n] <= '9') || (hex[n] >= 'a' && hex[n] <= 'f')))
            return false;
    return n == TASK_ID_LEN;
}

bool jd_task_id_parse(const char *id, int64_t *node)
{
    int64_t job, seq;
    return id_parse(id, node, &job, &seq);
}

int64_t jd_task_id_job(const char *id)
{
    int64_t node, job, seq;
    return id_parse(id, &node, &job, &seq) ? job : 0;
}

int64_t jd_task_id_claim(const char *id, char base[JD_TASK_ID_MAX + 1])
{
    int64_t node, job, seq;
    if (!id_parse(id, &node, &job, &seq) || job == 0)
        return -1;
    if (seq == 0) {
        snprintf(base, JD_TASK_ID_MAX + 1, "%s", id);
        return 0;
    }
    /* Drop "<seq>-" after "[<node>.]<job>-": the id its dispatch names. */
    const char *rest = strchr(id, '.') ? strchr(id, '.') + 1 : id;
    const char *dash = strchr(rest, '-');
    const char *dash2 = strchr(dash + 1, '-');
    snprintf(base, JD_TASK_ID_MAX + 1, "%.*s%s", (int)(dash + 1 - id), id, dash2 + 1);
    return seq;
}

bool tasks_name_ok(const char *s)
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
struct rcmd *tasks_cmd_find(struct jd_tasks *t, const char *name)
{
    for (struct rcmd *c = t->cmds; c; c = c->next)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

struct task *tasks_find(struct jd_tasks *t, const char *id)
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
struct wkr *tasks_worker_seen(struct jd_tasks *t, const char *name, struct rcmd *const *cmds,
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

void tasks_progress_set(struct jd_tasks *t, const struct task *k, const char *json)
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

void tasks_unref(struct task *k)
{
    if (--k->refs == 0)
        task_free(k);
}

void tasks_waiting_unlink(struct task *k)
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

void tasks_waiting_push(struct task *k, bool front)
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

void tasks_rename_locked(struct jd_tasks *t, struct task *k, int64_t seq)
{
    for (struct task **pp = &t->byid[hash_str(k->id)]; *pp; pp = &(*pp)->hnext)
        if (*pp == k) {
            *pp = k->hnext;
            break;
        }
    /* k->id is "[<node>.]<job>-<32 hex>": put "<seq>-" before the hex. */
    char id[TASK_ID_MAX + 1];
    size_t head = strlen(k->id) - TASK_ID_LEN;
    snprintf(id, sizeof id, "%.*s%" PRId64 "-%s", (int)head, k->id, seq, k->id + head);
    memcpy(k->id, id, sizeof k->id);
    unsigned h = hash_str(k->id);
    k->hnext = t->byid[h];
    t->byid[h] = k;
}

void tasks_take_out(struct jd_jobs *j, struct task *k, const char *reason)
{
    struct jd_tasks *t = j->tasks;
    if (k->st != TS_WAITING) {
        struct tomb *tb = &t->tombs[t->tomb_next++ % TOMBSTONES];
        memcpy(tb->id, k->id, sizeof tb->id);
        tb->reason = reason;
        struct wkr *w = k->shown ? worker_find(t, k->worker ? k->worker : "") : NULL;
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
    if (k->st == TS_WAITING && k->held)
        t->held--;
    else if (k->st == TS_WAITING)
        tasks_waiting_unlink(k);
    else
        k->cmd->in_flight--;
    if (k->timer_armed && jd_sched_timer_cancel(j->sched, k->timer_id) == 0)
        free(k->timer_arg);
    k->timer_armed = false;
    k->live = false;
}

/* ---- storage records ---- */

static struct trec *trec_new(struct jd_jobs *j, enum jd_write_op op)
{
    struct trec *r = jd_xcalloc(1, sizeof *r);
    r->j = j;
    r->w.op = op;
    return r;
}

struct trec *tasks_barrier(struct jd_jobs *j)
{
    struct trec *r = trec_new(j, JD_W_TASK_PUT);
    jd_store_write_barrier(&r->w);
    return r;
}

void tasks_trec_free(struct trec *r)
{
    free(r->s1);
    free(r->s2);
    free(r->s3);
    free(r->answer);
    free(r);
}

void tasks_trec_done(void *arg, struct jd_write *w, int rc);

void tasks_trec_submit(struct trec *r)
{
    r->w.done = tasks_trec_done;
    r->w.arg = r;
    if (jd_store_submit(r->j->store, &r->w) != 0) {
        /* Closing: nothing is recorded; tell the caller as a failed commit. */
        tasks_trec_done(r, &r->w, JD_ESHUTDOWN);
    }
}

/* Under tmu (or not): a task row as k is now. */
struct trec *tasks_row(struct jd_jobs *j, const struct task *k, enum jd_task_state st)
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

void tasks_trec_done(void *arg, struct jd_write *w, int rc)
{
    struct trec *r = arg;
    if (r->claim) {
        if (rc == 0 && w->op == JD_W_JOB_CHANGE) /* its dispatch event: the job moved on */
            jobs_change_committed(r->j, w->job_id, w->version);
        tasks_claim_committed(r->j, r->claim, r->claim_ix, rc, rc == 0 ? w->version : 0);
    } else if (r->batch) {
        tasks_batch_committed(r->j, r->batch, rc);
    } else if (r->done) {
        if (rc == JD_ENOENT && r->w.op == JD_W_COMMAND_DELETE)
            rc = 0; /* deleted meanwhile: the same end */
        r->done(r->arg, rc, rc == 0 ? (r->answer ? r->answer : "{}") : NULL);
    }
    tasks_trec_free(r);
}

/* ---- commands ---- */

static const struct jd_command *fallback_lookup(void *ctx, const char *name)
{
    struct jd_jobs *j = ctx;
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    struct rcmd *c = tasks_cmd_find(t, name);
    bool ok = c && c->registered;
    pthread_mutex_unlock(&t->mu);
    return ok ? &remote_cmd : NULL;
}

/* A JSON integer in [lo, hi] at o[name], or its default when absent. */
int tasks_int_field(const cJSON *o, const char *name, int64_t lo, int64_t hi, int64_t dflt,
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
cJSON *tasks_parse_object(const char *body, size_t len, bool empty_ok, struct jd_error *err)
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
    if (!tasks_name_ok(name))
        return jd_error_set(err, JD_EINVAL, "",
                            "a command name is 1-%d characters of a-z, 0-9, _ . - starting "
                            "with a letter",
                            NAME_MAX_LEN);
    cJSON *o = tasks_parse_object(body ? body : "", len, true, err);
    if (!o)
        return err->code;
    int64_t tmo = 0, cap = 0;
    int rc = tasks_int_field(o, "timeout_ms", 0, (int64_t)7 * 24 * 3600 * 1000, 0, &tmo, err);
    if (rc == 0)
        rc = tasks_int_field(o, "max_in_flight", 0, JD_COMMAND_LIMIT_MAX, 0, &cap, err);
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
    struct rcmd *c = tasks_cmd_find(t, name);
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
    c->max_in_flight = cap;
    free(c->description);
    c->description = desc;
    c->updated_ms = now;
    struct trec *r = trec_new(j, JD_W_COMMAND_PUT);
    r->s1 = jd_xstrdup(name);
    r->s2 = desc ? jd_xstrdup(desc) : NULL;
    r->w.rcmd = (struct jd_rcmd_write){
        .name = r->s1, .description = r->s2, .timeout_ms = tmo, .max_in_flight = cap};
    struct jd_sbuf b = {0};
    tasks_render_cmd(&b, c, now);
    r->answer = b.p;
    r->done = done;
    r->arg = arg;
    pthread_mutex_unlock(&t->mu);
    tasks_trec_submit(r);
    jobs_command_limit_set(j, name, (unsigned)cap); /* takes mu: never under tmu */
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
    struct rcmd *c = tasks_cmd_find(t, name);
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
        c->updated_ms = jd_wall_ms(); /* jobs_tasks_sync_commands leaves it alone a while */
        t->ncmds--;
        struct trec *r = trec_new(j, JD_W_COMMAND_DELETE);
        r->s1 = jd_xstrdup(name);
        r->w.rcmd.name = r->s1;
        r->done = done;
        r->arg = arg;
        pthread_mutex_unlock(&t->mu);
        pthread_mutex_unlock(&j->mu);
        tasks_trec_submit(r);
        jobs_command_limit_set(j, name, 0);
        return 0;
    }
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int64_t jobs_tasks_timeout_ms(struct jd_jobs *j, const char *name)
{
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    struct rcmd *c = tasks_cmd_find(t, name);
    int64_t v = c && c->registered ? c->timeout_ms : 0;
    pthread_mutex_unlock(&t->mu);
    return v;
}

bool jobs_tasks_is_remote_cmd(const struct jd_command *c)
{
    return c == &remote_cmd;
}

/* ---- a task's arrival and withdrawal ---- */

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
    if (!parse_job_key(info->idempotency_key, &job_id, &tag)) {
        host->fail(info->call, "internal", "the call has no job key", 0, NULL);
        return;
    }
    struct task *k = jd_xcalloc(1, sizeof *k);
    random_id(k->id, jd_store_node_id(j->store), job_id);
    k->call = info->call;
    k->job_id = job_id;
    k->tag = tag;
    k->attempt = info->attempt;
    k->args = jd_xstrdup(info->args_json ? info->args_json : "{}");
    k->key = jd_xstrdup(info->idempotency_key);
    k->created_ms = jd_wall_ms();
    k->refs = 1;
    /* The job under mu: a cancel or end of the job (jobs_tasks_job_over,
     * under mu and tmu) either came before, and the task is held back
     * here, or finds it in the hash. One that came between the two locks
     * moved over_gen: then (rarely) the job is read again with tmu taken
     * before mu is let go, which a claim holding tmu would make mu wait on. */
    pthread_mutex_lock(&j->mu);
    const struct job *jb = jobs_job_find(j, job_id);
    k->run = jb && jb->run ? jb->run : 1;
    k->traceparent =
        jb && jb->def && jb->def->traceparent ? jd_xstrdup(jb->def->traceparent) : NULL;
    k->over = jb && (jb->cancel_requested || jb->finished);
    uint64_t gen = t->over_gen;
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&t->mu);
    if (t->over_gen != gen) {
        pthread_mutex_unlock(&t->mu);
        pthread_mutex_lock(&j->mu);
        jb = jobs_job_find(j, job_id);
        k->over = jb && (jb->cancel_requested || jb->finished);
        pthread_mutex_lock(&t->mu);
        pthread_mutex_unlock(&j->mu);
    }
    struct rcmd *c = tasks_cmd_find(t, info->command);
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
    char *announce = NULL;
    if (k->over) {
        k->held = true; /* the job's cancel reaches the call soon and ends it */
        t->held++;
    } else {
        tasks_waiting_push(k, false);
        tasks_serve_claimers_locked(j, c);
        /* No claim here took it: other nodes' workers may (jobs_tasks_cluster.c). */
        announce = k->st == TS_WAITING ? tasks_left_waiting_locked(j, c) : NULL;
    }
    pthread_mutex_unlock(&t->mu);
    tasks_announce_send(j, announce);
    /* A cancel that came before the task was recorded found nothing to
     * withdraw: it is ours to end now. */
    if (host->is_cancelled(info->call)) {
        pthread_mutex_lock(&t->mu);
        bool mine = k->live;
        if (mine)
            tasks_take_out(j, k, "cancelled"); /* k stays valid: no one else can free it now */
        pthread_mutex_unlock(&t->mu);
        if (mine) {
            host->fail(info->call, "cancelled", "cancelled", 0, NULL);
            pthread_mutex_lock(&t->mu);
            tasks_unref(k);
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
        tasks_take_out(j, k, job_cancelled ? "cancelled" : "lease_lost");
        if (claimed)
            row = tasks_row(j, k, job_cancelled ? JD_TASK_CANCELLED : JD_TASK_EXPIRED);
        tasks_unref(k);
    }
    pthread_mutex_unlock(&t->mu);
    if (row)
        tasks_trec_submit(row);
    if (k)
        jd_registry_host(j->reg)->fail(call, "cancelled", "cancelled", 0, NULL);
}

void jobs_tasks_job_over(struct jd_jobs *j, int64_t job_id)
{
    struct jd_tasks *t = j->tasks;
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->over_gen++; /* under mu and tmu: remote_handle reads it under either */
    /* Rare (a cancel, or a job that ended with calls out): a walk of the
     * id hash costs less than a per-job index on every task. */
    for (unsigned b = 0; b < TASK_BUCKETS; b++)
        for (struct task *k = t->byid[b]; k; k = k->hnext) {
            if (k->job_id != job_id || k->over)
                continue;
            k->over = true;
            if (k->st == TS_WAITING) {
                tasks_waiting_unlink(k);
                k->held = true;
                t->held++;
            }
        }
    pthread_mutex_unlock(&t->mu);
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
        c->max_in_flight = rows[i].max_in_flight;
        if (c->max_in_flight > 0)
            jobs_command_limit_set(j, c->name, (unsigned)c->max_in_flight);
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

unsigned jobs_tasks_count(struct jd_jobs *j)
{
    struct jd_tasks *t = j->tasks;
    uint64_t n = 0;
    pthread_mutex_lock(&t->mu);
    for (struct rcmd *c = t->cmds; c; c = c->next)
        n += c->waiting + c->in_flight;
    n += t->held;
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
