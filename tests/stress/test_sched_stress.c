/*
 * Concurrency stress for the scheduler, meant for ThreadSanitizer (`make
 * test` builds tests/stress/ under TSan; `make tsan` runs with
 * JD_STRESS=long for millions of items). Each test counts that every item
 * ran exactly once, that no wake-up was lost (bounded waits), and that
 * finished/close hooks fire exactly once per process:
 *   - ring: one owner pushing/popping at both ends, three thieves;
 *   - spawn storms from outside threads and from inside workers (trees);
 *   - ping-pong message pairs;
 *   - yields completed from foreign threads, with duplicate completions;
 *   - concurrent send/cancel/kill against idle and running processes;
 *   - the spawn_many_remote_busy2 fairness shape.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "scheduler/ring.h"
#include "scheduler/sched.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bool long_mode;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Wait until *v reaches want, at most secs; returns whether it did. */
static bool wait_count(_Atomic long *v, long want, int secs)
{
    uint64_t end = now_ns() + (uint64_t)secs * 1000000000u;
    while (atomic_load(v) < want) {
        if (now_ns() > end)
            return false;
        sleep_ms(1);
    }
    return true;
}

/* ---------------- ring ---------------- */
#define ITEM(i) ((void *)(uintptr_t)((i) + 1))
#define NUM(p) ((uintptr_t)(p)-1)
static _Atomic unsigned char *ring_seen;
static _Atomic long ring_dups;
static struct jd_ring *victim;
static _Atomic bool ring_done;

static void ring_mark(void *p)
{
    if (atomic_fetch_add_explicit(&ring_seen[NUM(p)], 1, memory_order_relaxed) != 0)
        atomic_fetch_add(&ring_dups, 1);
}

static void *ring_thief(void *arg)
{
    (void)arg;
    struct jd_ring *mine = aligned_alloc(64, sizeof(*mine));
    jd_ring_init(mine);
    for (;;) {
        void *p = jd_ring_steal_half(victim, mine, NULL);
        if (p) {
            ring_mark(p);
            /* let others steal from us too: pop only half now */
            while ((p = jd_ring_pop_back(mine)))
                ring_mark(p);
        } else if (atomic_load(&ring_done) && jd_ring_len(victim) == 0) {
            break;
        }
    }
    free(mine);
    return NULL;
}

static void test_ring_many_thieves(void **state)
{
    (void)state;
    long n = long_mode ? 5000000 : 300000;
    ring_seen = calloc((size_t)n, 1);
    atomic_store(&ring_dups, 0);
    atomic_store(&ring_done, false);
    victim = aligned_alloc(64, sizeof(*victim));
    jd_ring_init(victim);
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, ring_thief, NULL);
    for (long i = 0; i < n; i++) {
        bool ok = (i & 7) == 0 ? jd_ring_push_back(victim, ITEM(i)) : false;
        if (!ok && !jd_ring_push(victim, ITEM(i))) {
            void *out[JD_RING_SIZE / 2];
            size_t k = jd_ring_take_half(victim, out); /* the overflow path */
            for (size_t j = 0; j < k; j++)
                ring_mark(out[j]);
            if (!jd_ring_push(victim, ITEM(i)))
                ring_mark(ITEM(i));
        }
        if (i % 5 == 0) {
            void *p = (i & 1) ? jd_ring_pop(victim) : jd_ring_pop_back(victim);
            if (p)
                ring_mark(p);
        }
    }
    void *p;
    while ((p = jd_ring_pop(victim)))
        ring_mark(p);
    atomic_store(&ring_done, true);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    long missing = 0;
    for (long i = 0; i < n; i++)
        if (atomic_load(&ring_seen[i]) == 0)
            missing++;
    assert_int_equal(atomic_load(&ring_dups), 0);
    assert_int_equal(missing, 0);
    free((void *)ring_seen);
    free(victim);
}

