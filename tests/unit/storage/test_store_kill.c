/*
 * The kill test: nothing reported durable is lost to a crash.
 *
 * A child process opens the store and writes as fast as it can (job inserts
 * and changes, many in flight); each done() with rc 0 appends a line to a log
 * file ("I <id>" for an insert, "C <id> <version>" for a change). The parent
 * waits until the child has logged something, SIGKILLs it at a random moment,
 * reopens the database and checks that every logged insert is present, every
 * logged change is reflected in the job's version, the history is complete
 * (seq 1..version) and PRAGMA integrity_check says ok. 20 rounds, alternating
 * --sync full and normal (both survive a process crash; only full survives
 * power loss, which a test cannot simulate). JD_STRESS=long runs 200 rounds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "storage/store.h"
#include "store_test_util.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WINDOW 256 /* records in flight in the child, like many open connections */

struct child_rec {
    struct jd_write w;
    struct jd_job job;
};

static int log_fd;
static atomic_int inflight;
static _Atomic int64_t committed_max; /* highest id whose insert committed */

static void child_done(void *arg, struct jd_write *w, int rc)
{
    struct child_rec *r = arg;
    if (rc == 0) {
        char line[64];
        int n;
        if (w->op == JD_W_JOB_INSERT) {
            n = snprintf(line, sizeof line, "I %lld\n", (long long)w->job_id);
            /* relaxed: only the child's producer reads it, as a hint */
            int64_t cur = atomic_load_explicit(&committed_max, memory_order_relaxed);
            if (w->job_id > cur)
                atomic_store_explicit(&committed_max, w->job_id, memory_order_relaxed);
        } else {
            n = snprintf(line, sizeof line, "C %lld %lld\n", (long long)w->job_id,
                         (long long)w->version);
        }
        if (write(log_fd, line, (size_t)n) != n)
            _exit(3);
    }
    free(r);
    /* release: pairs with the producer's acquire load of the window */
    atomic_fetch_sub_explicit(&inflight, 1, memory_order_release);
}

static void child_main(const char *path, bool sync_full)
{
    struct jd_store_config cfg = {.path = path, .sync_full = sync_full};
    struct jd_store *s;
    struct jd_error err;
    if (jd_store_open(&cfg, &s, &err) != 0) {
        fprintf(stderr, "child open: %s\n", err.message);
        _exit(2);
    }
    static const char def[] = "{\"steps\":[{\"id\":\"fetch\",\"call\":\"http\",\"args\":{\"url\":"
                              "\"http://127.0.0.1:9000/x\"}},{\"id\":\"report\",\"call\":\"exec\","
                              "\"args\":{\"argv\":[\"/usr/bin/logger\",\"${input.name}\"]}}],"
                              "\"input\":{\"name\":\"kill-test\"}}";
    unsigned seed = (unsigned)getpid();
    for (uint64_t i = 0;; i++) {
        while (atomic_load_explicit(&inflight, memory_order_acquire) >= WINDOW)
            sched_yield();
        struct child_rec *r = jd_xcalloc(1, sizeof *r);
        int64_t target = atomic_load_explicit(&committed_max, memory_order_relaxed);
        if (i % 3 == 2 && target > 0) {
            r->w.op = JD_W_JOB_CHANGE;
            r->w.job_id = 1 + (int64_t)(rand_r(&seed) % (unsigned)target);
            r->w.kind = JD_EVK_COMPLETE;
            r->w.tag = (uint32_t)i;
            r->w.data = "{\"result\":{\"status\":200}}";
        } else {
            r->job.id = jd_store_next_id(s);
            r->job.queue = "default";
            r->job.definition = (char *)def;
            r->w.op = JD_W_JOB_INSERT;
            r->w.job = &r->job;
        }
        r->w.done = child_done;
        r->w.arg = r;
        atomic_fetch_add_explicit(&inflight, 1, memory_order_relaxed);
        if (jd_store_submit(s, &r->w) != 0)
            _exit(4);
    }
}

static sqlite3_int64 one_int(sqlite3 *db, const char *sql, int64_t arg)
{
    sqlite3_stmt *st;
    sqlite3_int64 v = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        return -2;
    sqlite3_bind_int64(st, 1, arg);
    if (sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

static void one_round(const char *dir, int round, unsigned *seed)
{
    char *path = db_path(dir);
    char *logp = jd_xasprintf("%s/committed.log", dir);
    bool sync_full = round % 2 == 0;
    int fd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_TRUNC, 0644);
    assert_true(fd >= 0);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        log_fd = fd;
        child_main(path, sync_full);
        _exit(0);
    }
    close(fd);
    /* wait until the child commits, then let it run a random while */
    struct stat st;
    for (int i = 0; i < 1000 && (stat(logp, &st) != 0 || st.st_size == 0); i++)
        usleep(5000);
    assert_true(st.st_size > 0);
    usleep((useconds_t)(rand_r(seed) % 150000));
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status)); /* it did not die of anything else first */

    /* every logged record is in the reopened database */
    struct jd_store_config cfg = {.path = path, .sync_full = true};
    struct jd_store *s;
    struct jd_error err;
    assert_int_equal(jd_store_open(&cfg, &s, &err), 0);
    FILE *lf = fopen(logp, "r");
    assert_non_null(lf);
    char kind;
    long long id, version;
    int inserts = 0, changes = 0;
    sqlite3 *db;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    while (fscanf(lf, " %c %lld", &kind, &id) == 2) {
        struct jd_job got;
        int rc = jd_store_job_get(s, id, &got);
        if (rc != 0)
            fail_msg("round %d: committed job %lld is missing (%d)", round, id, rc);
        if (kind == 'C') {
            assert_int_equal(fscanf(lf, " %lld", &version), 1);
            if (got.version < version)
                fail_msg("round %d: job %lld at version %lld, change to %lld was reported", round,
                         id, (long long)got.version, version);
            /* one event per version, whether rows hold one or a packed run */
            struct jd_job_event *ev;
            size_t nev;
            assert_int_equal(jd_store_events(s, id, 0, 10000, &ev, &nev), 0);
            assert_int_equal(nev, got.version);
            for (size_t i = 0; i < nev; i++)
                assert_int_equal(ev[i].seq, (int64_t)i + 1);
            jd_job_events_free(ev, nev);
            assert_true(one_int(db, "SELECT count(*) FROM events WHERE job_id = ?1", id) <=
                        got.version);
            changes++;
        } else {
            inserts++;
        }
        jd_job_clear(&got);
    }
    fclose(lf);
    assert_true(inserts > 0);
    sqlite3_stmt *ic;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &ic, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(ic), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(ic, 0), "ok");
    sqlite3_finalize(ic);
    sqlite3_close(db);
    jd_store_close(s);
    if (getenv("JD_TEST_VERBOSE"))
        fprintf(stderr, "round %d: %d inserts, %d changes checked\n", round, inserts, changes);
    free(path);
    free(logp);
}

static void test_sigkill_loses_nothing_reported_durable(void **state)
{
    const char *stress = getenv("JD_STRESS");
    int rounds = stress && strcmp(stress, "long") == 0 ? 200 : 20;
    unsigned seed = (unsigned)time(NULL);
    fprintf(stderr, "kill test seed %u\n", seed);
    for (int round = 0; round < rounds; round++) {
        char *dir = scratch_dir();
        one_round(dir, round, &seed);
        rm_tree(dir);
        free(dir);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigkill_loses_nothing_reported_durable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
