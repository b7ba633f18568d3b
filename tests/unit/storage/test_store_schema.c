/*
 * Unit tests for storage/ at the file level: migrating an old-version file,
 * the query plans of every statement the store runs (no table scans, no temp
 * b-trees), and clear refusals for every bad file or place: missing or
 * read-only directory, foreign or corrupt file, newer schema, a database
 * held by another Jackdaw, and a full disk.
 *
 * Includes store.c and writer.c to reach their SQL tables (STYLE rule 9); the
 * rest of the storage layer comes from the library.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "storage/store.c"
#include "storage/writer.c"

#include "store_test_util.h"

#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>

static int sql_exec(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    int rc = sqlite3_open(path, &db);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    sqlite3_close(db);
    return rc;
}

static int64_t sql_int(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int64_t v = -1;
    if (sqlite3_open(path, &db) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

static bool integrity_ok(const char *path)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    bool ok = false;
    if (sqlite3_open(path, &db) == SQLITE_OK &&
        sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        ok = strcmp((const char *)sqlite3_column_text(st, 0), "ok") == 0;
    sqlite3_finalize(st);
    sqlite3_close(db);
    return ok;
}

static int open_store(const char *path, struct jd_store **s, struct jd_error *err)
{
    struct jd_store_config cfg = {.path = path, .sync_full = true};
    return jd_store_open(&cfg, s, err);
}

/* ---- migrations ---- */

/* Schema version 1 as it shipped, written here by hand so the test does not
 * depend on the code under test to make the old file. */
static const char *const schema_v1 =
    "CREATE TABLE jobs (id INTEGER PRIMARY KEY, queue TEXT NOT NULL,"
    " priority INTEGER NOT NULL DEFAULT 0,"
    " state INTEGER NOT NULL CHECK (state BETWEEN 0 AND 5),"
    " run_at_ms INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,"
    " version INTEGER NOT NULL DEFAULT 1, output TEXT, error TEXT,"
    " created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL,"
    " started_ms INTEGER NOT NULL DEFAULT 0, finished_ms INTEGER NOT NULL DEFAULT 0,"
    " idempotency_key TEXT) STRICT;"
    "CREATE TABLE job_definitions (job_id INTEGER PRIMARY KEY, definition TEXT NOT NULL) STRICT;"
    "CREATE INDEX jobs_state ON jobs(state);"
    "CREATE INDEX jobs_queue_state ON jobs(queue, state);"
    "CREATE INDEX jobs_finished ON jobs(finished_ms) WHERE state >= 3;"
    "CREATE UNIQUE INDEX jobs_idem ON jobs(idempotency_key) WHERE idempotency_key IS NOT NULL;"
    "CREATE TABLE events (id INTEGER PRIMARY KEY, job_id INTEGER NOT NULL,"
    " seq INTEGER NOT NULL, time_ms INTEGER NOT NULL,"
    " kind INTEGER NOT NULL CHECK (kind BETWEEN 0 AND 4),"
    " tag INTEGER NOT NULL DEFAULT 0, data TEXT) STRICT;"
    "CREATE UNIQUE INDEX events_job_seq ON events(job_id, seq);"
    "CREATE TABLE queues (name TEXT PRIMARY KEY, paused INTEGER NOT NULL DEFAULT 0)"
    " STRICT, WITHOUT ROWID;"
    "CREATE TABLE idempotency (key TEXT PRIMARY KEY, job_id INTEGER NOT NULL, fingerprint TEXT,"
    " created_ms INTEGER NOT NULL) STRICT, WITHOUT ROWID;"
    "PRAGMA application_id = 1245992779;" /* 0x4a44574b */
    "PRAGMA user_version = 1;"
    "INSERT INTO jobs(id, queue, state, created_ms, updated_ms, version) VALUES"
    " (10, 'a', 0, 1, 1, 1), (11, 'a', 1, 1, 1, 3), (12, 'b', 3, 1, 1, 2),"
    " (13, 'a', 0, 1, 1, 1);"
    "INSERT INTO job_definitions VALUES (10, '{}'), (11, '{}'),"
    " (12, '{\"handler\":\"exec\",\"labels\":{\"team\":\"billing\"}}'), (13, '{}');"
    "INSERT INTO events(job_id, seq, time_ms, kind, tag, data) VALUES"
    " (10, 1, 1, 0, 0, '{\"state\":\"queued\"}'),"
    " (11, 1, 1, 0, 0, '{\"state\":\"queued\"}'), (11, 2, 1, 0, 0, '{\"state\":\"running\"}'),"
    " (11, 3, 1, 1, 1, '{\"command\":\"echo\"}'),"
    " (12, 1, 1, 0, 0, '{\"state\":\"queued\"}'), (12, 2, 1, 0, 0, '{\"state\":\"succeeded\"}'),"
    " (13, 1, 1, 0, 0, '{\"state\":\"queued\"}');"
    "INSERT INTO queues VALUES ('c', 1);";

