/*
 * The work-stealing scheduler (sched.h): process control blocks and the PID
 * table, the process state machine, workers with their rings, LIFO slots and
 * inject queues, the global queue, parking, the stuck-step monitor, and the
 * glue to timers (timer.c) and the blocking pool (blocking.c).
 *
 * Process state: one 64-bit atomic word per slot, generation in the high 32
 * bits, state in bits 0-2, WAKEUP (an event arrived while Running) and KILL
 * flags above. Whoever moves a process to Ready puts it in exactly one run
 * queue; a worker runs it only after its CAS Ready -> Running succeeds, so
 * queue entries are hints and the word alone decides who runs a process.
 * Every CAS on the word retries while only a flag changed. After a move to
 * Blocked/Idle the worker re-checks the event queue (a second line of
 * defence behind WAKEUP). Events carry the generation they were sent to;
 * the consumer drops events of another generation and completions whose tag
 * is not outstanding (stale_dropped).
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
 * Memory: control blocks live in 4096-slot chunks that are never freed
 * before destroy, so a stale pid can always be looked at safely; a finished
 * slot gets generation + 1 and goes to a per-worker cache (then a global
 * free stack: an array of pointers, so refilling a cache chases no links
 * through blocks other cores wrote). Event nodes are pooled likewise (as
 * a list). No allocation on the
 * spawn/message fast path once the pools are warm.
 *
 * Parking (Tokio's protocol): nsearching counts workers looking for work to
 * steal (at most half of them), nparked the sleeping ones. Producers of
 * shared work (global/inject pushes) make their push visible seq_cst, then
 * read the counts seq_cst and wake a parked worker only if nobody searches.
 * A worker going to sleep leaves searching, counts itself parked, sets its
 * futex word, then re-checks the queues (seq_cst); the Dekker pattern means
 * either it sees the work or the producer sees it parked. No standalone
 * fences are used, so ThreadSanitizer models all of it.
 *
 * Threading: see sched.h. Worker-private fields (caches, buffers, counters
 * that only the owner writes) are touched only by their worker thread;
 * counters are relaxed atomics so statistics can read them from anywhere.
 */
#include "scheduler/sched.h"

#include "common/alloc.h"
#include "common/error.h"
#include "scheduler/blocking.h"
#include "scheduler/queue.h"
#include "scheduler/ring.h"
#include "scheduler/timer.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum {
    ST_FREE = 0,
    ST_READY = 1,
    ST_RUNNING = 2,
    ST_BLOCKED = 3,
    ST_IDLE = 4,
    ST_COMPLETE = 5,
    ST_MASK = 7,
    F_WAKEUP = 8,
    F_KILL = 16,
};

#define GEN(w) ((uint32_t)((w) >> 32))
#define ST(w) ((unsigned)((w)&ST_MASK))
#define MKSTATE(gen, st) ((uint64_t)(gen) << 32 | (st))

#define EV_KILL 100 /* internal event type carrying jd_sched_kill's error text */

#define CHUNK_SHIFT 12 /* 4096 slots per chunk: one allocation per 4096 spawns at most */
#define CHUNK_SLOTS (1u << CHUNK_SHIFT)
#define MAX_CHUNKS (1u << 16) /* 268M slots: far beyond any memory we have */
#define PCACHE_MAX 256        /* per-worker free control blocks before giving half back */
#define PCACHE_REFILL 64
#define ECACHE_MAX 1024 /* per-worker free event nodes before giving half back */
#define ECACHE_REFILL 64
#define GLOBAL_CELLS 16384 /* the global queue's array: a burst of remote spawns */
#define INJECT_CELLS 1024  /* each inject queue's array: wakes from other threads */
#define BATCH 16           /* moved from inject/global per visit, as Go and Tokio */
#define GLOBAL_INTERVAL 61 /* ticks between forced global-queue checks (Go's 61) */
#define LIFO_MAX 3         /* LIFO-slot runs in a row (Tokio 1.29's fairness fix) */
/* While work waits in the shared queues, yielded (CONTINUE) processes go
 * back to the run queue at most once per DEFER_SLICE_NS, checked at the
 * fairness tick: a yielder waits at most this slice plus one fairness
 * interval, and D yielders of step time t take about D*t/DEFER_SLICE_NS of
 * a flooded worker. An idle worker runs them at once. */
#define DEFER_SLICE_NS 1000000u
#define UNSTACK_STEPS 32 /* steps between looks for a stacked worker */
#define SPIN_ROUNDS 4    /* search rounds spinning before sched_yield */
#define YIELD_ROUNDS 16  /* ... and with sched_yield before parking */

struct evnode {
    struct jd_link link; /* first: queues link through it */
    uint32_t gen;
    uint32_t tag;
    int type;
    uint64_t value;
    char *data, *error;
};

struct proc {
    struct jd_link link; /* run queue / free list link; first member */
    _Atomic uint64_t state;
    struct jd_mpsc events;
    const struct jd_process_ops *ops;
    void *self, *user;
    char *method, *input; /* until init */
    uint32_t *tags;       /* outstanding yield tags (owner of Running only) */
    uint32_t ntags, tagcap;
    uint32_t index;
    _Atomic int last_worker; /* relaxed: an affinity hint */
    bool inited;
};

