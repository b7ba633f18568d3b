/*
 * The work-stealing scheduler: runs processes (scheduler/process.h) on a
 * fixed set of worker threads, dispatches their yields through hooks, owns
 * timers and a bounded blocking pool. No JSON, no SQLite, no HTTP here.
 *
 * Threading: every function below is safe to call from any thread (workers,
 * timer callbacks, blocking-pool jobs, HTTP threads) unless it says otherwise.
 * jd_sched_create / jd_sched_shutdown / jd_sched_destroy are called by one
 * owner thread, never from a worker.
 *
 * Process lifecycle (docs/architecture.md, "The scheduler"): spawn -> Ready -> Running (a
 * worker's CAS) -> Blocked (yielded, JD_STEP_WAIT) | Idle (JD_STEP_IDLE) |
 * Ready again (JD_STEP_CONTINUE) | Complete (DONE/FAIL). Blocked/Idle -> Ready
 * when an event arrives. An event that arrives while Running is never lost.
 */
#ifndef JD_SCHEDULER_SCHED_H
#define JD_SCHEDULER_SCHED_H

#include "scheduler/process.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct jd_sched;

/* How the scheduler reaches the rest of the system. All hooks run on a
 * worker thread and must not block. */
struct jd_sched_hooks {
    void *ctx;
    /* One call per yield, in order, after step returned (the process is
     * already Blocked/Idle/Ready as its status says, so the completion may
     * arrive before dispatch returns). y is borrowed for the call. `user` is
     * the pointer given at spawn. NULL: every yield completes at once with an
     * error {"kind":"no_dispatcher"}. */
    void (*dispatch)(void *ctx, jd_pid pid, void *user, const struct jd_yield *y,
                     struct jd_token token);
    /* After each step, with the status it returned (CONTINUE/WAIT/IDLE),
     * before dispatching its yields. May be NULL. */
    void (*stepped)(void *ctx, jd_pid pid, void *user, enum jd_step_status status);
    /* Once, when the process completes (DONE, FAIL, init failure, kill),
     * before ops->close. result/error borrowed. May be NULL. */
    void (*finished)(void *ctx, jd_pid pid, void *user, enum jd_step_status status,
                     const char *result, const char *error);
};

struct jd_sched_config {
    unsigned workers;          /* 0: one per online core */
    unsigned blocking_threads; /* blocking pool bound; 0: JD_SCHED_BLOCKING_DEFAULT */
    unsigned blocking_queue;   /* queued blocking jobs before JD_EFULL; 0: 4096 */
    uint64_t stuck_ns;         /* a step running longer is "stuck"; 0: 10 ms (as libgo) */
    /* Pin worker i to the i-th CPU this process may run on (wrapping).
     * Keeps the kernel from stacking two busy workers on one CPU while
     * another sits idle (it does, for milliseconds, when a third thread
     * such as an HTTP or bench thread keeps waking on the idle one).
     * Unpinned (the default), with no more workers than CPUs, a worker
     * that sees another busy worker stalled on its own CPU steps off that
     * CPU instead (counted in stats.unstacks). */
    bool pin_workers;
    struct jd_sched_hooks hooks;
};

#define JD_SCHED_BLOCKING_DEFAULT 16 /* enough for exec/file handlers on small machines */

/* Start the workers, timer thread and monitor. *out is freed with
 * jd_sched_destroy. */
int jd_sched_create(const struct jd_sched_config *cfg, struct jd_sched **out);

/*
 * Spawn a process. Takes ownership of self: ops->close(self) is called
 * exactly once, when the process completes, at destroy, or before this
 * returns an error (JD_ESHUTDOWN after shutdown began). method and input are
 * borrowed (copied when non-NULL). `user` is handed to the hooks untouched.
 * From a worker thread the process goes to that worker's local ring; from
 * elsewhere to the global queue. The process may run, and its hooks fire,
 * before this returns (*pid_out is written before it is queued).
 */
int jd_sched_spawn(struct jd_sched *s, const struct jd_process_ops *ops, void *self, void *user,
                   const char *method, const char *input, jd_pid *pid_out);

