/*
 * The scheduler's two queue kinds, both intrusive (an element embeds a
 * struct jd_link, so queueing never allocates):
 *
 * - struct jd_lqueue: a FIFO for the global queue and the per-worker inject
 *   queues. Any thread may push or pop. Single pushes are lock-free (a
 *   Treiber stack of arrivals); pops and chain pushes take the mutex and
 *   first move the arrivals, reversed, to the tail of the locked list, so
 *   the order stays FIFO. The length is a seq_cst counter raised after an
 *   element is visible and lowered by pops (it may read one low for a
 *   moment while a push is between its two steps; that pusher then makes
 *   its own notification), so a worker about to park and a producer about
 *   to notify agree (see sched.c, parking). Batch pops take up to a given
 *   count under one lock.
 *
 * - struct jd_mpsc: a lock-free multi-producer stack drained all at once by
 *   its single consumer (the worker running the process), which reverses it
 *   into arrival (FIFO) order. Used for per-process event queues: producers
 *   are any threads, the consumer is whoever holds the process Running.
 *   Push is a release CAS; take_all is an acquire exchange.
 */
#ifndef JD_SCHEDULER_QUEUE_H
#define JD_SCHEDULER_QUEUE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

struct jd_link {
    struct jd_link *next;
};

struct jd_lqueue {
    pthread_mutex_t mu;
    struct jd_link *head, *tail;        /* guarded by mu */
    _Atomic(struct jd_link *) arrivals; /* lock-free pushes, newest first */
    _Atomic long len;                   /* see above; read anywhere */
};

void jd_lqueue_init(struct jd_lqueue *q);
void jd_lqueue_destroy(struct jd_lqueue *q); /* the queue must no longer be used */
/* Append one element (borrowed link; the element must not be in a queue). */
void jd_lqueue_push(struct jd_lqueue *q, struct jd_link *e);
/* Append a chain first..last of n elements linked by next. */
void jd_lqueue_push_chain(struct jd_lqueue *q, struct jd_link *first, struct jd_link *last,
                          size_t n);
/* Pop up to max elements (oldest first) into out; returns the count. */
size_t jd_lqueue_pop_batch(struct jd_lqueue *q, struct jd_link **out, size_t max);
/* The length now (seq_cst load: see the parking protocol). */
size_t jd_lqueue_len(struct jd_lqueue *q);

struct jd_mpsc {
    _Atomic(struct jd_link *) top;
};

void jd_mpsc_init(struct jd_mpsc *m);
/* Any thread: push e (borrowed link). */
void jd_mpsc_push(struct jd_mpsc *m, struct jd_link *e);
/* The consumer: take everything pushed so far, oldest first (NULL if empty). */
struct jd_link *jd_mpsc_take_all(struct jd_mpsc *m);
/* Any thread: whether something is queued (acquire load; a snapshot). */
bool jd_mpsc_nonempty(struct jd_mpsc *m);

#endif
