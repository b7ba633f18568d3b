/*
 * Submitting jobs: one definition (with an optional Idempotency-Key), a
 * batch, or a validation only. A submission is answered from the insert's
 * commit callback (jobs_record.c), never before the job is durable.
 *
 * Invariants: an Idempotency-Key being committed is in jd_jobs.idems until
 * its insert's commit callback, so a concurrent second submit gets 409
 * instead of a second job; a committed key is answered from the store. A
 * unique key is checked against its live holder (jobs_unique.c) under mu,
 * and taken in the insert's own commit.
 *
 * Threading: called from HTTP threads; takes jd_jobs.mu to insert and
 * submit the records, parses definitions without it.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/sha256.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The Idempotency-Key fingerprint of a definition: SHA-256 of its stored
 * text, so that no one can build a second body that passes for the first
 * (a 64-bit FNV-1a hash, used before, can be made to collide). */
static void fingerprint(const char *text, char out[JD_SHA256_HEX_LEN + 1])
{
    jd_sha256_hex(text, strlen(text), out);
}

/* Whether a stored fingerprint is the one of text. Keys stored before the
 * switch to SHA-256 hold 16 hex digits of FNV-1a 64; they are compared that
 * way, so that a client retrying across an upgrade gets its job back. */
static bool fingerprint_matches(const char *stored, const char *text, const char *fp)
{
    if (!stored)
        return false;
    if (strlen(stored) != 16)
        return strcmp(stored, fp) == 0;
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64, legacy keys only */
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    char legacy[17];
    snprintf(legacy, sizeof legacy, "%016" PRIx64, h);
    return strcmp(stored, legacy) == 0;
}

/* Under mu: 0 if definitions holding `need` more bytes fit --max-job-memory
 * beside those of the live jobs, else JD_EBUSY (503: try later) with err set.
 * One job always fits an empty server, so the bound never refuses everything. */
static int def_mem_check_locked(struct jd_jobs *j, size_t need, struct jd_error *err)
{
    size_t held = atomic_load_explicit(&j->def_mem, memory_order_relaxed);
    if (held == 0 || (need <= j->max_job_memory && held <= j->max_job_memory - need))
        return 0;
    j->st.def_refused++;
    return jd_error_set(err, JD_EBUSY, NULL,
                        "live jobs hold %zu bytes in memory and this one needs "
                        "%zu more, past --max-job-memory (%zu); try again later",
                        held, need, j->max_job_memory);
}

/* Under mu: a job and its insert record (id 0: a fresh one). */
static struct wrec *insert_rec(struct jd_jobs *j, struct jd_jobdef *d, int64_t id, const char *key,
                               const char *fp)
{
    int64_t now = jd_wall_ms();
    struct job *jb = jobs_job_new(j, d, id ? id : jd_store_next_id(j->store), now);
    jobs_job_insert(j, jb);
    struct wrec *r = jobs_wrec_new(j, jb, JD_W_JOB_INSERT);
    r->row.id = jb->id;
    r->row.queue = jd_xstrdup(jb->queue);
    r->row.priority = jb->priority;
    r->row.state = JD_JOB_QUEUED;
    r->row.definition = d->text;
    /* borrowed from d, which the job keeps: indexed for GET /v1/jobs?handler= */
    r->row.handler = d->shape == JD_JOBDEF_TASK && d->nsteps > 0 ? (char *)d->steps[0].call : NULL;
    r->row.run_at_ms = jb->run_at_ms;
    r->row.created_ms = now;
    if (key) {
        r->idem_key = jd_xstrdup(key);
        r->fingerprint = jd_xstrdup(fp);
        r->row.idempotency_key = r->idem_key;
        r->w.idem_fingerprint = r->fingerprint;
    }
    r->w.job = &r->row;
    jb->row_known = true;
    r->after = AFTER_QUEUED;
    if (d->has_unique) {
        int64_t until = d->unique_for_ms ? now + d->unique_for_ms : 0;
        r->w.unique_key = d->unique_key; /* lives in d, which jb keeps */
        r->w.unique_expires_ms = until;
        jobs_unique_hold_locked(j, jb, d->unique_key, d->unique_while_queued, until);
    }
    jobs_window_submit_locked(j, jb, &r->w);
    j->st.submitted++;
    return r;
}

/* Without mu: answer a submit with an earlier job (res->job_id: an
 * Idempotency-Key's, or a unique key's holder), rendered from the store. */
