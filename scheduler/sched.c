/*
 * The work-stealing scheduler (sched.h): create, shutdown and destroy, spawn,
 * events sent to processes (complete, send, cancel, kill) with the wake-up
 * of their process, statistics, and the PID table's growth. How the parts
 * fit together, the process state word and memory: scheduler/sched_impl.h;
 * the run order: sched_find.c; parking: sched_park.c.
 *
 * Threading: see sched.h. create/shutdown/destroy run on the owner thread;
 * spawn and the event functions on any thread (a sender pushes its event
 * seq_cst, then CASes the state word: the sender half of the wake-up Dekker
 * pattern, the worker half is in sched_run.c). The free stack of control
 * blocks and chunk allocation are under jd_sched.pid_mu.
 */
#include "scheduler/sched_impl.h"

#include "common/error.h"
#include "scheduler/blocking.h"
#include "scheduler/timer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic uint64_t sched_ids;
_Thread_local struct worker *sched_tls_worker;
_Thread_local jd_pid sched_tls_pid;
_Thread_local struct sched_tls_pcache sched_tls_pcache;

/* ---------- PID table ---------- */

/* Under pid_mu: p is free. */
void sched_pfree_push_locked(struct jd_sched *s, struct proc *p)
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
        sched_pfree_push_locked(s, p); /* lowest index on top */
    }
    atomic_store_explicit(&s->chunks[c], chunk, memory_order_release);
    atomic_store_explicit(&s->nchunks, c + 1, memory_order_release);
}

struct proc *sched_pfree_pop_locked(struct jd_sched *s)
{
    if (!s->npfree)
        grow_slots(s);
    return s->pfree[--s->npfree];
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
        if (pthread_create(&s->workers[started].thread, NULL, sched_worker_main,
                           &s->workers[started]) != 0)
            break;
    if (started < nw) {
        atomic_store(&s->stop, true);
        for (unsigned i = 0; i < started; i++) {
            sched_unpark_worker(s, i);
            pthread_join(s->workers[i].thread, NULL);
        }
        rc = JD_EIO;
        goto fail;
    }
    for (unsigned i = 0; i < nw; i++)
        pthread_setname_np(s->workers[i].thread, "jd-worker");
    if (pthread_create(&s->monitor, NULL, sched_monitor_main, s) == 0) {
        pthread_setname_np(s->monitor, "jd-monitor");
        s->monitor_started = true;
    }
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
    return sched_tls_pid;
}

int jd_sched_current_worker(void)
{
    return sched_tls_worker ? (int)sched_tls_worker->index : -1;
}

unsigned jd_sched_workers(const struct jd_sched *s)
{
    return s ? s->nworkers : 0;
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
        sched_unpark_worker(s, i);
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
