/*
 * Watches: change notification on a job's committed version (long-poll and
 * SSE wait on these). A watch stays in its bucket from jd_jobs_watch until
 * its fn has returned or it was withdrawn (struct watch), which is what lets
 * jd_jobs_unwatch keep its promise in the window between a commit detaching
 * it and its fn.
 *
 * Threading: jobs_watches_collect runs under jd_jobs.mu (from the commit
 * callback); jobs_watches_fire runs without mu and takes it around each fn.
 * jd_jobs_watch and jd_jobs_unwatch are called from any thread (the HTTP
 * threads); unwatch from another thread waits while the fn runs, but never
 * from inside a watch fn (tls_in_watch_fn).
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"

#include <stdlib.h>
#include <string.h>

/* Depth of watch fns running on this thread: unwatch called from inside one
 * never waits for another thread's fn (two fns withdrawing each other's
 * watches would wait for each other forever). */
static _Thread_local unsigned tls_in_watch_fn;

/* Under mu: mark the watches on job_id that this commit satisfies as fired
 * and list them for jobs_watches_fire (they stay in their bucket; see struct
 * watch). */
void jobs_watches_collect(struct jd_jobs *j, int64_t job_id, int64_t version, bool terminal,
                          struct fire **list)
{
    /* Watches on any job (job_id 0, the global event stream) fire on every
     * commit a job record makes; commits counts them. */
    j->commits++;
    for (struct watch *w = j->watches[jobs_bucket(0)]; w; w = w->next) {
        if (!w->fired && w->job_id == 0 && (int64_t)j->commits > w->since) {
            w->fired = true;
            struct fire *f = jd_xcalloc(1, sizeof *f);
            f->w = w;
            f->version = (int64_t)j->commits;
            f->next = *list;
            *list = f;
        }
    }
    for (struct watch *w = j->watches[jobs_bucket(job_id)]; w; w = w->next) {
        if (!w->fired && w->job_id == job_id && version > w->since &&
            (!w->terminal_only || terminal)) {
            w->fired = true;
            struct fire *f = jd_xcalloc(1, sizeof *f);
            f->w = w;
            f->version = version;
            f->next = *list;
            *list = f;
        }
    }
}

/* Under mu: take w out of its bucket. */
static void watch_unlink(struct jd_jobs *j, struct watch *w)
{
    for (struct watch **pp = &j->watches[w->id & (NBUCKETS - 1)]; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            return;
        }
}

/* Without mu: run the fired watches (unless withdrawn meanwhile), then drop
 * them; unwatch from another thread waits while one runs. */
void jobs_watches_fire(struct jd_jobs *j, struct fire *list, int rc)
{
    while (list) {
        struct fire *f = list;
        struct watch *w = f->w;
        list = f->next;
        pthread_mutex_lock(&j->mu);
        bool run = !w->cancelled;
        if (run) {
            w->running = true;
            w->thread = pthread_self();
        }
        pthread_mutex_unlock(&j->mu);
        if (run) {
            tls_in_watch_fn++;
            if (w->fn_json)
                w->fn_json(w->arg, rc ? rc : f->rc, f->version, rc ? NULL : f->json);
            else
                w->fn(w->arg, rc ? rc : f->rc, f->version);
            tls_in_watch_fn--;
        }
        pthread_mutex_lock(&j->mu);
        watch_unlink(j, w);
        if (run)
            pthread_cond_broadcast(&j->cv); /* an unwatch may wait for this fn */
        pthread_mutex_unlock(&j->mu);
        free(w);
        free(f);
    }
}

/* Under mu: add a pending watch on job id (0: any job); one of fn and
 * fn_json is set. */
static void watch_add_locked(struct jd_jobs *j, int64_t id, int64_t since, bool terminal_only,
                             void (*fn)(void *arg, int rc, int64_t version),
                             void (*fn_json)(void *arg, int rc, int64_t version, const char *json),
                             void *arg, uint64_t *watch_id)
{
    struct watch *w = jd_xcalloc(1, sizeof *w);
    unsigned b = jobs_bucket(id);
    w->id = (++j->next_watch << WATCH_ID_SHIFT) | b; /* unwatch finds the bucket */
    w->job_id = id;
    w->since = since;
    w->terminal_only = terminal_only;
    w->fn = fn;
    w->fn_json = fn_json;
    w->arg = arg;
    w->next = j->watches[b];
    j->watches[b] = w;
    if (watch_id)
        *watch_id = w->id;
}

/* A long-poll that comes after its job ended (the usual case for a short
 * job: the job is gone from the table by the time the GET arrives) is
 * answered from one store read (rendered here for fn_json), without j->mu:
 * the ended row is a state the job was in after the request came, so
 * answering with it needs no watch and misses none. Called without mu for
 * a job that was not in the table; false (a job not ended, a failed read)
 * sends the caller back to its locked path. One of fn and fn_json is set. */
static bool ended_answer(struct jd_jobs *j, int64_t id, int64_t since_version,
                         void (*fn)(void *arg, int rc, int64_t version),
                         void (*fn_json)(void *arg, int rc, int64_t version, const char *json),
                         void *arg)
{
    struct jd_job row = {0};
    if (jd_store_job_get(j->store, id, &row) != 0)
        return false;
    bool ready = jd_job_state_terminal(row.state) && row.version > since_version;
    char *json = ready && fn_json ? jd_render_job_json(&row) : NULL;
    int64_t version = row.version;
    jd_job_clear(&row);
    if (!ready || (fn_json && !json))
        return false;
    if (fn_json)
        fn_json(arg, 0, version, json);
    else
        fn(arg, 0, version);
    free(json);
    return true;
}

