/*
 * Finding work: the run queues (a worker's ring, LIFO slot and inject
 * queue, the global queue), stealing, the deferred yielders, and the
 * worker loop (find work, run it, spin, yield, park). The loop lives here
 * so that find_work and the step's entry inline into it: the hot path of
 * every step stays in one file, as fast as it was in one.
 *
 * Run order (find_work): every 61st tick the inject queue, the global
 * queue, then the oldest local item first; otherwise the LIFO slot (the
 * process this worker just spawned or woke, at most 3 in a row; an evicted
 * chain also pulls its fair share of the shared queues, and while other
 * work waits it runs one link per turn from then on, not a fresh run of
 * 3), the ring's newest item,
 * the inject queue (one plus up to 16 moved), the global queue (likewise),
 * stealing half of a random victim's ring (searchers only), and last the
 * processes that yielded (CONTINUE), which wait on a private list until the
 * worker has nothing else (as Tokio defers yield_now) and then go back to
 * the ring, stealable, in batches of one CAS. The fairness tick releases
 * them too, but while work waits in the shared queues (a flood of remote
 * spawns) at most once per DEFER_SLICE_NS (at once when a worker is
 * parked and could run them): they cannot starve, and a flood is not
 * slowed by a round of every yielder per 61 ticks.
 *
 * Threading: everything here runs on the worker that owns w (its thread). Other workers
 * touch its ring only through jd_ring_steal_half, its inject queue and LIFO
 * slot only when the monitor flagged it stuck (worker.stuck); the shared
 * queues are lock-free (queue.c).
 */
#include "scheduler/sched_impl.h"

#include "scheduler/timer.h"

void sched_overflow_to_global(struct worker *w, struct proc *p)
{
    struct jd_sched *s = w->s;
    size_t n = jd_ring_take_half(&w->ring, (void **)w->overflow);
    w->overflow[n++] = p;
    for (size_t i = 0; i + 1 < n; i++)
        w->overflow[i]->link.next = &w->overflow[i + 1]->link;
    jd_lqueue_push_chain(&s->global, &w->overflow[0]->link, &w->overflow[n - 1]->link, n);
    notify_parked(s);
}

/* Move a batch from a shared queue: run the first, the rest to our ring. */
static struct proc *take_batch(struct worker *w, struct jd_lqueue *q, size_t max)
{
    size_t room = JD_RING_SIZE - jd_ring_len(&w->ring);
    if (max > room + 1)
        max = room + 1;
    size_t n = jd_lqueue_pop_batch(q, w->batch, max);
    if (n == 0)
        return NULL;
    for (size_t i = 1; i < n; i++)
        push_bottom(w, (struct proc *)w->batch[i]);
    return (struct proc *)w->batch[0];
}

/* Move this worker's fair share of a shared queue (its length / W + 1,
 * at least BATCH + 1, at most the free ring less one) to the bottom of our
 * ring. Used only when the LIFO cap evicts a self-waking chain: such a
 * chain gets the worker back after each batch, so a batch of 16 would let
 * a backlog of remote spawns wait one chain round per 16 of them. */
static size_t pull_fair_share(struct worker *w, struct jd_lqueue *q)
{
    size_t room = JD_RING_SIZE - jd_ring_len(&w->ring);
    size_t max = jd_lqueue_len(q) / w->s->nworkers + 1;
    if (max < BATCH + 1)
        max = BATCH + 1;
    if (max + 1 > room)
        max = room > 0 ? room - 1 : 0; /* leave a slot for the evicted chain */
    size_t n = 0;
    while (n < max) {
        size_t chunk = max - n < BATCH + 1 ? max - n : BATCH + 1;
        size_t got = jd_lqueue_pop_batch(q, w->batch, chunk);
        for (size_t i = 0; i < got; i++)
            push_bottom(w, (struct proc *)w->batch[i]);
        n += got;
        if (got < chunk)
            break;
    }
    return n;
}

static uint32_t next_rand(struct worker *w)
{
    /* xorshift32: victim choice needs spread, not quality */
    uint32_t x = w->rng;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    w->rng = x;
    return x;
}

static struct proc *steal(struct worker *w)
{
    struct jd_sched *s = w->s;
    unsigned n = s->nworkers;
    unsigned start = next_rand(w) % n;
    for (unsigned k = 0; k < n; k++) {
        unsigned i = (start + k) % n;
        if (i == w->index)
            continue;
        struct worker *v = &s->workers[i];
        BUMP(w, c_steal_attempts, 1);
        size_t moved;
        struct proc *p = jd_ring_steal_half(&v->ring, &w->ring, &moved);
        if (p) {
            BUMP(w, c_steals, 1);
            BUMP(w, c_stolen, moved);
            return p;
        }
        /* relaxed: the flag is a hint; the exchange/lock give the ordering */
        if (atomic_load_explicit(&v->stuck, memory_order_relaxed)) {
            p = atomic_exchange_explicit(&v->lifo, NULL, memory_order_acq_rel);
            if (!p)
                p = take_batch(w, &v->inject, BATCH + 1);
            if (p) {
                BUMP(w, c_steals, 1);
                BUMP(w, c_stolen, 1);
                return p;
            }
        }
    }
    return take_batch(w, &s->global, BATCH + 1);
}

/* Move every deferred process to the oldest end of the ring (stealable),
 * in batches of one CAS each. */
