/*
 * Concurrency tests for the writer (run under ThreadSanitizer by make test):
 * many producer threads with many records in flight while readers query,
 * and shutdown racing producers. Checks that every accepted record gets
 * exactly one done(), in each producer's submission order, with versions
 * that increase per job, and that a submit racing close either is refused
 * (JD_ESHUTDOWN, no callback) or is committed and called back.
 *
 * Includes store.c and writer.c to stop the writer without freeing the store
 * while producers still hold it (STYLE rule 9).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "storage/store.c"
#include "storage/writer.c"

#include "store_test_util.h"

#define PRODUCERS 8
#define WINDOW 64

static int records_per_producer(void)
{
    const char *s = getenv("JD_STRESS");
    return s && strcmp(s, "long") == 0 ? 100000 : 1500;
}

struct prod;

struct prec {
    struct jd_write w;
    struct jd_job job;
    struct prod *p;
    uint64_t seq;
};

struct prod {
    struct jd_store *s;
    int index;
    int total;
    atomic_int inflight;
    /* written by the writer thread in done(), read after the join */
    uint64_t next_seq_done;
    int64_t last_version[64];
    int64_t ids[64];
    int n_ids;
    int errors;
    atomic_int committed_ids; /* ids[0..committed_ids) have committed inserts */
    atomic_bool done_ok;
};

static void prod_done(void *arg, struct jd_write *w, int rc)
{
    struct prec *r = arg;
    struct prod *p = r->p;
    if (r->seq != p->next_seq_done)
        p->errors++;
    p->next_seq_done = r->seq + 1;
    if (rc != 0) {
        p->errors++;
    } else if (w->op == JD_W_JOB_INSERT) {
        if (w->version != 1)
            p->errors++;
        /* release: the producer may now target this job */
        atomic_fetch_add_explicit(&p->committed_ids, 1, memory_order_release);
    } else {
        int slot = (int)(r->w.tag % 64);
        if (w->version <= p->last_version[slot])
            p->errors++;
        p->last_version[slot] = w->version;
    }
    free(r);
    atomic_fetch_sub_explicit(&p->inflight, 1, memory_order_release);
}

static void *producer(void *arg)
{
    struct prod *p = arg;
    char queue[16];
    snprintf(queue, sizeof queue, "q%d", p->index % 3);
    for (int i = 0; i < p->total; i++) {
        while (atomic_load_explicit(&p->inflight, memory_order_acquire) >= WINDOW)
            sched_yield();
        struct prec *r = jd_xcalloc(1, sizeof *r);
        r->p = p;
        r->seq = (uint64_t)i;
        int committed = atomic_load_explicit(&p->committed_ids, memory_order_acquire);
        if (i < 64) {
            r->job = make_job(jd_store_next_id(p->s), "default", NULL);
            p->ids[i] = r->job.id;
            r->w.op = JD_W_JOB_INSERT;
            r->w.job = &r->job;
        } else if (committed > 0) {
            int slot = i % committed;
            r->w.op = JD_W_JOB_CHANGE;
            r->w.job_id = p->ids[slot];
            r->w.tag = (uint32_t)slot; /* which job, for the version check */
            r->w.kind = JD_EVK_MESSAGE;
            r->w.data = "{\"topic\":\"t\"}";
        } else {
            r->w.op = JD_W_QUEUE;
            r->w.queue = queue;
            r->w.tag = 0;
        }
        r->w.done = prod_done;
        r->w.arg = r;
        atomic_fetch_add_explicit(&p->inflight, 1, memory_order_relaxed);
        if (jd_store_submit(p->s, &r->w) != 0) {
            p->errors++;
            free(r);
            atomic_fetch_sub_explicit(&p->inflight, 1, memory_order_relaxed);
        }
    }
    while (atomic_load_explicit(&p->inflight, memory_order_acquire) > 0)
        sched_yield();
    return NULL;
}

struct reader {
    struct jd_store *s;
    atomic_bool *stop;
    int errors;
    int reads;
};

static void *reader(void *arg)
{
    struct reader *rd = arg;
    while (!atomic_load_explicit(rd->stop, memory_order_acquire)) {
        struct jd_job_filter f = {.state = -1, .limit = 20};
        struct jd_job *rows;
        size_t n;
        int64_t cursor;
        if (jd_store_job_list(rd->s, &f, &rows, &n, &cursor) != 0) {
            rd->errors++;
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            struct jd_job_event *ev;
            size_t ne;
            if (jd_store_events(rd->s, rows[i].id, 0, 10000, &ev, &ne) != 0)
                rd->errors++;
            else if ((int64_t)ne < rows[i].version) /* history covers the version read */
                rd->errors++;
            else
                jd_job_events_free(ev, ne);
        }
        jd_jobs_free(rows, n);
        struct jd_queue_counts *qc;
        if (jd_store_queue_counts(rd->s, &qc, &n) != 0)
            rd->errors++;
        else
            jd_queue_counts_free(qc, n);
        rd->reads++;
    }
    return NULL;
}

