/*
 * Internals of the scheduler shared by its files. Not a public contract
 * (that is sched.h): only scheduler/sched*.c include it.
 *
 *   sched.c        create, shutdown, destroy, spawn, events (complete, send,
 *                  cancel, kill), statistics; the PID table's growth
 *   sched_find.c   the run queues and finding work: the run order, batches
 *                  from shared queues, stealing, deferred yielders; the
 *                  worker loop
 *   sched_run.c    running a process: init, one step, its events, its end
 *   sched_park.c   searching, parking and unparking workers (futexes)
 *   sched_pool.c   CPU placement of workers, the stuck-step monitor, the
 *                  timers and blocking pool glue
 *
 * The helpers below are on the spawn / wake / step fast path, so they stay
 * static inline here rather than becoming calls between files (measured:
 * two calls more per step cost chained_spawn about 5%).
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
 * Memory: control blocks live in 4096-slot chunks that are never freed
 * before destroy, so a stale pid can always be looked at safely; a finished
 * slot gets generation + 1 and goes to a per-worker cache (then a global
 * free stack: an array of pointers, so refilling a cache chases no links
 * through blocks other cores wrote). Event nodes are pooled likewise (as
 * a list). No allocation on the
 * spawn/message fast path once the pools are warm.
 *
 * Threading: see sched.h. Worker-private fields (caches, buffers, counters
 * that only the owner writes) are touched only by their worker thread;
 * counters are relaxed atomics so statistics can read them from anywhere.
 * jd_sched.pid_mu guards the free stack of control blocks and chunk
 * allocation, jd_sched.ev_mu the free list of event nodes, jd_sched.mon_mu
 * the monitor's stop flag; everything else shared is atomic.
 */
#ifndef JD_SCHEDULER_SCHED_IMPL_H
#define JD_SCHEDULER_SCHED_IMPL_H

#include "scheduler/sched.h"

#include "common/alloc.h"
#include "scheduler/queue.h"
#include "scheduler/ring.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

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
    uint64_t id; /* unique per process lifetime: keys sched_tls_pcache */
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

extern _Thread_local struct worker *sched_tls_worker;
extern _Thread_local jd_pid sched_tls_pid; /* the process running on this worker, or 0 */

/* Free control blocks cached by a non-worker thread that spawns (HTTP or
 * timer threads), so a remote spawn takes the table lock once per
 * TLS_PCACHE spawns. Keyed by the scheduler's unique id: a cache of another
 * (or a destroyed) scheduler is dropped, never used; the slots it held stay
 * Free in their own table. */
#define TLS_PCACHE 32
struct sched_tls_pcache {
    uint64_t id;
    unsigned n;
    struct proc *p[TLS_PCACHE];
};
extern _Thread_local struct sched_tls_pcache sched_tls_pcache;

#define BUMP(w, field, n)                                                                          \
    atomic_store_explicit(&(w)->field,                                                             \
                          atomic_load_explicit(&(w)->field, memory_order_relaxed) + (n),           \
                          memory_order_relaxed)

static inline struct worker *my_worker(struct jd_sched *s)
{
    struct worker *w = sched_tls_worker;
    return w && w->s == s ? w : NULL;
}

/* sched.c: the PID table's free stack. Under pid_mu. */
void sched_pfree_push_locked(struct jd_sched *s, struct proc *p);
struct proc *sched_pfree_pop_locked(struct jd_sched *s);

/* sched_park.c */
bool sched_unpark_worker(struct jd_sched *s, unsigned i);
void sched_unpark_any(struct jd_sched *s);
void sched_park(struct worker *w);
bool sched_enter_searching(struct worker *w);
void sched_leave_searching(struct worker *w);

/* sched_find.c: a worker thread's entry point (arg: the worker), and the
 * ring's overflow (owner worker only). */
void *sched_worker_main(void *arg);
void sched_overflow_to_global(struct worker *w, struct proc *p);

/* sched_run.c (owner worker only): run p, which is Running and ours. */
void sched_run_locked(struct worker *w, struct proc *p, uint64_t nw, uint32_t gen, jd_pid pid);

/* sched_pool.c: the monitor thread's entry point (arg: the scheduler), and
 * CPU placement for a worker (on that worker). */
void *sched_monitor_main(void *arg);
void sched_pin_self(unsigned index);
void sched_unstack(struct worker *w);

static inline struct proc *slot_lookup(struct jd_sched *s, uint32_t idx)
{
    uint32_t c = idx >> CHUNK_SHIFT;
    /* acquire: pairs with the release publication of a new chunk */
    if (c >= atomic_load_explicit(&s->nchunks, memory_order_acquire))
        return NULL;
    struct proc *chunk = atomic_load_explicit(&s->chunks[c], memory_order_acquire);
    return chunk ? &chunk[idx & (CHUNK_SLOTS - 1)] : NULL;
}

