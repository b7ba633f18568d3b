/*
 * The job table of the job layer: the hash of live jobs by id, their
 * reference counts and the small helpers every other jobs_*.c file shares
 * (building a struct job, parsing a stored definition, error JSON).
 *
 * Invariants: a job is in the table from its insert (or recovery) until its
 * final state is durable; the table holds one reference, and so does every
 * ready list, timer, call, process and write record that points at it. The
 * last jobs_job_unref frees the job.
 *
 * Threading: everything here is called under jd_jobs.mu except jobs_job_new,
 * jobs_parse_stored and jobs_err_json, which touch no shared state.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"

#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

/* A drain of at least this many jobs gives memory back (some 2.8 KB each). */
#define TRIM_MIN_JOBS 4096

void jobs_jtimer_free(struct jtimer *t)
{
    free(t->res);
    free(t->res_err);
    free(t);
}

unsigned jobs_bucket(int64_t id)
{
    return (unsigned)((uint64_t)id * 0x9E3779B97F4A7C15ull >> 52) % NBUCKETS;
}

struct job *jobs_job_find(struct jd_jobs *j, int64_t id)
{
    for (struct job *p = j->table[jobs_bucket(id)]; p; p = p->hnext)
        if (p->id == id)
            return p;
    return NULL;
}

void jobs_job_insert(struct jd_jobs *j, struct job *jb)
{
    unsigned b = jobs_bucket(jb->id);
    jb->hnext = j->table[b];
    j->table[b] = jb;
    jb->refs++;
    if (++j->live > j->live_peak)
        j->live_peak = j->live;
}

void jobs_recs_free(struct rec *r)
{
    while (r) {
        struct rec *n = r->next;
        free(r->command);
        free(r);
        r = n;
    }
}

void jobs_job_free(struct job *jb)
{
    struct jd_jobs *j = jb->owner;
    jobs_recs_free(jb->recs);
    for (struct dlv *d = jb->dlv, *n; d; d = n) {
        n = d->next;
        free(d->data);
        free(d->error);
        free(d);
    }
    jd_jobdef_free(jb->def);
    free(jb->queue);
    free(jb->ukey);
    free(jb);
    if (j && atomic_fetch_sub(&j->jobs_alloc, 1) == 1)
        jobs_release_check(j);
}

/* Under mu. */
void jobs_job_unref(struct job *jb)
{
    if (--jb->refs == 0)
        jobs_job_free(jb);
}

void jobs_job_remove(struct jd_jobs *j, struct job *jb)
{
    struct job **pp = &j->table[jobs_bucket(jb->id)];
    while (*pp && *pp != jb)
        pp = &(*pp)->hnext;
    if (*pp) {
        *pp = jb->hnext;
        j->live--;
        if (j->window)
            jobs_window_gone_locked(j, jb);
        jobs_unique_drop_locked(j, jb);
        jobs_job_unref(jb);
    }
}

/*
 * glibc keeps the heap a large backlog freed (mostly small chunks spread
 * over hundreds of MB) and RSS stays at the backlog's peak. So while the
 * table shrinks, each time it is down to a quarter of its size at the last
 * trim, having lost at least TRIM_MIN_JOBS, the free pages go back
 * (malloc_trim walks every arena). A steady load never shrinks that far and
 * never trims.
 *
 * When the table is empty after such a drain, the idle server gives back
 * what it does not need: the object caches' pools, SQLite's page caches
 * (the writer's 32 MiB the drain filled), the writer's batch buffers, then
 * the heap. Not at that moment but once the last struct job is freed too:
 * a job leaves the table when its end is durable, while its process may
 * still be finishing and its write record still holds it, and the few
 * hundred jobs freed just after a trim (each a few KB spread over pages
 * that are otherwise free) kept up to 40 MB resident in about one drain in
 * four (docs/performance.md, "RSS after the drain, measured").
 */
bool jobs_trim_due_locked(struct jd_jobs *j)
{
    /* With the queued-job window the table only swings by a page (at most
     * window + free slots) as a backlog drains, and a trim every swing would
     * cost more than it gives back: then only the one at the end, once a
     * drain read TRIM_MIN_JOBS jobs in (jobs_window.c sets trim_tail). */
    if (!j->window && j->live_peak - j->live >= TRIM_MIN_JOBS && j->live <= j->live_peak / 4) {
        j->live_peak = j->live;
        j->trim_tail = true;
        j->st.heap_trims++;
        return true;
    }
    if (j->live == 0 && j->trim_tail) {
        j->trim_tail = false;
        j->live_peak = 0;
        atomic_store(&j->release_wait, true);
        jobs_release_check(j);
    }
    return false;
}

void jobs_release_check(struct jd_jobs *j)
{
    if (atomic_load(&j->jobs_alloc) != 0 || !atomic_exchange(&j->release_wait, false))
        return;
    atomic_fetch_add(&j->releases, 1);
    jd_objcache_release();
    jd_store_release_memory(j->store); /* the rest on the writer, when it is idle */
}

void jobs_trim(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

char *jobs_err_json(const char *kind, const char *msg)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "kind", kind);
    cJSON_AddStringToObject(e, "message", msg);
    char *t = cJSON_PrintUnformatted(e);
    cJSON_Delete(e);
    return t;
}

int64_t jobs_job_timeout_ms(const struct job *jb)
{
    return jb->def ? jb->def->timeout_ms : 0;
}

/* Under mu: take a fired timer off its job's list. */
void jobs_jtimer_unlink(struct job *jb, struct jtimer *t)
{
    for (struct jtimer **pp = &jb->timers; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            return;
        }
}

struct job *jobs_job_new(struct jd_jobs *j, struct jd_jobdef *d, int64_t id, int64_t now)
{
    struct job *jb = jd_xcalloc(1, sizeof *jb);
    jb->owner = j;
    atomic_fetch_add(&j->jobs_alloc, 1);
    jb->id = id;
    jb->def = d;
    if (d)
        jd_jobdef_charge(d, &j->def_mem);
    jb->queue = jd_xstrdup(d ? d->queue : "default");
    jb->priority = d ? d->priority : 0;
    jb->run_at_ms = d && d->run_at_ms ? d->run_at_ms : now + (d ? d->delay_ms : 0);
    jb->created_ms = now;
    jb->state = jb->committed_state = JD_JOB_QUEUED;
    jb->run = 1;
    return jb;
}

struct jd_jobdef *jobs_parse_stored(const char *text)
{
    struct jd_job_limits big = {.max_definition_bytes = SIZE_MAX / 2,
                                .max_depth = 1u << 20,
                                .max_steps = 1u << 20,
                                .max_string = SIZE_MAX / 2};
    struct jd_jobdef *d = NULL;
    if (text)
        jd_jobdef_parse(text, strlen(text), &big, NULL, &d, NULL);
    return d;
}
