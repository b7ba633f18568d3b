/*
 * Storage benchmark: group-commit throughput and commit latency.
 *
 * For --sync full and normal, with 1, 4 and 16 producer threads, each
 * producer keeps up to --window (default 32) records in flight
 * (asynchronously, like an HTTP server holding many connections, each
 * waiting for its 201; 16 producers x 32 = 512 in flight) and submits
 * a realistic mix for --seconds: job inserts with a ~300-byte definition, and
 * history appends (a state change, a dispatch and a completion with small
 * JSON payloads), one insert per three appends. Appends go to one of the
 * 2,000 most recently inserted jobs, as in a queue where jobs run soon after
 * they are accepted; the table starts with 10,000 jobs.
 *
 * Prints per run: records committed per second, commits per second, mean
 * batch size, commit latency (submit -> done callback) p50 / p99 / max, and
 * the process's CPU time per record (writer + producers; steadier than
 * records/s on a shared machine).
 * Runs are repeated --reps times, interleaved (full, normal, full, ...), and
 * the median of each column is printed.
 *
 * The baseline, run right after each run in the same round: plain SQLite
 * (one thread, no store) writing the same mix (a job row with the same
 * definition, then three history rows for recent jobs) into two plain
 * tables, in transactions of the run's own mean batch size, at the same
 * synchronous setting, WAL mode. Printed as its records/s and the store's
 * ratio to it: what the store's writer, records and callbacks cost over the
 * bare inserts at the same batching (SQLite databases only). The database lives in a fresh
 * directory under --dir (default: build), on the real disk, so fsync is real;
 * or, with --db postgres://..., in that PostgreSQL database (emptied before
 * each run: its schema is dropped; CPU per record is then only this
 * process's, not the server's).
 *
 * Threading: producers submit; done() runs on the writer thread and records
 * the latency into its producer's array (only the writer appends to it;
 * the producer reads it after the run).
 */
#include "common/alloc.h"
#include "common/clock.h"
#include "common/error.h"
#include "storage/store.h"

#include <libpq-fe.h>
#include <sqlite3.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define PREPOPULATED 10000 /* jobs in the table before the run */
#define ACTIVE_SET 2000    /* appends go to one of the most recently inserted jobs */

/* Highest job id whose insert committed (written by the writer thread in
 * done(); relaxed: producers only use it to pick a plausible target). */
static _Atomic int64_t last_committed;

static const char definition[] =
    "{\"steps\":[{\"id\":\"fetch\",\"call\":\"http\",\"args\":{\"url\":\"http://127.0.0.1:9000/"
    "orders/42\",\"method\":\"GET\",\"timeout_ms\":5000}},{\"id\":\"notify\",\"call\":\"exec\","
    "\"args\":{\"argv\":[\"/usr/bin/logger\",\"order ${steps.fetch.output.status}\"]}}],"
    "\"input\":{\"customer\":\"c-1029\",\"amount\":1250},\"queue\":\"default\",\"priority\":5,"
    "\"retry\":{\"max_attempts\":5,\"backoff_ms\":200,\"factor\":2},\"labels\":{\"team\":\"x\"}}";

struct producer;

struct rec {
    struct jd_write w;
    struct jd_job job;
    struct producer *p;
    uint64_t t0;
};

struct producer {
    struct jd_store *s;
    unsigned seed;
    unsigned window;
    uint64_t deadline_ns;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned inflight; /* under mu */
    bool waiting;      /* under mu */
    uint64_t *lat;     /* writer thread only, until the run ends */
    size_t nlat, cap;
    uint64_t failed;
};