static int count_active(void *arg, const struct jd_job *job, const struct jd_job_event *ev,
                        size_t n)
{
    int *c = arg;
    if (job->id == 11) {
        assert_int_equal(n, 1);
        assert_int_equal(ev[0].kind, JD_EVK_DISPATCH);
    }
    (*c)++;
    return 0;
}

static void test_old_version_file_is_migrated_with_its_data(void **state)
{
    char *dir = scratch_dir(), *path = db_path(dir);
    assert_int_equal(sql_exec(path, schema_v1), SQLITE_OK);
    assert_int_equal(sql_int(path, "PRAGMA user_version"), 1);

    struct jd_store *s;
    struct jd_error err;
    assert_int_equal(open_store(path, &s, &err), 0);
    /* counts per queue were backfilled from the existing jobs */
    struct jd_queue_counts *rows;
    size_t n;
    assert_int_equal(jd_store_queue_counts(s, &rows, &n), 0);
    assert_int_equal(n, 3);
    assert_string_equal(rows[0].queue, "a");
    assert_int_equal(rows[0].counts[JD_JOB_QUEUED], 2);
    assert_int_equal(rows[0].counts[JD_JOB_RUNNING], 1);
    assert_string_equal(rows[1].queue, "b");
    assert_int_equal(rows[1].counts[JD_JOB_SUCCEEDED], 1);
    assert_string_equal(rows[2].queue, "c");
    assert_true(rows[2].paused);
    jd_queue_counts_free(rows, n);
    /* the new indexes serve the old rows */
    struct jd_job_filter f = {.state = -1, .queue = "a", .limit = 10};
    struct jd_job *jobs;
    int64_t cursor;
    assert_int_equal(jd_store_job_list(s, &f, &jobs, &n, &cursor), 0);
    assert_int_equal(n, 3);
    assert_int_equal(jobs[0].id, 13);
    jd_jobs_free(jobs, n);
    /* labels and handlers of old jobs were backfilled (schema 4) */
    struct jd_job_find ff = {.state = -1, .limit = 10, .handler = "exec", .n_labels = 1};
    ff.label_key[0] = "team";
    ff.label_value[0] = "billing";
    struct jd_job_find_cursor next;
    assert_int_equal(jd_store_job_find(s, &ff, true, &jobs, &n, &next), 0);
    assert_int_equal(n, 1);
    assert_int_equal(jobs[0].id, 12);
    jd_jobs_free(jobs, n);
    int active = 0;
    assert_int_equal(jd_store_recover(s, count_active, &active), 0);
    assert_int_equal(active, 3);
    /* the queued-job window's index holds the old queued rows (schema 10) */
    int queued = 0;
    assert_int_equal(
        jd_store_queued_page(s, "a", JD_QUEUED_START, INT64_MAX, 10, count_active, &queued, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(queued, 2);
    assert_true(jd_store_next_id(s) > 13);
    /* and the triggers keep counting after the migration */
    struct tres r;
    assert_int_equal(change_state_wait(s, 13, JD_JOB_RUNNING, &r), 0);
    assert_int_equal(r.version, 2);
    assert_int_equal(jd_store_queue_counts(s, &rows, &n), 0);
    assert_int_equal(rows[0].counts[JD_JOB_QUEUED], 1);
    assert_int_equal(rows[0].counts[JD_JOB_RUNNING], 2);
    jd_queue_counts_free(rows, n);
    jd_store_close(s);

    assert_int_equal(sql_int(path, "PRAGMA user_version"), jd_store_schema_version());
    assert_int_equal(sql_int(path, "PRAGMA application_id"), JD_SCHEMA_APP_ID);
    assert_true(integrity_ok(path));
    /* reopening a current file runs no migration and keeps the data */
    assert_int_equal(open_store(path, &s, &err), 0);
    jd_store_close(s);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM jobs"), 4);
    rm_tree(dir);
    free(dir);
    free(path);
}

static void test_new_file_is_wal_with_strict_tables(void **state)
{
    char *dir = scratch_dir(), *path = db_path(dir);
    struct jd_store *s;
    struct jd_error err;
    assert_int_equal(open_store(path, &s, &err), 0);
    assert_int_equal(sql_int(path, "PRAGMA user_version"), jd_store_schema_version());
    jd_store_close(s);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT count(*) FROM pragma_table_list"
                                        " WHERE schema = 'main' AND name NOT LIKE 'sqlite%'"
                                        " AND strict = 0",
                                        -1, &st, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(st, 0), 0);
    sqlite3_finalize(st);
    /* a STRICT table refuses a wrongly typed value */
    assert_int_not_equal(sqlite3_exec(db,
                                      "INSERT INTO jobs(id, queue, state, created_ms,"
                                      " updated_ms) VALUES (1, 'q', 'x', 0, 0)",
                                      NULL, NULL, NULL),
                         SQLITE_OK);
    sqlite3_close(db);
    rm_tree(dir);
    free(dir);
    free(path);
}

/* ---- query plans ---- */

static void check_plan(sqlite3 *db, const char *sql)
{
    char *q = jd_xasprintf("EXPLAIN QUERY PLAN %s", sql);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, q, -1, &st, NULL) != SQLITE_OK)
        fail_msg("prepare %s: %s", sql, sqlite3_errmsg(db));
    /* Scans allowed: the tiny queues and queue_counts tables (one row per
     * queue, or per queue and state), and unique_keys (whose rows are the keys live jobs hold), and
     * the remote commands (at most JD_TASK_MAX_COMMANDS), read whole at start. */
    static const char *const allowed[] = {
        "SCAN queue_counts", "SCAN queues", "SCAN unique_keys", "SCAN remote_commands",
        "SCAN remote_commands USING INDEX sqlite_autoindex_remote_commands_1"};
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *detail = (const char *)sqlite3_column_text(st, 3);
        if (strstr(detail, "TEMP B-TREE"))
            fail_msg("%s\n  uses a temp b-tree: %s", sql, detail);
        if (strncmp(detail, "SCAN", 4) == 0) {
            bool ok = false;
            for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
                ok = ok || strcmp(detail, allowed[i]) == 0;
            if (!ok)
                fail_msg("%s\n  scans: %s", sql, detail);
        }
    }
    sqlite3_finalize(st);
    free(q);
}