/* ---------------- scheduler hooks: count finishes ---------------- */
static _Atomic long finished, closed_count;
static struct jd_sched *S;

static void on_finished(void *ctx, jd_pid pid, void *user, enum jd_step_status st,
                        const char *result, const char *error)
{
    (void)ctx;
    (void)pid;
    (void)user;
    (void)st;
    (void)result;
    (void)error;
    atomic_fetch_add(&finished, 1);
}

static struct jd_sched *make(unsigned workers,
                             void (*dispatch)(void *, jd_pid, void *, const struct jd_yield *,
                                              struct jd_token))
{
    atomic_store(&finished, 0);
    atomic_store(&closed_count, 0);
    struct jd_sched_config cfg = {.workers = workers};
    cfg.hooks.finished = on_finished;
    cfg.hooks.dispatch = dispatch;
    assert_int_equal(jd_sched_create(&cfg, &S), 0);
    return S;
}

/* ---------------- spawn storms ----------------
 * self encodes (index << 8 | fanout depth). A process with depth > 0 spawns
 * 4 children (inside a worker); every process marks its index once. */
static _Atomic unsigned char *seen;
static _Atomic long next_index, dups;

static void mark_index(long i)
{
    if (atomic_fetch_add_explicit(&seen[i], 1, memory_order_relaxed) != 0)
        atomic_fetch_add(&dups, 1);
}

static const struct jd_process_ops storm_ops;
static int storm_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)ev;
    (void)n;
    uintptr_t v = (uintptr_t)self;
    long idx = (long)(v >> 8);
    unsigned depth = v & 0xff;
    mark_index(idx);
    if (depth > 0) {
        for (int k = 0; k < 4; k++) {
            long c = atomic_fetch_add(&next_index, 1);
            int rc = jd_sched_spawn(S, &storm_ops, (void *)((uintptr_t)c << 8 | (depth - 1)), NULL,
                                    NULL, NULL, NULL);
            assert_int_equal(rc, 0);
        }
    }
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops storm_ops = {.type_name = "storm", .step = storm_step};

static long roots_per_thread;
static void *storm_producer(void *arg)
{
    (void)arg;
    for (long i = 0; i < roots_per_thread; i++) {
        long c = atomic_fetch_add(&next_index, 1);
        /* every 8th root grows a tree of depth 3 (1 + 4 + 16 + 64 processes) */
        unsigned depth = (i % 8 == 0) ? 3 : 0;
        while (jd_sched_spawn(S, &storm_ops, (void *)((uintptr_t)c << 8 | depth), NULL, NULL, NULL,
                              NULL) != 0)
            ;
    }
    return NULL;
}

static void test_spawn_storms_exactly_once(void **state)
{
    (void)state;
    roots_per_thread = long_mode ? 200000 : 8000;
    long expected =
        3 * (roots_per_thread - (roots_per_thread + 7) / 8) + 3 * ((roots_per_thread + 7) / 8) * 85;
    seen = calloc((size_t)expected + 16, 1);
    atomic_store(&next_index, 0);
    atomic_store(&dups, 0);
    make(long_mode ? 4 : 3, NULL);
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, storm_producer, NULL);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    assert_true(wait_count(&finished, expected, long_mode ? 600 : 60));
    assert_int_equal(atomic_load(&next_index), expected);
    assert_int_equal(atomic_load(&dups), 0);
    for (long i = 0; i < expected; i++)
        assert_int_equal(atomic_load(&seen[i]), 1);
    struct jd_sched_stats st;
    jd_sched_stats(S, &st);
    assert_int_equal(st.spawns, expected);
    assert_int_equal(st.completions, expected);
    jd_sched_destroy(S);
    free((void *)seen);
}

/* ---------------- ping-pong ---------------- */
/* A pair: the pinger starts by messaging its partner; each side replies to
 * value with value+1 until the count reaches the target. Pids are swapped
 * through the first message (value carries the sender's pid in data-less
 * form: the first message's value is the pinger's pid, later ones count). */
