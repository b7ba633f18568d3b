/*
 * bench/sched: the scheduler shapes of docs/performance.md (Tokio's
 * benches/rt_multi_threaded.rs and Go's runtime benchmarks) on Jackdaw's
 * scheduler. Every iteration ends with a cross-thread signal (mutex +
 * condvar) from a worker to the bench thread, as Tokio's bench does.
 *
 *   sched [--workers W] [--iters N]              all shapes, a table
 *   sched --shape NAME --iters N --workers W --raw
 *       one shape, fresh runtime, one warm-up iteration not counted; prints
 *       RESULT shape=NAME iters=N samples_ns=v1,...,vN rss_kb=K
 *       (the protocol bench/compare.sh shares with the Tokio and Go peers)
 *   JD_PIN=1 in the environment (not empty, not 0) pins the workers (jd_sched_config's
 *   pin_workers); the default, and what bench-compare reports, is unpinned.
 *
 * Processes carry their small state in the `self` pointer where they can
 * (an integer, or a tagged pointer to the parent's state), as a Rust future
 * or a goroutine closure would; skynet's inner nodes allocate 48 bytes.
 * Threading: the bench thread spawns and waits; everything else runs on the
 * scheduler's workers.
 */
#include "scheduler/sched.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define NUM_SPAWN 10000      /* spawn_many_* */
#define NUM_SPAWN_BUSY2 1000 /* spawn_many_remote_busy2 */
#define NUM_PINGS 1000       /* ping_pong rounds */
#define YIELD_TASKS 200      /* yield_many */
#define NUM_YIELD 1000
#define CHAIN_DEPTH 1000    /* chained_spawn */
#define SKYNET_SIZE 1000000 /* leaves; 1,111,111 processes */
#define SKYNET_ANSWER 499999500000ull
#define STALL_NS 10000 /* busy processes spin 10 us */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void stall(void)
{
    uint64_t end = now_ns() + STALL_NS;
    while (now_ns() < end)
        ;
}

/* ---- the cross-thread signal ---- */
static pthread_mutex_t done_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static bool done_flag;
static uint64_t done_value;

static void signal_done(uint64_t v)
{
    pthread_mutex_lock(&done_mu);
    done_flag = true;
    done_value = v;
    pthread_cond_signal(&done_cv);
    pthread_mutex_unlock(&done_mu);
}

static uint64_t wait_done(void)
{
    pthread_mutex_lock(&done_mu);
    while (!done_flag)
        pthread_cond_wait(&done_cv, &done_mu);
    done_flag = false;
    uint64_t v = done_value;
    pthread_mutex_unlock(&done_mu);
    return v;
}

static struct jd_sched *S;
static _Atomic long remaining;
static _Atomic bool busy_flag;
static _Atomic int busy_alive;

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench/sched: %s failed (%d)\n", what, rc);
    exit(1);
}

static void spawn_or_die(const struct jd_process_ops *ops, void *self, jd_pid *pid)
{
    int rc = jd_sched_spawn(S, ops, self, NULL, NULL, NULL, pid);
    if (rc)
        die("spawn", rc);
}

/* ---- a process that decrements `remaining`; the last signals ---- */
static int dec_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    (void)ev;
    (void)n;
    if (atomic_fetch_sub_explicit(&remaining, 1, memory_order_acq_rel) == 1)
        signal_done(0);
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops dec_ops = {.type_name = "dec", .step = dec_step};

/* spawn_many_local: a root process spawns them from inside a worker */
static int local_root_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    (void)ev;
    (void)n;
    for (int i = 0; i < NUM_SPAWN; i++)
        spawn_or_die(&dec_ops, NULL, NULL);
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops local_root_ops = {.type_name = "root", .step = local_root_step};

static void iter_spawn_many_local(void)
{
    atomic_store(&remaining, NUM_SPAWN);
    spawn_or_die(&local_root_ops, NULL, NULL);
    wait_done();
}

static void iter_spawn_many_remote(void)
{
    atomic_store(&remaining, NUM_SPAWN);
    for (int i = 0; i < NUM_SPAWN; i++)
        spawn_or_die(&dec_ops, NULL, NULL);
    wait_done();
}

