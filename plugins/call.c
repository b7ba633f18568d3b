/*
 * The call lifecycle of the plugin ABI's host side: the host function
 * table, and calls (attempts, timeouts, cancel, retries with backoff,
 * completion, statistics).
 *
 * Calls. A logical call (struct jd_call_handle) runs one or more attempts.
 * Each attempt is what a plugin sees as a `struct jd_call *`: not a pointer
 * but a 64-bit id from a process-wide counter, looked up in a process-wide
 * sharded table. Ids are never reused, so a stale or duplicate completion
 * can never reach a newer call or freed memory: it simply finds nothing and
 * is dropped (JD_PLUGIN_ESTALE, counted as late_dropped). The table is
 * process-wide, not per registry, because the ABI's complete()/fail() carry
 * no registry; each attempt remembers its registry.
 *
 * Exactly once. An attempt ends once: the first of plugin completion,
 * timeout, or cancel sets `finished` under the shard lock and takes over the
 * attempt's reference to the logical call; the others see `finished` and
 * drop. The attempt stays in the table (so is_cancelled() answers and the
 * plugin can still release it) until the plugin calls complete()/fail().
 * A logical call fires done() once: `done_fired` under its mutex.
 *
 * Cancel hooks. The host calls a command's cancel(call) only while the
 * attempt is in the table, and a complete()/fail() for that attempt from
 * another thread waits until the hook returns. So a plugin never gets
 * cancel() for a call it has already released (it may get it before or
 * while handle() runs).
 *
 * Context-free host functions (timer_after, timer_cancel, config) go to the
 * most recently created registry that is still alive (g_current): a process
 * normally has exactly one.
 *
 * Threading: calls, cancels and host functions are safe from any thread
 * (job-layer threads, scheduler workers, timer callbacks, the blocking pool,
 * plugin threads). A shard's mutex guards its attempts; a logical call's mu
 * guards the fields below it in struct jd_call_handle; the registry's
 * counters and g_current are atomics.
 */
#include "plugins/registry_impl.h"

#include "common/alloc.h"
#include "common/error.h"
#include "common/log.h"
#include "plugins/jackdaw_json.h"
#include "scheduler/process.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the process-wide attempt table ---- */

#define SHARDS 64 /* power of two; enough that completions from many threads rarely collide */

struct attempt {
    uint64_t id;
    struct attempt *next;
    struct jd_registry *reg;
    const struct jd_command *cmd;
    struct jd_call_handle *call; /* reference held until the attempt ends; then NULL */
    uint32_t attempt_no;
    bool finished;       /* ended by completion, timeout or cancel */
    bool cancel_running; /* the cancel hook is running on cancel_thread */
    pthread_t cancel_thread;
    uint64_t timer_id; /* timeout timer, 0 if none */
};

struct shard {
    pthread_mutex_t mu;
    pthread_cond_t cond; /* signalled when a cancel hook returns */
    struct attempt **buckets;
    size_t nbuckets, count;
};

static struct shard g_shards[SHARDS];
static pthread_once_t g_shards_once = PTHREAD_ONCE_INIT;
/* Ids start at 1 (0 is "none"); relaxed: uniqueness is all that matters. */
static _Atomic uint64_t g_next_id = 1;
/* The registry context-free host functions use; acq_rel so a plugin thread
 * that reads it sees the registry's initialised fields. */
static _Atomic(struct jd_registry *) g_current;