/* jd_jobs_watch and jd_jobs_watch_json: one of fn and fn_json is set. */
static int watch_add(struct jd_jobs *j, int64_t id, int64_t since_version, bool terminal_only,
                     void (*fn)(void *arg, int rc, int64_t version),
                     void (*fn_json)(void *arg, int rc, int64_t version, const char *json),
                     void *arg, uint64_t *watch_id)
{
    if (watch_id)
        *watch_id = 0;
    pthread_mutex_lock(&j->mu);
    struct job *here = jobs_job_find(j, id);
    if (!jobs_cluster_held(here)) {
        pthread_mutex_unlock(&j->mu);
        if (!here && ended_answer(j, id, since_version, fn, fn_json, arg))
            return 0;
        /* its changes may commit on another node: notices on before the
         * read below (jobs_cluster_want_notices) */
        jobs_cluster_want_notices(j);
        pthread_mutex_lock(&j->mu);
    }
    int64_t version = 0;
    bool terminal = false;
    /* A live job's version is the one its last commit callback saw: a
     * commit whose callback has not run yet will run wrec_done, which takes
     * mu and fires this watch, so none is missed. A job not in the table is
     * terminal (or unknown) and changes no more unless retried, which takes
     * mu too: the store is its truth. */
    struct job *jb = jobs_job_find(j, id);
    if (jb) {
        version = jb->version;
        terminal = jd_job_state_terminal(jb->committed_state);
    } else {
        struct jd_job row = {0};
        if (jd_store_job_get(j->store, id, &row) != 0) {
            pthread_mutex_unlock(&j->mu);
            return JD_ENOENT;
        }
        version = row.version;
        terminal = jd_job_state_terminal(row.state);
        jd_job_clear(&row);
    }
    int now_rc = version > since_version && (!terminal_only || terminal) ? 0
                 : j->drained                                            ? JD_ESHUTDOWN
                                                                         : -1;
    if (now_rc >= 0) {
        pthread_mutex_unlock(&j->mu);
        if (fn_json)
            fn_json(arg, now_rc, version, NULL);
        else
            fn(arg, now_rc, version);
        return 0;
    }
    watch_add_locked(j, id, since_version, terminal_only, fn, fn_json, arg, watch_id);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

uint64_t jd_jobs_commits(struct jd_jobs *j)
{
    pthread_mutex_lock(&j->mu);
    uint64_t n = j->commits;
    pthread_mutex_unlock(&j->mu);
    return n;
}

int jd_jobs_watch_any(struct jd_jobs *j, uint64_t since_commits,
                      void (*fn)(void *arg, int rc, int64_t version), void *arg, uint64_t *watch_id)
{
    if (watch_id)
        *watch_id = 0;
    jobs_cluster_want_notices(j); /* other nodes' commits count too */
    pthread_mutex_lock(&j->mu);
    if (j->commits > since_commits) {
        int64_t v = (int64_t)j->commits;
        pthread_mutex_unlock(&j->mu);
        fn(arg, 0, v);
        return 0;
    }
    if (j->drained) {
        pthread_mutex_unlock(&j->mu);
        fn(arg, JD_ESHUTDOWN, 0);
        return 0;
    }
    watch_add_locked(j, 0, (int64_t)since_commits, false, fn, NULL, arg, watch_id); /* 0: any job */
    pthread_mutex_unlock(&j->mu);
    return 0;
}

int jd_jobs_watch(struct jd_jobs *j, int64_t id, int64_t since_version, bool terminal_only,
                  void (*fn)(void *arg, int rc, int64_t version), void *arg, uint64_t *watch_id)
{
    return watch_add(j, id, since_version, terminal_only, fn, NULL, arg, watch_id);
}

int jd_jobs_watch_json(struct jd_jobs *j, int64_t id, int64_t since_version, bool terminal_only,
                       void (*fn)(void *arg, int rc, int64_t version, const char *json), void *arg,
                       uint64_t *watch_id)
{
    return watch_add(j, id, since_version, terminal_only, NULL, fn, arg, watch_id);
}

/* Under mu: the watch named id, or NULL once it is gone. */
static struct watch *watch_find(struct jd_jobs *j, uint64_t id)
{
    for (struct watch *w = j->watches[id & (NBUCKETS - 1)]; w; w = w->next)
        if (w->id == id)
            return w;
    return NULL;
}

bool jd_jobs_unwatch(struct jd_jobs *j, uint64_t watch_id)
{
    if (!watch_id)
        return false;
    pthread_mutex_lock(&j->mu);
    struct watch *w = watch_find(j, watch_id);
    bool withdrawn = false;
    if (w && !w->fired) {
        /* Not due yet: gone for good. */
        watch_unlink(j, w);
        free(w);
        withdrawn = true;
    } else if (w && !w->running && !w->cancelled) {
        /* Due, but fn has not started (its firing thread has it in a list,
         * maybe behind other watches): it will skip fn and free w. */
        w->cancelled = true;
        withdrawn = true;
    } else if (w && w->running && !tls_in_watch_fn) {
        /* fn runs on another thread (this thread runs no watch fn): wait
         * until it has returned and its watch is gone. */
        while ((w = watch_find(j, watch_id)) && w->running)
            pthread_cond_wait(&j->cv, &j->mu);
    }
    pthread_mutex_unlock(&j->mu);
    return withdrawn;
}