static void iter_spawn_many_remote_busy2(void)
{
    atomic_store(&remaining, NUM_SPAWN_BUSY2);
    for (int i = 0; i < NUM_SPAWN_BUSY2; i++)
        spawn_or_die(&dec_ops, NULL, NULL);
    wait_done();
}

/* Busy steps taken (both loads), read per iteration when JD_BENCH_BUSY_STEPS
 * is set: a count robust to machine noise, unlike wall time. Relaxed: a
 * statistic read after the iteration's done signal. */
static _Atomic uint64_t busy_steps;

/* busy1 background: loop { yield; spin 10 us } while the flag is up */
static int busy1_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    (void)ev;
    (void)n;
    if (!atomic_load_explicit(&busy_flag, memory_order_relaxed)) {
        atomic_fetch_sub(&busy_alive, 1);
        out->status = JD_STEP_DONE;
        return 0;
    }
    stall();
    atomic_fetch_add_explicit(&busy_steps, 1, memory_order_relaxed);
    out->status = JD_STEP_CONTINUE;
    return 0;
}
static const struct jd_process_ops busy1_ops = {.type_name = "busy1", .step = busy1_step};

/* busy2 background: a chain where each link spins 10 us and spawns the next */
static const struct jd_process_ops busy2_ops;
static int busy2_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    (void)ev;
    (void)n;
    if (atomic_load_explicit(&busy_flag, memory_order_relaxed)) {
        stall();
        atomic_fetch_add_explicit(&busy_steps, 1, memory_order_relaxed);
        spawn_or_die(&busy2_ops, NULL, NULL);
    } else {
        atomic_fetch_sub(&busy_alive, 1);
    }
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops busy2_ops = {.type_name = "busy2", .step = busy2_step};

static void start_busy(const struct jd_process_ops *ops, int count)
{
    atomic_store(&busy_flag, true);
    atomic_store(&busy_alive, count);
    for (int i = 0; i < count; i++)
        spawn_or_die(ops, NULL, NULL);
}

static void stop_busy(void)
{
    atomic_store(&busy_flag, false);
    while (atomic_load(&busy_alive) > 0) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

/* ---- ping_pong: A spawns B, A messages B (with A's pid), B answers ---- */
static int pong_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    if (n == 0) {
        out->status = JD_STEP_IDLE;
        return 0;
    }
    jd_sched_send(S, (jd_pid)ev[0].value, 0, NULL);
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops pong_ops = {.type_name = "pong", .step = pong_step};

static int ping_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    (void)ev;
    if (n == 0) {
        jd_pid b;
        spawn_or_die(&pong_ops, NULL, &b);
        jd_sched_send(S, b, jd_sched_self(), NULL);
        out->status = JD_STEP_IDLE;
        return 0;
    }
    if (atomic_fetch_sub_explicit(&remaining, 1, memory_order_acq_rel) == 1)
        signal_done(0);
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops ping_ops = {.type_name = "ping", .step = ping_step};

static void iter_ping_pong(void)
{
    atomic_store(&remaining, NUM_PINGS);
    for (int i = 0; i < NUM_PINGS; i++)
        spawn_or_die(&ping_ops, NULL, NULL);
    wait_done();
}

/* ---- yield_many: each process CONTINUEs NUM_YIELD times ---- */
static int yield_counts[YIELD_TASKS];
static int yielder_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)ev;
    (void)n;
    int *count = self;
    if (++*count < NUM_YIELD) {
        out->status = JD_STEP_CONTINUE;
        return 0;
    }
    if (atomic_fetch_sub_explicit(&remaining, 1, memory_order_acq_rel) == 1)
        signal_done(0);
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops yielder_ops = {.type_name = "yielder", .step = yielder_step};

static void iter_yield_many(void)
{
    atomic_store(&remaining, YIELD_TASKS);
    for (int i = 0; i < YIELD_TASKS; i++) {
        yield_counts[i] = 0;
        spawn_or_die(&yielder_ops, &yield_counts[i], NULL);
    }
    wait_done();
}

