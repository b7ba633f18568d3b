/*
 * Test services for the plugins layer: a timer (fake clock driven by the
 * test, or a real timer thread) and a blocking "pool" (one thread per job),
 * wired into struct jd_plugin_env. Included by the plugin tests.
 *
 * Fake mode: timers fire only inside penv_advance(), on the test thread, in
 * due order; the clock moves only there. Real mode: a timer thread fires
 * them on time. Either way every function is thread-safe.
 */
#ifndef JD_TESTS_PLUGIN_ENV_H
#define JD_TESTS_PLUGIN_ENV_H

#include "plugins/registry.h"

#include <pthread.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ptimer {
    uint64_t id;
    uint64_t due_ms;
    void (*fn)(void *);
    void *arg;
    struct ptimer *next;
};

struct penv {
    bool real;
    pthread_mutex_t mu;
    pthread_cond_t cond;   /* timer thread wake-ups; blocking jobs finished */
    struct ptimer *timers; /* pending, unsorted */
    uint64_t next_id;
    uint64_t fake_now_ms;
    uint64_t fired, armed, cancelled;
    uint64_t last_delay_ms; /* delay of the most recent timer_after */
    unsigned blocking_running;
    uint64_t blocking_started;
    bool stop;
    pthread_t thread;
    const char *exec_allow, *http_allow, *output_cap;
    const char *exec_env_allow, *exec_timeout_ms, *http_timeout_ms;
};

static inline uint64_t penv_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline uint64_t penv_now(struct penv *e)
{
    return e->real ? penv_mono_ms() : e->fake_now_ms;
}

static inline uint64_t penv_timer_after(void *ctx, uint64_t delay_ms, void (*fn)(void *), void *arg)
{
    struct penv *e = ctx;
    struct ptimer *t = calloc(1, sizeof *t);
    uint64_t id;
    pthread_mutex_lock(&e->mu);
    id = t->id = ++e->next_id;
    t->due_ms = penv_now(e) + delay_ms;
    t->fn = fn;
    t->arg = arg;
    t->next = e->timers;
    e->timers = t;
    e->armed++;
    e->last_delay_ms = delay_ms;
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->mu);
    return id;
}

static inline int penv_timer_cancel(void *ctx, uint64_t id)
{
    struct penv *e = ctx;
    int rc = 1;
    pthread_mutex_lock(&e->mu);
    for (struct ptimer **pp = &e->timers; *pp; pp = &(*pp)->next) {
        if ((*pp)->id == id) {
            struct ptimer *t = *pp;
            *pp = t->next;
            free(t);
            e->cancelled++;
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* Take the earliest timer due at or before now (caller holds mu). */
static inline struct ptimer *penv_take_due(struct penv *e, uint64_t now)
{
    struct ptimer **best = NULL;
    for (struct ptimer **pp = &e->timers; *pp; pp = &(*pp)->next)
        if ((*pp)->due_ms <= now && (!best || (*pp)->due_ms < (*best)->due_ms ||
                                     ((*pp)->due_ms == (*best)->due_ms && (*pp)->id < (*best)->id)))
            best = pp;
    if (!best)
        return NULL;
    struct ptimer *t = *best;
    *best = t->next;
    return t;
}

/* Fake mode: move the clock forward by ms, firing timers as their time comes. */
static inline void penv_advance(struct penv *e, uint64_t ms)
{
    uint64_t target;
    pthread_mutex_lock(&e->mu);
    target = e->fake_now_ms + ms;
    for (;;) {
        struct ptimer *t = NULL, *earliest = NULL;
        for (struct ptimer *p = e->timers; p; p = p->next)
            if (p->due_ms <= target && (!earliest || p->due_ms < earliest->due_ms))
                earliest = p;
        if (!earliest)
            break;
        if (earliest->due_ms > e->fake_now_ms)
            e->fake_now_ms = earliest->due_ms;
        t = penv_take_due(e, e->fake_now_ms);
        e->fired++;
        pthread_mutex_unlock(&e->mu);
        t->fn(t->arg);
        free(t);
        pthread_mutex_lock(&e->mu);
    }
    e->fake_now_ms = target;
    pthread_mutex_unlock(&e->mu);
}

static inline size_t penv_pending(struct penv *e)
{
    size_t n = 0;
    pthread_mutex_lock(&e->mu);
    for (struct ptimer *p = e->timers; p; p = p->next)
        n++;
    pthread_mutex_unlock(&e->mu);
    return n;
}

static inline void *penv_timer_thread(void *arg)
{
    struct penv *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        uint64_t now = penv_mono_ms();
        struct ptimer *t = penv_take_due(e, now);
        if (t) {
            e->fired++;
            pthread_mutex_unlock(&e->mu);
            t->fn(t->arg);
            free(t);
            pthread_mutex_lock(&e->mu);
            continue;
        }
        uint64_t next = UINT64_MAX;
        for (struct ptimer *p = e->timers; p; p = p->next)
            if (p->due_ms < next)
                next = p->due_ms;
        struct timespec ts;
        /* The condition variable waits on CLOCK_REALTIME (the default): a
         * monotonic deadline would lie in its past and make this spin. */
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t wait = next == UINT64_MAX ? 100 : next - now;
        if (wait > 100)
            wait = 100;
        ts.tv_nsec += (long)(wait * 1000000);
        ts.tv_sec += ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&e->cond, &e->mu, &ts);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

struct penv_job {
    struct penv *e;
    void (*fn)(void *);
    void *arg;
};

static inline void *penv_job_thread(void *arg)
{
    struct penv_job *j = arg;
    struct penv *e = j->e;
    j->fn(j->arg);
    free(j);
    pthread_mutex_lock(&e->mu);
    e->blocking_running--;
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

static inline int penv_run_blocking(void *ctx, void (*fn)(void *), void *arg)
{
    struct penv *e = ctx;
    struct penv_job *j = calloc(1, sizeof *j);
    pthread_t t;
    pthread_attr_t at;
    j->e = e;
    j->fn = fn;
    j->arg = arg;
    pthread_mutex_lock(&e->mu);
    e->blocking_running++;
    e->blocking_started++;
    pthread_mutex_unlock(&e->mu);
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, penv_job_thread, j) != 0) {
        pthread_attr_destroy(&at);
        free(j);
        pthread_mutex_lock(&e->mu);
        e->blocking_running--;
        pthread_mutex_unlock(&e->mu);
        return -6; /* JD_EFULL */
    }
    pthread_attr_destroy(&at);
    return 0;
}

static inline const char *penv_config(void *ctx, const char *key)
{
    struct penv *e = ctx;
    if (strcmp(key, "exec_allow") == 0)
        return e->exec_allow;
    if (strcmp(key, "http_allow") == 0)
        return e->http_allow;
    if (strcmp(key, "output_cap") == 0)
        return e->output_cap;
    if (strcmp(key, "exec_env_allow") == 0)
        return e->exec_env_allow;
    if (strcmp(key, "exec_timeout_ms") == 0)
        return e->exec_timeout_ms;
    if (strcmp(key, "http_timeout_ms") == 0)
        return e->http_timeout_ms;
    return NULL;
}

static inline struct jd_plugin_env penv_env(struct penv *e)
{
    struct jd_plugin_env env = {
        .ctx = e,
        .timer_after = penv_timer_after,
        .timer_cancel = penv_timer_cancel,
        .run_blocking = penv_run_blocking,
        .config = penv_config,
    };
    return env;
}

static inline void penv_init(struct penv *e, bool real)
{
    memset(e, 0, sizeof *e);
    e->real = real;
    e->fake_now_ms = 1000;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cond, NULL);
    if (real)
        pthread_create(&e->thread, NULL, penv_timer_thread, e);
}

/* Wait until no blocking job runs (up to timeout_ms); true if idle. */
static inline bool penv_wait_blocking(struct penv *e, uint64_t timeout_ms)
{
    uint64_t end = penv_mono_ms() + timeout_ms;
    bool idle;
    pthread_mutex_lock(&e->mu);
    while (e->blocking_running && penv_mono_ms() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000000;
        ts.tv_sec += ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&e->cond, &e->mu, &ts);
    }
    idle = e->blocking_running == 0;
    pthread_mutex_unlock(&e->mu);
    return idle;
}

