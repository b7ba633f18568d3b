/*
 * Around the workers: pinning and unstacking them across CPUs, the monitor
 * thread that flags stuck steps so others may take a stuck worker's queue,
 * and the glue to the timer thread (timer.c) and the blocking pool
 * (blocking.c). The worker loop itself is in sched_find.c.
 *
 * Threading: sched_pin_self and sched_unstack run on the worker they move;
 * sched_monitor_main on the monitor thread (its stop flag under
 * jd_sched.mon_mu), started by jd_sched_create and joined by
 * jd_sched_shutdown. The timer and blocking entry points may be called
 * from any thread.
 */
#include "scheduler/sched_impl.h"

#include "common/error.h"
#include "scheduler/blocking.h"
#include "scheduler/timer.h"

#include <stdlib.h>
#include <time.h>

/* Pin the calling worker to the (index mod n)-th CPU of the process's
 * affinity mask; a failure leaves it unpinned (a hint, not a contract). */
void sched_pin_self(unsigned index)
{
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        return;
    int n = CPU_COUNT(&allowed);
    if (n <= 0)
        return;
    int want = (int)(index % (unsigned)n);
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &allowed) || want-- > 0)
            continue;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        (void)pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
        return;
    }
}

/* Every UNSTACK_STEPS steps (the worker loop counts), look at one other worker (in turn): if it has
 * not gone round its loop since the last look, is not parked, and last
 * went round on the CPU we are on now, it is waiting for our CPU: the
 * kernel has stacked two workers on one CPU (it does, for milliseconds,
 * while a third thread keeps waking on the other one). Step off this CPU:
 * narrow our affinity to the others, which migrates us, then restore it.
 * Only when there are no more workers than allowed CPUs and workers are
 * not pinned. */
void sched_unstack(struct worker *w)
{
    struct jd_sched *s = w->s;
    w->place_tick = 0;
    unsigned n = s->nworkers;
    struct worker *v = &s->workers[w->watch];
    uint64_t beat = atomic_load_explicit(&v->beat, memory_order_relaxed);
    bool stalled =
        beat == w->watch_beat && atomic_load_explicit(&v->parked, memory_order_relaxed) == 0;
    int cpu = atomic_load_explicit(&w->cpu, memory_order_relaxed);
    if (stalled && cpu >= 0 && atomic_load_explicit(&v->cpu, memory_order_relaxed) == cpu) {
        cpu_set_t others = s->allowed;
        CPU_CLR(cpu, &others);
        if (CPU_COUNT(&others) > 0 &&
            pthread_setaffinity_np(pthread_self(), sizeof(others), &others) == 0) {
            (void)pthread_setaffinity_np(pthread_self(), sizeof(s->allowed), &s->allowed);
            atomic_fetch_add_explicit(&s->unstacks, 1, memory_order_relaxed);
        }
    }
    /* watch the next worker from now on */
    unsigned next = (w->watch + 1) % n;
    if (next == w->index)
        next = (next + 1) % n;
    w->watch = next;
    w->watch_beat = atomic_load_explicit(&s->workers[next].beat, memory_order_relaxed);
}

/* ---------- the monitor: stuck steps ---------- */

void *sched_monitor_main(void *arg)
{
    struct jd_sched *s = arg;
    unsigned n = s->nworkers;
    uint64_t *last = jd_xcalloc(n, sizeof(*last));
    uint64_t *since = jd_xcalloc(n, sizeof(*since));
    bool *reported = jd_xcalloc(n, sizeof(*reported));
    uint64_t period = s->stuck_ns / 2 ? s->stuck_ns / 2 : 1;
    pthread_mutex_lock(&s->mon_mu);
    while (!s->mon_stop) {
        uint64_t due = jd_timers_now_ns() + period;
        struct timespec ts = {.tv_sec = (time_t)(due / 1000000000u),
                              .tv_nsec = (long)(due % 1000000000u)};
        pthread_cond_timedwait(&s->mon_cv, &s->mon_mu, &ts);
        if (s->mon_stop)
            break;
        uint64_t now = jd_timers_now_ns();
        for (unsigned i = 0; i < n; i++) {
            struct worker *v = &s->workers[i];
            /* relaxed: a sample; a step that ends meanwhile just resets it */
            uint64_t seq = atomic_load_explicit(&v->stepseq, memory_order_relaxed);
            if (seq != last[i] || !(seq & 1)) {
                last[i] = seq;
                since[i] = now;
                if (reported[i]) {
                    reported[i] = false;
                    atomic_store_explicit(&v->stuck, false, memory_order_relaxed);
                }
                continue;
            }
            if (!reported[i] && now - since[i] >= s->stuck_ns) {
                reported[i] = true;
                atomic_fetch_add_explicit(&s->stuck_events, 1, memory_order_relaxed);
                atomic_store_explicit(&v->stuck, true, memory_order_relaxed);
            }
            /* leave the stuck worker's queue to the others */
            if (reported[i] &&
                (jd_ring_len(&v->ring) || jd_lqueue_len(&v->inject) ||
                 atomic_load_explicit(&v->lifo, memory_order_relaxed)) &&
                atomic_load_explicit(&s->nsearching, memory_order_seq_cst) == 0)
                sched_unpark_any(s);
        }
        /* safety net: shared work and nobody awake to look for it */
        if (jd_lqueue_len(&s->global))
            notify_parked(s);
    }
    pthread_mutex_unlock(&s->mon_mu);
    free(last);
    free(since);
    free(reported);
    return NULL;
}

/* ---------- timers and the blocking pool ---------- */

int jd_sched_timer_after(struct jd_sched *s, uint64_t delay_ns, void (*fn)(void *arg), void *arg,
                         uint64_t *id_out)
{
    if (!s || !fn)
        return JD_EINVAL;
    return jd_timers_add(s->timers, delay_ns, fn, arg, id_out);
}

int jd_sched_timer_cancel(struct jd_sched *s, uint64_t id)
{
    if (!s)
        return JD_ENOENT;
    return jd_timers_cancel(s->timers, id);
}

int jd_sched_run_blocking(struct jd_sched *s, void (*fn)(void *arg), void *arg)
{
    if (!s || !fn)
        return JD_EINVAL;
    return jd_blocking_submit(s->blocking, fn, arg);
}
