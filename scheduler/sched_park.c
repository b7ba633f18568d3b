/*
 * Parking and waking workers (Tokio's protocol). nsearching counts workers
 * looking for work to steal (at most half of them), nparked the sleeping
 * ones. Producers of shared work (global/inject pushes) make their push
 * visible seq_cst, then read the counts seq_cst and wake a parked worker
 * only if nobody searches. A worker going to sleep leaves searching, counts
 * itself parked, sets its futex word, then re-checks the queues (seq_cst);
 * the Dekker pattern means either it sees the work or the producer sees it
 * parked. No standalone fences are used, so ThreadSanitizer models all of
 * it.
 *
 * Threading: sched_park, sched_enter_searching and sched_leave_searching
 * run on the worker itself; sched_unpark_worker / sched_unpark_any on any
 * thread (producers, the monitor, shutdown). Everything shared here is
 * atomic: the counts nsearching and nparked, and each worker's futex word
 * (worker.parked), which other threads change only by CAS.
 */
#include "scheduler/sched_impl.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* Wake worker i if it is parked; it wakes as a searcher. The searcher
 * count goes up before the CAS so the woken worker's later decrement can
 * never run first (a brief over-count only delays a notification that the
 * awake worker's own queue checks make unnecessary). */
bool sched_unpark_worker(struct jd_sched *s, unsigned i)
{
    struct worker *v = &s->workers[i];
    uint32_t one = 1;
    /* seq_cst: part of the parking Dekker pattern (see the file comment) */
    if (atomic_load_explicit(&v->parked, memory_order_seq_cst) != 1)
        return false;
    atomic_fetch_add_explicit(&s->nsearching, 1, memory_order_seq_cst);
    if (!atomic_compare_exchange_strong_explicit(&v->parked, &one, 0, memory_order_seq_cst,
                                                 memory_order_relaxed)) {
        atomic_fetch_sub_explicit(&s->nsearching, 1, memory_order_seq_cst);
        return false;
    }
    atomic_fetch_sub_explicit(&s->nparked, 1, memory_order_seq_cst);
    atomic_fetch_add_explicit(&s->unparks, 1, memory_order_relaxed);
    futex_wake(&v->parked);
    return true;
}

void sched_unpark_any(struct jd_sched *s)
{
    unsigned n = s->nworkers;
    unsigned start = (unsigned)(uintptr_t)&start >> 6; /* cheap variety, not randomness */
    struct worker *w = sched_tls_worker;
    if (w)
        start = w->rng;
    for (unsigned k = 0; k < n; k++)
        if (sched_unpark_worker(s, (start + k) % n))
            return;
}

/* Is there work this worker should wake up for? (seq_cst reads: the
 * re-check half of the parking Dekker pattern.) */
static bool work_visible(struct worker *w)
{
    struct jd_sched *s = w->s;
    if (jd_lqueue_len(&s->global) || jd_lqueue_len(&w->inject))
        return true;
    if (atomic_load_explicit(&s->nsearching, memory_order_seq_cst) != 0)
        return false; /* a searcher will look at the rings */
    for (unsigned i = 0; i < s->nworkers; i++) {
        struct worker *v = &s->workers[i];
        if (i != w->index && jd_ring_len(&v->ring))
            return true;
        if (atomic_load_explicit(&v->stuck, memory_order_relaxed) &&
            (atomic_load_explicit(&v->lifo, memory_order_relaxed) || jd_lqueue_len(&v->inject)))
            return true;
    }
    return false;
}

void sched_park(struct worker *w)
{
    struct jd_sched *s = w->s;
    if (w->searching) {
        w->searching = false;
        atomic_fetch_sub_explicit(&s->nsearching, 1, memory_order_seq_cst);
    }
    atomic_fetch_add_explicit(&s->nparked, 1, memory_order_seq_cst);
    atomic_store_explicit(&w->parked, 1, memory_order_seq_cst);
    if (work_visible(w) || atomic_load_explicit(&s->stop, memory_order_seq_cst)) {
        uint32_t one = 1;
        if (atomic_compare_exchange_strong_explicit(&w->parked, &one, 0, memory_order_seq_cst,
                                                    memory_order_relaxed))
            atomic_fetch_sub_explicit(&s->nparked, 1, memory_order_seq_cst);
        else
            w->searching = true; /* a waker already counted us as searching */
        return;
    }
    BUMP(w, c_parks, 1);
    /* acquire: pairs with the waker's CAS, which follows its push */
    while (atomic_load_explicit(&w->parked, memory_order_acquire) == 1)
        futex_wait(&w->parked, 1);
    w->searching = true;
}

bool sched_enter_searching(struct worker *w)
{
    if (w->searching)
        return true;
    struct jd_sched *s = w->s;
    uint32_t n = atomic_load_explicit(&s->nsearching, memory_order_relaxed);
    do {
        if (2 * n >= s->nworkers && !(s->nworkers == 1 && n == 0))
            return false; /* at most half the workers search at once */
    } while (!atomic_compare_exchange_weak_explicit(&s->nsearching, &n, n + 1, memory_order_seq_cst,
                                                    memory_order_relaxed));
    w->searching = true;
    return true;
}

void sched_leave_searching(struct worker *w)
{
    w->searching = false;
    /* seq_cst: the last searcher to find work wakes another (Tokio's rule) */
    if (atomic_fetch_sub_explicit(&w->s->nsearching, 1, memory_order_seq_cst) == 1)
        notify_parked(w->s);
}