static void test_many_producers_and_readers(void **state)
{
    char *dir = scratch_dir(), *path = test_db_path(dir);
    struct jd_store_config cfg = {.path = path, .sync_full = false, .max_batch = 128};
    struct jd_store *s;
    struct jd_error err;
    assert_int_equal(jd_store_open(&cfg, &s, &err), 0);

    static struct prod prods[PRODUCERS];
    pthread_t pt[PRODUCERS], rt[2];
    atomic_bool stop = false;
    struct reader readers[2] = {{.s = s, .stop = &stop}, {.s = s, .stop = &stop}};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&rt[i], NULL, reader, &readers[i]), 0);
    for (int i = 0; i < PRODUCERS; i++) {
        memset(&prods[i], 0, sizeof prods[i]);
        prods[i].s = s;
        prods[i].index = i;
        prods[i].total = records_per_producer();
        assert_int_equal(pthread_create(&pt[i], NULL, producer, &prods[i]), 0);
    }
    for (int i = 0; i < PRODUCERS; i++)
        pthread_join(pt[i], NULL);
    atomic_store_explicit(&stop, true, memory_order_release);
    for (int i = 0; i < 2; i++) {
        pthread_join(rt[i], NULL);
        assert_int_equal(readers[i].errors, 0);
        assert_true(readers[i].reads > 0);
    }
    int64_t total_versions = 0;
    for (int i = 0; i < PRODUCERS; i++) {
        assert_int_equal(prods[i].errors, 0);
        assert_int_equal(prods[i].next_seq_done, (uint64_t)prods[i].total);
        for (int k = 0; k < 64; k++) {
            struct jd_job j;
            assert_int_equal(jd_store_job_get(s, prods[i].ids[k], &j), 0);
            total_versions += j.version;
            jd_job_clear(&j);
        }
    }
    struct jd_store_stats st;
    jd_store_stats(s, &st);
    assert_int_equal(st.queue_depth, 0);
    assert_true(st.records >= (uint64_t)PRODUCERS * (uint64_t)records_per_producer());
    /* group commit happened: fewer commits than records */
    assert_true(st.commits < st.records);
    jd_store_close(s);
    (void)total_versions;
    rm_tree(dir);
    free(dir);
    free(path);
}

struct racer {
    struct jd_store *s;
    atomic_int accepted, called;
    int refused;
};

static void racer_done(void *arg, struct jd_write *w, int rc)
{
    struct racer *r = w->arg;
    atomic_fetch_add_explicit(&r->called, 1, memory_order_relaxed);
    free(w);
}

static void *racer_main(void *arg)
{
    struct racer *r = arg;
    for (;;) {
        struct jd_write *w = jd_xcalloc(1, sizeof *w);
        *w = (struct jd_write){.op = JD_W_QUEUE, .queue = "race", .done = racer_done, .arg = r};
        int rc = jd_store_submit(r->s, w);
        if (rc == JD_ESHUTDOWN) {
            free(w);
            r->refused++;
            return NULL;
        }
        atomic_fetch_add_explicit(&r->accepted, 1, memory_order_relaxed);
        if (atomic_load_explicit(&r->accepted, memory_order_relaxed) % 32 == 0)
            sched_yield();
    }
}

static void test_close_racing_producers_loses_no_callback(void **state)
{
    char *dir = scratch_dir(), *path = test_db_path(dir);
    struct jd_store_config cfg = {.path = path, .sync_full = false};
    struct jd_store *s;
    struct jd_error err;
    assert_int_equal(jd_store_open(&cfg, &s, &err), 0);
    struct racer r[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].s = s;
        assert_int_equal(pthread_create(&t[i], NULL, racer_main, &r[i]), 0);
    }
    /* let every racer get going (however loaded the machine), then close */
    for (int i = 0; i < 4; i++)
        while (atomic_load(&r[i].accepted) < 100)
            usleep(1000);
    jd_writer_stop(s); /* what jd_store_close does first; the store stays allocated */
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(r[i].refused, 1);
        assert_true(atomic_load(&r[i].accepted) >= 100);
        assert_int_equal(atomic_load(&r[i].called), atomic_load(&r[i].accepted));
    }
    jd_store_close(s);
    rm_tree(dir);
    free(dir);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_producers_and_readers),
        cmocka_unit_test(test_close_racing_producers_loses_no_callback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