static inline struct proc *proc_alloc(struct jd_sched *s, struct worker *w)
{
    if (w && w->npcache)
        return w->pcache[--w->npcache];
    if (!w) {
        if (sched_tls_pcache.id != s->id) {
            sched_tls_pcache.id = s->id;
            sched_tls_pcache.n = 0;
        }
        if (!sched_tls_pcache.n) {
            pthread_mutex_lock(&s->pid_mu);
            while (sched_tls_pcache.n < TLS_PCACHE)
                sched_tls_pcache.p[sched_tls_pcache.n++] = sched_pfree_pop_locked(s);
            pthread_mutex_unlock(&s->pid_mu);
        }
        return sched_tls_pcache.p[--sched_tls_pcache.n];
    }
    pthread_mutex_lock(&s->pid_mu);
    struct proc *p = sched_pfree_pop_locked(s);
    if (w)
        while (w->npcache < PCACHE_REFILL)
            w->pcache[w->npcache++] = sched_pfree_pop_locked(s);
    pthread_mutex_unlock(&s->pid_mu);
    return p;
}

static inline void proc_release(struct jd_sched *s, struct worker *w, struct proc *p)
{
    if (w && w->npcache < PCACHE_MAX) {
        w->pcache[w->npcache++] = p;
        return;
    }
    pthread_mutex_lock(&s->pid_mu);
    sched_pfree_push_locked(s, p);
    if (w)
        while (w->npcache > PCACHE_MAX / 2)
            sched_pfree_push_locked(s, w->pcache[--w->npcache]);
    pthread_mutex_unlock(&s->pid_mu);
}

static inline struct evnode *ev_alloc(struct jd_sched *s, struct worker *w)
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

static inline void ev_release(struct jd_sched *s, struct worker *w, struct evnode *e)
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

static inline void count_stale(struct jd_sched *s, struct worker *w)
{
    if (w)
        BUMP(w, c_stale, 1);
    else
        atomic_fetch_add_explicit(&s->x_stale, 1, memory_order_relaxed);
}

/* After pushing shared work (made visible seq_cst): wake someone unless a
 * searcher will find it. */
static inline void notify_parked(struct jd_sched *s)
{
    if (atomic_load_explicit(&s->nsearching, memory_order_seq_cst) != 0)
        return;
    if (atomic_load_explicit(&s->nparked, memory_order_seq_cst) == 0)
        return;
    sched_unpark_any(s);
}

/* After pushing to our own ring: a parallelism hint only (we will run the
 * work ourselves otherwise), so relaxed reads suffice and the common case
 * costs two plain loads. */
static inline void notify_local(struct jd_sched *s)
{
    if (atomic_load_explicit(&s->nparked, memory_order_relaxed) == 0 ||
        atomic_load_explicit(&s->nsearching, memory_order_relaxed) != 0)
        return;
    sched_unpark_any(s);
}

/* Owner: newest end (run next). */
static inline void push_top(struct worker *w, struct proc *p)
{
    if (!jd_ring_push(&w->ring, p))
        sched_overflow_to_global(w, p);
    notify_local(w->s);
}

/* Owner: oldest end (a cooperative yield; batches from shared queues). */
static inline void push_bottom(struct worker *w, struct proc *p)
{
    if (!jd_ring_push_back(&w->ring, p) && !jd_ring_push(&w->ring, p))
        sched_overflow_to_global(w, p);
    notify_local(w->s);
}

/* Owner: put p in the LIFO slot; the previous occupant goes to the ring. */
static inline void push_lifo(struct worker *w, struct proc *p)
{
    /* acq_rel: exchanges with a thief's acquire exchange on a stuck worker */
    struct proc *old = atomic_exchange_explicit(&w->lifo, p, memory_order_acq_rel);
    if (old)
        push_top(w, old);
}

static inline void push_inject(struct jd_sched *s, unsigned i, struct proc *p)
{
    jd_lqueue_push(&s->workers[i].inject, &p->link); /* seq_cst length store */
    sched_unpark_worker(s, i);                       /* seq_cst read of its futex word */
}

static inline void push_global(struct jd_sched *s, struct proc *p)
{
    jd_lqueue_push(&s->global, &p->link);
    notify_parked(s);
}

/* p was just made Ready by us (a wake): queue it. msg: a message send, which
 * prefers the sender's LIFO slot (latency); completions prefer the worker
 * the process last ran on. */
static inline void schedule_woken(struct jd_sched *s, struct proc *p, bool msg)
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

/* A cooperative yield (CONTINUE) waits on a private list until the worker
 * has nothing else to do or the fairness tick comes (as Tokio defers
 * yield_now), so freshly spawned and woken work runs first. */
static inline void defer(struct worker *w, struct proc *p)
{
    p->link.next = NULL;
    if (w->deferred_tail)
        w->deferred_tail->link.next = &p->link;
    else
        w->deferred = p;
    w->deferred_tail = p;
}

/* Run p if it is still Ready (queue entries are hints): the CAS Ready ->
 * Running makes it ours. Inline: once per step, as the worker loop's own code. */
static inline void sched_run(struct worker *w, struct proc *p)
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
    sched_tls_pid = pid;
    sched_run_locked(w, p, nw, gen, pid);
    sched_tls_pid = 0;
}

#endif
