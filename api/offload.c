/*
 * The slow lane: requests with a large body (OFFLOAD_MIN and up) are parsed
 * and validated on one thread of their own instead of on an MHD thread.
 * Turning a body of a few hundred thousand members into a job takes a
 * large part of a second, and every connection that MHD assigned to the
 * same pool thread (a health check, a small submit) would wait that long.
 * A request in the slow lane is suspended like any asynchronous one: the
 * lane calls the route's start function (which hands the request to the
 * job layer with a done callback) and, if that refuses at once, delivers
 * the refusal as if a callback had fired; http_finish_async answers on the
 * request's MHD thread in both cases.
 *
 * Invariants: the lane holds a reference on each queued request; requests
 * run in arrival order, one at a time; at most OFFLOAD_QUEUE_MAX wait (more
 * get 503 at once), so the lane's backlog and the bodies it keeps are
 * bounded.
 *
 * Threading: http_async_run runs on an MHD thread; the lane's thread runs
 * start functions, which may only read the request's fields and call the
 * job layer.
 */
#include "api/http_impl.h"

#include "common/alloc.h"

#include <pthread.h>
#include <stdlib.h>

#define OFFLOAD_MIN ((size_t)64 << 10) /* bodies this large and up take the lane */
#define OFFLOAD_QUEUE_MAX 64           /* 64 x --max-body at most held waiting */

struct jd_offload {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct jd_req *head, *tail; /* linked through r->onext */
    unsigned queued;
    bool stop;
    pthread_t thread;
};

/* Run start on this thread; the result goes to r as a callback's would. */
static void run_one(struct jd_req *r)
{
    struct jd_error err = {0};
    http_req_ref(r); /* the job-layer callback's */
    int rc = r->offload_start(r, &err);
    if (rc == 0)
        return;        /* the callback will fire (or has) and wake r */
    http_req_unref(r); /* it never will */
    pthread_mutex_lock(&r->mu);
    r->cb_rc = rc;
    r->cb_err = err;
    pthread_mutex_unlock(&r->mu);
    http_wake(r, WAKE_CHANGED);
}

static void *offload_main(void *arg)
{
    struct jd_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (o->head == NULL && !o->stop)
            pthread_cond_wait(&o->cv, &o->mu);
        if (o->head == NULL)
            break; /* stopping, and nothing is left */
        struct jd_req *r = o->head;
        o->head = r->onext;
        if (o->head == NULL)
            o->tail = NULL;
        r->onext = NULL;
        o->queued--;
        pthread_mutex_unlock(&o->mu);
        run_one(r);
        http_req_unref(r); /* the lane's */
        pthread_mutex_lock(&o->mu);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

int http_offload_start(struct jd_offload **out)
{
    struct jd_offload *o = jd_xcalloc(1, sizeof *o);
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    if (pthread_create(&o->thread, NULL, offload_main, o) != 0) {
        pthread_cond_destroy(&o->cv);
        pthread_mutex_destroy(&o->mu);
        free(o);
        return JD_EIO;
    }
    pthread_setname_np(o->thread, "jd-http-lane");
    *out = o;
    return 0;
}

void http_offload_stop(struct jd_offload *o)
{
    if (o == NULL)
        return;
    pthread_mutex_lock(&o->mu);
    o->stop = true; /* what is queued still runs: each request gets its answer */
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->thread, NULL);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

enum MHD_Result http_async_run(struct jd_req *r, jd_async_start_fn *start,
                               jd_async_answer_fn *answer)
{
    struct jd_offload *o = r->h->offload;
    if (r->len < OFFLOAD_MIN || o == NULL) {
        struct jd_error err = {0};
        http_arm(r);
        http_req_ref(r); /* the job-layer callback's */
        int rc = start(r, &err);
        return http_async_started(r, rc, &err, answer);
    }
    pthread_mutex_lock(&o->mu);
    bool full = o->queued >= OFFLOAD_QUEUE_MAX || o->stop;
    pthread_mutex_unlock(&o->mu);
    if (full)
        return http_respond_problem(r, 503, "too many large requests in progress", NULL);
    r->answer = answer;
    r->offload_start = start;
    r->phase = PH_ASYNC;
    http_arm(r);
    /* Suspend before queueing: the lane may finish and wake r at once. */
    pthread_mutex_lock(&r->mu);
    r->suspended = true;
    MHD_suspend_connection(r->conn);
    pthread_mutex_unlock(&r->mu);
    http_req_ref(r); /* the lane's */
    pthread_mutex_lock(&o->mu);
    r->onext = NULL;
    if (o->tail != NULL)
        o->tail->onext = r;
    else
        o->head = r;
    o->tail = r;
    o->queued++;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return MHD_YES;
}