struct worker {
    struct jd_ring ring;
    struct jd_lqueue inject;
    _Alignas(64) _Atomic uint32_t parked; /* futex word: 1 while asleep; others CAS it */
    /* owner-written, read by others only when the monitor flags a stuck step */
    _Alignas(64) _Atomic(struct proc *) lifo;
    _Atomic uint64_t stepseq; /* odd while a step runs (the monitor reads it) */
    _Atomic int cpu;          /* the CPU of our latest loop round (unstack) */
    _Atomic uint64_t beat;    /* loop rounds so far (unstack: a stalled worker's stays put) */
    _Atomic bool stuck;       /* set by the monitor: thieves may empty lifo/inject */
    /* owner-written counters (relaxed, read by statistics) */
    _Alignas(64) _Atomic uint64_t c_steps, c_spawns, c_completions,
        c_steal_attempts, c_steals, c_stolen, c_parks, c_lifo_hits, c_stale;
    /* owner-only */
    _Alignas(64) struct jd_sched *s;
    unsigned index;
    pthread_t thread;
    uint32_t tick, lifo_run, rng;
    struct proc *evicted;       /* a chain the LIFO cap evicted during a flood (a hint) */
    uint32_t place_tick, watch; /* unstack(): steps since the last look, whom we watch */
    uint64_t watch_beat;        /* that worker's beat at the last look */
    bool searching;
    struct proc *pcache[PCACHE_MAX];
    unsigned npcache;
    struct evnode *ecache;
    unsigned necache;
    struct jd_event *evbuf;
    size_t evcap;
    struct jd_step_out out;
    struct jd_link *batch[BATCH + 1];
    struct proc *deferred, *deferred_tail; /* CONTINUEd processes, oldest first */
    uint64_t defer_released_ns;            /* last fairness-tick release of deferred */
    struct proc *overflow[JD_RING_SIZE / 2 + 1];
    struct proc *flushbuf[JD_RING_SIZE / 2];
};

struct jd_sched {
    struct jd_sched_hooks hooks;
    uint64_t id; /* unique per process lifetime: keys tls_pcache */
    unsigned nworkers;
    uint64_t stuck_ns;
    bool pin_workers;
    bool unstack;      /* see unstack() */
    cpu_set_t allowed; /* the process's CPUs at create */
    struct worker *workers;
    struct jd_lqueue global;
    _Alignas(64) _Atomic uint32_t nsearching;
    _Alignas(64) _Atomic uint32_t nparked;
    _Alignas(64) _Atomic bool accepting;
    _Atomic bool stop;
    /* PID table */
    _Atomic(struct proc *) *chunks;
    _Atomic uint32_t nchunks;
    pthread_mutex_t pid_mu; /* guards the free stack and chunk allocation */
    struct proc **pfree;    /* free control blocks, a stack (no links to chase) */
    size_t npfree, pfree_cap;
    /* event node pool */
    pthread_mutex_t ev_mu;
    struct evnode *efree;
    size_t nefree;
    /* counters from non-worker threads */
    _Atomic uint64_t x_spawns, x_stale, unparks, stuck_events, unstacks;
    struct jd_timers *timers;
    struct jd_blocking *blocking;
    pthread_t monitor;
    pthread_mutex_t mon_mu;
    pthread_cond_t mon_cv;
    bool mon_stop, monitor_started, shut;
    int shut_rc;
    struct jd_sched_pending shut_pending;
};

static _Thread_local struct worker *tls_worker;
static _Thread_local jd_pid tls_pid; /* the process running on this worker, or 0 */

/* Free control blocks cached by a non-worker thread that spawns (HTTP or
 * timer threads), so a remote spawn takes the table lock once per
 * TLS_PCACHE spawns. Keyed by the scheduler's unique id: a cache of another
 * (or a destroyed) scheduler is dropped, never used; the slots it held stay
 * Free in their own table. */
#define TLS_PCACHE 32
static _Atomic uint64_t sched_ids;
static _Thread_local struct {
    uint64_t id;
    unsigned n;
    struct proc *p[TLS_PCACHE];
} tls_pcache;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#define BUMP(w, field, n)                                                                          \
    atomic_store_explicit(&(w)->field,                                                             \
                          atomic_load_explicit(&(w)->field, memory_order_relaxed) + (n),           \
                          memory_order_relaxed)

static struct worker *my_worker(struct jd_sched *s)
{
    struct worker *w = tls_worker;
    return w && w->s == s ? w : NULL;
}

/* ---------- futex parking ---------- */

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
static bool unpark_worker(struct jd_sched *s, unsigned i)
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

static void unpark_any(struct jd_sched *s)
{
    unsigned n = s->nworkers;
    unsigned start = (unsigned)(uintptr_t)&start >> 6; /* cheap variety, not randomness */
    struct worker *w = tls_worker;
    if (w)
        start = w->rng;
    for (unsigned k = 0; k < n; k++)
        if (unpark_worker(s, (start + k) % n))
            return;
}

/* After pushing shared work (made visible seq_cst): wake someone unless a
 * searcher will find it. */
static void notify_parked(struct jd_sched *s)
{
    if (atomic_load_explicit(&s->nsearching, memory_order_seq_cst) != 0)
        return;
    if (atomic_load_explicit(&s->nparked, memory_order_seq_cst) == 0)
        return;
    unpark_any(s);
}

/* After pushing to our own ring: a parallelism hint only (we will run the
 * work ourselves otherwise), so relaxed reads suffice and the common case
 * costs two plain loads. */
static void notify_local(struct jd_sched *s)
{
    if (atomic_load_explicit(&s->nparked, memory_order_relaxed) == 0 ||
        atomic_load_explicit(&s->nsearching, memory_order_relaxed) != 0)
        return;
    unpark_any(s);
}

/* ---------- PID table and control block pool ---------- */

static struct proc *slot_lookup(struct jd_sched *s, uint32_t idx)
{
    uint32_t c = idx >> CHUNK_SHIFT;
    /* acquire: pairs with the release publication of a new chunk */
    if (c >= atomic_load_explicit(&s->nchunks, memory_order_acquire))
        return NULL;
    struct proc *chunk = atomic_load_explicit(&s->chunks[c], memory_order_acquire);
    return chunk ? &chunk[idx & (CHUNK_SLOTS - 1)] : NULL;
}

/* Under pid_mu: p is free. */
static void pfree_push_locked(struct jd_sched *s, struct proc *p)
{
    if (s->npfree == s->pfree_cap) {
        s->pfree_cap = s->pfree_cap ? 2 * s->pfree_cap : CHUNK_SLOTS;
        s->pfree = jd_xrealloc(s->pfree, s->pfree_cap * sizeof(*s->pfree));
    }
    s->pfree[s->npfree++] = p;
}