struct pair {
    jd_pid a, b;
    _Atomic long hits;
};
static long pp_rounds;
static _Atomic long pairs_done;

static int pp_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    struct pair *pr = (struct pair *)((uintptr_t)self & ~(uintptr_t)1);
    bool is_a = ((uintptr_t)self & 1) == 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = ev[i].value;
        atomic_fetch_add_explicit(&pr->hits, 1, memory_order_relaxed);
        if ((long)v >= pp_rounds) {
            /* the first to reach the target tells its partner, then both finish */
            if ((long)v == pp_rounds)
                assert_int_equal(jd_sched_send(S, is_a ? pr->b : pr->a, v + 1, NULL), 0);
            else
                atomic_fetch_add(&pairs_done, 1);
            out->status = JD_STEP_DONE;
            return 0;
        }
        int rc = jd_sched_send(S, is_a ? pr->b : pr->a, v + 1, NULL);
        assert_int_equal(rc, 0);
    }
    out->status = JD_STEP_IDLE;
    return 0;
}
static const struct jd_process_ops pp_ops = {.type_name = "pp", .step = pp_step};

static void test_ping_pong_messages(void **state)
{
    (void)state;
    int npairs = 8;
    pp_rounds = long_mode ? 250000 : 4000; /* messages per pair */
    atomic_store(&pairs_done, 0);
    make(2, NULL);
    struct pair *pr = aligned_alloc(64, sizeof(*pr) * (size_t)npairs);
    for (int i = 0; i < npairs; i++) {
        atomic_init(&pr[i].hits, 0);
        assert_int_equal(jd_sched_spawn(S, &pp_ops, &pr[i], NULL, NULL, NULL, &pr[i].a), 0);
        assert_int_equal(
            jd_sched_spawn(S, &pp_ops, (void *)((uintptr_t)&pr[i] | 1), NULL, NULL, NULL, &pr[i].b),
            0);
    }
    /* both idle with no events at first; start each exchange from outside */
    for (int i = 0; i < npairs; i++)
        assert_int_equal(jd_sched_send(S, pr[i].b, 1, NULL), 0);
    long done_target = npairs;
    assert_true(wait_count(&pairs_done, done_target, long_mode ? 600 : 60));
    assert_true(wait_count(&finished, 2 * npairs, 10));
    for (int i = 0; i < npairs; i++)
        assert_true(atomic_load(&pr[i].hits) >= pp_rounds);
    jd_sched_destroy(S);
    free(pr);
}

/* ---------------- foreign completions with duplicates ---------------- */
#define TOKQ 4096
static struct jd_token tokq[TOKQ];
static _Atomic long tok_head, tok_tail;
static pthread_mutex_t tok_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic bool handlers_stop;
static _Atomic long delivered, dup_sent;

static void yield_dispatch(void *ctx, jd_pid pid, void *user, const struct jd_yield *y,
                           struct jd_token tok)
{
    (void)ctx;
    (void)pid;
    (void)user;
    (void)y;
    pthread_mutex_lock(&tok_mu);
    long t = atomic_load(&tok_tail);
    if (t - atomic_load(&tok_head) < TOKQ) {
        tokq[t % TOKQ] = tok;
        atomic_store(&tok_tail, t + 1);
        pthread_mutex_unlock(&tok_mu);
        return;
    }
    pthread_mutex_unlock(&tok_mu);
    jd_sched_complete(S, tok, NULL, NULL); /* queue full: complete inline */
}

static void *handler_thread(void *arg)
{
    (void)arg;
    while (!atomic_load(&handlers_stop)) {
        pthread_mutex_lock(&tok_mu);
        long h = atomic_load(&tok_head);
        if (h == atomic_load(&tok_tail)) {
            pthread_mutex_unlock(&tok_mu);
            sched_yield();
            continue;
        }
        struct jd_token tok = tokq[h % TOKQ];
        atomic_store(&tok_head, h + 1);
        pthread_mutex_unlock(&tok_mu);
        jd_sched_complete(S, tok, strdup("1"), NULL);
        if (h % 3 == 0) {
            /* a duplicate: must never be delivered twice */
            jd_sched_complete(S, tok, strdup("dup"), NULL);
            atomic_fetch_add(&dup_sent, 1);
        }
    }
    return NULL;
}

