/*
 * The process interface: what the scheduler runs.
 *
 * A process is a state machine behind a vtable. A worker calls init(method,
 * input) once, then step(events) each time the process is Ready; step writes
 * zero or more yields (commands to dispatch) and a status into a
 * struct jd_step_out. The scheduler never looks inside payloads: they are
 * opaque JSON text (or a small integer in `value`, for processes that pass
 * numbers around, as the benchmarks do).
 *
 * Tags identify yields. The process assigns them (deterministically, so a
 * replay after a restart produces the same tags); 0 is reserved. Completions
 * are matched by tag, never by position.
 *
 * Threading: init/step/close of one process are never called concurrently;
 * successive calls may run on different workers (with a happens-before edge
 * between them). step must not block: long or blocking work is a yield.
 */
#ifndef JD_SCHEDULER_PROCESS_H
#define JD_SCHEDULER_PROCESS_H

#include <stddef.h>
#include <stdint.h>

struct jd_error;

/* A process id: slot index in the low 32 bits, slot generation in the high
 * 32 bits. 0 is never a valid pid. A pid whose generation no longer matches
 * its slot names a finished process: sends to it fail with JD_ENOENT. */
typedef uint64_t jd_pid;

/* Names one dispatched yield for its completion. It binds the process's
 * generation at dispatch time (inside pid), so a completion for a recycled
 * slot is dropped. */
struct jd_token {
    jd_pid pid;
    uint32_t tag;
};

enum jd_event_type {
    JD_EVENT_YIELD_COMPLETE = 1, /* a yield finished: tag, data (result) or error */
    JD_EVENT_MESSAGE = 2,        /* send(pid, ...): value, data */
    JD_EVENT_CANCEL = 3,         /* cancel(pid): the process may clean up, then must finish */
};

struct jd_event {
    enum jd_event_type type;
    uint32_t tag;   /* the yield's tag for completions; 0 otherwise */
    uint64_t value; /* small integer payload (messages); 0 if unused */
    char *data;     /* JSON text or NULL. Owned by the event: step may take it by
                       setting the pointer to NULL, else it is freed after step. */
    char *error;    /* for a failed completion: JSON text of the error; else NULL.
                       Same ownership as data. */
};

struct jd_yield {
    uint32_t tag;       /* chosen by the process, unique among its live yields, != 0 */
    char *command;      /* handler command name, owned by the step output */
    char *args;         /* JSON text or NULL, owned by the step output */
    int64_t timeout_ms; /* 0: the handler's default */
};

enum jd_step_status {
    JD_STEP_CONTINUE = 0, /* run me again soon (re-queued at the back: a cooperative yield) */
    JD_STEP_WAIT = 1,     /* Blocked until one of my yields completes */
    JD_STEP_IDLE = 2,     /* Idle until a message (or cancel) arrives */
    JD_STEP_DONE = 3,     /* finished: result (may be NULL) */
    JD_STEP_FAIL = 4,     /* finished with error (JSON text) */
};

/* Filled by step. The scheduler owns the buffers and resets it before each
 * step; use the jd_step_* helpers rather than writing fields directly. */
struct jd_step_out {
    enum jd_step_status status;
    char *result; /* DONE: JSON text or NULL (owned) */
    char *error;  /* FAIL: JSON text (owned) */
    struct jd_yield *yields;
    size_t nyields;
    size_t cap;
};

/* Append a yield. command and args are copied (borrowed). */
void jd_step_yield(struct jd_step_out *out, uint32_t tag, const char *command, const char *args,
                   int64_t timeout_ms);
/* Set DONE with a copy of result (may be NULL). */
void jd_step_done(struct jd_step_out *out, const char *result);
/* Set DONE, taking ownership of result (malloc'd, may be NULL). */
void jd_step_done_take(struct jd_step_out *out, char *result);
/* Set FAIL with a copy of error (JSON text). */
void jd_step_fail(struct jd_step_out *out, const char *error);
/* Set FAIL, taking ownership of error (malloc'd JSON text). */
void jd_step_fail_take(struct jd_step_out *out, char *error);
/* Free what the output holds and reset it to empty (status CONTINUE). */
void jd_step_out_reset(struct jd_step_out *out);

struct jd_process_ops {
    const char *type_name; /* "task", "workflow", "counter", ... (for stats and logs) */
    /* Prepare the process for entry point `method` with `input` (JSON text or
     * NULL), both borrowed. Unknown method or bad input: return JD_EINVAL
     * with detail in err; the process then completes as failed. May be NULL. */
    int (*init)(void *self, const char *method, const char *input, struct jd_error *err);
    /* Advance with n events (borrowed array; see jd_event for payload
     * ownership). Write yields and status into out. Returning non-zero
     * fails the process with that code. */
    int (*step)(void *self, struct jd_event *events, size_t n, struct jd_step_out *out);
    /* Release everything; called exactly once, after the last step. May be NULL. */
    void (*close)(void *self);
};

#endif