/* Under pid_mu: add a chunk of fresh slots to the free stack. */
static void grow_slots(struct jd_sched *s)
{
    uint32_t c = atomic_load_explicit(&s->nchunks, memory_order_relaxed);
    if (c >= MAX_CHUNKS) {
        fprintf(stderr, "jackdaw: process table full (%u slots)\n", c * CHUNK_SLOTS);
        abort();
    }
    struct proc *chunk = jd_xcalloc(CHUNK_SLOTS, sizeof(*chunk));
    for (uint32_t i = CHUNK_SLOTS; i-- > 0;) {
        struct proc *p = &chunk[i];
        atomic_init(&p->state, MKSTATE(1, ST_FREE));
        jd_mpsc_init(&p->events);
        atomic_init(&p->last_worker, -1);
        p->index = c * CHUNK_SLOTS + i;
        pfree_push_locked(s, p); /* lowest index on top */
    }
    atomic_store_explicit(&s->chunks[c], chunk, memory_order_release);
    atomic_store_explicit(&s->nchunks, c + 1, memory_order_release);
}

static struct proc *pfree_pop_locked(struct jd_sched *s)
{
    if (!s->npfree)
        grow_slots(s);
    return s->pfree[--s->npfree];
}

static struct proc *proc_alloc(struct jd_sched *s, struct worker *w)
{
    if (w && w->npcache)
        return w->pcache[--w->npcache];
    if (!w) {
        if (tls_pcache.id != s->id) {
            tls_pcache.id = s->id;
            tls_pcache.n = 0;
        }
        if (!tls_pcache.n) {
            pthread_mutex_lock(&s->pid_mu);
            while (tls_pcache.n < TLS_PCACHE)
                tls_pcache.p[tls_pcache.n++] = pfree_pop_locked(s);
            pthread_mutex_unlock(&s->pid_mu);
        }
        return tls_pcache.p[--tls_pcache.n];
    }
    pthread_mutex_lock(&s->pid_mu);
    struct proc *p = pfree_pop_locked(s);
    if (w)
        while (w->npcache < PCACHE_REFILL)
            w->pcache[w->npcache++] = pfree_pop_locked(s);
    pthread_mutex_unlock(&s->pid_mu);
    return p;
}

static void proc_release(struct jd_sched *s, struct worker *w, struct proc *p)
{
    if (w && w->npcache < PCACHE_MAX) {
        w->pcache[w->npcache++] = p;
        return;
    }
    pthread_mutex_lock(&s->pid_mu);
    pfree_push_locked(s, p);
    if (w)
        while (w->npcache > PCACHE_MAX / 2)
            pfree_push_locked(s, w->pcache[--w->npcache]);
    pthread_mutex_unlock(&s->pid_mu);
}

/* ---------- event node pool ---------- */

static struct evnode *ev_alloc(struct jd_sched *s, struct worker *w)
{
    struct evnode *e;
    if (w && w->ecache) {
        e = w->ecache;
        w->ecache = (struct evnode *)e->link.next;
        w->necache--;
        return e;
    }
    pthread_mutex_lock(&s->ev_mu);
    if (w) {
        while (s->efree && w->necache < ECACHE_REFILL) {
            e = s->efree;
            s->efree = (struct evnode *)e->link.next;
            s->nefree--;
            e->link.next = (struct jd_link *)w->ecache;
            w->ecache = e;
            w->necache++;
        }
    }
    e = s->efree;
    if (e) {
        s->efree = (struct evnode *)e->link.next;
        s->nefree--;
    }
    pthread_mutex_unlock(&s->ev_mu);
    return e ? e : jd_xmalloc(sizeof(*e));
}

static void ev_release(struct jd_sched *s, struct worker *w, struct evnode *e)
{
    if (w) {
        e->link.next = (struct jd_link *)w->ecache;
        w->ecache = e;
        if (++w->necache <= ECACHE_MAX)
            return;
        pthread_mutex_lock(&s->ev_mu);
        while (w->necache > ECACHE_MAX / 2) {
            struct evnode *x = w->ecache;
            w->ecache = (struct evnode *)x->link.next;
            w->necache--;
            x->link.next = (struct jd_link *)s->efree;
            s->efree = x;
            s->nefree++;
        }
        pthread_mutex_unlock(&s->ev_mu);
        return;
    }
    pthread_mutex_lock(&s->ev_mu);
    e->link.next = (struct jd_link *)s->efree;
    s->efree = e;
    s->nefree++;
    pthread_mutex_unlock(&s->ev_mu);
}

static void count_stale(struct jd_sched *s, struct worker *w)
{
    if (w)
        BUMP(w, c_stale, 1);
    else
        atomic_fetch_add_explicit(&s->x_stale, 1, memory_order_relaxed);
}

/* ---------- run queues ---------- */

static void overflow_to_global(struct worker *w, struct proc *p)
{
    struct jd_sched *s = w->s;
    size_t n = jd_ring_take_half(&w->ring, (void **)w->overflow);
    w->overflow[n++] = p;
    for (size_t i = 0; i + 1 < n; i++)
        w->overflow[i]->link.next = &w->overflow[i + 1]->link;
    jd_lqueue_push_chain(&s->global, &w->overflow[0]->link, &w->overflow[n - 1]->link, n);
    notify_parked(s);
}

/* Owner: newest end (run next). */
static void push_top(struct worker *w, struct proc *p)
{
    if (!jd_ring_push(&w->ring, p))
        overflow_to_global(w, p);
    notify_local(w->s);
}

/* Owner: oldest end (a cooperative yield; batches from shared queues). */
static void push_bottom(struct worker *w, struct proc *p)
{
    if (!jd_ring_push_back(&w->ring, p) && !jd_ring_push(&w->ring, p))
        overflow_to_global(w, p);
    notify_local(w->s);
}