static void flush_deferred(struct worker *w)
{
    struct proc *p = w->deferred;
    w->deferred = w->deferred_tail = NULL;
    while (p) {
        size_t n = 0;
        while (p && n < JD_RING_SIZE / 2) {
            w->flushbuf[n++] = p;
            p = (struct proc *)p->link.next;
        }
        size_t k = jd_ring_push_back_many(&w->ring, (void *const *)w->flushbuf, n);
        for (size_t i = k; i < n; i++)
            push_bottom(w, w->flushbuf[i]);
    }
    notify_local(w->s);
}

/* At the fairness tick, the yielders go back to the ring (as Tokio's
 * maintenance wakes its deferred tasks every 61 ticks), except while work
 * waits in the shared queues (remote spawns, new requests: a flood): then
 * only once their slice has passed, so they still run while the flood
 * lasts but do not take a round of every yielder per 61 short ticks. A
 * parked worker could run them in parallel: release them at once
 * (flush_deferred wakes it). */
static void release_deferred_if_due(struct worker *w)
{
    struct jd_sched *s = w->s;
    /* hints (queue lengths read seq_cst, nparked relaxed): a wrong guess
     * costs one early or late release, never a lost one */
    bool flood = jd_lqueue_len(&w->inject) || jd_lqueue_len(&s->global);
    if (flood && atomic_load_explicit(&s->nparked, memory_order_relaxed) == 0) {
        uint64_t now = jd_timers_now_ns();
        if (now - w->defer_released_ns < DEFER_SLICE_NS)
            return;
        w->defer_released_ns = now;
    }
    flush_deferred(w);
}

/* p, taken from anywhere but the LIFO slot, runs next: a fresh LIFO run
 * starts after it, unless p is the chain the LIFO cap evicted, whose
 * successor then queues at once (see find_work). */
static struct proc *took(struct worker *w, struct proc *p)
{
    if (p == w->evicted) {
        w->evicted = NULL;
        w->lifo_run = LIFO_MAX;
    } else {
        w->lifo_run = 0;
    }
    return p;
}

static struct proc *find_work(struct worker *w)
{
    struct jd_sched *s = w->s;
    struct proc *p;
    if (++w->tick % GLOBAL_INTERVAL == 0) {
        if (w->deferred)
            release_deferred_if_due(w);
        /* fairness: shared queues and the oldest local work first, now and then */
        if ((p = take_batch(w, &w->inject, BATCH + 1)) ||
            (p = take_batch(w, &s->global, BATCH + 1)) || (p = jd_ring_pop_back(&w->ring)))
            return took(w, p);
    }
    if (atomic_load_explicit(&w->lifo, memory_order_relaxed)) {
        p = atomic_exchange_explicit(&w->lifo, NULL, memory_order_acq_rel);
        if (p) {
            if (w->lifo_run < LIFO_MAX) {
                w->lifo_run++;
                BUMP(w, c_lifo_hits, 1);
                return p;
            }
            /* A chain of self-waking processes: let the others run first,
             * shared queues included (such chains starve them). The ring
             * then holds, top to bottom: what was there, a batch from the
             * inject or global queue, and the chain. */
            if (!pull_fair_share(w, &w->inject))
                pull_fair_share(w, &s->global);
            push_bottom(w, p);
            /* The chain has had its run: while other work waits, its link
             * runs once when it comes back round and the next one queues
             * behind that work again (took()). Alone, it keeps its LIFO run. */
            w->evicted = jd_ring_len(&w->ring) > 1 ? p : NULL;
        }
    }
    if ((p = jd_ring_pop(&w->ring)))
        return took(w, p);
    if ((p = take_batch(w, &w->inject, BATCH + 1)))
        return took(w, p);
    if ((p = take_batch(w, &s->global, BATCH + 1)))
        return took(w, p);
    if (s->nworkers > 1 && sched_enter_searching(w) && (p = steal(w)))
        return took(w, p);
    if (w->deferred) {
        /* Nothing else to do: the yielded processes go back to the ring
         * (one CAS per batch), where thieves can take them too: a worker
         * preempted by the OS or stuck in a step must not hold them. */
        flush_deferred(w);
        if ((p = jd_ring_pop(&w->ring)))
            return took(w, p);
    }
    return NULL;
}

/* ---------- the worker loop ---------- */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* A worker thread: find work and run it; with none, spin, then yield the
 * CPU, then park. */
void *sched_worker_main(void *arg)
{
    struct worker *w = arg;
    struct jd_sched *s = w->s;
    if (s->pin_workers)
        sched_pin_self(w->index);
    sched_tls_worker = w;
    unsigned idle = 0;
    while (!atomic_load_explicit(&s->stop, memory_order_acquire)) {
        if (s->unstack) {
            /* relaxed: hints for unstack() on other workers */
            atomic_store_explicit(&w->beat,
                                  atomic_load_explicit(&w->beat, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
            atomic_store_explicit(&w->cpu, sched_getcpu(), memory_order_relaxed);
        }
        struct proc *p = find_work(w);
        if (p) {
            if (w->searching)
                sched_leave_searching(w);
            idle = 0;
            sched_run(w, p);
            if (s->unstack && ++w->place_tick >= UNSTACK_STEPS)
                sched_unstack(w);
            continue;
        }
        if (idle < SPIN_ROUNDS) {
            idle++;
            for (int i = 0; i < 32; i++)
                cpu_relax();
        } else if (idle < YIELD_ROUNDS) {
            idle++;
            sched_yield();
        } else {
            sched_park(w);
            idle = 0;
        }
    }
    if (w->searching) {
        w->searching = false;
        atomic_fetch_sub_explicit(&s->nsearching, 1, memory_order_seq_cst);
    }
    sched_tls_worker = NULL;
    return NULL;
}