static long yields_per_proc;
static int yielding_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    long *count = self;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ev[i].type, JD_EVENT_YIELD_COMPLETE);
        assert_int_equal(ev[i].tag, (uint32_t)*count);
        assert_string_equal(ev[i].data, "1");
        atomic_fetch_add(&delivered, 1);
    }
    /* Woken without our completion (a dropped duplicate may wake us): keep
     * waiting. This comes first: finishing here would leave the last
     * completion undelivered. */
    if (n == 0 && *count > 0) {
        out->status = JD_STEP_WAIT;
        return 0;
    }
    if (*count >= yields_per_proc) {
        out->status = JD_STEP_DONE;
        return 0;
    }
    ++*count;
    jd_step_yield(out, (uint32_t)*count, "x", NULL, 0);
    out->status = JD_STEP_WAIT;
    return 0;
}
static const struct jd_process_ops yielding_ops = {.type_name = "y", .step = yielding_step};

static void test_foreign_completions_exactly_once(void **state)
{
    (void)state;
    int nproc = 64;
    yields_per_proc = long_mode ? 20000 : 300;
    atomic_store(&tok_head, 0);
    atomic_store(&tok_tail, 0);
    atomic_store(&handlers_stop, false);
    atomic_store(&delivered, 0);
    atomic_store(&dup_sent, 0);
    make(2, yield_dispatch);
    pthread_t h[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&h[i], NULL, handler_thread, NULL);
    long *counts = calloc((size_t)nproc, sizeof(*counts));
    for (int i = 0; i < nproc; i++)
        assert_int_equal(jd_sched_spawn(S, &yielding_ops, &counts[i], NULL, NULL, NULL, NULL), 0);
    assert_true(wait_count(&finished, nproc, long_mode ? 600 : 60));
    atomic_store(&handlers_stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(h[i], NULL);
    assert_int_equal(atomic_load(&delivered), nproc * yields_per_proc);
    assert_true(atomic_load(&dup_sent) > 0);
    /* Every duplicate was dropped, and counted when dropped. A duplicate
     * posted just as its process finished lands in the freed slot's event
     * queue and is counted only when the slot is reused (the new process
     * drops it as another generation's): at most one per process here, as
     * only the last tag's duplicate can race the finish. */
    struct jd_sched_stats st;
    jd_sched_stats(S, &st);
    uint64_t sent = (uint64_t)atomic_load(&dup_sent);
    if (st.stale_dropped < sent)
        print_message("%llu duplicates, %llu counted so far\n", (unsigned long long)sent,
                      (unsigned long long)st.stale_dropped);
    assert_true(st.stale_dropped + (uint64_t)nproc >= sent);
    jd_sched_destroy(S);
    free(counts);
}

/* ---------------- send / cancel / kill races ---------------- */
static int racy_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].type == JD_EVENT_CANCEL) {
            jd_step_fail(out, "{\"kind\":\"cancelled\"}");
            return 0;
        }
    }
    out->status = (n % 2) ? JD_STEP_CONTINUE : JD_STEP_IDLE;
    return 0;
}
static void racy_close(void *self)
{
    (void)self;
    atomic_fetch_add(&closed_count, 1);
}
static const struct jd_process_ops racy_ops = {
    .type_name = "racy", .step = racy_step, .close = racy_close};

