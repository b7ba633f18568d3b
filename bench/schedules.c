/*
 * Schedules benchmark: N schedules (default 10,000) with "every": "1s", on
 * the real job layer and store (SQLite in a fresh directory under --dir,
 * --sync normal), each fire creating and running a real job (the echo
 * plugin). Prints the fire lag (the moment the engine's timer callback
 * starts deciding a fire, minus the fire time it was armed for) p50 / p99 /
 * max, fires per second, and the skips and catch-ups seen.
 *
 * Beside it, in the same run and on the same kind of timer heap (the
 * scheduler's), a baseline: N plain timers that re-arm themselves every
 * second for the same wall-clock fire times (whole ms, as the engine arms
 * them) and do nothing else. The ratio of the two p99s is what the
 * schedule machinery (decision, job submit, commit callbacks) adds to a
 * bare timer.
 *
 * Lag is measured through the engine's timer seam (docs/architecture.md, "Testing"): the
 * bench's timer functions arm the scheduler's timers and note when each
 * was due. Both phases run for --seconds (default 10) after a 3 s warm-up.
 *
 * Threading: lags are recorded on the scheduler's timer thread only.
 */
#include "common/alloc.h"
#include "common/clock.h"
#include "common/error.h"
#include "scheduler/sched.h"
#include "server/jobs.h"
#include "server/schedules.h"
#include "storage/store.h"

#include <inttypes.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_SAMPLES (4u << 20)

static struct jd_sched *g_sched;
static double *g_lag;        /* ms; written on the timer thread only */
static size_t g_nlag;        /* timer thread */
static atomic_bool g_record; /* the measured window is open */

static void note(uint64_t due_ns)
{
    if (!atomic_load_explicit(&g_record, memory_order_relaxed) || g_nlag >= MAX_SAMPLES)
        return;
    uint64_t now = jd_now_ns();
    g_lag[g_nlag++] = now > due_ns ? (double)(now - due_ns) / 1e6 : 0;
}

/* ---- the engine's timers, through the scheduler, noting lag ---- */

struct wrap {
    void (*fn)(void *);
    void *arg;
    uint64_t due_ns;
};

static void wrap_fire(void *p)
{
    struct wrap w = *(struct wrap *)p;
    free(p);
    note(w.due_ns);
    w.fn(w.arg);
}

static int wrap_after(void *ctx, int64_t delay_ms, void (*fn)(void *), void *arg, uint64_t *id)
{
    (void)ctx;
    struct wrap *w = jd_xmalloc(sizeof *w);
    *w = (struct wrap){fn, arg, jd_now_ns() + (uint64_t)delay_ms * 1000000u};
    int rc = jd_sched_timer_after(g_sched, (uint64_t)delay_ms * 1000000u, wrap_fire, w, id);
    if (rc)
        free(w);
    return rc;
}

static int wrap_cancel(void *ctx, uint64_t id)
{
    (void)ctx;
    /* A cancelled wrap is not freed: cancels happen only at shutdown here. */
    return jd_sched_timer_cancel(g_sched, id);
}

/* ---- the baseline: bare self-re-arming timers ---- */

struct plain {
    int64_t next_ms; /* wall ms of its next fire */
    uint64_t due_ns;
};
static atomic_bool g_plain_stop;

static void plain_fire(void *arg);

static void plain_arm(struct plain *p)
{
    int64_t delay = p->next_ms - jd_wall_ms();
    if (delay < 0)
        delay = 0;
    p->due_ns = jd_now_ns() + (uint64_t)delay * 1000000u;
    jd_sched_timer_after(g_sched, (uint64_t)delay * 1000000u, plain_fire, p, NULL);
}

static void plain_fire(void *arg)
{
    struct plain *p = arg;
    note(p->due_ns);
    if (atomic_load_explicit(&g_plain_stop, memory_order_relaxed))
        return;
    p->next_ms += 1000;
    plain_arm(p);
}

/* ---- helpers ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct result {
    size_t n;
    double p50, p99, max;
};

static struct result take_window(void)
{
    struct result r = {.n = g_nlag};
    if (g_nlag) {
        qsort(g_lag, g_nlag, sizeof *g_lag, cmp_double);
        r.p50 = g_lag[g_nlag / 2];
        r.p99 = g_lag[(size_t)((double)g_nlag * 0.99)];
        r.max = g_lag[g_nlag - 1];
    }
    g_nlag = 0;
    return r;
}

static void measure(double seconds, struct jd_schedules *s, struct jd_schedules_stats *before)
{
    sleep(3); /* warm-up: every timer has fired a few times */
    if (s)
        jd_schedules_stats(s, before);
    atomic_store(&g_record, true);
    usleep((useconds_t)(seconds * 1e6));
    atomic_store(&g_record, false);
    usleep(100000); /* a callback that read g_record true has finished */
}

static sem_t put_sem;
static atomic_int put_failures;

static void put_done(void *arg, int rc, bool created, const char *json)
{
    (void)arg;
    (void)created;
    (void)json;
    if (rc)
        atomic_fetch_add(&put_failures, 1);
    sem_post(&put_sem);
}