/* ---- chained_spawn: depth in the self pointer ---- */
static int chain_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out);
static const struct jd_process_ops chain_ops = {.type_name = "chain", .step = chain_step};
static int chain_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)ev;
    (void)n;
    uintptr_t left = (uintptr_t)self;
    if (left == 0)
        signal_done(0);
    else
        spawn_or_die(&chain_ops, (void *)(left - 1), NULL);
    out->status = JD_STEP_DONE;
    return 0;
}

static void iter_chained_spawn(void)
{
    spawn_or_die(&chain_ops, (void *)(uintptr_t)CHAIN_DEPTH, NULL);
    wait_done();
}

/* ---- skynet ----
 * An inner node's self is a struct node its parent allocated; a leaf's self
 * is its parent's node pointer tagged with the leaf's index (0-9) in the low
 * 4 bits, so leaves (90% of the tree) allocate nothing. */
struct node {
    jd_pid pid;      /* set by the node's first step */
    struct node *up; /* NULL at the root */
    uint64_t num, size, sum;
    unsigned got;
};

static int leaf_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)ev;
    (void)n;
    struct node *up = (struct node *)((uintptr_t)self & ~(uintptr_t)15);
    uint64_t idx = (uintptr_t)self & 15;
    jd_sched_send(S, up->pid, up->num + idx, NULL);
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops leaf_ops = {.type_name = "leaf", .step = leaf_step};

static void node_close(void *self)
{
    free(self);
}