static void shards_init(void)
{
    for (size_t i = 0; i < SHARDS; i++) {
        pthread_mutex_init(&g_shards[i].mu, NULL);
        pthread_cond_init(&g_shards[i].cond, NULL);
        g_shards[i].nbuckets = 64;
        g_shards[i].buckets = jd_xcalloc(64, sizeof(struct attempt *));
    }
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static struct shard *shard_of(uint64_t id)
{
    return &g_shards[id & (SHARDS - 1)];
}

static size_t bucket_of(const struct shard *s, uint64_t id)
{
    return (size_t)(mix64(id >> 6) & (s->nbuckets - 1));
}

/* Caller holds s->mu. */
static struct attempt **shard_find(struct shard *s, uint64_t id)
{
    struct attempt **pp = &s->buckets[bucket_of(s, id)];
    while (*pp && (*pp)->id != id)
        pp = &(*pp)->next;
    return pp;
}

/* Caller holds s->mu. */
static void shard_insert(struct shard *s, struct attempt *a)
{
    if (s->count >= s->nbuckets * 2) {
        size_t n = s->nbuckets * 2;
        struct attempt **nb = jd_xcalloc(n, sizeof *nb);
        struct attempt **old = s->buckets;
        size_t oldn = s->nbuckets;
        s->buckets = nb;
        s->nbuckets = n;
        for (size_t i = 0; i < oldn; i++) {
            struct attempt *e = old[i];
            while (e) {
                struct attempt *next = e->next;
                size_t b = bucket_of(s, e->id);
                e->next = nb[b];
                nb[b] = e;
                e = next;
            }
        }
        free(old);
    }
    size_t b = bucket_of(s, a->id);
    a->next = s->buckets[b];
    s->buckets[b] = a;
    s->count++;
}

static uint64_t call_id(struct jd_call *c)
{
    return (uint64_t)(uintptr_t)c;
}

static struct jd_call *call_ptr(uint64_t id)
{
    return (struct jd_call *)(uintptr_t)id;
}

/* ---- logical calls ---- */

struct jd_call_handle {
    _Atomic unsigned refs; /* acq_rel on release so the last owner sees all writes */
    struct jd_registry *reg;
    const struct jd_command *cmd;
    char *command, *args, *key;
    int64_t timeout_ms; /* resolved: > 0 or none */
    struct jd_retry_policy retry;
    void (*on_attempt)(void *arg, uint32_t attempt);
    void (*done)(void *arg, const struct jd_call_result *res);
    void *arg;

    pthread_mutex_t mu;    /* guards the fields below */
    uint64_t cur_attempt;  /* id of the live attempt, 0 if none */
    uint64_t retry_timer;  /* pending retry timer, 0 if none */
    uint32_t next_attempt; /* the attempt the retry timer starts */
    bool cancelled, done_fired;
};

struct outcome {
    bool ok;
    const char *result_json;
    const char *kind;
    const char *message;
    bool retryable;
    const char *details_json;
};

static void call_ref(struct jd_call_handle *c)
{
    atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
}

static void call_unref(struct jd_call_handle *c)
{
    if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_destroy(&c->mu);
    free(c->command);
    free(c->args);
    free(c->key);
    free(c);
}

static void start_attempt(struct jd_call_handle *c, uint32_t attempt_no);

/* A failure's error object as JSON text (caller frees with free). */
static char *error_json(const struct outcome *o, uint32_t attempt)
{
    struct jd_pjson_buf b = {0};
    jd_pjson_buf_cat(&b, "{\"kind\":");
    jd_pjson_buf_str(&b, o->kind ? o->kind : "error");
    jd_pjson_buf_cat(&b, ",\"message\":");
    jd_pjson_buf_str(&b, o->message ? o->message : "");
    jd_pjson_buf_printf(&b, ",\"retryable\":%s,\"attempt\":%u", o->retryable ? "true" : "false",
                        attempt);
    if (o->details_json) {
        jd_pjson_buf_cat(&b, ",\"details\":");
        jd_pjson_buf_cat(&b, o->details_json);
    }
    jd_pjson_buf_cat(&b, "}");
    return b.p;
}

/* Fire done() once; drops the call's life reference when it does. */
static void finish_call(struct jd_call_handle *c, const struct outcome *o, uint32_t attempt)
{
    struct jd_registry *r = c->reg;
    struct jd_call_result res = {0};
    char *ej = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->done_fired) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    c->done_fired = true;
    c->cur_attempt = 0;
    pthread_mutex_unlock(&c->mu);

    res.ok = o->ok;
    res.attempt = attempt;
    if (o->ok) {
        res.result_json = o->result_json ? o->result_json : "null";
        atomic_fetch_add_explicit(&r->ok, 1, memory_order_relaxed);
    } else {
        ej = error_json(o, attempt);
        res.error_json = ej;
        res.error_kind = o->kind ? o->kind : "error";
        res.retryable = o->retryable;
        if (strcmp(res.error_kind, "cancelled") == 0)
            atomic_fetch_add_explicit(&r->cancelled, 1, memory_order_relaxed);
        else
            atomic_fetch_add_explicit(&r->failed, 1, memory_order_relaxed);
    }
    c->done(c->arg, &res);
    free(ej);
    call_unref(c); /* the life reference */
}