int main(int argc, char **argv)
{
    unsigned n = 10000;
    double seconds = 10;
    const char *dir = "build", *plugins = "build/plugins";
    const char *job = "{\"handler\":\"echo\",\"args\":{\"hello\":\"world\"}}";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--schedules") && i + 1 < argc)
            n = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--plugin-dir") && i + 1 < argc)
            plugins = argv[++i];
        else if (!strcmp(argv[i], "--job") && i + 1 < argc)
            job = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s [--schedules N] [--seconds S] [--dir D] [--plugin-dir P] "
                    "[--job JSON]\n",
                    argv[0]);
            return 2;
        }
    }
    g_lag = jd_xmalloc(MAX_SAMPLES * sizeof *g_lag);
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/bench-schedules-XXXXXX", dir);
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        return 1;
    }
    char *path = jd_xasprintf("%s/jackdaw.db", tmpl);
    struct jd_error err;
    struct jd_store *store = NULL;
    struct jd_store_config sc = {.path = path, .sync_full = false};
    if (jd_store_open(&sc, &store, &err) != 0) {
        fprintf(stderr, "store: %s\n", err.message);
        return 1;
    }
    struct jd_jobs *jobs = NULL;
    struct jd_jobs_config jc = {.store = store, .plugin_dir = plugins, .max_running = 100000};
    if (jd_jobs_create(&jc, &jobs, &err) != 0) {
        fprintf(stderr, "jobs: %s\n", err.message);
        return 1;
    }
    g_sched = jd_jobs_sched(jobs);
    struct jd_schedules_timers timers = {wrap_after, wrap_cancel, NULL};
    struct jd_schedules *s = NULL;
    struct jd_schedules_config scfg = {
        .store = store, .jobs = jobs, .max_schedules = n, .timers = &timers};
    if (jd_schedules_create(&scfg, &s, &err) != 0) {
        fprintf(stderr, "schedules: %s\n", err.message);
        return 1;
    }

    printf("schedules bench: %u schedules, every 1s, job %s, %.0fs measured after 3s warm-up "
           "(sync normal)\n",
           n, job, seconds);
    sem_init(&put_sem, 0, 0);
    char *body = jd_xasprintf("{\"every\":\"1s\",\"overlap\":\"allow\",\"job\":%s}", job);
    uint64_t t0 = jd_now_ns();
    for (unsigned i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "bench-%u", i);
        if (jd_schedules_put(s, id, body, strlen(body), put_done, NULL, &err) != 0) {
            fprintf(stderr, "put %s: %s\n", id, err.message);
            return 1;
        }
    }
    for (unsigned i = 0; i < n; i++)
        sem_wait(&put_sem);
    printf("  created %u schedules in %.2fs (%d failed)\n", n, (double)(jd_now_ns() - t0) / 1e9,
           atomic_load(&put_failures));

    struct jd_schedules_stats st0, st1;
    measure(seconds, s, &st0);
    jd_schedules_stats(s, &st1);
    struct result rs = take_window();
    jd_schedules_stop(s);

    /* Baseline: the same number of bare timers on the same heap, with fire
     * times spread over the second as the schedules' anchors were. */
    struct plain *pl = jd_xcalloc(n, sizeof *pl);
    int64_t base = jd_wall_ms() + 1000;
    for (unsigned i = 0; i < n; i++) {
        pl[i].next_ms = base + (int64_t)i * 1000 / n;
        plain_arm(&pl[i]);
    }
    measure(seconds, NULL, NULL);
    struct result rb = take_window();
    atomic_store(&g_plain_stop, true);
    usleep(1200000); /* every plain timer fires once more and stops */

    double fires = (double)(st1.fires - st0.fires);
    printf("  %-22s %10s %9s %9s %9s %9s\n", "", "fires/s", "p50 ms", "p99 ms", "max ms",
           "samples");
    printf("  %-22s %10.0f %9.2f %9.2f %9.2f %9zu\n", "schedules (engine)", fires / seconds, rs.p50,
           rs.p99, rs.max, rs.n);
    printf("  %-22s %10.0f %9.2f %9.2f %9.2f %9zu\n", "baseline (bare timers)",
           (double)rb.n / seconds, rb.p50, rb.p99, rb.max, rb.n);
    printf("  p99 ratio schedules / baseline: %.2f (%.2f ms over a bare timer)\n",
           rb.p99 > 0 ? rs.p99 / rb.p99 : 0.0, rs.p99 - rb.p99);
    printf("  skips %" PRIu64 ", caught up %" PRIu64 ", expected fires %.0f, got %.0f\n",
           st1.skips - st0.skips, st1.caught_up - st0.caught_up, (double)n * seconds, fires);

    jd_schedules_destroy(s);
    jd_jobs_destroy(jobs);
    jd_store_close(store);
    char *cmd = jd_xasprintf("rm -rf '%s'", tmpl);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpl);
    free(cmd);
    free(path);
    free(pl);
    free(body);
    free(g_lag);
    return 0;
}