/* Owner: put p in the LIFO slot; the previous occupant goes to the ring. */
static void push_lifo(struct worker *w, struct proc *p)
{
    /* acq_rel: exchanges with a thief's acquire exchange on a stuck worker */
    struct proc *old = atomic_exchange_explicit(&w->lifo, p, memory_order_acq_rel);
    if (old)
        push_top(w, old);
}

static void push_inject(struct jd_sched *s, unsigned i, struct proc *p)
{
    jd_lqueue_push(&s->workers[i].inject, &p->link); /* seq_cst length store */
    unpark_worker(s, i);                             /* seq_cst read of its futex word */
}

static void push_global(struct jd_sched *s, struct proc *p)
{
    jd_lqueue_push(&s->global, &p->link);
    notify_parked(s);
}

/* p was just made Ready by us (a wake): queue it. msg: a message send, which
 * prefers the sender's LIFO slot (latency); completions prefer the worker
 * the process last ran on. */
static void schedule_woken(struct jd_sched *s, struct proc *p, bool msg)
{
    struct worker *w = my_worker(s);
    int lw = atomic_load_explicit(&p->last_worker, memory_order_relaxed);
    if (w && (msg || lw < 0 || (unsigned)lw == w->index)) {
        push_lifo(w, p);
        return;
    }
    if (lw >= 0 && (unsigned)lw < s->nworkers)
        push_inject(s, (unsigned)lw, p);
    else
        push_global(s, p);
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

/* ---------- searching and stealing ---------- */

static bool enter_searching(struct worker *w)
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

static void leave_searching(struct worker *w)
{
    w->searching = false;
    /* seq_cst: the last searcher to find work wakes another (Tokio's rule) */
    if (atomic_fetch_sub_explicit(&w->s->nsearching, 1, memory_order_seq_cst) == 1)
        notify_parked(w->s);
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

/* A cooperative yield (CONTINUE) waits on a private list until the worker
 * has nothing else to do or the fairness tick comes (as Tokio defers
 * yield_now), so freshly spawned and woken work runs first. */
static void defer(struct worker *w, struct proc *p)
{
    p->link.next = NULL;
    if (w->deferred_tail)
        w->deferred_tail->link.next = &p->link;
    else
        w->deferred = p;
    w->deferred_tail = p;
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
    if (s->nworkers > 1 && enter_searching(w) && (p = steal(w)))
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

static void park(struct worker *w)
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

/* ---------- running processes ---------- */

static void free_event_payloads(struct jd_event *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(ev[i].data);
        free(ev[i].error);
    }
}

static bool take_tag(struct proc *p, uint32_t tag)
{
    for (uint32_t i = 0; i < p->ntags; i++) {
        if (p->tags[i] == tag) {
            p->tags[i] = p->tags[--p->ntags];
            return true;
        }
    }
    return false;
}

static void add_tag(struct proc *p, uint32_t tag)
{
    if (p->ntags == p->tagcap) {
        p->tagcap = p->tagcap ? p->tagcap * 2 : 4;
        p->tags = jd_xrealloc(p->tags, p->tagcap * sizeof(*p->tags));
    }
    p->tags[p->ntags++] = tag;
}

static void drop_event(struct jd_sched *s, struct worker *w, struct evnode *e)
{
    free(e->data);
    free(e->error);
    ev_release(s, w, e);
}

/* Drain the process's events into w->evbuf. Returns the count; if a kill
 * event is found, *kill receives its text (owned) and the rest are dropped. */
static size_t collect_events(struct worker *w, struct proc *p, uint32_t gen, char **kill,
                             bool *killed)
{
    struct jd_sched *s = w->s;
    size_t n = 0;
    struct jd_link *l = jd_mpsc_take_all(&p->events);
    while (l) {
        struct evnode *e = (struct evnode *)l;
        l = l->next;
        if (e->gen != gen || *killed ||
            (e->type == JD_EVENT_YIELD_COMPLETE && !take_tag(p, e->tag))) {
            if (e->type != EV_KILL)
                count_stale(s, w);
            drop_event(s, w, e);
            continue;
        }
        if (e->type == EV_KILL) {
            *killed = true;
            *kill = e->data;
            e->data = NULL;
            drop_event(s, w, e);
            continue;
        }
        if (n == w->evcap) {
            w->evcap = w->evcap ? w->evcap * 2 : 16;
            w->evbuf = jd_xrealloc(w->evbuf, w->evcap * sizeof(*w->evbuf));
        }
        struct jd_event *ev = &w->evbuf[n++];
        ev->type = (enum jd_event_type)e->type;
        ev->tag = e->tag;
        ev->value = e->value;
        ev->data = e->data;
        ev->error = e->error;
        ev_release(s, w, e);
    }
    if (*killed) {
        free_event_payloads(w->evbuf, n);
        n = 0;
    }
    return n;
}

/* The process is Running and ours: complete it, recycle the slot. */
static void finish(struct worker *w, struct proc *p, uint32_t gen, enum jd_step_status status,
                   const char *result, const char *error)
{
    struct jd_sched *s = w->s;
    jd_pid pid = (uint64_t)gen << 32 | p->index;
    /* release: later senders see Complete and get JD_ENOENT */
    atomic_store_explicit(&p->state, MKSTATE(gen, ST_COMPLETE), memory_order_release);
    BUMP(w, c_completions, 1);
    if (s->hooks.finished)
        s->hooks.finished(s->hooks.ctx, pid, p->user, status, result, error);
    if (p->ops->close)
        p->ops->close(p->self);
    free(p->method);
    free(p->input);
    free(p->tags);
    p->method = p->input = NULL;
    p->tags = NULL;
    p->ntags = p->tagcap = 0;
    struct jd_link *l = jd_mpsc_take_all(&p->events);
    while (l) {
        struct evnode *e = (struct evnode *)l;
        l = l->next;
        if (e->type != EV_KILL)
            count_stale(s, w);
        drop_event(s, w, e);
    }
    uint32_t ng = gen + 1 ? gen + 1 : 1;
    /* release: the slot's fields are reset before anyone can reuse it */
    atomic_store_explicit(&p->state, MKSTATE(ng, ST_FREE), memory_order_release);
    proc_release(s, w, p);
}

static void finish_killed(struct worker *w, struct proc *p, uint32_t gen, char *text)
{
    if (!text) {
        char *dummy = NULL;
        bool killed = false;
        size_t n = collect_events(w, p, gen, &dummy, &killed);
        free_event_payloads(w->evbuf, n);
        text = dummy;
    }
    finish(w, p, gen, JD_STEP_FAIL, NULL, text ? text : "{\"kind\":\"killed\"}");
    free(text);
}

static char *json_escape_error(const char *kind, const char *msg)
{
    size_t len = strlen(msg);
    char *esc = jd_xmalloc(len * 6 + 1), *o = esc;
    for (const unsigned char *c = (const unsigned char *)msg; *c; c++) {
        if (*c == '"' || *c == '\\') {
            *o++ = '\\';
            *o++ = (char)*c;
        } else if (*c < 0x20) {
            o += sprintf(o, "\\u%04x", *c);
        } else {
            *o++ = (char)*c;
        }
    }
    *o = 0;
    char *r = jd_xasprintf("{\"kind\":\"%s\",\"message\":\"%s\"}", kind, esc);
    free(esc);
    return r;
}

static void dispatch_yields(struct jd_sched *s, jd_pid pid, void *user, struct jd_step_out *out)
{
    for (size_t i = 0; i < out->nyields; i++) {
        struct jd_token tok = {.pid = pid, .tag = out->yields[i].tag};
        if (s->hooks.dispatch)
            s->hooks.dispatch(s->hooks.ctx, pid, user, &out->yields[i], tok);
        else
            jd_sched_complete(s, tok, NULL, jd_xstrdup("{\"kind\":\"no_dispatcher\"}"));
    }
}

static void run_locked(struct worker *w, struct proc *p, uint64_t nw, uint32_t gen, jd_pid pid);

static void run(struct worker *w, struct proc *p)
{
    uint64_t st = atomic_load_explicit(&p->state, memory_order_relaxed);
    uint64_t nw;
    do {
        if (ST(st) != ST_READY)
            return; /* a stale hint */
        nw = (st & ~(uint64_t)(ST_MASK | F_WAKEUP)) | ST_RUNNING;
        /* acquire: see everything the one who made it Ready wrote */
    } while (!atomic_compare_exchange_weak_explicit(&p->state, &st, nw, memory_order_acquire,
                                                    memory_order_relaxed));
    uint32_t gen = GEN(nw);
    jd_pid pid = (uint64_t)gen << 32 | p->index;
    atomic_store_explicit(&p->last_worker, (int)w->index, memory_order_relaxed);
    tls_pid = pid;
    run_locked(w, p, nw, gen, pid);
    tls_pid = 0;
}

/* run(), once p is Running and ours. */
static void run_locked(struct worker *w, struct proc *p, uint64_t nw, uint32_t gen, jd_pid pid)
{
    struct jd_sched *s = w->s;
    uint64_t st;
    if (nw & F_KILL) {
        finish_killed(w, p, gen, NULL);
        return;
    }
    struct jd_step_out *out = &w->out;
    if (!p->inited) {
        p->inited = true;
        if (p->ops->init) {
            struct jd_error err;
            jd_error_clear(&err);
            int rc = p->ops->init(p->self, p->method, p->input, &err);
            if (rc) {
                char *e = json_escape_error("init_failed",
                                            err.message[0] ? err.message : jd_strerror(rc));
                finish(w, p, gen, JD_STEP_FAIL, NULL, e);
                free(e);
                return;
            }
        }
        free(p->method);
        free(p->input);
        p->method = p->input = NULL;
    }
    char *kill = NULL;
    bool killed = false;
    size_t n = collect_events(w, p, gen, &kill, &killed);
    if (killed) {
        finish_killed(w, p, gen, kill);
        return;
    }
    uint64_t seq = atomic_load_explicit(&w->stepseq, memory_order_relaxed);
    atomic_store_explicit(&w->stepseq, seq + 1, memory_order_relaxed);
    int rc = p->ops->step(p->self, w->evbuf, n, out);
    atomic_store_explicit(&w->stepseq, seq + 2, memory_order_relaxed);
    free_event_payloads(w->evbuf, n);
    BUMP(w, c_steps, 1);
    if (rc)
        jd_step_fail_take(out, jd_xasprintf("{\"kind\":\"step_error\",\"code\":%d}", rc));
    enum jd_step_status status = out->status;
    if (status == JD_STEP_DONE || status == JD_STEP_FAIL) {
        finish(w, p, gen, status, out->result, out->error);
        jd_step_out_reset(out);
        return;
    }
    if (s->hooks.stepped)
        s->hooks.stepped(s->hooks.ctx, pid, p->user, status);
    for (size_t i = 0; i < out->nyields; i++)
        add_tag(p, out->yields[i].tag);
    void *user = p->user;
    unsigned target = status == JD_STEP_CONTINUE ? ST_READY
                      : status == JD_STEP_WAIT   ? ST_BLOCKED
                                                 : ST_IDLE;
    st = nw;
    unsigned to;
    for (;;) {
        if (st & F_KILL) {
            jd_step_out_reset(out);
            finish_killed(w, p, gen, NULL);
            return;
        }
        to = (st & F_WAKEUP) ? ST_READY : target;
        /* seq_cst: the worker half of the wake-up Dekker pattern (the sender
         * pushes its event seq_cst, then CASes this word) */
        if (atomic_compare_exchange_weak_explicit(&p->state, &st,
                                                  (st & ~(uint64_t)(ST_MASK | F_WAKEUP)) | to,
                                                  memory_order_seq_cst, memory_order_relaxed))
            break;
    }
    if (to == ST_READY) {
        if (target == ST_READY)
            defer(w, p); /* a cooperative yield goes to the back */
        else
            push_top(w, p); /* woken while running: it has events to handle */
    } else if (jd_mpsc_nonempty(&p->events)) {
        /* Re-check after the move to Blocked/Idle. p may already be running
         * elsewhere or recycled: the CAS names the generation and state. */
        uint64_t exp = MKSTATE(gen, to);
        if (atomic_compare_exchange_strong_explicit(&p->state, &exp, MKSTATE(gen, ST_READY),
                                                    memory_order_seq_cst, memory_order_relaxed))
            push_top(w, p);
    }
    dispatch_yields(s, pid, user, out);
    jd_step_out_reset(out);
}

/* Pin the calling worker to the (index mod n)-th CPU of the process's
 * affinity mask; a failure leaves it unpinned (a hint, not a contract). */
static void pin_self(unsigned index)
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

/* Every UNSTACK_STEPS steps, look at one other worker (in turn): if it has
 * not gone round its loop since the last look, is not parked, and last
 * went round on the CPU we are on now, it is waiting for our CPU: the
 * kernel has stacked two workers on one CPU (it does, for milliseconds,
 * while a third thread keeps waking on the other one). Step off this CPU:
 * narrow our affinity to the others, which migrates us, then restore it.
 * Only when there are no more workers than allowed CPUs and workers are
 * not pinned. */
static void unstack(struct worker *w)
{
    struct jd_sched *s = w->s;
    if (++w->place_tick < UNSTACK_STEPS)
        return;
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

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct jd_sched *s = w->s;
    if (s->pin_workers)
        pin_self(w->index);
    tls_worker = w;
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
                leave_searching(w);
            idle = 0;
            run(w, p);
            if (s->unstack)
                unstack(w);
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
            park(w);
            idle = 0;
        }
    }
    if (w->searching) {
        w->searching = false;
        atomic_fetch_sub_explicit(&s->nsearching, 1, memory_order_seq_cst);
    }
    tls_worker = NULL;
    return NULL;
}

