/*
 * Unique jobs ("unique": {"key", "while", "for_ms", "on_conflict"} on a job
 * definition): at most one live job holds a key. Here: the in-memory index
 * of who holds which key (a hash of chains, like the job table), the hold
 * rule, and rebuilding the index at start from the unique_keys table.
 *
 * The store is the truth: a key row is written in the commit of its job's
 * insert and deleted in the commit that ends the hold (jobs_state_rec sets
 * release_unique on the final state, and on the start of a "while":
 * "queued" job), and the store refuses a second live holder
 * (JD_ECONFLICT). This index answers conflicts without a read and in the
 * order records are enqueued: a job stops holding here exactly when the
 * record that releases it in the store is enqueued, so both agree.
 *
 * Threading: under jd_jobs.mu, except jobs_unique_recover (takes it).
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"

#include <stdlib.h>
#include <string.h>

static unsigned key_bucket(const char *key)
{
    uint32_t h = 2166136261u; /* FNV-1a 32 */
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
        h ^= *p;
        h *= 16777619u;
    }
    return h & (NBUCKETS - 1);
}

/* Does jb (which has a key) hold it at wall time now? */
static bool holds(const struct job *jb, int64_t now)
{
    if (jb->finished)
        return false;
    if (jb->ukey_queued && jb->state != JD_JOB_QUEUED)
        return false; /* started: its "running" record released the key */
    return jb->ukey_until == 0 || now < jb->ukey_until;
}

struct job *jobs_unique_holder_locked(struct jd_jobs *j, const char *key, int64_t now)
{
    for (struct job *jb = j->ukeys[key_bucket(key)]; jb; jb = jb->unext)
        if (strcmp(jb->ukey, key) == 0 && holds(jb, now))
            return jb;
    return NULL;
}

void jobs_unique_hold_locked(struct jd_jobs *j, struct job *jb, const char *key, bool queued,
                             int64_t until)
{
    jobs_unique_drop_locked(j, jb);
    jb->ukey = jd_xstrdup(key);
    jb->ukey_queued = queued;
    jb->ukey_until = until;
    unsigned b = key_bucket(key);
    jb->unext = j->ukeys[b];
    j->ukeys[b] = jb;
}

void jobs_unique_drop_locked(struct jd_jobs *j, struct job *jb)
{
    if (!jb->ukey)
        return;
    for (struct job **pp = &j->ukeys[key_bucket(jb->ukey)]; *pp; pp = &(*pp)->unext)
        if (*pp == jb) {
            *pp = jb->unext;
            break;
        }
    jb->unext = NULL;
    free(jb->ukey);
    jb->ukey = NULL;
}

struct held {
    char *key;
    int64_t job_id, expires_ms;
    struct held *next;
};

static void collect_one(void *arg, const char *key, int64_t job_id, int64_t expires_ms)
{
    struct held **list = arg;
    struct held *h = jd_xcalloc(1, sizeof *h);
    h->key = jd_xstrdup(key);
    h->job_id = job_id;
    h->expires_ms = expires_ms;
    h->next = *list;
    *list = h;
}

/* Under mu. With the queued-job window a holder may be only in the store:
 * it is read in, and stays in memory while it holds (jobs_window.c). */
static void recover_one(struct jd_jobs *j, const struct held *h)
{
    struct job *jb = jobs_job_find(j, h->job_id);
    bool loaded = !jb && j->window && jobs_window_load_locked(j, h->job_id, &jb) == 0;
    /* A row of a job that is not live cannot hold (the store takes such a
     * row over), so the index leaves it out too. */
    if (jb && !jb->finished && jb->def && jb->def->has_unique)
        jobs_unique_hold_locked(j, jb, h->key, jb->def->unique_while_queued, h->expires_ms);
    if (loaded)
        jobs_window_settle_locked(j, jb);
}

void jobs_unique_recover(struct jd_jobs *j)
{
    struct held *list = NULL;
    jd_store_unique_keys(j->store, collect_one, &list);
    pthread_mutex_lock(&j->mu);
    while (list) {
        struct held *h = list;
        list = h->next;
        recover_one(j, h);
        free(h->key);
        free(h);
    }
    pthread_mutex_unlock(&j->mu);
}