static void test_every_query_uses_an_index(void **state)
{
    char *dir = scratch_dir(), *path = db_path(dir);
    struct jd_store *s;
    struct jd_error err;
    assert_int_equal(open_store(path, &s, &err), 0);
    /* some rows, and statistics as a long-running database would have */
    struct tres r;
    for (int i = 0; i < 50; i++) {
        struct jd_job j = make_job(jd_store_next_id(s), i % 3 ? "q1" : "q2", NULL);
        assert_int_equal(insert_wait(s, &j, NULL, &r), 0);
        if (i % 4 == 0)
            assert_int_equal(change_state_wait(s, j.id, JD_JOB_SUCCEEDED, &r), 0);
    }
    jd_store_close(s);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(read_functions(db), SQLITE_OK);
    for (int i = 0; i < RS_N; i++)
        if (i != RS_BEGIN && i != RS_COMMIT)
            check_plan(db, read_sql[i]);
    for (int i = JD_WS_IDEM_INSERT; i < JD_WS_N; i++)
        check_plan(db, writer_sql[i]);
    assert_int_equal(sqlite3_exec(db, "ANALYZE", NULL, NULL, NULL), SQLITE_OK);
    for (int i = 0; i < RS_N; i++)
        if (i != RS_BEGIN && i != RS_COMMIT)
            check_plan(db, read_sql[i]);
    for (int i = JD_WS_IDEM_INSERT; i < JD_WS_N; i++)
        check_plan(db, writer_sql[i]);
    sqlite3_close(db);
    rm_tree(dir);
    free(dir);
    free(path);
}