/* ---------- the monitor: stuck steps ---------- */

static void *monitor_main(void *arg)
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
                unpark_any(s);
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

/* ---------- public API ---------- */

int jd_sched_create(const struct jd_sched_config *cfg, struct jd_sched **out)
{
    struct jd_sched_config def = {0};
    if (!cfg)
        cfg = &def;
    if (!out)
        return JD_EINVAL;
    *out = NULL;
    struct jd_sched *s = jd_xcalloc(1, sizeof(*s));
    s->hooks = cfg->hooks;
    s->id = atomic_fetch_add_explicit(&sched_ids, 1, memory_order_relaxed) + 1;
    unsigned nw = cfg->workers;
    if (nw == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        nw = c > 0 ? (unsigned)c : 1;
    }
    if (nw > 1024)
        nw = 1024;
    s->nworkers = nw;
    s->stuck_ns = cfg->stuck_ns ? cfg->stuck_ns : 10000000u;
    s->pin_workers = cfg->pin_workers;
    if (sched_getaffinity(0, sizeof(s->allowed), &s->allowed) == 0)
        s->unstack = !s->pin_workers && nw > 1 && (int)nw <= CPU_COUNT(&s->allowed);
    s->workers = aligned_alloc(64, sizeof(struct worker) * nw);
    if (!s->workers) {
        fprintf(stderr, "jackdaw: out of memory for workers\n");
        abort();
    }
    memset(s->workers, 0, sizeof(struct worker) * nw);
    jd_lqueue_init(&s->global, GLOBAL_CELLS);
    atomic_init(&s->nsearching, 0);
    atomic_init(&s->nparked, 0);
    atomic_init(&s->accepting, true);
    atomic_init(&s->stop, false);
    s->chunks = jd_xcalloc(MAX_CHUNKS, sizeof(*s->chunks));
    atomic_init(&s->nchunks, 0);
    pthread_mutex_init(&s->pid_mu, NULL);
    pthread_mutex_init(&s->ev_mu, NULL);
    pthread_mutex_init(&s->mon_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->mon_cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = jd_timers_create(&s->timers);
    if (rc)
        goto fail;
    jd_blocking_create(cfg->blocking_threads ? cfg->blocking_threads : JD_SCHED_BLOCKING_DEFAULT,
                       cfg->blocking_queue ? cfg->blocking_queue : 4096, &s->blocking);
    for (unsigned i = 0; i < nw; i++) {
        struct worker *w = &s->workers[i];
        jd_ring_init(&w->ring);
        jd_lqueue_init(&w->inject, INJECT_CELLS);
        w->s = s;
        w->index = i;
        w->rng = 0x9E3779B9u * (i + 1) | 1;
        w->watch = nw > 1 ? (i + 1) % nw : 0;
        atomic_init(&w->cpu, -1);
    }
    unsigned started = 0;
    for (; started < nw; started++)
        if (pthread_create(&s->workers[started].thread, NULL, worker_main, &s->workers[started]) !=
            0)
            break;
    if (started < nw) {
        atomic_store(&s->stop, true);
        for (unsigned i = 0; i < started; i++) {
            unpark_worker(s, i);
            pthread_join(s->workers[i].thread, NULL);
        }
        rc = JD_EIO;
        goto fail;
    }
    if (pthread_create(&s->monitor, NULL, monitor_main, s) == 0)
        s->monitor_started = true;
    *out = s;
    return 0;
fail:
    jd_blocking_destroy(s->blocking);
    jd_timers_destroy(s->timers);
    for (unsigned i = 0; i < nw; i++)
        jd_lqueue_destroy(&s->workers[i].inject);
    jd_lqueue_destroy(&s->global);
    free(s->chunks);
    free(s->pfree);
    free(s->workers);
    free(s);
    return rc;
}

int jd_sched_spawn(struct jd_sched *s, const struct jd_process_ops *ops, void *self, void *user,
                   const char *method, const char *input, jd_pid *pid_out)
{
    if (!s || !ops || !ops->step) {
        if (ops && ops->close)
            ops->close(self);
        return JD_EINVAL;
    }
    /* acquire: pairs with the release store in shutdown */
    if (!atomic_load_explicit(&s->accepting, memory_order_acquire)) {
        if (ops->close)
            ops->close(self);
        return JD_ESHUTDOWN;
    }
    struct worker *w = my_worker(s);
    struct proc *p = proc_alloc(s, w);
    p->ops = ops;
    p->self = self;
    p->user = user;
    p->method = method ? jd_xstrdup(method) : NULL;
    p->input = input ? jd_xstrdup(input) : NULL;
    p->inited = false;
    p->ntags = 0;
    atomic_store_explicit(&p->last_worker, -1, memory_order_relaxed);
    uint32_t gen = GEN(atomic_load_explicit(&p->state, memory_order_relaxed));
    jd_pid pid = (uint64_t)gen << 32 | p->index;
    if (pid_out)
        *pid_out = pid;
    /* release: the fields above are visible to the worker's acquire CAS */
    atomic_store_explicit(&p->state, MKSTATE(gen, ST_READY), memory_order_release);
    if (w) {
        BUMP(w, c_spawns, 1);
        push_lifo(w, p);
    } else {
        atomic_fetch_add_explicit(&s->x_spawns, 1, memory_order_relaxed);
        push_global(s, p);
    }
    return 0;
}

/* Find a live process by pid, or NULL. */
static struct proc *live_proc(struct jd_sched *s, jd_pid pid)
{
    if (!s || !pid)
        return NULL;
    struct proc *p = slot_lookup(s, (uint32_t)pid);
    if (!p)
        return NULL;
    uint64_t st = atomic_load_explicit(&p->state, memory_order_acquire);
    if (GEN(st) != (uint32_t)(pid >> 32) || ST(st) == ST_FREE || ST(st) == ST_COMPLETE)
        return NULL;
    return p;
}

/* After pushing an event for generation gen: make the process Ready if it
 * waits, or flag WAKEUP if it runs. */
static void wake(struct jd_sched *s, struct proc *p, uint32_t gen, bool msg, bool kill)
{
    uint64_t st = atomic_load_explicit(&p->state, memory_order_seq_cst);
    for (;;) {
        if (GEN(st) != gen)
            return;
        uint64_t nw;
        switch (ST(st)) {
        case ST_READY:
            if (!kill || (st & F_KILL))
                return;
            nw = st | F_KILL;
            break;
        case ST_RUNNING:
            nw = st | F_WAKEUP | (kill ? F_KILL : 0);
            if (nw == st)
                return;
            break;
        case ST_BLOCKED:
        case ST_IDLE:
            nw = (st & ~(uint64_t)(ST_MASK | F_WAKEUP)) | ST_READY | (kill ? F_KILL : 0);
            break;
        default:
            return; /* finished meanwhile: the event is dropped by the recycler */
        }
        /* seq_cst: the sender half of the wake-up Dekker pattern */
        if (atomic_compare_exchange_weak_explicit(&p->state, &st, nw, memory_order_seq_cst,
                                                  memory_order_seq_cst)) {
            if (ST(st) == ST_BLOCKED || ST(st) == ST_IDLE)
                schedule_woken(s, p, msg);
            return;
        }
    }
}

static int post_event(struct jd_sched *s, jd_pid pid, int type, uint32_t tag, uint64_t value,
                      char *data, char *error, int gone)
{
    struct proc *p = live_proc(s, pid);
    if (!p) {
        free(data);
        free(error);
        if (s) {
            struct worker *w = my_worker(s);
            if (type == JD_EVENT_YIELD_COMPLETE)
                count_stale(s, w);
        }
        return gone;
    }
    uint32_t gen = (uint32_t)(pid >> 32);
    struct evnode *e = ev_alloc(s, my_worker(s));
    e->gen = gen;
    e->tag = tag;
    e->type = type;
    e->value = value;
    e->data = data;
    e->error = error;
    jd_mpsc_push(&p->events, &e->link);
    wake(s, p, gen, type == JD_EVENT_MESSAGE, type == EV_KILL);
    return 0;
}

int jd_sched_complete(struct jd_sched *s, struct jd_token token, char *result, char *error)
{
    if (token.tag == 0) {
        free(result);
        free(error);
        return JD_ESTALE;
    }
    return post_event(s, token.pid, JD_EVENT_YIELD_COMPLETE, token.tag, 0, result, error,
                      JD_ESTALE);
}

int jd_sched_send(struct jd_sched *s, jd_pid pid, uint64_t value, char *data)
{
    return post_event(s, pid, JD_EVENT_MESSAGE, 0, value, data, NULL, JD_ENOENT);
}

int jd_sched_cancel(struct jd_sched *s, jd_pid pid)
{
    return post_event(s, pid, JD_EVENT_CANCEL, 0, 0, NULL, NULL, JD_ENOENT);
}

int jd_sched_kill(struct jd_sched *s, jd_pid pid, const char *error)
{
    if (!live_proc(s, pid))
        return JD_ENOENT;
    return post_event(s, pid, EV_KILL, 0, 0, jd_xstrdup(error ? error : "{\"kind\":\"killed\"}"),
                      NULL, JD_ENOENT);
}

jd_pid jd_sched_self(void)
{
    return tls_pid;
}

int jd_sched_current_worker(void)
{
    return tls_worker ? (int)tls_worker->index : -1;
}

unsigned jd_sched_workers(const struct jd_sched *s)
{
    return s ? s->nworkers : 0;
}

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

static void count_states(struct jd_sched *s, uint64_t *ready, uint64_t *running, uint64_t *blocked,
                         uint64_t *idle)
{
    *ready = *running = *blocked = *idle = 0;
    uint32_t nc = atomic_load_explicit(&s->nchunks, memory_order_acquire);
    for (uint32_t c = 0; c < nc; c++) {
        struct proc *chunk = atomic_load_explicit(&s->chunks[c], memory_order_acquire);
        for (uint32_t i = 0; i < CHUNK_SLOTS; i++) {
            /* relaxed: a gauge, not a decision */
            switch (ST(atomic_load_explicit(&chunk[i].state, memory_order_relaxed))) {
            case ST_READY:
                (*ready)++;
                break;
            case ST_RUNNING:
                (*running)++;
                break;
            case ST_BLOCKED:
                (*blocked)++;
                break;
            case ST_IDLE:
                (*idle)++;
                break;
            default:
                break;
            }
        }
    }
}

void jd_sched_stats(struct jd_sched *s, struct jd_sched_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!s)
        return;
    count_states(s, &out->ready, &out->running, &out->blocked, &out->idle);
    out->spawns = atomic_load_explicit(&s->x_spawns, memory_order_relaxed);
    out->stale_dropped = atomic_load_explicit(&s->x_stale, memory_order_relaxed);
    out->unparks = atomic_load_explicit(&s->unparks, memory_order_relaxed);
    out->stuck_events = atomic_load_explicit(&s->stuck_events, memory_order_relaxed);
    out->unstacks = atomic_load_explicit(&s->unstacks, memory_order_relaxed);
    for (unsigned i = 0; i < s->nworkers; i++) {
        struct worker *w = &s->workers[i];
#define RD(f) atomic_load_explicit(&w->f, memory_order_relaxed)
        out->spawns += RD(c_spawns);
        out->completions += RD(c_completions);
        out->steps += RD(c_steps);
        out->steal_attempts += RD(c_steal_attempts);
        out->steals += RD(c_steals);
        out->stolen_items += RD(c_stolen);
        out->parks += RD(c_parks);
        out->lifo_hits += RD(c_lifo_hits);
        out->stale_dropped += RD(c_stale);
#undef RD
        out->inject_depth += jd_lqueue_len(&w->inject);
    }
    out->global_depth = jd_lqueue_len(&s->global);
    out->timers_pending = jd_timers_pending(s->timers);
    jd_blocking_counts(s->blocking, &out->blocking_active, &out->blocking_queued);
    out->workers = s->nworkers;
}

