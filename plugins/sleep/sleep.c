/*
 * sleep: {"ms": N} completes with {"slept_ms": N} after N milliseconds.
 *
 * It holds no thread: handle() arms a host timer (host->timer_after) and
 * returns; the timer callback completes the call. cancel() (timeout or job
 * cancel) stops the timer and releases the call.
 *
 * Invariant: a call is in the pending table from handle() until exactly one
 * of the timer callback or cancel() removes it; whoever removes it calls
 * complete() (after a cancel that returns JD_PLUGIN_ESTALE, which is the
 * release the ABI asks for). Call handles are never reused by the host, so
 * the timer's argument is the call handle itself.
 *
 * Threading: handle() on a worker, the timer callback on the host's timer
 * thread, cancel() on any thread; the table is guarded by one mutex.
 */
#include "plugins/builtin.h"

#include <pthread.h>

#define SLEEP_MAX_MS (366LL * 24 * 3600 * 1000) /* a year: longer is surely a unit mistake */
#define BUCKETS 1024                            /* pending sleeps hash; chains stay short */

struct pending {
    struct jd_call *call;
    uint64_t timer; /* 0 until armed */
    int64_t ms;
    struct pending *next;
};

static const struct jd_host *host;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct pending *table[BUCKETS];

static struct pending **find(struct jd_call *call)
{
    uintptr_t k = (uintptr_t)call;
    struct pending **pp = &table[(k ^ (k >> 10)) % BUCKETS];
    while (*pp && (*pp)->call != call)
        pp = &(*pp)->next;
    return pp;
}

/* Remove call's entry; returns it (caller frees) or NULL. */
static struct pending *take(struct jd_call *call)
{
    struct pending *p;
    pthread_mutex_lock(&mu);
    struct pending **pp = find(call);
    p = *pp;
    if (p)
        *pp = p->next;
    pthread_mutex_unlock(&mu);
    return p;
}

static int parse_ms(const char *args_json, int64_t *ms, char *err, size_t errlen)
{
    struct jd_pjson *a = jd_pjson_parse(args_json, err, errlen);
    int ok = a && jd_pjson_int(jd_pjson_get(a, "ms"), ms) && *ms >= 0 && *ms <= SLEEP_MAX_MS;
    if (a && !ok && err)
        snprintf(err, errlen, "ms must be an integer from 0 to %lld", (long long)SLEEP_MAX_MS);
    jd_pjson_free(a);
    return ok ? 0 : 1;
}

static int sleep_validate(const char *args_json, char *err, size_t errlen, char *ptr, size_t ptrlen)
{
    int64_t ms;
    if (parse_ms(args_json, &ms, err, errlen) == 0)
        return 0;
    snprintf(ptr, ptrlen, "/ms");
    return 1;
}

static void finish(struct pending *p)
{
    char result[64];
    snprintf(result, sizeof result, "{\"slept_ms\":%lld}", (long long)p->ms);
    host->complete(p->call, result);
    free(p);
}

static void fire(void *arg)
{
    struct pending *p = take((struct jd_call *)arg);
    if (p)
        finish(p);
}

static void sleep_handle(const struct jd_call_info *info)
{
    int64_t ms;
    char err[128];
    struct pending *p;
    uint64_t timer;
    int armed;
    if (parse_ms(info->args_json, &ms, err, sizeof err) != 0) {
        host->fail(info->call, "invalid_args", err, 0, NULL);
        return;
    }
    p = calloc(1, sizeof *p);
    if (!p) {
        host->fail(info->call, "no_memory", "out of memory", 1, NULL);
        return;
    }
    p->call = info->call;
    p->ms = ms;
    if (ms == 0) {
        finish(p);
        return;
    }
    pthread_mutex_lock(&mu);
    struct pending **pp = find(p->call);
    p->next = *pp;
    *pp = p;
    pthread_mutex_unlock(&mu);
    if (host->is_cancelled(info->call)) {
        /* cancel() may have run before the entry existed: release it here. */
        p = take(info->call);
        if (p) {
            host->complete(p->call, NULL);
            free(p);
        }
        return;
    }

    timer = host->timer_after((uint64_t)ms, fire, info->call);
    if (timer == 0) {
        p = take(info->call);
        if (p) {
            host->fail(p->call, "no_timer", "the host could not arm a timer", 1, NULL);
            free(p);
        }
        return;
    }
    pthread_mutex_lock(&mu);
    pp = find(info->call);
    armed = *pp != NULL;
    if (armed)
        (*pp)->timer = timer;
    pthread_mutex_unlock(&mu);
    if (!armed) /* cancelled (or fired) meanwhile; stop a timer nobody needs */
        host->timer_cancel(timer);
}

static void sleep_cancel(struct jd_call *call)
{
    struct pending *p = take(call);
    if (!p)
        return; /* the timer got there first, or handle() has not armed it yet */
    if (p->timer)
        host->timer_cancel(p->timer);
    host->complete(p->call, NULL); /* releases the handle (returns ESTALE) */
    free(p);
}

static const struct jd_command commands[] = {
    {.name = "sleep", .validate = sleep_validate, .handle = sleep_handle, .cancel = sleep_cancel},
};

JD_BUILTIN_PLUGIN("sleep", commands, 1, NULL, 0)