/* ---- refusals ---- */

static void expect_refusal(const char *path, int code, const char *needle)
{
    struct jd_store *s = NULL;
    struct jd_error err;
    jd_error_clear(&err);
    int rc = open_store(path, &s, &err);
    if (rc != code)
        fail_msg("open %s: rc %d (want %d): %s", path, rc, code, err.message);
    assert_null(s);
    assert_int_equal(err.code, code);
    assert_non_null(strstr(err.message, path));
    if (needle && !strstr(err.message, needle))
        fail_msg("message \"%s\" lacks \"%s\"", err.message, needle);
}

static void test_missing_directory_is_refused_by_name(void **state)
{
    char *dir = scratch_dir();
    char *path = jd_xasprintf("%s/no/such/dir/jackdaw.db", dir);
    expect_refusal(path, JD_EIO, "no/such/dir");
    free(path);
    rm_tree(dir);
    free(dir);
}

static void test_read_only_directory_is_refused_by_name(void **state)
{
    char *dir = scratch_dir();
    char *ro = jd_xasprintf("%s/ro", dir);
    assert_int_equal(mkdir(ro, 0755), 0);
    bool mounted = false;
    if (geteuid() == 0) {
        /* root ignores permission bits: use a read-only mount when allowed */
        mounted = mount("tmpfs", ro, "tmpfs", MS_RDONLY, "size=64k") == 0;
    }
    if (!mounted)
        assert_int_equal(chmod(ro, 0555), 0);
    char *path = jd_xasprintf("%s/jackdaw.db", ro);
    if (mounted || geteuid() != 0) {
        expect_refusal(path, JD_EIO, "not writable");
    } else {
        /* root without mount rights: a read-only kernel file system */
        free(path);
        path = jd_xstrdup("/proc/jackdaw-test.db");
        expect_refusal(path, JD_EIO, NULL);
    }
    if (mounted)
        umount(ro);
    free(path);
    free(ro);
    rm_tree(dir);
    free(dir);
}

static void test_foreign_files_are_refused(void **state)
{
    char *dir = scratch_dir(), *path = db_path(dir);
    FILE *fp = fopen(path, "w");
    fputs("name,value\nthis is a csv file, not a database\n", fp);
    fclose(fp);
    expect_refusal(path, JD_ECORRUPT, "not a SQLite database");
    /* the file was not touched */
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 46);
    unlink(path);

    /* someone else's SQLite database */
    assert_int_equal(sql_exec(path, "CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT);"
                                    "INSERT INTO users VALUES (1, 'ann');"),
                     SQLITE_OK);
    expect_refusal(path, JD_ECORRUPT, "not a Jackdaw database");
    assert_int_equal(sql_int(path, "SELECT count(*) FROM users"), 1);
    rm_tree(dir);
    free(dir);
    free(path);
}

static void test_corrupt_file_is_refused(void **state)
{
    char *dir = scratch_dir(), *path = db_path(dir);
    struct jd_store *s;
    struct jd_error err;
    assert_int_equal(open_store(path, &s, &err), 0);
    jd_store_close(s); /* checkpoints the WAL into the file */
    /* scribble over the schema on page 1 (after the 100-byte header) */
    FILE *fp = fopen(path, "r+");
    assert_non_null(fp);
    fseek(fp, 100, SEEK_SET);
    for (int i = 0; i < 3000; i++)
        fputc(0xa5, fp);
    fclose(fp);
    expect_refusal(path, JD_ECORRUPT, "corrupt");
    rm_tree(dir);
    free(dir);
    free(path);
}