static void answer_existing(struct jd_jobs *j, struct jd_submit_result *res, jd_submit_done_fn done,
                            void *arg)
{
    struct jd_job row = {0};
    char *json = NULL;
    if ((res->rc = jd_store_job_get(j->store, res->job_id, &row)) == 0) {
        json = jd_render_job_json(&row);
        jd_job_clear(&row);
    } else {
        jd_error_set(&res->err, res->rc, NULL, "the earlier job is gone");
    }
    res->json = json;
    done(arg, res);
    free(json);
}

/* Under mu: cancel the queued holder of a unique key for a "replace"
 * (its records go first in ws, which the caller commits together with the
 * new insert). Returns how many records it put. Mirrors the cancel of a
 * job that has not run (jobs_act.c). */
static size_t replace_records(struct jd_jobs *j, struct job *h, int64_t new_id,
                              struct jd_write **ws)
{
    struct wrec *ce = jobs_wrec_new(j, h, JD_W_JOB_CHANGE);
    ce->data = jobs_with_run(cJSON_CreateObject(), h->run);
    ce->w.kind = JD_EVK_CANCEL;
    ce->w.data = ce->data;
    h->cancel_requested = true;
    jobs_ready_remove(j, h);
    jobs_run_at_cancel_locked(j, h);
    h->finished = true;
    struct wrec *r = jobs_state_rec(j, h, JD_JOB_CANCELLED, AFTER_FINAL);
    char m[96];
    snprintf(m, sizeof m, "replaced by job %" PRId64 " with the same unique key", new_id);
    r->error = jobs_err_json("replaced", m);
    r->w.set |= JD_SET_ERROR | JD_SET_FINISHED;
    r->w.error = r->error;
    r->w.finished_ms = jd_wall_ms();
    ws[0] = &ce->w;
    ws[1] = &r->w;
    return 2;
}

/* Can a "replace" take h's key: h still waits to run? */
static bool replaceable(const struct job *h)
{
    return h->state == JD_JOB_QUEUED && !h->admitted && !h->spawned && !h->cancel_requested &&
           !h->finished;
}

/* The request's traceparent (if valid) into d, unless d has its own. */
static void add_trace(struct jd_jobdef *d, const char *traceparent)
{
    if (!traceparent || d->traceparent || !jd_traceparent_valid(traceparent))
        return;
    cJSON *t = cJSON_AddStringToObject(d->root, "traceparent", traceparent);
    d->traceparent = t ? t->valuestring : NULL;
    free(d->text);
    d->text = cJSON_PrintUnformatted(d->root);
}

int jd_jobs_submit(struct jd_jobs *j, const char *body, size_t len, const char *idempotency_key,
                   jd_submit_done_fn done, void *arg, struct jd_error *err)
{
    return jd_jobs_submit_traced(j, body, len, idempotency_key, NULL, done, arg, err);
}

