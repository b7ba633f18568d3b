/*
 * jackdaw_plugin.h — the public plugin ABI of Jackdaw (version 1).
 *
 * A plugin is a shared object exporting one function:
 *
 *     const struct jd_plugin *jd_plugin_entry(const struct jd_host *host);
 *
 * Jackdaw dlopen()s it (RTLD_NOW | RTLD_LOCAL), calls jd_plugin_entry once at
 * start-up with the host's function table, and reads the returned descriptor
 * (which must stay valid until the process exits; a static const struct is
 * the usual choice). Returning NULL refuses to load (log why with host->log).
 *
 * JSON crosses this boundary as NUL-terminated UTF-8 text, so a plugin needs
 * no JSON library of ours. Every string the host passes in is borrowed: valid
 * only for the duration of the call unless a function says otherwise. Every
 * string a plugin passes to the host is copied by the host before the call
 * returns.
 *
 * This header is self-contained (C99 + stdint); it includes nothing of
 * Jackdaw's. jackdaw_json.h beside it is an optional header-only JSON reader
 * and writer for plugins; plugins/README.md walks through a complete plugin. Nothing in it may
 * change without bumping JD_PLUGIN_ABI_VERSION.
 */
#ifndef JACKDAW_PLUGIN_H
#define JACKDAW_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define JD_PLUGIN_ABI_VERSION 1
#define JD_PLUGIN_ENTRY "jd_plugin_entry"

/* Opaque handle for one in-flight command call (one attempt). The host
 * never reuses a handle within a process, so a stale one can never name a
 * newer call: complete()/fail() on it returns JD_PLUGIN_ESTALE and does
 * nothing else. Handles may be compared and used as keys. */
struct jd_call;

/* Log levels for host->log. */
enum { JD_PLOG_DEBUG = 0, JD_PLOG_INFO = 1, JD_PLOG_WARN = 2, JD_PLOG_ERROR = 3 };

/* Return codes of host functions. */
enum {
    JD_PLUGIN_OK = 0,
    /* The call was already finished (second completion, or after timeout or
     * cancel): dropped. */
    JD_PLUGIN_ESTALE = -9,
    JD_PLUGIN_EINVAL = -1,
};

/*
 * What the host offers. All functions are thread-safe and may be called from
 * any thread, including threads the plugin creates.
 */
struct jd_host {
    uint32_t abi_version; /* JD_PLUGIN_ABI_VERSION of the host */

    /* Finish a call successfully with result_json (JSON text; NULL means
     * null). Returns JD_PLUGIN_OK, or JD_PLUGIN_ESTALE if the call was
     * already finished (e.g. it timed out): the result is dropped. Either way
     * this ends the plugin's use of `call`: the handle must not be touched
     * again. Exactly one of complete/fail must eventually be called for
     * every handle() invocation, even after cancel(). */
    int (*complete)(struct jd_call *call, const char *result_json);

    /* Finish a call with an error. kind is a short machine-readable word
     * ("exit_status", "http_error", "invalid_args", ...), message is for
     * humans, retryable says whether trying again may succeed (the job's retry
     * policy only retries retryable errors). details_json may be NULL.
     * Same return and handle rules as complete(). */
    int (*fail)(struct jd_call *call, const char *kind, const char *message, int retryable,
                const char *details_json);

    /* Non-zero once the call was cancelled or timed out: stop work early. */
    int (*is_cancelled)(struct jd_call *call);

    /* Run fn(arg) once after delay_ms on the host's timer thread (must not
     * block; may call complete/fail). Returns a timer id > 0, or 0 on failure.
     * Timers, config and log need no call: they serve the process's
     * registry (the most recently created one, in tests with several). */
    uint64_t (*timer_after)(uint64_t delay_ms, void (*fn)(void *arg), void *arg);
    /* 0 if the timer was pending and will now never fire; non-zero if it has
     * fired, is firing, or never existed. */
    int (*timer_cancel)(uint64_t timer_id);

    /* A configuration value for this plugin, or NULL. Keys in use:
     * "exec_allow" (comma-separated program paths), "exec_env_allow"
     * (comma-separated env names), "exec_timeout_ms" and "http_timeout_ms"
     * (default deadlines, decimal ms), "http_allow" (comma-separated hosts,
     * optionally with ports), "output_cap" (bytes, decimal). Borrowed,
     * valid for the life of the process. */
    const char *(*config)(const char *key);

    /* One log line, attributed to the plugin. */
    void (*log)(int level, const char *plugin, const char *message);