static const struct outcome k_cancelled = {
    .ok = false, .kind = "cancelled", .message = "call cancelled", .retryable = false};

/* Jitter source: splitmix64 over a shared counter (seeded at registry
 * creation). Jitter only needs to differ between calls, not to be
 * unpredictable. Relaxed: no data hangs off it. */
static _Atomic uint64_t g_rand_state;

static uint64_t rand64(void)
{
    uint64_t s =
        atomic_fetch_add_explicit(&g_rand_state, 0x9E3779B97F4A7C15ULL, memory_order_relaxed);
    return mix64(s + 0x9E3779B97F4A7C15ULL);
}

/* ---- attempts ---- */

/* What an ender learns about the attempt it ended. */
struct ended {
    struct jd_registry *reg;
    const struct jd_command *cmd;
    uint32_t attempt_no;
    uint64_t timer_id;
};

/* The plugin releases attempt `id` (complete/fail). Returns the call
 * reference if this also ended the attempt, else NULL (*found says whether
 * the id was live at all). Waits while another thread runs the attempt's
 * cancel hook, so the hook never outlives the plugin's handle. */
static struct jd_call_handle *attempt_release(uint64_t id, struct ended *e, bool *found)
{
    struct shard *s = shard_of(id);
    struct jd_call_handle *c = NULL;
    struct attempt **pp, *a;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        pp = shard_find(s, id);
        a = *pp;
        if (!a || !a->cancel_running || pthread_equal(a->cancel_thread, pthread_self()))
            break;
        pthread_cond_wait(&s->cond, &s->mu);
    }
    *found = a != NULL;
    if (a) {
        *pp = a->next;
        s->count--;
        e->reg = a->reg;
        e->cmd = a->cmd;
        e->attempt_no = a->attempt_no;
        e->timer_id = a->timer_id;
        if (!a->finished)
            c = a->call;
        free(a);
    }
    pthread_mutex_unlock(&s->mu);
    return c;
}

/* The host ends attempt `id` (timeout, cancel). Returns the call reference
 * if this ended it. With a cancel hook, marks it running on this thread:
 * the caller must call hook_done(id) after running it. */