static void test_newer_schema_is_refused(void **state)
{
    char *dir = scratch_dir(), *path = db_path(dir);
    struct jd_store *s;
    struct jd_error err;
    assert_int_equal(open_store(path, &s, &err), 0);
    jd_store_close(s);
    assert_int_equal(sql_exec(path, "PRAGMA user_version = 99"), SQLITE_OK);
    expect_refusal(path, JD_ECORRUPT, "newer");
    assert_int_equal(sql_int(path, "PRAGMA user_version"), 99);
    rm_tree(dir);
    free(dir);
    free(path);
}

static void test_database_held_by_another_jackdaw_is_refused(void **state)
{
    char *dir = scratch_dir(), *path = db_path(dir);
    struct jd_store *s;
    struct jd_error err;
    assert_int_equal(open_store(path, &s, &err), 0);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
    expect_refusal(path, JD_EBUSY, pid);
    /* the holder keeps working */
    struct tres r;
    struct jd_job j = make_job(jd_store_next_id(s), "default", NULL);
    assert_int_equal(insert_wait(s, &j, NULL, &r), 0);
    jd_store_close(s);
    /* released on close */
    assert_int_equal(open_store(path, &s, &err), 0);
    jd_store_close(s);
    rm_tree(dir);
    free(dir);
    free(path);
}

/* A child holds "<db>.lock" (as one being forked when its Jackdaw was
 * killed does, until it execs) after telling the parent through a pipe;
 * it lets go after hold_ms. */
static pid_t hold_lock(const char *lock_path, int hold_ms)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(lock_path, O_RDWR);
        if (fd < 0 || flock(fd, LOCK_EX) != 0)
            _exit(1);
        if (write(p[1], "x", 1) != 1)
            _exit(1);
        usleep((useconds_t)hold_ms * 1000);
        _exit(0);
    }
    char c;
    close(p[1]);
    assert_int_equal(read(p[0], &c, 1), 1);
    close(p[0]);
    return pid;
}

static uint64_t ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Restart after a kill -9: the pid in the lock file is dead but a child it
 * was forking still holds the lock for a moment. The open waits for it
 * (up to 2 s) instead of refusing; while the recorded pid is alive it
 * still refuses at once. */
static void test_lock_left_by_a_dead_jackdaws_child_is_waited_for(void **state)
{
    char *dir = scratch_dir(), *path = db_path(dir);
    char *lock = jd_xasprintf("%s.lock", path);
    struct jd_store *s;
    struct jd_error err;
    assert_int_equal(open_store(path, &s, &err), 0);
    jd_store_close(s);
    /* a dead pid: a child that has exited and been reaped */
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    assert_int_equal(waitpid(dead, NULL, 0), dead);
    FILE *fp = fopen(lock, "w");
    assert_non_null(fp);
    fprintf(fp, "%ld\n", (long)dead);
    fclose(fp);
    pid_t child = hold_lock(lock, 300);
    uint64_t t0 = ms_now();
    assert_int_equal(open_store(path, &s, &err), 0);
    uint64_t waited = ms_now() - t0;
    print_message("open waited %llu ms for the orphaned lock\n", (unsigned long long)waited);
    assert_true(waited >= 150 && waited < 2000);
    jd_store_close(s);
    assert_int_equal(waitpid(child, NULL, 0), child);
    /* the recorded pid alive (ours): refused at once, not after 2 s */
    fp = fopen(lock, "w");
    assert_non_null(fp);
    fprintf(fp, "%ld\n", (long)getpid());
    fclose(fp);
    child = hold_lock(lock, 3000);
    t0 = ms_now();
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
    expect_refusal(path, JD_EBUSY, pid);
    assert_true(ms_now() - t0 < 1000);
    kill(child, SIGKILL);
    assert_int_equal(waitpid(child, NULL, 0), child);
    free(lock);
    rm_tree(dir);
    free(dir);
    free(path);
}

/* Fill the database until commits fail; every record whose done() said 0
 * must be there after a reopen, none whose done() said JD_EIO. With a
 * filler file, free its space after the failure: the same store must then
 * commit again. */
