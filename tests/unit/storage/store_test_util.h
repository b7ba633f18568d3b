/*
 * Helpers shared by the storage unit tests: a scratch directory per test,
 * synchronous wrappers around the asynchronous write path (submit, then
 * jd_store_sync, whose return orders the done() callback before the check),
 * and a job builder. Header-only so each test program stays one file.
 *
 * Two backends: with JD_TEST_PG_URL set (tests/integration/test_store_pg.sh
 * starts a throwaway PostgreSQL and sets it), test_db_path() resets that
 * database (drops and recreates its schema) and returns its URL, so a test
 * written against test_db_path() runs on PostgreSQL; otherwise it is a
 * SQLite file in the scratch directory, as db_path(). Tests about SQLite
 * files themselves use db_path() and skip on PostgreSQL (test_skip_on_pg).
 */
#ifndef JD_TEST_STORE_UTIL_H
#define JD_TEST_STORE_UTIL_H

#include "common/error.h"
#include "storage/store.h"

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tres {
    int rc;
    int64_t version;
    int64_t job_id;
    int calls;
};

static void tres_done(void *arg, struct jd_write *w, int rc)
{
    struct tres *r = arg;
    r->rc = rc;
    r->version = w->version;
    r->job_id = w->job_id;
    r->calls++;
}

/* A fresh scratch directory; caller frees the string and removes the tree
 * with rm_tree. */
static inline char *scratch_dir(void)
{
    char tmpl[] = "/tmp/jd-store-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    if (!d) {
        perror("mkdtemp");
        abort();
    }
    return strdup(d);
}

static inline void rm_tree(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static inline char *db_path(const char *dir)
{
    char *p = malloc(strlen(dir) + 16);
    sprintf(p, "%s/jackdaw.db", dir);
    return p;
}

/* The PostgreSQL URL the tests run on, or NULL for SQLite. */
static inline const char *test_pg_url(void)
{
    const char *u = getenv("JD_TEST_PG_URL");
    return u && u[0] ? u : NULL;
}

/* Empty the test database: every table, sequence and row of its schema. */
static inline void test_pg_reset(const char *url)
{
    PGconn *c = PQconnectdb(url);
    PGresult *r = NULL;
    if (PQstatus(c) == CONNECTION_OK)
        r = PQexec(c, "SET client_min_messages = warning;"
                      " DROP SCHEMA public CASCADE; CREATE SCHEMA public;");
    if (!r || PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "resetting %s failed: %s\n", url, PQerrorMessage(c));
        abort();
    }
    PQclear(r);
    PQfinish(c);
}

/* The database of one test (caller frees): a fresh PostgreSQL schema when
 * JD_TEST_PG_URL is set, else a SQLite file in dir. */
static inline char *test_db_path(const char *dir)
{
    const char *url = test_pg_url();
    if (!url)
        return db_path(dir);
    test_pg_reset(url);
    return strdup(url);
}

/* Inside a cmocka test: skip a test about SQLite files on PostgreSQL. */
#define test_skip_on_pg()                                                                          \
    do {                                                                                           \
        if (test_pg_url())                                                                         \
            skip();                                                                                \
    } while (0)

static inline struct jd_job make_job(int64_t id, const char *queue, const char *key)
{
    struct jd_job j = {0};
    j.id = id;
    j.queue = (char *)queue;
    j.state = JD_JOB_QUEUED;
    j.definition = (char *)"{\"handler\":\"echo\",\"args\":{\"v\":1}}";
    j.idempotency_key = (char *)key;
    return j;
}

/* Submit w, wait until it is committed; returns the done() rc. */
static inline int submit_wait(struct jd_store *s, struct jd_write *w, struct tres *r)
{
    memset(r, 0, sizeof *r);
    r->rc = 12345;
    w->done = tres_done;
    w->arg = r;
    int rc = jd_store_submit(s, w);
    if (rc != 0)
        return rc;
    rc = jd_store_sync(s);
    if (rc != 0)
        return rc;
    return r->calls == 1 ? r->rc : 99999;
}

static inline int insert_wait(struct jd_store *s, const struct jd_job *j, const char *fp,
                              struct tres *r)
{
    struct jd_write w = {.op = JD_W_JOB_INSERT, .job = j, .idem_fingerprint = fp};
    return submit_wait(s, &w, r);
}

static inline int change_state_wait(struct jd_store *s, int64_t id, enum jd_job_state st,
                                    struct tres *r)
{
    struct jd_write w = {.op = JD_W_JOB_CHANGE,
                         .job_id = id,
                         .set = JD_SET_STATE,
                         .state = st,
                         .kind = JD_EVK_STATE};
    return submit_wait(s, &w, r);
}

static inline int event_wait(struct jd_store *s, int64_t id, enum jd_event_kind k, uint32_t tag,
                             const char *data, struct tres *r)
{
    struct jd_write w = {.op = JD_W_JOB_CHANGE, .job_id = id, .kind = k, .tag = tag, .data = data};
    return submit_wait(s, &w, r);
}

#endif
