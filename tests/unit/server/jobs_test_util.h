/*
 * Helpers shared by the job layer's lifecycle tests: a fresh database in a
 * temporary directory, a job layer with the in-process test plugin, and
 * blocking wrappers (submit and wait for the commit, wait for a state) built
 * on the layer's own callbacks and watches.
 *
 * Threading: callbacks signal a semaphore; the test thread waits on it.
 */
#ifndef JD_JOBS_TEST_UTIL_H
#define JD_JOBS_TEST_UTIL_H

#include "common/clock.h"
#include "server/jobs.h"
#include "storage/store.h"
#include "test_plugin.h"

#include <cJSON.h>
#include <errno.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct env {
    char dir[128];
    char db[192];
    struct jd_store *store;
    struct jd_jobs *jobs;
};

static __attribute__((unused)) void env_open_store(struct env *e)
{
    struct jd_store_config sc = {.path = e->db, .sync_full = false};
    struct jd_error err;
    jd_error_clear(&err);
    if (jd_store_open(&sc, &e->store, &err) != 0)
        fail_msg("store open: %s", err.message);
}

static __attribute__((unused)) void env_start_jobs(struct env *e, struct jd_jobs_config *cfg)
{
    struct jd_jobs_config c = {0};
    if (cfg)
        c = *cfg;
    c.store = e->store;
    if (!c.workers)
        c.workers = 2;
    if (!c.register_plugins)
        c.register_plugins = tp_register;
    struct jd_error err;
    jd_error_clear(&err);
    if (jd_jobs_create(&c, &e->jobs, &err) != 0)
        fail_msg("jobs create: %s", err.message);
}

static __attribute__((unused)) void env_up(struct env *e, struct jd_jobs_config *cfg)
{
    memset(e, 0, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "/tmp/jd_jobs_test_XXXXXX");
    if (!mkdtemp(e->dir))
        fail_msg("mkdtemp: %s", strerror(errno));
    snprintf(e->db, sizeof e->db, "%s/jd.db", e->dir);
    env_open_store(e);
    env_start_jobs(e, cfg);
}

static __attribute__((unused)) void env_down(struct env *e)
{
    jd_jobs_destroy(e->jobs);
    jd_store_close(e->store);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cleanup of %s failed\n", e->dir);
}

static __attribute__((unused)) void sem_wait_ms(sem_t *s, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    while (sem_timedwait(s, &ts) != 0) {
        if (errno == ETIMEDOUT)
            fail_msg("timed out after %d ms", ms);
    }
}

struct submit_wait {
    sem_t sem;
    int rc;
    int64_t id;
    bool existing;
    char *json;
};

static __attribute__((unused)) void submit_cb(void *arg, const struct jd_submit_result *res)
{
    struct submit_wait *w = arg;
    w->rc = res->rc;
    w->id = res->job_id;
    w->existing = res->existing;
    w->json = res->json ? strdup(res->json) : NULL;
    sem_post(&w->sem);
}

/* Submit and wait until durable; returns the id (fails the test on error). */
static __attribute__((unused)) int64_t submit_key(struct jd_jobs *j, const char *def,
                                                  const char *key, bool *existing)
{
    struct submit_wait w = {0};
    sem_init(&w.sem, 0, 0);
    struct jd_error err;
    jd_error_clear(&err);
    int rc = jd_jobs_submit(j, def, strlen(def), key, submit_cb, &w, &err);
    if (rc)
        fail_msg("submit %s: %d %s %s", def, rc, err.pointer, err.message);
    sem_wait_ms(&w.sem, 10000);
    sem_destroy(&w.sem);
    if (w.rc)
        fail_msg("submit done rc %d", w.rc);
    if (existing)
        *existing = w.existing;
    free(w.json);
    return w.id;
}

static __attribute__((unused)) int64_t submit(struct jd_jobs *j, const char *def)
{
    return submit_key(j, def, NULL, NULL);
}

struct watch_wait {
    sem_t sem;
    int rc;
    int64_t version;
};

static __attribute__((unused)) void watch_cb(void *arg, int rc, int64_t version)
{
    struct watch_wait *w = arg;
    w->rc = rc;
    w->version = version;
    sem_post(&w->sem);
}

/* The job as parsed JSON (caller deletes). */
static __attribute__((unused)) cJSON *job_get(struct jd_jobs *j, int64_t id)
{
    char *json = NULL;
    int64_t v;
    bool t;
    if (jd_jobs_get_json(j, id, &json, &v, &t) != 0)
        fail_msg("get %lld", (long long)id);
    cJSON *o = cJSON_Parse(json);
    free(json);
    return o;
}

static __attribute__((unused)) const char *jstate(const cJSON *job)
{
    return cJSON_GetObjectItem(job, "state")->valuestring;
}

/* Wait until the job is terminal (through a watch); returns it parsed. */
static __attribute__((unused)) cJSON *wait_terminal(struct jd_jobs *j, int64_t id, int ms)
{
    struct watch_wait w = {0};
    sem_init(&w.sem, 0, 0);
    int rc = jd_jobs_watch(j, id, 0, true, watch_cb, &w, NULL);
    if (rc)
        fail_msg("watch %d", rc);
    sem_wait_ms(&w.sem, ms);
    sem_destroy(&w.sem);
    return job_get(j, id);
}

/* Poll (through watches on each new version) until the job is in state. */
static __attribute__((unused)) cJSON *wait_state(struct jd_jobs *j, int64_t id, const char *state,
                                                 int ms)
{
    int64_t deadline = jd_wall_ms() + ms;
    for (;;) {
        cJSON *o = job_get(j, id);
        if (strcmp(jstate(o), state) == 0)
            return o;
        int64_t v = (int64_t)cJSON_GetObjectItem(o, "version")->valuedouble;
        cJSON_Delete(o);
        struct watch_wait w = {0};
        sem_init(&w.sem, 0, 0);
        uint64_t wid = 0;
        if (jd_jobs_watch(j, id, v, false, watch_cb, &w, &wid) != 0)
            fail_msg("watch");
        int left = (int)(deadline - jd_wall_ms());
        if (left <= 0)
            fail_msg("job %lld never reached %s", (long long)id, state);
        sem_wait_ms(&w.sem, left);
        sem_destroy(&w.sem);
    }
}

struct action_wait {
    sem_t sem;
    int rc;
    char *json;
};

static __attribute__((unused)) void action_cb(void *arg, int rc, const char *json)
{
    struct action_wait *w = arg;
    w->rc = rc;
    w->json = json ? strdup(json) : NULL;
    sem_post(&w->sem);
}

static __attribute__((unused)) void action_wait_init(struct action_wait *w)
{
    memset(w, 0, sizeof *w);
    sem_init(&w->sem, 0, 0);
}

static __attribute__((unused)) void action_wait_done(struct action_wait *w)
{
    sem_wait_ms(&w->sem, 10000);
    sem_destroy(&w->sem);
    free(w->json);
}

static __attribute__((unused)) cJSON *jget(const cJSON *o, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *v = o;
    for (char *tok = strtok(buf, "."); tok && v; tok = strtok(NULL, "."))
        v = cJSON_GetObjectItem(v, tok);
    return (cJSON *)v;
}

/* The job's events as parsed JSON (caller deletes). */
static __attribute__((unused)) cJSON *job_events(struct jd_jobs *j, int64_t id)
{
    char *json = NULL;
    if (jd_jobs_events_json(j, id, 0, 0, &json) != 0)
        fail_msg("events");
    cJSON *o = cJSON_Parse(json);
    free(json);
    return o;
}

#endif