static void fill_until_full(const char *path, uint64_t max_bytes, const char *filler)
{
    struct jd_store_config cfg = {.path = path, .sync_full = true, .max_bytes = max_bytes};
    struct jd_store *s;
    struct jd_error err;
    assert_int_equal(jd_store_open(&cfg, &s, &err), 0);
    char *def = malloc(4001);
    memset(def, 'x', 4000);
    def[0] = '"';
    def[3999] = '"';
    def[4000] = '\0';
    int64_t ok_ids[2000], failed_id = 0;
    int n_ok = 0;
    struct tres r;
    for (int i = 0; i < 2000 && !failed_id; i++) {
        struct jd_job j = make_job(jd_store_next_id(s), "default", NULL);
        j.definition = def;
        int rc = insert_wait(s, &j, NULL, &r);
        if (rc == 0)
            ok_ids[n_ok++] = j.id;
        else if (rc == JD_EIO)
            failed_id = j.id;
        else
            fail_msg("insert: unexpected rc %d", rc);
    }
    assert_true(failed_id != 0);
    assert_true(n_ok > 0);
    struct jd_store_stats st;
    jd_store_stats(s, &st);
    assert_true(st.failed_commits >= 1);
    /* reads still work while full */
    struct jd_job got;
    assert_int_equal(jd_store_job_get(s, ok_ids[0], &got), 0);
    jd_job_clear(&got);
    if (filler) {
        assert_int_equal(unlink(filler), 0);
        struct jd_job j = make_job(jd_store_next_id(s), "default", NULL);
        assert_int_equal(insert_wait(s, &j, NULL, &r), 0);
        ok_ids[n_ok++] = j.id;
    }
    jd_store_close(s);

    cfg.max_bytes = 0;
    assert_int_equal(jd_store_open(&cfg, &s, &err), 0);
    for (int i = 0; i < n_ok; i++) {
        assert_int_equal(jd_store_job_get(s, ok_ids[i], &got), 0);
        jd_job_clear(&got);
    }
    assert_int_equal(jd_store_job_get(s, failed_id, &got), JD_ENOENT);
    jd_store_close(s);
    assert_true(integrity_ok(path));
    free(def);
}

static void test_full_database_fails_commits_with_eio_and_loses_nothing(void **state)
{
    char *dir = scratch_dir(), *path = db_path(dir);
    fill_until_full(path, 256 * 1024, NULL);
    rm_tree(dir);
    free(dir);
    free(path);
}

static void test_full_disk_fails_commits_with_eio_loses_nothing_and_recovers(void **state)
{
    char *dir = scratch_dir();
    if (geteuid() != 0 || mount("tmpfs", dir, "tmpfs", 0, "size=640k") != 0) {
        rm_tree(dir);
        free(dir);
        skip(); /* needs mount rights; the max_bytes test covers the same path */
    }
    char *path = db_path(dir);
    char *filler = jd_xasprintf("%s/filler", dir);
    FILE *fp = fopen(filler, "w");
    assert_non_null(fp);
    for (int i = 0; i < 64 * 1024; i++)
        fputc('f', fp);
    assert_int_equal(fclose(fp), 0);
    fill_until_full(path, 0, filler);
    free(filler);
    umount(dir);
    rm_tree(dir);
    free(dir);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_old_version_file_is_migrated_with_its_data),
        cmocka_unit_test(test_new_file_is_wal_with_strict_tables),
        cmocka_unit_test(test_every_query_uses_an_index),
        cmocka_unit_test(test_missing_directory_is_refused_by_name),
        cmocka_unit_test(test_read_only_directory_is_refused_by_name),
        cmocka_unit_test(test_foreign_files_are_refused),
        cmocka_unit_test(test_corrupt_file_is_refused),
        cmocka_unit_test(test_newer_schema_is_refused),
        cmocka_unit_test(test_database_held_by_another_jackdaw_is_refused),
        cmocka_unit_test(test_lock_left_by_a_dead_jackdaws_child_is_waited_for),
        cmocka_unit_test(test_full_database_fails_commits_with_eio_and_loses_nothing),
        cmocka_unit_test(test_full_disk_fails_commits_with_eio_loses_nothing_and_recovers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
