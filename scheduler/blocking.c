/*
 * The bounded blocking pool; see blocking.h. Invariants (under mu): nthreads
 * <= max_threads; idle <= nthreads; queued jobs form a FIFO list of
 * length nqueued <= queue_cap.
 */
#include "scheduler/blocking.h"

#include "common/alloc.h"
#include "common/error.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

struct job {
    void (*fn)(void *);
    void *arg;
    struct job *next;
};

struct jd_blocking {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* jobs queued or stop */
    unsigned max_threads, queue_cap;
    pthread_t *threads;
    unsigned nthreads, idle, active;
    struct job *head, *tail;
    size_t nqueued;
    bool stop;
};

static void *pool_main(void *arg)
{
    struct jd_blocking *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->head && !b->stop) {
            b->idle++;
            pthread_cond_wait(&b->cv, &b->mu);
            b->idle--;
        }
        if (b->stop)
            break;
        struct job *j = b->head;
        b->head = j->next;
        if (!b->head)
            b->tail = NULL;
        b->nqueued--;
        b->active++;
        pthread_mutex_unlock(&b->mu);
        j->fn(j->arg);
        free(j);
        pthread_mutex_lock(&b->mu);
        b->active--;
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

int jd_blocking_create(unsigned threads, unsigned queue_cap, struct jd_blocking **out)
{
    struct jd_blocking *b = jd_xcalloc(1, sizeof(*b));
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->max_threads = threads ? threads : 1;
    b->queue_cap = queue_cap ? queue_cap : 1;
    b->threads = jd_xcalloc(b->max_threads, sizeof(*b->threads));
    *out = b;
    return 0;
}

int jd_blocking_submit(struct jd_blocking *b, void (*fn)(void *), void *arg)
{
    if (!fn)
        return JD_EINVAL;
    pthread_mutex_lock(&b->mu);
    if (b->stop) {
        pthread_mutex_unlock(&b->mu);
        return JD_ESHUTDOWN;
    }
    if (b->nqueued >= b->queue_cap) {
        pthread_mutex_unlock(&b->mu);
        return JD_EFULL;
    }
    struct job *j = jd_xmalloc(sizeof(*j));
    j->fn = fn;
    j->arg = arg;
    j->next = NULL;
    if (b->tail)
        b->tail->next = j;
    else
        b->head = j;
    b->tail = j;
    b->nqueued++;
    /* Start a thread when every existing one is busy (or waking for an
     * earlier job) and the bound allows. */
    if (b->nqueued > b->idle && b->nthreads < b->max_threads &&
        pthread_create(&b->threads[b->nthreads], NULL, pool_main, b) == 0)
        b->nthreads++;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

void jd_blocking_counts(struct jd_blocking *b, uint64_t *active, uint64_t *queued)
{
    pthread_mutex_lock(&b->mu);
    *active = b->active;
    *queued = b->nqueued;
    pthread_mutex_unlock(&b->mu);
}

size_t jd_blocking_stop(struct jd_blocking *b)
{
    pthread_mutex_lock(&b->mu);
    if (b->stop) {
        pthread_mutex_unlock(&b->mu);
        return 0;
    }
    b->stop = true;
    size_t dropped = b->nqueued;
    struct job *j = b->head;
    b->head = b->tail = NULL;
    b->nqueued = 0;
    pthread_cond_broadcast(&b->cv);
    unsigned n = b->nthreads;
    pthread_mutex_unlock(&b->mu);
    while (j) {
        struct job *next = j->next;
        free(j);
        j = next;
    }
    for (unsigned i = 0; i < n; i++)
        pthread_join(b->threads[i], NULL);
    return dropped;
}

void jd_blocking_destroy(struct jd_blocking *b)
{
    if (!b)
        return;
    jd_blocking_stop(b);
    free(b->threads);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