static struct jd_call_handle *attempt_end_host(uint64_t id, struct ended *e, bool *hook)
{
    struct shard *s = shard_of(id);
    struct jd_call_handle *c = NULL;
    struct attempt *a;
    *hook = false;
    pthread_mutex_lock(&s->mu);
    a = *shard_find(s, id);
    if (a && !a->finished) {
        a->finished = true;
        c = a->call;
        a->call = NULL;
        e->reg = a->reg;
        e->cmd = a->cmd;
        e->attempt_no = a->attempt_no;
        e->timer_id = a->timer_id;
        a->timer_id = 0;
        if (a->cmd->cancel) {
            a->cancel_running = true;
            a->cancel_thread = pthread_self();
            *hook = true;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return c;
}

static void hook_done(uint64_t id)
{
    struct shard *s = shard_of(id);
    struct attempt *a;
    pthread_mutex_lock(&s->mu);
    a = *shard_find(s, id);
    if (a)
        a->cancel_running = false;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

static bool attempt_live(uint64_t id)
{
    struct shard *s = shard_of(id);
    struct attempt *a;
    bool live;
    pthread_mutex_lock(&s->mu);
    a = *shard_find(s, id);
    live = a && !a->finished;
    pthread_mutex_unlock(&s->mu);
    return live;
}

static void retry_fire(void *arg)
{
    struct jd_call_handle *c = arg; /* carries the retry timer's reference */
    uint32_t next;
    bool cancelled;
    pthread_mutex_lock(&c->mu);
    c->retry_timer = 0;
    cancelled = c->cancelled;
    next = c->next_attempt;
    pthread_mutex_unlock(&c->mu);
    if (cancelled)
        finish_call(c, &k_cancelled, next - 1);
    else
        start_attempt(c, next);
    call_unref(c);
}

/* An attempt ended with outcome o; the caller owns a reference to c. Retry
 * (after a backoff timer) or finish the call. */
static void attempt_ended(struct jd_call_handle *c, uint32_t attempt_no, const struct outcome *o)
{
    struct jd_registry *r = c->reg;
    bool retry = false, cancelled;
    uint64_t delay, tid;

    pthread_mutex_lock(&c->mu);
    c->cur_attempt = 0;
    cancelled = c->cancelled;
    if (!o->ok && o->retryable && !cancelled && !c->done_fired &&
        attempt_no < c->retry.max_attempts) {
        retry = true;
        c->next_attempt = attempt_no + 1;
    }
    pthread_mutex_unlock(&c->mu);
    if (!o->ok && cancelled)
        o = &k_cancelled; /* a failure racing a cancel reports the cancel */
    if (!retry) {
        finish_call(c, o, attempt_no);
        return;
    }
    delay = jd_retry_delay_ms(&c->retry, attempt_no + 1, rand64());
    atomic_fetch_add_explicit(&r->retries, 1, memory_order_relaxed);
    call_ref(c); /* for the retry timer */
    tid = r->env.timer_after ? r->env.timer_after(r->env.ctx, delay, retry_fire, c) : 0;
    if (tid == 0) {
        call_unref(c);
        finish_call(c, o, attempt_no);
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (c->next_attempt == attempt_no + 1 && c->cur_attempt == 0)
        c->retry_timer = tid;
    cancelled = c->cancelled;
    pthread_mutex_unlock(&c->mu);
    /* A cancel that came while the timer was being armed saw no timer to
     * stop: stop it here rather than wait out the backoff. */
    if (cancelled && r->env.timer_cancel && r->env.timer_cancel(r->env.ctx, tid) == 0) {
        finish_call(c, &k_cancelled, attempt_no);
        call_unref(c);
    }
}

static struct jd_registry *current(void)
{
    return atomic_load_explicit(&g_current, memory_order_acquire);
}

static void count_late(struct jd_registry *r)
{
    if (r)
        atomic_fetch_add_explicit(&r->late_dropped, 1, memory_order_relaxed);
}

/* complete()/fail() from the plugin (or the host on its behalf). */
static int end_by_plugin(uint64_t id, const struct outcome *o, bool count)
{
    struct ended e = {0};
    bool found;
    struct jd_call_handle *c = attempt_release(id, &e, &found);
    if (!c) {
        if (count)
            count_late(found ? e.reg : current());
        return JD_PLUGIN_ESTALE;
    }
    if (e.timer_id && e.reg->env.timer_cancel)
        e.reg->env.timer_cancel(e.reg->env.ctx, e.timer_id);
    attempt_ended(c, e.attempt_no, o);
    call_unref(c);
    return JD_PLUGIN_OK;
}

/* Timeout or cancel of a live attempt: run the cancel hook, report o. */
static bool end_by_host(uint64_t id, const struct outcome *o, bool is_timeout)
{
    struct ended e = {0};
    bool hook;
    struct jd_call_handle *c = attempt_end_host(id, &e, &hook);
    if (!c)
        return false;
    if (is_timeout)
        atomic_fetch_add_explicit(&e.reg->timeouts, 1, memory_order_relaxed);
    else if (e.timer_id && e.reg->env.timer_cancel)
        e.reg->env.timer_cancel(e.reg->env.ctx, e.timer_id);
    if (hook) {
        e.cmd->cancel(call_ptr(id));
        hook_done(id);
    }
    attempt_ended(c, e.attempt_no, o);
    call_unref(c);
    return true;
}

static void on_timeout(void *arg)
{
    uint64_t id = (uint64_t)(uintptr_t)arg;
    struct outcome o = {.ok = false, .kind = "timeout", .retryable = true};
    char msg[96];
    int64_t ms = 0;
    /* The message names the deadline; read it while the attempt is live. */
    struct shard *s = shard_of(id);
    pthread_mutex_lock(&s->mu);
    struct attempt *a = *shard_find(s, id);
    if (a && !a->finished && a->call)
        ms = a->call->timeout_ms;
    pthread_mutex_unlock(&s->mu);
    snprintf(msg, sizeof msg, "no completion within %lld ms", (long long)ms);
    o.message = msg;
    end_by_host(id, &o, true);
}

struct blocking_job {
    struct jd_call_handle *c; /* a dispatch reference */
    uint64_t id;
    uint32_t attempt_no;
};

static void run_handle(struct jd_call_handle *c, uint64_t id, uint32_t attempt_no)
{
    struct jd_call_info info = {
        .call = call_ptr(id),
        .command = c->command,
        .args_json = c->args,
        .idempotency_key = c->key,
        .attempt = attempt_no,
        .timeout_ms = c->timeout_ms > 0 ? c->timeout_ms : 0,
    };
    c->cmd->handle(&info);
}

static void blocking_run(void *arg)
{
    struct blocking_job *bj = arg;
    if (attempt_live(bj->id)) {
        run_handle(bj->c, bj->id, bj->attempt_no);
    } else {
        /* Ended (cancel/timeout) while queued: release it for the plugin,
         * which never saw it. */
        end_by_plugin(bj->id, &k_cancelled, false);
    }
    call_unref(bj->c);
    free(bj);
}

static void start_attempt(struct jd_call_handle *c, uint32_t attempt_no)
{
    struct jd_registry *r = c->reg;
    struct attempt *a;
    struct shard *s;
    uint64_t id, tid = 0;
    bool stop_timer = false;

    if (c->on_attempt)
        c->on_attempt(c->arg, attempt_no);
    a = jd_xcalloc(1, sizeof *a);
    id = atomic_fetch_add_explicit(&g_next_id, 1, memory_order_relaxed);
    a->id = id;
    a->reg = r;
    a->cmd = c->cmd;
    a->call = c;
    a->attempt_no = attempt_no;
    s = shard_of(id);

    pthread_mutex_lock(&c->mu);
    if (c->cancelled || c->done_fired) {
        pthread_mutex_unlock(&c->mu);
        free(a);
        finish_call(c, &k_cancelled, attempt_no);
        return;
    }
    call_ref(c); /* the attempt's reference */
    c->cur_attempt = id;
    pthread_mutex_lock(&s->mu); /* lock order: call, then shard */
    shard_insert(s, a);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&c->mu);

    if (c->timeout_ms > 0 && r->env.timer_after) {
        tid = r->env.timer_after(r->env.ctx, (uint64_t)c->timeout_ms, on_timeout,
                                 (void *)(uintptr_t)id);
        pthread_mutex_lock(&s->mu);
        a = *shard_find(s, id);
        if (a && !a->finished)
            a->timer_id = tid;
        else
            stop_timer = true;
        pthread_mutex_unlock(&s->mu);
        if (stop_timer && tid && r->env.timer_cancel)
            r->env.timer_cancel(r->env.ctx, tid);
    }

    if (c->cmd->flags & JD_CMD_BLOCKING) {
        struct blocking_job *bj = jd_xmalloc(sizeof *bj);
        int rc = r->env.run_blocking ? JD_OK : JD_EINTERNAL;
        bj->c = c;
        bj->id = id;
        bj->attempt_no = attempt_no;
        call_ref(c);
        if (rc == JD_OK)
            rc = r->env.run_blocking(r->env.ctx, blocking_run, bj);
        if (rc != JD_OK) {
            struct outcome o = {.ok = false,
                                .kind = "overloaded",
                                .message = "the blocking pool is full",
                                .retryable = true};
            call_unref(c);
            free(bj);
            end_by_plugin(id, &o, false);
        }
    } else {
        call_ref(c); /* keep the strings in info alive through handle() */
        run_handle(c, id, attempt_no);
        call_unref(c);
    }
}

/* ---- the host table ---- */

static int host_complete(struct jd_call *call, const char *result_json)
{
    char perr[128];
    struct jd_pjson *v = jd_pjson_parse(result_json, perr, sizeof perr);
    if (!v) {
        char msg[256];
        struct outcome bad = {.ok = false, .kind = "bad_result", .retryable = false};
        snprintf(msg, sizeof msg, "handler returned invalid JSON: %s", perr);
        bad.message = msg;
        return end_by_plugin(call_id(call), &bad, true);
    }
    jd_pjson_free(v);
    struct outcome o = {.ok = true, .result_json = result_json ? result_json : "null"};
    return end_by_plugin(call_id(call), &o, true);
}

static int host_fail(struct jd_call *call, const char *kind, const char *message, int retryable,
                     const char *details_json)
{
    struct outcome o = {.ok = false,
                        .kind = kind && *kind ? kind : "error",
                        .message = message ? message : "",
                        .retryable = retryable != 0,
                        .details_json = NULL};
    struct jd_pjson_buf quoted = {0};
    int rc;
    if (details_json) {
        struct jd_pjson *v = jd_pjson_parse(details_json, NULL, 0);
        if (v) {
            o.details_json = details_json;
            jd_pjson_free(v);
        } else {
            jd_pjson_buf_str(&quoted, details_json); /* not JSON: keep it as a string */
            o.details_json = quoted.p;
        }
    }
    rc = end_by_plugin(call_id(call), &o, true);
    jd_pjson_buf_free(&quoted);
    return rc;
}

static int host_is_cancelled(struct jd_call *call)
{
    return !attempt_live(call_id(call));
}

static uint64_t host_timer_after(uint64_t delay_ms, void (*fn)(void *arg), void *arg)
{
    struct jd_registry *r = current();
    if (!r || !r->env.timer_after)
        return 0;
    return r->env.timer_after(r->env.ctx, delay_ms, fn, arg);
}

static int host_timer_cancel(uint64_t timer_id)
{
    struct jd_registry *r = current();
    if (!r || !r->env.timer_cancel || timer_id == 0)
        return 1;
    return r->env.timer_cancel(r->env.ctx, timer_id);
}

static const char *host_config(const char *key)
{
    struct jd_registry *r = current();
    if (!r || !r->env.config || !key)
        return NULL;
    return r->env.config(r->env.ctx, key);
}

static void host_log(int level, const char *plugin, const char *message)
{
    enum jd_log_level l = level <= JD_PLOG_DEBUG  ? JD_LOG_DEBUG
                          : level == JD_PLOG_INFO ? JD_LOG_INFO
                          : level == JD_PLOG_WARN ? JD_LOG_WARN
                                                  : JD_LOG_ERROR;
    jd_log(l, message ? message : "", "plugin", plugin ? plugin : "?", NULL);
}

static void host_step_yield(void *out, uint32_t tag, const char *command, const char *args_json,
                            int64_t timeout_ms)
{
    jd_step_yield(out, tag, command, args_json, timeout_ms);
}

static void host_step_wait(void *out)
{
    ((struct jd_step_out *)out)->status = JD_STEP_WAIT;
}

static void host_step_idle(void *out)
{
    ((struct jd_step_out *)out)->status = JD_STEP_IDLE;
}

static void host_step_continue(void *out)
{
    ((struct jd_step_out *)out)->status = JD_STEP_CONTINUE;
}

static void host_step_done(void *out, const char *result_json)
{
    jd_step_done(out, result_json);
}

static void host_step_fail(void *out, const char *error_json)
{
    jd_step_fail(out, error_json ? error_json : "{\"kind\":\"error\",\"message\":\"\"}");
}

static const struct jd_host g_host = {
    .abi_version = JD_PLUGIN_ABI_VERSION,
    .complete = host_complete,
    .fail = host_fail,
    .is_cancelled = host_is_cancelled,
    .timer_after = host_timer_after,
    .timer_cancel = host_timer_cancel,
    .config = host_config,
    .log = host_log,
    .step_yield = host_step_yield,
    .step_wait = host_step_wait,
    .step_idle = host_step_idle,
    .step_continue = host_step_continue,
    .step_done = host_step_done,
    .step_fail = host_step_fail,
};

const struct jd_host *jd_registry_host(const struct jd_registry *r)
{
    (void)r;
    return &g_host;
}

/* ---- the registry's share of the attempt table ---- */

void registry_calls_attach(struct jd_registry *r)
{
    struct timespec ts;
    pthread_once(&g_shards_once, shards_init);
    clock_gettime(CLOCK_REALTIME, &ts);
    atomic_fetch_add_explicit(&g_rand_state, (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20),
                              memory_order_relaxed);
    atomic_store_explicit(&g_current, r, memory_order_release);
}

void registry_calls_detach(struct jd_registry *r)
{
    struct jd_registry *expect = r;
    atomic_compare_exchange_strong_explicit(&g_current, &expect, NULL, memory_order_acq_rel,
                                            memory_order_acquire);
    /* Attempts a plugin never released would otherwise outlive us. Calls
     * must have finished before destroy (the job layer drains first); what
     * is left here belongs to a plugin that broke the complete-once rule. */
    for (size_t i = 0; i < SHARDS; i++) {
        struct shard *s = &g_shards[i];
        pthread_mutex_lock(&s->mu);
        for (size_t b = 0; b < s->nbuckets; b++) {
            struct attempt **pp = &s->buckets[b];
            while (*pp) {
                struct attempt *a = *pp;
                if (a->reg != r || a->cancel_running) {
                    pp = &a->next;
                    continue;
                }
                *pp = a->next;
                s->count--;
                if (a->call)
                    call_unref(a->call);
                free(a);
            }
        }
        pthread_mutex_unlock(&s->mu);
    }
}

/* ---- calls ---- */

uint64_t jd_retry_delay_ms(const struct jd_retry_policy *p, uint32_t attempt, uint64_t rand64v)
{
    /* Kept in double and capped early: factor^n overflows quickly, and
     * anything past ~2^53 ms (285 000 years) is "forever" anyway. */
    const double limit = 9.0e15;
    double d;
    uint64_t base, half;
    if (!p || attempt < 2 || p->backoff_ms == 0)
        return 0;
    d = (double)p->backoff_ms;
    if (p->factor > 1.0)
        for (uint32_t i = 2; i < attempt && d < limit; i++)
            d *= p->factor;
    if (d > limit)
        d = limit;
    if (p->max_backoff_ms && d > (double)p->max_backoff_ms)
        d = (double)p->max_backoff_ms;
    base = (uint64_t)d;
    half = base / 2;
    return (base - half) + rand64v % (half + 1);
}

int jd_registry_call(struct jd_registry *r, const struct jd_call_request *req,
                     struct jd_call_handle **out)
{
    struct jd_call_handle *c;
    if (out)
        *out = NULL;
    if (!r || !req || !req->command || !req->done)
        return JD_EINVAL;
    c = jd_xcalloc(1, sizeof *c);
    atomic_init(&c->refs, out ? 2u : 1u);
    pthread_mutex_init(&c->mu, NULL);
    c->reg = r;
    c->cmd = jd_registry_command(r, req->command);
    c->command = jd_xstrdup(req->command);
    c->args = jd_xstrdup(req->args_json ? req->args_json : "{}");
    c->key = jd_xstrdup(req->idempotency_key ? req->idempotency_key : "");
    c->retry = req->retry;
    if (c->retry.max_attempts == 0)
        c->retry.max_attempts = 1;
    c->on_attempt = req->on_attempt;
    c->done = req->done;
    c->arg = req->arg;
    if (out)
        *out = c;
    atomic_fetch_add_explicit(&r->calls, 1, memory_order_relaxed);
    if (!c->cmd) {
        char msg[200];
        struct outcome o = {.ok = false, .kind = "unknown_command", .retryable = false};
        snprintf(msg, sizeof msg, "no loaded plugin provides command \"%.120s\"", req->command);
        o.message = msg;
        atomic_fetch_add_explicit(&r->unknown, 1, memory_order_relaxed);
        finish_call(c, &o, req->first_attempt ? req->first_attempt : 1);
        return JD_OK;
    }
    c->timeout_ms = req->timeout_ms > 0    ? req->timeout_ms
                    : req->timeout_ms == 0 ? c->cmd->default_timeout_ms
                                           : 0;
    call_ref(c); /* hold c across start_attempt: done() may drop the life reference inside */
    start_attempt(c, req->first_attempt ? req->first_attempt : 1);
    call_unref(c);
    return JD_OK;
}

void jd_registry_call_cancel(struct jd_registry *r, struct jd_call_handle *h)
{
    uint64_t att, rt;
    (void)r;
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    if (h->done_fired || h->cancelled) {
        pthread_mutex_unlock(&h->mu);
        return;
    }
    h->cancelled = true;
    att = h->cur_attempt;
    rt = h->retry_timer;
    pthread_mutex_unlock(&h->mu);
    if (att) {
        /* Lost to a completion racing us: that path sees `cancelled`. */
        end_by_host(att, &k_cancelled, false);
    } else if (rt && h->reg->env.timer_cancel &&
               h->reg->env.timer_cancel(h->reg->env.ctx, rt) == 0) {
        uint32_t n;
        pthread_mutex_lock(&h->mu);
        n = h->next_attempt;
        h->retry_timer = 0;
        pthread_mutex_unlock(&h->mu);
        finish_call(h, &k_cancelled, n - 1);
        call_unref(h); /* the retry timer's reference */
    }
}

void jd_registry_call_release(struct jd_call_handle *h)
{
    if (h)
        call_unref(h);
}

void jd_registry_stats(const struct jd_registry *r, struct jd_registry_stats *out)
{
    struct jd_registry *m = (struct jd_registry *)r; /* atomics need a non-const lvalue */
    out->calls = atomic_load_explicit(&m->calls, memory_order_relaxed);
    out->ok = atomic_load_explicit(&m->ok, memory_order_relaxed);
    out->failed = atomic_load_explicit(&m->failed, memory_order_relaxed);
    out->timeouts = atomic_load_explicit(&m->timeouts, memory_order_relaxed);
    out->cancelled = atomic_load_explicit(&m->cancelled, memory_order_relaxed);
    out->retries = atomic_load_explicit(&m->retries, memory_order_relaxed);
    out->late_dropped = atomic_load_explicit(&m->late_dropped, memory_order_relaxed);
    out->unknown_command = atomic_load_explicit(&m->unknown, memory_order_relaxed);
}