int jd_jobs_submit_traced(struct jd_jobs *j, const char *body, size_t len,
                          const char *idempotency_key, const char *traceparent,
                          jd_submit_done_fn done, void *arg, struct jd_error *err)
{
    jd_error_clear(err);
    struct jd_jobdef *d = NULL;
    int rc = jd_jobdef_parse(body, len, &j->limits, j->reg, &d, err);
    if (rc)
        return rc;
    char fp[JD_SHA256_HEX_LEN + 1] = "";
    if (idempotency_key) /* only a key is stored with its body's fingerprint */
        fingerprint(d->text, fp);
    add_trace(d, traceparent); /* after the fingerprint: not part of the request's identity */
    jd_jobdef_slim(d);         /* now: the parsed tree is not kept while the job waits its turn */
    if (idempotency_key) {
        int64_t existing = 0;
        char *efp = NULL;
        if (jd_store_idem_lookup(j->store, idempotency_key, &existing, &efp) == 0) {
            bool same = fingerprint_matches(efp, d->text, fp);
            free(efp);
            jd_jobdef_free(d);
            if (!same)
                return jd_error_set(err, JD_EINVAL, "",
                                    "this Idempotency-Key was used with a different body");
            struct jd_submit_result res = {.job_id = existing, .existing = true};
            answer_existing(j, &res, done, arg);
            return 0;
        }
    }
    pthread_mutex_lock(&j->mu);
    if (j->draining) {
        pthread_mutex_unlock(&j->mu);
        jd_jobdef_free(d);
        return jd_error_set(err, JD_ESHUTDOWN, NULL, "the server is shutting down");
    }
    struct job *holder =
        d->has_unique ? jobs_unique_holder_locked(j, d->unique_key, jd_wall_ms()) : NULL;
    if (holder && !holder->inserted) {
        pthread_mutex_unlock(&j->mu);
        jd_jobdef_free(d);
        return jd_error_set(err, JD_ECONFLICT, NULL,
                            "the job holding this unique key is still being stored; try again");
    }
    if (holder && (d->unique_on != JD_UNIQUE_REPLACE || !replaceable(holder))) {
        int64_t hid = holder->id;
        int how = d->unique_on == JD_UNIQUE_RETURN_EXISTING ? JD_SUBMIT_UNIQUE_EXISTING
                                                            : JD_SUBMIT_UNIQUE_REJECTED;
        pthread_mutex_unlock(&j->mu);
        jd_jobdef_free(d);
        struct jd_submit_result res = {.job_id = hid, .unique = how};
        answer_existing(j, &res, done, arg);
        return 0;
    }
    if ((rc = def_mem_check_locked(j, d->mem, err))) {
        pthread_mutex_unlock(&j->mu);
        jd_jobdef_free(d);
        return rc;
    }
    if (idempotency_key) {
        for (struct idem *i = j->idems; i; i = i->next)
            if (strcmp(i->key, idempotency_key) == 0) {
                pthread_mutex_unlock(&j->mu);
                jd_jobdef_free(d);
                return jd_error_set(err, JD_ECONFLICT, NULL,
                                    "a job with this Idempotency-Key is still being stored");
            }
        struct idem *i = jd_xcalloc(1, sizeof *i);
        i->key = jd_xstrdup(idempotency_key);
        i->next = j->idems;
        j->idems = i;
    }
    struct jd_write *ws[3];
    size_t nw = 0;
    int64_t id = jd_store_next_id(j->store);
    if (holder) /* replace: cancel it in the commit of the new insert */
        nw = replace_records(j, holder, id, ws);
    struct wrec *r = insert_rec(j, d, id, idempotency_key, fp);
    r->submit_done = done;
    r->user_arg = arg;
    struct job *jb = r->job;
    ws[nw++] = &r->w;
    rc = nw == 1 ? jd_store_submit(j->store, &r->w) : jd_store_submit_many(j->store, ws, nw);
    if (rc) {
        for (size_t k = 0; k + 1 < nw; k++) /* the store is closing: nothing was enqueued */
            jobs_wrec_free((struct wrec *)ws[k]);
        if (idempotency_key)
            jobs_idem_forget(j, idempotency_key);
        jb->finished = true;
        jobs_window_inserted_locked(j, jb);
        jobs_job_remove(j, jb);
        jobs_job_unref(jb);
        jobs_wrec_free(r);
        j->st.submitted--;
    }
    pthread_mutex_unlock(&j->mu);
    if (rc)
        return jd_error_set(err, rc, NULL, "cannot store the job: %s", jd_strerror(rc));
    return 0;
}

int jd_jobs_submit_with(struct jd_jobs *j, const char *body, size_t len,
                        const struct jd_jobs_submit_with *with, jd_submit_done_fn done, void *arg,
                        struct jd_error *err)
{
    jd_error_clear(err);
    if (with->n_extra > JD_JOBS_MAX_EXTRA || with->job_id <= 0)
        return jd_error_set(err, JD_EINVAL, NULL, "bad submit_with");
    struct jd_jobdef *d = NULL;
    int rc = jd_jobdef_parse(body, len, &j->limits, j->reg, &d, err);
    if (rc)
        return rc;
    if (d->has_unique) {
        jd_jobdef_free(d);
        return jd_error_set(err, JD_EINVAL, "/unique",
                            "unique is for jobs submitted one by one (POST /v1/jobs)");
    }
    struct jd_write *ws[JD_JOBS_MAX_EXTRA + 1];
    pthread_mutex_lock(&j->mu);
    if (j->draining) {
        pthread_mutex_unlock(&j->mu);
        jd_jobdef_free(d);
        return jd_error_set(err, JD_ESHUTDOWN, NULL, "the server is shutting down");
    }
    /* No fingerprint: the key's uniqueness in the store is what is wanted. */
    struct wrec *r = insert_rec(j, d, with->job_id, with->idempotency_key, NULL);
    if (with->schedule_id) {
        r->sched_id = jd_xstrdup(with->schedule_id);
        r->row.schedule_id = r->sched_id;
        r->job->row_known = false; /* its render needs the schedule's fire time */
    }
    r->no_json = with->no_json;
    r->submit_done = done;
    r->user_arg = arg;
    for (size_t i = 0; i < with->n_extra; i++)
        ws[i] = with->extra[i];
    ws[with->n_extra] = &r->w;
    rc = jd_store_submit_many(j->store, ws, with->n_extra + 1);
    if (rc) {
        struct job *jb = r->job;
        jb->finished = true;
        jobs_window_inserted_locked(j, jb);
        jobs_job_remove(j, jb);
        jobs_job_unref(jb);
        jobs_wrec_free(r);
        j->st.submitted--;
    }
    pthread_mutex_unlock(&j->mu);
    if (rc)
        return jd_error_set(err, rc, NULL, "cannot store the job: %s", jd_strerror(rc));
    return 0;
}