static jd_pid *racy_pids;
static int racy_n;
static void *racer(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int round = 0; round < (long_mode ? 200000 : 6000); round++) {
        seed = seed * 1103515245 + 12345;
        jd_pid pid = racy_pids[(seed >> 8) % (unsigned)racy_n];
        switch ((seed >> 20) % 8) {
        case 0:
            jd_sched_kill(S, pid, NULL);
            break;
        case 1:
            jd_sched_cancel(S, pid);
            break;
        default:
            jd_sched_send(S, pid, round, (seed & 1) ? strdup("\"d\"") : NULL);
            break;
        }
    }
    return NULL;
}

static void test_send_cancel_kill_races(void **state)
{
    (void)state;
    racy_n = 200;
    make(2, NULL);
    racy_pids = calloc((size_t)racy_n, sizeof(*racy_pids));
    for (int i = 0; i < racy_n; i++)
        assert_int_equal(jd_sched_spawn(S, &racy_ops, NULL, NULL, NULL, NULL, &racy_pids[i]), 0);
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, racer, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    /* finish the survivors; every process finishes and closes exactly once */
    for (int i = 0; i < racy_n; i++)
        jd_sched_kill(S, racy_pids[i], NULL);
    assert_true(wait_count(&finished, racy_n, 30));
    assert_true(wait_count(&closed_count, racy_n, 30));
    sleep_ms(20);
    assert_int_equal(atomic_load(&finished), racy_n);
    assert_int_equal(atomic_load(&closed_count), racy_n);
    for (int i = 0; i < racy_n; i++)
        assert_int_equal(jd_sched_send(S, racy_pids[i], 1, NULL), JD_ENOENT);
    jd_sched_destroy(S);
    assert_int_equal(atomic_load(&closed_count), racy_n);
    free(racy_pids);
}

/* ---------------- busy2 fairness ---------------- */
static _Atomic bool chain_on;
static _Atomic long chains_alive, remote_left;
static const struct jd_process_ops chain_ops;
static int chain_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    (void)ev;
    (void)n;
    if (atomic_load(&chain_on)) {
        uint64_t end = now_ns() + 10000;
        while (now_ns() < end)
            ;
        jd_sched_spawn(S, &chain_ops, NULL, NULL, NULL, NULL, NULL);
    } else {
        atomic_fetch_sub(&chains_alive, 1);
    }
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops chain_ops = {.type_name = "chain", .step = chain_step};

static int remote_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    (void)ev;
    (void)n;
    atomic_fetch_sub(&remote_left, 1);
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops remote_ops = {.type_name = "remote", .step = remote_step};

static void test_busy2_fairness_completes(void **state)
{
    (void)state;
    make(2, NULL);
    atomic_store(&chain_on, true);
    atomic_store(&chains_alive, 2);
    for (int i = 0; i < 2; i++)
        assert_int_equal(jd_sched_spawn(S, &chain_ops, NULL, NULL, NULL, NULL, NULL), 0);
    int rounds = long_mode ? 50 : 3;
    for (int r = 0; r < rounds; r++) {
        atomic_store(&remote_left, 1000);
        uint64_t t0 = now_ns();
        for (int i = 0; i < 1000; i++)
            assert_int_equal(jd_sched_spawn(S, &remote_ops, NULL, NULL, NULL, NULL, NULL), 0);
        while (atomic_load(&remote_left) > 0) {
            /* while the chains spin, remote spawns still finish promptly */
            assert_true(now_ns() - t0 < 20000000000ull);
            sleep_ms(1);
        }
    }
    atomic_store(&chain_on, false);
    while (atomic_load(&chains_alive) > 0)
        sleep_ms(1);
    jd_sched_destroy(S);
}

int main(void)
{
    const char *m = getenv("JD_STRESS");
    long_mode = m && strcmp(m, "long") == 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_many_thieves),
        cmocka_unit_test(test_spawn_storms_exactly_once),
        cmocka_unit_test(test_ping_pong_messages),
        cmocka_unit_test(test_foreign_completions_exactly_once),
        cmocka_unit_test(test_send_cancel_kill_races),
        cmocka_unit_test(test_busy2_fairness_completes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