static const struct jd_process_ops node_ops;
static int node_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    struct node *me = self;
    if (me->pid == 0) {
        me->pid = jd_sched_self();
        uint64_t size = me->size / 10;
        for (uintptr_t i = 0; i < 10; i++) {
            if (size == 1) {
                spawn_or_die(&leaf_ops, (void *)((uintptr_t)me | i), NULL);
            } else {
                struct node *k = malloc(sizeof(*k));
                k->pid = 0;
                k->up = me;
                k->num = me->num + i * size;
                k->size = size;
                k->sum = 0;
                k->got = 0;
                spawn_or_die(&node_ops, k, NULL);
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        me->sum += ev[i].value;
        me->got++;
    }
    if (me->got < 10) {
        out->status = JD_STEP_IDLE;
        return 0;
    }
    if (me->up)
        jd_sched_send(S, me->up->pid, me->sum, NULL);
    else
        signal_done(me->sum);
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops node_ops = {
    .type_name = "node", .step = node_step, .close = node_close};

static void iter_skynet(void)
{
    struct node *root = aligned_alloc(16, sizeof(*root));
    memset(root, 0, sizeof(*root));
    root->size = SKYNET_SIZE;
    spawn_or_die(&node_ops, root, NULL);
    uint64_t sum = wait_done();
    if (sum != SKYNET_ANSWER) {
        fprintf(stderr, "bench/sched: skynet answered %llu, expected %llu\n",
                (unsigned long long)sum, (unsigned long long)SKYNET_ANSWER);
        exit(1);
    }
}

/* ---- the harness ---- */
struct shape {
    const char *name;
    void (*iter)(void);
    const struct jd_process_ops *busy; /* background load, or NULL */
    int busy_per_worker;
};

static const struct shape shapes[] = {
    {"spawn_many_local", iter_spawn_many_local, NULL, 0},
    {"spawn_many_remote_idle", iter_spawn_many_remote, NULL, 0},
    {"spawn_many_remote_busy1", iter_spawn_many_remote, &busy1_ops, 2},
    {"spawn_many_remote_busy2", iter_spawn_many_remote_busy2, &busy2_ops, 1},
    {"ping_pong", iter_ping_pong, NULL, 0},
    {"yield_many", iter_yield_many, NULL, 0},
    {"chained_spawn", iter_chained_spawn, NULL, 0},
    {"skynet", iter_skynet, NULL, 0},
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Fresh runtime, one warm-up iteration, then iters timed ones. */
static void run_shape(const struct shape *sh, unsigned workers, int iters, uint64_t *samples)
{
    const char *pin = getenv("JD_PIN");
    struct jd_sched_config cfg = {.workers = workers,
                                  .pin_workers = pin && *pin && strcmp(pin, "0") != 0};
    int rc = jd_sched_create(&cfg, &S);
    if (rc)
        die("jd_sched_create", rc);
    if (sh->busy)
        start_busy(sh->busy, sh->busy_per_worker * (int)workers);
    sh->iter();
    bool count = sh->busy && getenv("JD_BENCH_BUSY_STEPS");
    uint64_t *steps = count ? calloc((size_t)iters, sizeof(*steps)) : NULL;
    for (int i = 0; i < iters; i++) {
        uint64_t b0 = atomic_load_explicit(&busy_steps, memory_order_relaxed);
        uint64_t t0 = now_ns();
        sh->iter();
        samples[i] = now_ns() - t0;
        if (steps)
            steps[i] = atomic_load_explicit(&busy_steps, memory_order_relaxed) - b0;
    }
    if (steps) {
        qsort(steps, (size_t)iters, sizeof(*steps), cmp_u64);
        fprintf(stderr, "BUSY_STEPS shape=%s median=%llu min=%llu max=%llu\n", sh->name,
                (unsigned long long)steps[iters / 2], (unsigned long long)steps[0],
                (unsigned long long)steps[iters - 1]);
        free(steps);
    }
    if (sh->busy)
        stop_busy();
    jd_sched_destroy(S);
    S = NULL;
}

static long peak_rss_kb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static void fmt_ns(char *buf, size_t len, uint64_t ns)
{
    if (ns >= 10000000)
        snprintf(buf, len, "%.1f ms", ns / 1e6);
    else if (ns >= 1000000)
        snprintf(buf, len, "%.2f ms", ns / 1e6);
    else
        snprintf(buf, len, "%.0f us", ns / 1e3);
}

static void usage(void)
{
    fprintf(stderr, "usage: sched [--workers W] [--iters N] [--shape NAME] [--raw]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    unsigned workers = 2;
    int iters = 40;
    const char *only = NULL;
    bool raw = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--workers") == 0 && i + 1 < argc)
            workers = (unsigned)atoi(argv[++i]);
        else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--raw") == 0)
            raw = true;
        else
            usage();
    }
    if (workers == 0 || iters <= 0)
        usage();
    uint64_t *samples = calloc((size_t)iters, sizeof(*samples));
    size_t nshapes = sizeof(shapes) / sizeof(shapes[0]);
    bool found = false;
    if (!raw)
        printf("%-26s %10s %10s %10s   (W=%u, %d iterations)\n", "shape", "median", "min", "p90",
               workers, iters);
    for (size_t k = 0; k < nshapes; k++) {
        const struct shape *sh = &shapes[k];
        if (only && strcmp(only, sh->name) != 0)
            continue;
        found = true;
        run_shape(sh, workers, iters, samples);
        if (raw) {
            printf("RESULT shape=%s iters=%d samples_ns=", sh->name, iters);
            for (int i = 0; i < iters; i++)
                printf("%s%llu", i ? "," : "", (unsigned long long)samples[i]);
            printf(" rss_kb=%ld\n", peak_rss_kb());
            continue;
        }
        qsort(samples, (size_t)iters, sizeof(*samples), cmp_u64);
        char med[32], mn[32], p90[32];
        fmt_ns(med, sizeof(med), samples[iters / 2]);
        fmt_ns(mn, sizeof(mn), samples[0]);
        fmt_ns(p90, sizeof(p90), samples[(iters * 9) / 10 < iters ? (iters * 9) / 10 : iters - 1]);
        printf("%-26s %10s %10s %10s", sh->name, med, mn, p90);
        if (strcmp(sh->name, "skynet") == 0)
            printf("   peak RSS %ld KiB", peak_rss_kb());
        printf("\n");
        fflush(stdout);
    }
    free(samples);
    if (!found) {
        fprintf(stderr, "bench/sched: unknown shape %s\n", only);
        return 2;
    }
    return 0;
}