int jd_jobs_validate(struct jd_jobs *j, const char *body, size_t len, struct jd_error *err)
{
    struct jd_jobdef *d = NULL;
    jd_error_clear(err);
    int rc = jd_jobdef_parse(body, len, &j->limits, j->reg, &d, err);
    jd_jobdef_free(d);
    return rc;
}

int jd_jobs_submit_batch(struct jd_jobs *j, const char *body, size_t len, jd_submit_done_fn done,
                         void *arg, struct jd_error *err)
{
    return jd_jobs_submit_batch_traced(j, body, len, NULL, done, arg, err);
}

int jd_jobs_submit_batch_traced(struct jd_jobs *j, const char *body, size_t len,
                                const char *traceparent, jd_submit_done_fn done, void *arg,
                                struct jd_error *err)
{
    jd_error_clear(err);
    struct jd_jobdef **defs = NULL;
    size_t n = 0;
    int rc = jd_jobdef_parse_batch(body, len, &j->limits, j->reg, &defs, &n, err);
    if (rc)
        return rc;
    for (size_t k = 0; k < n; k++)
        add_trace(defs[k], traceparent);
    for (size_t k = 0; k < n; k++) {
        if (!defs[k]->has_unique)
            continue;
        char ptr[48];
        snprintf(ptr, sizeof ptr, "/jobs/%zu/unique", k);
        jd_error_set(err, JD_EINVAL, ptr,
                     "unique is for jobs submitted one by one (POST /v1/jobs), not in a batch");
        for (size_t i = 0; i < n; i++)
            jd_jobdef_free(defs[i]);
        free(defs);
        return JD_EINVAL;
    }
    struct batch *b = jd_xcalloc(1, sizeof *b);
    b->n = n;
    b->remaining = (int)n;
    b->recs = jd_xcalloc(n, sizeof *b->recs);
    b->done = done;
    b->arg = arg;
    struct jd_write **ws = jd_xcalloc(n, sizeof *ws);
    size_t need = 0;
    for (size_t k = 0; k < n; k++) {
        jd_jobdef_slim(defs[k]);
        need += defs[k]->mem;
    }
    pthread_mutex_lock(&j->mu);
    if (j->draining)
        rc = JD_ESHUTDOWN;
    else
        rc = def_mem_check_locked(j, need, err); /* err says which bound */
    if (!rc) {
        for (size_t k = 0; k < n; k++) {
            b->recs[k] = insert_rec(j, defs[k], 0, NULL, NULL);
            b->recs[k]->batch = b;
            ws[k] = &b->recs[k]->w;
        }
        rc = jd_store_submit_many(j->store, ws, n);
        if (rc) {
            for (size_t k = 0; k < n; k++) {
                struct job *jb = b->recs[k]->job;
                jb->finished = true;
                jobs_window_inserted_locked(j, jb);
                jobs_job_remove(j, jb);
                jobs_job_unref(jb);
                jobs_wrec_free(b->recs[k]);
                j->st.submitted--;
            }
        }
    }
    pthread_mutex_unlock(&j->mu);
    free(ws);
    if (rc) {
        if (!b->recs[0])
            for (size_t k = 0; k < n; k++)
                jd_jobdef_free(defs[k]);
        free(b->recs);
        free(b);
        free(defs);
        if (rc == JD_EBUSY)
            return rc;
        return jd_error_set(err, rc, NULL, "cannot store the batch: %s", jd_strerror(rc));
    }
    free(defs);
    return 0;
}