    /* Process types only: emit a step's outputs (see jd_process_type.step).
     * `out` is the opaque handle the host passed to step. */
    void (*step_yield)(void *out, uint32_t tag, const char *command, const char *args_json,
                       int64_t timeout_ms);
    void (*step_wait)(void *out); /* blocked until a yield completes */
    void (*step_idle)(void *out); /* waiting for a message */
    void (*step_continue)(void *out);
    void (*step_done)(void *out, const char *result_json);
    void (*step_fail)(void *out, const char *error_json);
};

/* Everything a handler learns about one call. Borrowed for the handle() call
 * only, except `call`, valid until complete()/fail(). */
struct jd_call_info {
    struct jd_call *call;
    const char *command;         /* command name (a plugin may serve several) */
    const char *args_json;       /* the yield's args, already validated */
    const char *idempotency_key; /* "<job_id>:<tag>", stable across retries and restarts */
    uint32_t attempt;            /* 1 for the first dispatch, +1 per retry or re-dispatch */
    int64_t timeout_ms;          /* the deadline the host enforces (0: none) */
};

enum {
    /* handle() may block (exec, file I/O): the host calls it on its blocking
     * pool, never on a scheduler worker. Without this flag handle() must
     * return quickly and finish the call later (timer, own thread, event loop). */
    JD_CMD_BLOCKING = 1u << 0,
};

struct jd_command {
    const char *name;           /* unique across all loaded plugins: [a-z][a-z0-9_.-]* */
    uint32_t flags;             /* JD_CMD_* */
    int64_t default_timeout_ms; /* used when the yield gives none; 0: no timeout */
    /* Check args at job submit time. Return 0 if fine; otherwise write a
     * message into err (NUL-terminated, at most errlen bytes) and, if the
     * problem is at a place inside args, its JSON pointer relative to args
     * into ptr ("/argv/0"); return non-zero. May be NULL (everything valid). */
    int (*validate)(const char *args_json, char *err, size_t errlen, char *ptr, size_t ptrlen);
    /* Start (or, with JD_CMD_BLOCKING, run) the call. */
    void (*handle)(const struct jd_call_info *info);
    /* The call timed out or its job was cancelled: stop it if you can (kill
     * the child, abort the transfer). The host has already finished the
     * call; the plugin still calls complete()/fail() once to release the
     * handle (that call returns JD_PLUGIN_ESTALE). May be NULL. May run
     * concurrently with handle() on another thread, and may even come
     * before handle() has recorded the call: record it, then check
     * host->is_cancelled(). The host never calls cancel() for a call the
     * plugin has already released: a complete()/fail() racing a running
     * cancel() on another thread waits until cancel() returns (calling
     * complete()/fail() from inside cancel() is fine; holding a lock that
     * cancel() takes while calling complete()/fail() is not). Must not
     * block. */
    void (*cancel)(struct jd_call *call);
};

/* Events given to a plugin process type's step. */
enum { JD_PEVENT_COMPLETE = 1, JD_PEVENT_MESSAGE = 2, JD_PEVENT_CANCEL = 3 };
struct jd_plugin_event {
    int type;               /* JD_PEVENT_* */
    uint32_t tag;           /* completions: the yield's tag */
    const char *data_json;  /* result or message payload, or NULL */
    const char *error_json; /* failed completion: the error object, else NULL */
};

/*
 * A process type: a state machine a job can name with {"process": name,
 * "method": m, "input": {...}}. Instances are never used by two threads at
 * once. Step outputs go through host->step_* with the `out` handle; a step
 * that sets no status is treated as wait if it yielded, else fail.
 */
struct jd_process_type {
    const char *name;           /* unique across all loaded plugins */
    const char *const *methods; /* NULL-terminated list of entry points */
    /* Make an instance for `method` with input (JSON text or NULL). Return
     * NULL and write a message into err to refuse (unknown method, bad
     * input): the job fails validation / fails. */
    void *(*create)(const char *method, const char *input_json, char *err, size_t errlen);
    /* Advance with n events (borrowed). Return 0, or non-zero to fail. */
    int (*step)(void *self, const struct jd_plugin_event *events, size_t n, void *out);
    void (*destroy)(void *self);
};

struct jd_plugin {
    uint32_t abi_version; /* must be JD_PLUGIN_ABI_VERSION */
    const char *name;     /* plugin name, for logs and GET /v1/handlers */
    const char *version;  /* free-form, e.g. "1.0.0" */
    const struct jd_command *commands;
    size_t ncommands;
    const struct jd_process_type *process_types;
    size_t nprocess_types;
};

typedef const struct jd_plugin *(*jd_plugin_entry_fn)(const struct jd_host *host);

#ifdef __cplusplus
}
#endif

#endif