/*
 * Complete a dispatched yield. Exactly one completion per token is
 * delivered; the strings (either may be NULL; error non-NULL means failure)
 * are taken over and freed if dropped. Returns 0 when queued for delivery,
 * JD_ESTALE when the process is gone (dropped). The process becomes Ready,
 * with affinity to the worker it last ran on.
 */
int jd_sched_complete(struct jd_sched *s, struct jd_token token, char *result, char *error);

/* Send a message event (value, data taken over; data may be NULL). Wakes an
 * Idle or Blocked process. JD_ENOENT if pid names no live process. */
int jd_sched_send(struct jd_sched *s, jd_pid pid, uint64_t value, char *data);

/* Deliver a JD_EVENT_CANCEL event (the process decides how to finish).
 * JD_ENOENT if gone. */
int jd_sched_cancel(struct jd_sched *s, jd_pid pid);

/* Force the process to complete as failed with `error` (JSON text, copied;
 * NULL: {"kind":"killed"}) without running another step: at once if it is
 * not Running (the worker that next picks it up finishes it), else as soon as its
 * current step returns (that step's yields are not dispatched).
 * hooks.finished sees JD_STEP_FAIL. JD_ENOENT if gone. */
int jd_sched_kill(struct jd_sched *s, jd_pid pid, const char *error);

/* The worker index (0..W-1) of the calling thread, or -1 outside workers. */
int jd_sched_current_worker(void);
/* The pid of the process whose init/step (or hooks.stepped/dispatch) is
 * running on the calling thread, or 0 elsewhere. Lets a process name itself
 * (e.g. to pass its pid to a child it spawns). */
jd_pid jd_sched_self(void);
unsigned jd_sched_workers(const struct jd_sched *s);

/* Timers. fn(arg) runs once on the scheduler's timer thread after delay_ns;
 * it must not block (it may spawn, send, complete, or hand work to the
 * blocking pool). *id_out (may be NULL) names the timer for cancel. */
int jd_sched_timer_after(struct jd_sched *s, uint64_t delay_ns, void (*fn)(void *arg), void *arg,
                         uint64_t *id_out);
/* 0: the timer was pending and will not fire. JD_ENOENT: it already fired
 * (or is firing) or never existed. */
int jd_sched_timer_cancel(struct jd_sched *s, uint64_t id);

/* Run fn(arg) on the bounded blocking pool (never on a worker). JD_EFULL
 * when the pool's queue is full, JD_ESHUTDOWN after shutdown. */
int jd_sched_run_blocking(struct jd_sched *s, void (*fn)(void *arg), void *arg);

struct jd_sched_stats {
    /* gauges: processes now in each state */
    uint64_t ready, running, blocked, idle;
    /* counters since start */
    uint64_t spawns, completions, steps, steal_attempts, steals, stolen_items;
    uint64_t parks, unparks, stuck_events, stale_dropped, lifo_hits;
    uint64_t unstacks; /* times a worker stepped off a CPU another busy worker waited on */
    /* gauges */
    uint64_t global_depth, inject_depth, timers_pending, blocking_active, blocking_queued;
    unsigned workers;
};
void jd_sched_stats(struct jd_sched *s, struct jd_sched_stats *out);

struct jd_sched_pending {
    uint64_t ready, blocked, idle; /* processes still alive when the workers stopped */
    uint64_t timers, blocking;     /* timers not fired, blocking jobs not started */
};

/* Stop admitting spawns (JD_ESHUTDOWN), let running steps finish, wait up
 * to grace_ns for Ready work to drain, then stop workers, the timer thread
 * and the blocking pool (running blocking jobs are waited for). Processes
 * still alive are reported in *pending (may be NULL), not finished. Hooks
 * are not called after this returns. Returns 0, or JD_ETIMEOUT if the grace
 * period ran out with work left. */
int jd_sched_shutdown(struct jd_sched *s, uint64_t grace_ns, struct jd_sched_pending *pending);

/* Shut down (grace 0) if not yet, close every remaining process, free all. */
void jd_sched_destroy(struct jd_sched *s);

#endif
