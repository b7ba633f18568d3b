/*
 * The scheduler's two queue kinds, both intrusive (an element embeds a
 * struct jd_link, so queueing never allocates):
 *
 * - struct jd_lqueue: a FIFO for the global queue and the per-worker inject
 *   queues. Any thread may push or pop. Single pushes go to a bounded array
 *   of cells (Vyukov's bounded MPMC queue: one CAS to claim a cell, a
 *   release store of its sequence number to publish it), so consumers read
 *   pointers from consecutive cells instead of chasing links through
 *   elements another core just wrote. When the array is full, and then for
 *   as long as anything waits there, pushes go to an overflow list (a
 *   lock-free Treiber stack of arrivals, moved reversed under the mutex to
 *   a locked list); chain pushes always go there. Pops take the mutex, take
 *   the array's cells in order and then the overflow, which only holds
 *   newer elements, so each producer's order is kept; a pop stops at a
 *   cell claimed but not yet published rather than pass it. The length is
 *   a seq_cst counter raised after an element is visible and lowered by
 *   pops (it may read one low for a moment while a push is between its
 *   two steps; that pusher then makes its own notification), so a worker
 *   about to park and a producer about to notify agree (see
 *   sched_park.c). Batch pops take up to a given count under one lock.
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
#include <stdint.h>

struct jd_link {
    struct jd_link *next;
};

struct jd_lqueue_cell {
    _Atomic uint64_t seq; /* pos: free for push pos; pos + 1: holds push pos's item */
    struct jd_link *item; /* written before seq's release store, read after its acquire */
};

struct jd_lqueue {
    pthread_mutex_t mu;
    uint64_t deq;                              /* next cell to pop; guarded by mu */
    struct jd_link *head, *tail;               /* overflow list, guarded by mu */
    _Atomic(struct jd_link *) arrivals;        /* overflow pushes, newest first */
    _Atomic long nover;                        /* elements in the overflow, or about to be */
    _Atomic long len;                          /* see above; read anywhere */
    _Alignas(64) _Atomic uint64_t enq;         /* next cell to claim */
    _Alignas(64) struct jd_lqueue_cell *cells; /* set at init, read-only after */
    uint64_t mask;                             /* cells - 1 */
};

/* cells: the array's capacity, a power of two (pushes beyond it overflow). */
void jd_lqueue_init(struct jd_lqueue *q, size_t cells);
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
