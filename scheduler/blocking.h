/*
 * The bounded blocking pool: threads for handler work that blocks (exec,
 * file I/O), so it never runs on a worker. At most `threads` jobs run at
 * once; at most `queue_cap` wait. Threads start lazily, when a job arrives
 * and none is idle, and live until stop.
 *
 * Threading: submit/counts from any thread (one mutex); create, stop and
 * destroy from the owner. A job may submit further jobs.
 */
#ifndef JD_SCHEDULER_BLOCKING_H
#define JD_SCHEDULER_BLOCKING_H

#include <stddef.h>
#include <stdint.h>

struct jd_blocking;

/* *out is freed with jd_blocking_destroy. */
int jd_blocking_create(unsigned threads, unsigned queue_cap, struct jd_blocking **out);
/* Queue fn(arg). JD_EFULL when queue_cap jobs already wait, JD_ESHUTDOWN
 * after stop began. */
int jd_blocking_submit(struct jd_blocking *b, void (*fn)(void *), void *arg);
void jd_blocking_counts(struct jd_blocking *b, uint64_t *active, uint64_t *queued);
/* Refuse new jobs, drop queued ones (not run), wait for running ones and
 * join the threads. Returns how many were dropped. Idempotent. */
size_t jd_blocking_stop(struct jd_blocking *b);
void jd_blocking_destroy(struct jd_blocking *b);

#endif
