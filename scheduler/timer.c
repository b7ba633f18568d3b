/*
 * Timer heap and thread; see timer.h. Invariant: every pending timer is in
 * the heap at heap[t->idx] and in the id hash; both are guarded by mu.
 */
#include "scheduler/timer.h"

#include "common/alloc.h"
#include "common/error.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

struct timer {
    uint64_t id, due;
    void (*fn)(void *);
    void *arg;
    size_t idx;          /* position in the heap */
    struct timer *hnext; /* hash chain */
};

struct jd_timers {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when the earliest deadline changes or on stop */
    pthread_t thread;
    bool started, stop;
    struct timer **heap;
    size_t n, cap;
    struct timer **hash;
    size_t nbuckets; /* power of two */
    uint64_t next_id;
};

uint64_t jd_timers_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static bool before(const struct timer *a, const struct timer *b)
{
    return a->due < b->due || (a->due == b->due && a->id < b->id);
}

static void heap_set(struct jd_timers *t, size_t i, struct timer *x)
{
    t->heap[i] = x;
    x->idx = i;
}

static void sift_up(struct jd_timers *t, size_t i)
{
    struct timer *x = t->heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(x, t->heap[p]))
            break;
        heap_set(t, i, t->heap[p]);
        i = p;
    }
    heap_set(t, i, x);
}

static void sift_down(struct jd_timers *t, size_t i)
{
    struct timer *x = t->heap[i];
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        struct timer *best = x;
        if (l < t->n && before(t->heap[l], best)) {
            m = l;
            best = t->heap[l];
        }
        if (l + 1 < t->n && before(t->heap[l + 1], best)) {
            m = l + 1;
            best = t->heap[l + 1];
        }
        if (m == i)
            break;
        heap_set(t, i, best);
        i = m;
    }
    heap_set(t, i, x);
}

static void heap_remove(struct jd_timers *t, struct timer *x)
{
    size_t i = x->idx;
    struct timer *last = t->heap[--t->n];
    if (last != x) {
        heap_set(t, i, last);
        sift_down(t, i);
        sift_up(t, last->idx);
    }
}

static struct timer **hash_slot(struct jd_timers *t, uint64_t id)
{
    struct timer **pp = &t->hash[(id * 0x9E3779B97F4A7C15ull >> 20) & (t->nbuckets - 1)];
    while (*pp && (*pp)->id != id)
        pp = &(*pp)->hnext;
    return pp;
}

static void hash_grow(struct jd_timers *t)
{
    size_t old = t->nbuckets;
    struct timer **oh = t->hash;
    t->nbuckets = old * 2;
    t->hash = jd_xcalloc(t->nbuckets, sizeof(*t->hash));
    for (size_t i = 0; i < old; i++) {
        for (struct timer *x = oh[i], *nx; x; x = nx) {
            nx = x->hnext;
            struct timer **pp = hash_slot(t, x->id);
            x->hnext = NULL;
            *pp = x;
        }
    }
    free(oh);
}

static void *timer_main(void *arg)
{
    struct jd_timers *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        if (t->n == 0) {
            pthread_cond_wait(&t->cv, &t->mu);
            continue;
        }
        struct timer *x = t->heap[0];
        uint64_t now = jd_timers_now_ns();
        if (x->due > now) {
            struct timespec ts = {.tv_sec = (time_t)(x->due / 1000000000u),
                                  .tv_nsec = (long)(x->due % 1000000000u)};
            pthread_cond_timedwait(&t->cv, &t->mu, &ts);
            continue;
        }
        heap_remove(t, x);
        *hash_slot(t, x->id) = x->hnext;
        pthread_mutex_unlock(&t->mu);
        x->fn(x->arg);
        free(x);
        pthread_mutex_lock(&t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int jd_timers_create(struct jd_timers **out)
{
    struct jd_timers *t = jd_xcalloc(1, sizeof(*t));
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&t->mu, NULL);
    t->nbuckets = 64;
    t->hash = jd_xcalloc(t->nbuckets, sizeof(*t->hash));
    t->next_id = 1;
    if (pthread_create(&t->thread, NULL, timer_main, t) != 0) {
        jd_timers_destroy(t);
        return JD_EIO;
    }
    pthread_setname_np(t->thread, "jd-timer");
    t->started = true;
    *out = t;
    return 0;
}

int jd_timers_add(struct jd_timers *t, uint64_t delay_ns, void (*fn)(void *), void *arg,
                  uint64_t *id_out)
{
    if (!fn)
        return JD_EINVAL;
    struct timer *x = jd_xmalloc(sizeof(*x));
    x->fn = fn;
    x->arg = arg;
    x->hnext = NULL;
    uint64_t now = jd_timers_now_ns();
    x->due = delay_ns > UINT64_MAX - now ? UINT64_MAX : now + delay_ns;
    pthread_mutex_lock(&t->mu);
    if (t->stop) {
        pthread_mutex_unlock(&t->mu);
        free(x);
        return JD_ESHUTDOWN;
    }
    x->id = t->next_id++;
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 64;
        t->heap = jd_xrealloc(t->heap, t->cap * sizeof(*t->heap));
    }
    heap_set(t, t->n++, x);
    sift_up(t, x->idx);
    if (t->n > t->nbuckets)
        hash_grow(t);
    *hash_slot(t, x->id) = x;
    if (t->heap[0] == x)
        pthread_cond_signal(&t->cv);
    if (id_out)
        *id_out = x->id;
    pthread_mutex_unlock(&t->mu);
    return 0;
}

int jd_timers_cancel(struct jd_timers *t, uint64_t id)
{
    pthread_mutex_lock(&t->mu);
    struct timer **pp = hash_slot(t, id);
    struct timer *x = *pp;
    if (!x) {
        pthread_mutex_unlock(&t->mu);
        return JD_ENOENT;
    }
    *pp = x->hnext;
    heap_remove(t, x);
    pthread_mutex_unlock(&t->mu);
    free(x);
    return 0;
}

size_t jd_timers_pending(struct jd_timers *t)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->n;
    pthread_mutex_unlock(&t->mu);
    return n;
}

size_t jd_timers_stop(struct jd_timers *t)
{
    pthread_mutex_lock(&t->mu);
    bool was = t->stop;
    t->stop = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (!was && t->started)
        pthread_join(t->thread, NULL);
    pthread_mutex_lock(&t->mu);
    size_t n = t->n;
    for (size_t i = 0; i < t->n; i++)
        free(t->heap[i]);
    t->n = 0;
    for (size_t i = 0; i < t->nbuckets; i++)
        t->hash[i] = NULL;
    pthread_mutex_unlock(&t->mu);
    return n;
}

void jd_timers_destroy(struct jd_timers *t)
{
    if (!t)
        return;
    jd_timers_stop(t);
    free(t->heap);
    free(t->hash);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}
