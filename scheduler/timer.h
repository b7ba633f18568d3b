/*
 * The scheduler's timers: a binary min-heap of deadlines (CLOCK_MONOTONIC)
 * served by one thread, plus a hash of live timer ids so cancel is
 * O(log n). Callbacks run on the timer thread, one at a time, without the
 * lock held, so they may add or cancel timers.
 *
 * Threading: add/cancel/pending from any thread (one mutex); create, stop
 * and destroy from the owner. A timer is either pending (in the heap and the
 * hash), firing (removed from both, callback running) or gone.
 */
#ifndef JD_SCHEDULER_TIMER_H
#define JD_SCHEDULER_TIMER_H

#include <stddef.h>
#include <stdint.h>

struct jd_timers;

/* Start the timer thread. *out is freed with jd_timers_destroy. */
int jd_timers_create(struct jd_timers **out);
/* fn(arg) after delay_ns; *id_out (may be NULL) gets an id > 0. JD_ESHUTDOWN
 * once stopped. */
int jd_timers_add(struct jd_timers *t, uint64_t delay_ns, void (*fn)(void *), void *arg,
                  uint64_t *id_out);
/* 0 if the timer was pending (it will not fire), JD_ENOENT otherwise. */
int jd_timers_cancel(struct jd_timers *t, uint64_t id);
size_t jd_timers_pending(struct jd_timers *t);
/* Stop the thread (waits for a running callback); pending timers are
 * dropped unfired. Returns how many were dropped. Idempotent (0 after). */
size_t jd_timers_stop(struct jd_timers *t);
void jd_timers_destroy(struct jd_timers *t);

/* CLOCK_MONOTONIC now, in ns. */
uint64_t jd_timers_now_ns(void);

#endif