static inline void penv_fini(struct penv *e)
{
    penv_wait_blocking(e, 10000);
    if (e->real) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_broadcast(&e->cond);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    while (e->timers) {
        struct ptimer *t = e->timers;
        e->timers = t->next;
        free(t);
    }
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cond);
}

/* ---- a call recorder: what done() saw ---- */

struct precord {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int done_count;
    bool ok;
    char kind[64];
    char *result; /* result_json or error_json */
    bool retryable;
    uint32_t attempt;
    uint32_t attempts_seen[16];
    int nattempts;
};

static inline void prec_init(struct precord *p)
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cond, NULL);
}

static inline void prec_fini(struct precord *p)
{
    free(p->result);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cond);
}

static inline void prec_done(void *arg, const struct jd_call_result *res)
{
    struct precord *p = arg;
    pthread_mutex_lock(&p->mu);
    p->done_count++;
    p->ok = res->ok;
    snprintf(p->kind, sizeof p->kind, "%s", res->ok ? "" : res->error_kind);
    free(p->result);
    p->result = strdup(res->ok ? res->result_json : res->error_json);
    p->retryable = res->retryable;
    p->attempt = res->attempt;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
}

static inline void prec_on_attempt(void *arg, uint32_t attempt)
{
    struct precord *p = arg;
    pthread_mutex_lock(&p->mu);
    if (p->nattempts < 16)
        p->attempts_seen[p->nattempts++] = attempt;
    pthread_mutex_unlock(&p->mu);
}

/* Wait (real time) until done fired; true if it did. */
static inline bool prec_wait(struct precord *p, uint64_t timeout_ms)
{
    uint64_t end = penv_mono_ms() + timeout_ms;
    bool got;
    pthread_mutex_lock(&p->mu);
    while (p->done_count == 0 && penv_mono_ms() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000000;
        ts.tv_sec += ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&p->cond, &p->mu, &ts);
    }
    got = p->done_count > 0;
    pthread_mutex_unlock(&p->mu);
    return got;
}

static inline int prec_count(struct precord *p)
{
    int n;
    pthread_mutex_lock(&p->mu);
    n = p->done_count;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* A path under $JD_BUILD (default "build"): caller frees. */
static inline char *pbuild_path(const char *rel)
{
    const char *b = getenv("JD_BUILD");
    size_t n;
    char *s;
    if (!b || !*b)
        b = "build";
    n = strlen(b) + strlen(rel) + 2;
    s = malloc(n);
    snprintf(s, n, "%s/%s", b, rel);
    return s;
}

#endif