static void rec_done(void *arg, struct jd_write *w, int rc)
{
    struct rec *r = arg;
    struct producer *p = r->p;
    if (rc != 0) {
        p->failed++;
    } else {
        if (w->op == JD_W_JOB_INSERT &&
            w->job_id > atomic_load_explicit(&last_committed, memory_order_relaxed))
            atomic_store_explicit(&last_committed, w->job_id, memory_order_relaxed);
        if (p->nlat == p->cap) {
            p->cap = p->cap ? p->cap * 2 : 65536;
            p->lat = jd_xrealloc(p->lat, p->cap * sizeof *p->lat);
        }
        p->lat[p->nlat++] = jd_now_ns() - r->t0;
    }
    free(r);
    pthread_mutex_lock(&p->mu);
    p->inflight--;
    /* wake the producer once half its window is free, not on every record */
    if (p->waiting && (p->inflight <= p->window / 2 || p->inflight == 0)) {
        p->waiting = false;
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
}

static void *producer_main(void *arg)
{
    struct producer *p = arg;
    uint64_t i = 0;
    while (jd_now_ns() < p->deadline_ns) {
        pthread_mutex_lock(&p->mu);
        while (p->inflight >= p->window) {
            p->waiting = true;
            pthread_cond_wait(&p->cv, &p->mu);
        }
        p->inflight++;
        pthread_mutex_unlock(&p->mu);

        struct rec *r = jd_xcalloc(1, sizeof *r);
        r->p = p;
        switch (i++ % 4) {
        case 0:
            r->job.id = jd_store_next_id(p->s);
            r->job.queue = "default";
            r->job.priority = 5;
            r->job.definition = (char *)definition;
            r->w.op = JD_W_JOB_INSERT;
            r->w.job = &r->job;
            break;
        case 1:
            r->w.op = JD_W_JOB_CHANGE;
            r->w.set = JD_SET_STATE | JD_SET_ATTEMPTS | JD_SET_STARTED;
            r->w.state = JD_JOB_RUNNING;
            r->w.attempts = 1;
            r->w.started_ms = jd_wall_ms();
            r->w.kind = JD_EVK_STATE;
            break;
        case 2:
            r->w.op = JD_W_JOB_CHANGE;
            r->w.kind = JD_EVK_DISPATCH;
            r->w.tag = 1;
            r->w.data = "{\"command\":\"http\",\"attempt\":1,\"args\":{\"url\":"
                        "\"http://127.0.0.1:9000/orders/42\"}}";
            break;
        default:
            r->w.op = JD_W_JOB_CHANGE;
            r->w.kind = JD_EVK_COMPLETE;
            r->w.tag = 1;
            r->w.data = "{\"result\":{\"status\":200,\"body\":\"ok\"}}";
            break;
        }
        if (r->w.op == JD_W_JOB_CHANGE) {
            int64_t last = atomic_load_explicit(&last_committed, memory_order_relaxed);
            r->w.job_id = last - rand_r(&p->seed) % ACTIVE_SET;
        }
        r->w.done = rec_done;
        r->w.arg = r;
        r->t0 = jd_now_ns();
        if (jd_store_submit(p->s, &r->w) != 0) {
            fprintf(stderr, "submit failed\n");
            exit(1);
        }
    }
    pthread_mutex_lock(&p->mu);
    while (p->inflight > 0) {
        p->waiting = true;
        pthread_cond_wait(&p->cv, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

struct result {
    double rps, cps, batch, p50_ms, p99_ms, max_ms, cpu_us;
};

/* CPU time of the whole process (writer + producers), microseconds. */
static double cpu_us_now(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static void prepopulate(struct jd_store *s)
{
    struct jd_job *jobs = jd_xcalloc(PREPOPULATED, sizeof *jobs);
    struct jd_write *ws = jd_xcalloc(PREPOPULATED, sizeof *ws);
    for (int i = 0; i < PREPOPULATED; i++) {
        jobs[i].id = jd_store_next_id(s);
        jobs[i].queue = "default";
        jobs[i].definition = (char *)definition;
        ws[i].op = JD_W_JOB_INSERT;
        ws[i].job = &jobs[i];
        jd_store_submit(s, &ws[i]);
    }
    jd_store_sync(s);
    atomic_store_explicit(&last_committed, jobs[PREPOPULATED - 1].id, memory_order_relaxed);
    free(jobs);
    free(ws);
}

/* Empty the PostgreSQL database at url (its public schema). */
static int pg_reset(const char *url)
{
    PGconn *c = PQconnectdb(url);
    PGresult *r = PQstatus(c) == CONNECTION_OK
                      ? PQexec(c, "SET client_min_messages = warning;"
                                  " DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
                      : NULL;
    int rc = r && PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : -1;
    if (rc)
        fprintf(stderr, "resetting %s: %s\n", url, PQerrorMessage(c));
    PQclear(r);
    PQfinish(c);
    return rc;
}

static const char *pg_url; /* --db: run on PostgreSQL */

static int run_once(const char *dir, bool full, unsigned producers, unsigned window, double secs,
                    struct result *out)
{
    char tmpl[4096] = "";
    char *path;
    if (pg_url) {
        if (pg_reset(pg_url) != 0)
            return -1;
        path = jd_xstrdup(pg_url);
    } else {
        snprintf(tmpl, sizeof tmpl, "%s/bench-store-XXXXXX", dir);
        if (!mkdtemp(tmpl)) {
            perror("mkdtemp");
            return -1;
        }
        path = jd_xasprintf("%s/jackdaw.db", tmpl);
    }
    struct jd_store_config cfg = {.path = path, .sync_full = full};
    struct jd_store *s;
    struct jd_error err;
    if (jd_store_open(&cfg, &s, &err) != 0) {
        fprintf(stderr, "open: %s\n", err.message);
        return -1;
    }
    prepopulate(s);

    struct jd_store_stats st0, st1;
    jd_store_stats(s, &st0);
    struct producer *ps = jd_xcalloc(producers, sizeof *ps);
    pthread_t *t = jd_xcalloc(producers, sizeof *t);
    uint64_t start = jd_now_ns();
    double cpu0 = cpu_us_now();
    for (unsigned i = 0; i < producers; i++) {
        ps[i].s = s;
        ps[i].seed = 1234 + i;
        ps[i].window = window;
        ps[i].deadline_ns = start + (uint64_t)(secs * 1e9);
        pthread_mutex_init(&ps[i].mu, NULL);
        pthread_cond_init(&ps[i].cv, NULL);
        pthread_create(&t[i], NULL, producer_main, &ps[i]);
    }
    for (unsigned i = 0; i < producers; i++)
        pthread_join(t[i], NULL);
    double elapsed = (double)(jd_now_ns() - start) / 1e9;
    double cpu = cpu_us_now() - cpu0;
    jd_store_stats(s, &st1);

    size_t n = 0;
    uint64_t failed = 0;
    for (unsigned i = 0; i < producers; i++) {
        n += ps[i].nlat;
        failed += ps[i].failed;
    }
    uint64_t *all = jd_xmalloc((n ? n : 1) * sizeof *all);
    size_t k = 0;
    for (unsigned i = 0; i < producers; i++) {
        memcpy(all + k, ps[i].lat, ps[i].nlat * sizeof *all);
        k += ps[i].nlat;
        free(ps[i].lat);
        pthread_mutex_destroy(&ps[i].mu);
        pthread_cond_destroy(&ps[i].cv);
    }
    qsort(all, n, sizeof *all, cmp_u64);
    uint64_t commits = st1.commits - st0.commits;
    uint64_t records = st1.records - st0.records;
    out->rps = (double)n / elapsed;
    out->cps = (double)commits / elapsed;
    out->batch = commits ? (double)records / (double)commits : 0;
    out->p50_ms = n ? (double)all[n / 2] / 1e6 : 0;
    out->p99_ms = n ? (double)all[(size_t)((double)n * 0.99)] / 1e6 : 0;
    out->max_ms = n ? (double)all[n - 1] / 1e6 : 0;
    out->cpu_us = n ? cpu / (double)n : 0;
    if (failed)
        fprintf(stderr, "warning: %llu records failed\n", (unsigned long long)failed);
    free(all);
    free(ps);
    free(t);
    jd_store_close(s);
    char *cmd = jd_xasprintf("rm -rf '%s'", tmpl);
    if (tmpl[0] && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpl);
    free(cmd);
    free(path);
    return 0;
}

/* Plain SQLite at batch records a transaction for secs (see the file
 * comment): records/s into *rps. 0 or -1. */
static int plain_sqlite(const char *dir, bool full, double batch, double secs, double *rps)
{
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/bench-plain-XXXXXX", dir);
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        return -1;
    }
    char *path = jd_xasprintf("%s/plain.db", tmpl);
    sqlite3 *db = NULL;
    sqlite3_stmt *ins_job = NULL, *ins_ev = NULL;
    int rc = -1;
    char pragmas[400];
    snprintf(pragmas, sizeof pragmas,
             "PRAGMA journal_mode = WAL; PRAGMA synchronous = %s;"
             " CREATE TABLE jobs (id INTEGER PRIMARY KEY, definition TEXT, state INT);"
             " CREATE TABLE events (job_id INT, seq INT, data TEXT, PRIMARY KEY (job_id, seq));",
             full ? "FULL" : "NORMAL");
    if (sqlite3_open(path, &db) != SQLITE_OK || sqlite3_exec(db, pragmas, 0, 0, 0) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO jobs (definition, state) VALUES (?, 0)", -1, &ins_job,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO events (job_id, seq, data) VALUES (?, ?, ?)", -1,
                           &ins_ev, NULL) != SQLITE_OK) {
        fprintf(stderr, "plain sqlite: %s\n", db ? sqlite3_errmsg(db) : "cannot open");
        goto out;
    }
    unsigned per_tx = batch >= 1 ? (unsigned)(batch + 0.5) : 1;
    int64_t jobs = 0, seq = 0;
    uint64_t records = 0, t0 = jd_now_ns(), deadline = t0 + (uint64_t)(secs * 1e9);
    unsigned seed = 7;
    while (jd_now_ns() < deadline) {
        sqlite3_exec(db, "BEGIN", 0, 0, 0);
        for (unsigned i = 0; i < per_tx; i++, records++) {
            if (records % 4 == 0 || jobs == 0) {
                sqlite3_bind_text(ins_job, 1, definition, -1, SQLITE_STATIC);
                sqlite3_step(ins_job);
                sqlite3_reset(ins_job);
                jobs++;
            } else {
                int64_t span = jobs < ACTIVE_SET ? jobs : ACTIVE_SET;
                sqlite3_bind_int64(ins_ev, 1, jobs - (int64_t)(rand_r(&seed) % span));
                sqlite3_bind_int64(ins_ev, 2, ++seq);
                sqlite3_bind_text(ins_ev, 3, "{\"state\":\"running\",\"attempt\":1}", -1,
                                  SQLITE_STATIC);
                sqlite3_step(ins_ev);
                sqlite3_reset(ins_ev);
            }
        }
        if (sqlite3_exec(db, "COMMIT", 0, 0, 0) != SQLITE_OK) {
            fprintf(stderr, "plain sqlite: %s\n", sqlite3_errmsg(db));
            goto out;
        }
    }
    *rps = (double)records / ((double)(jd_now_ns() - t0) / 1e9);
    rc = 0;
out:
    sqlite3_finalize(ins_job);
    sqlite3_finalize(ins_ev);
    sqlite3_close(db);
    char *cmd = jd_xasprintf("rm -rf '%s'", tmpl);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpl);
    free(cmd);
    free(path);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    const char *dir = "build";
    double secs = 1.5;
    unsigned window = 32;
    int reps = 3;
    int only_sync = -1; /* -1: both; 1: full; 0: normal */
    unsigned only_producers = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "--db") == 0 && i + 1 < argc)
            pg_url = argv[++i];
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            secs = atof(argv[++i]);
        else if (strcmp(argv[i], "--window") == 0 && i + 1 < argc)
            window = (unsigned)atoi(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--sync") == 0 && i + 1 < argc)
            only_sync = strcmp(argv[++i], "full") == 0;
        else if (strcmp(argv[i], "--producers") == 0 && i + 1 < argc)
            only_producers = (unsigned)atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--dir DIR | --db postgres://...] [--seconds S] [--window N per "
                    "producer] [--reps N]"
                    " [--sync full|normal] [--producers N]\n",
                    argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 50 || window < 1 || secs <= 0)
        return 2;
    static const unsigned nprod[3] = {1, 4, 16};
    printf("storage bench: %.1fs per run, window %u per producer, median of %d interleaved runs\n",
           secs, window, reps);
    printf("%-7s %9s %12s %11s %8s %9s %9s %9s %11s %12s %6s\n", "sync", "producers", "records/s",
           "commits/s", "batch", "p50 ms", "p99 ms", "max ms", "cpu us/rec", "plain rec/s",
           "ratio");
    for (int pi = 0; pi < 3; pi++) {
        double v[2][9][50];
        if (only_producers && nprod[pi] != only_producers)
            continue;
        for (int r = 0; r < reps; r++) {
            for (int m = 0; m < 2; m++) {
                if (only_sync >= 0 && only_sync != (m == 0))
                    continue;
                struct result res;
                if (run_once(dir, m == 0, nprod[pi], window, secs, &res) != 0)
                    return 1;
                v[m][0][r] = res.rps;
                v[m][1][r] = res.cps;
                v[m][2][r] = res.batch;
                v[m][3][r] = res.p50_ms;
                v[m][4][r] = res.p99_ms;
                v[m][5][r] = res.max_ms;
                v[m][6][r] = res.cpu_us;
                /* the baseline right after, at this run's batch size */
                double plain = 0;
                if (!pg_url && plain_sqlite(dir, m == 0, res.batch, secs, &plain) != 0)
                    return 1;
                v[m][7][r] = plain;
                v[m][8][r] = plain > 0 ? res.rps / plain : 0;
            }
        }
        for (int m = 0; m < 2; m++)
            if (only_sync < 0 || only_sync == (m == 0))
                printf("%-7s %9u %12.0f %11.0f %8.1f %9.2f %9.2f %9.2f %11.2f %12.0f %5.2fx\n",
                       m == 0 ? "full" : "normal", nprod[pi], median(v[m][0], reps),
                       median(v[m][1], reps), median(v[m][2], reps), median(v[m][3], reps),
                       median(v[m][4], reps), median(v[m][5], reps), median(v[m][6], reps),
                       median(v[m][7], reps), median(v[m][8], reps));
        fflush(stdout);
    }
    return 0;
}