/* Any process Ready or Running? (The state words decide, not the queues,
 * which a worker empties just before it starts a step.) */
static bool busy(struct jd_sched *s)
{
    uint64_t ready, running, blocked, idle;
    count_states(s, &ready, &running, &blocked, &idle);
    return ready + running > 0;
}

int jd_sched_shutdown(struct jd_sched *s, uint64_t grace_ns, struct jd_sched_pending *pending)
{
    if (!s)
        return JD_EINVAL;
    if (s->shut) {
        if (pending)
            *pending = s->shut_pending;
        return s->shut_rc;
    }
    /* release: spawns that see false return JD_ESHUTDOWN */
    atomic_store_explicit(&s->accepting, false, memory_order_release);
    uint64_t deadline = jd_timers_now_ns() + grace_ns;
    int rc = 0;
    while (busy(s)) {
        if (jd_timers_now_ns() >= deadline) {
            rc = JD_ETIMEOUT;
            break;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    atomic_store_explicit(&s->stop, true, memory_order_seq_cst);
    for (unsigned i = 0; i < s->nworkers; i++)
        unpark_worker(s, i);
    for (unsigned i = 0; i < s->nworkers; i++)
        pthread_join(s->workers[i].thread, NULL);
    pthread_mutex_lock(&s->mon_mu);
    s->mon_stop = true;
    pthread_cond_broadcast(&s->mon_cv);
    pthread_mutex_unlock(&s->mon_mu);
    if (s->monitor_started)
        pthread_join(s->monitor, NULL);
    struct jd_sched_pending pd = {0};
    pd.timers = jd_timers_stop(s->timers);
    pd.blocking = jd_blocking_stop(s->blocking);
    uint64_t running;
    count_states(s, &pd.ready, &running, &pd.blocked, &pd.idle);
    pd.ready += running;
    s->shut = true;
    s->shut_rc = rc;
    s->shut_pending = pd;
    if (pending)
        *pending = pd;
    return rc;
}

static void free_event_list(struct jd_link *l)
{
    while (l) {
        struct evnode *e = (struct evnode *)l;
        l = l->next;
        free(e->data);
        free(e->error);
        free(e);
    }
}

void jd_sched_destroy(struct jd_sched *s)
{
    if (!s)
        return;
    jd_sched_shutdown(s, 0, NULL);
    uint32_t nc = atomic_load_explicit(&s->nchunks, memory_order_acquire);
    for (uint32_t c = 0; c < nc; c++) {
        struct proc *chunk = atomic_load_explicit(&s->chunks[c], memory_order_acquire);
        for (uint32_t i = 0; i < CHUNK_SLOTS; i++) {
            struct proc *p = &chunk[i];
            unsigned st = ST(atomic_load_explicit(&p->state, memory_order_acquire));
            if (st != ST_FREE && st != ST_COMPLETE && p->ops->close)
                p->ops->close(p->self);
            free(p->method);
            free(p->input);
            free(p->tags);
            free_event_list(jd_mpsc_take_all(&p->events));
        }
        free(chunk);
    }
    for (unsigned i = 0; i < s->nworkers; i++) {
        struct worker *w = &s->workers[i];
        struct evnode *e = w->ecache;
        while (e) {
            struct evnode *next = (struct evnode *)e->link.next;
            free(e);
            e = next;
        }
        free(w->evbuf);
        jd_step_out_reset(&w->out);
        free(w->out.yields);
        jd_lqueue_destroy(&w->inject);
    }
    struct evnode *e = s->efree;
    while (e) {
        struct evnode *next = (struct evnode *)e->link.next;
        free(e);
        e = next;
    }
    jd_blocking_destroy(s->blocking);
    jd_timers_destroy(s->timers);
    jd_lqueue_destroy(&s->global);
    pthread_mutex_destroy(&s->pid_mu);
    pthread_mutex_destroy(&s->ev_mu);
    pthread_mutex_destroy(&s->mon_mu);
    pthread_cond_destroy(&s->mon_cv);
    free(s->chunks);
    free(s->pfree);
    free(s->workers);
    free(s);
}
