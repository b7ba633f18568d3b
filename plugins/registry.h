/*
 * The host side of the plugin ABI: the loader, the frozen registry of
 * commands and process types, and call dispatch (timeouts, exactly-once
 * completion, retries with backoff).
 *
 * Threading: load/freeze are start-up only (one thread). After
 * jd_registry_freeze, lookups take no lock and every other function is safe
 * from any thread. Services (timers, blocking pool) are injected through
 * struct jd_plugin_env so tests can use a fake clock and the job layer can
 * wire in the scheduler.
 */
#ifndef JD_PLUGINS_REGISTRY_H
#define JD_PLUGINS_REGISTRY_H

#include "plugins/jackdaw_plugin.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct jd_error;
struct jd_registry;

struct jd_plugin_env {
    void *ctx;
    /* fn(arg) once after delay_ms on a thread that may not block; returns an
     * id > 0, or 0 on failure. */
    uint64_t (*timer_after)(void *ctx, uint64_t delay_ms, void (*fn)(void *arg), void *arg);
    /* 0 if cancelled before firing; non-zero otherwise. */
    int (*timer_cancel)(void *ctx, uint64_t id);
    /* Run fn(arg) on a thread that may block. 0 or a JD_E* code. */
    int (*run_blocking)(void *ctx, void (*fn)(void *arg), void *arg);
    /* Plugin configuration (keys: see jd_host.config in jackdaw_plugin.h): a
     * string valid for the registry's life, or NULL. */
    const char *(*config)(void *ctx, const char *key);
};

/* env is copied. *out freed with jd_registry_destroy. */
int jd_registry_create(const struct jd_plugin_env *env, struct jd_registry **out);

/* Load one shared object. Refused (JD_EINVAL, logged naming the file, detail
 * in err): dlopen failure, missing jd_plugin_entry, NULL descriptor, wrong ABI
 * version, duplicate command or process-type name. A refused plugin leaves
 * the registry as it was. */
int jd_registry_load_file(struct jd_registry *r, const char *path, struct jd_error *err);
/* Load every *.so in dir, in name order. Returns the first error but tries
 * all files; *loaded (may be NULL) counts the successes. */
int jd_registry_load_dir(struct jd_registry *r, const char *dir, unsigned *loaded,
                         struct jd_error *err);
/* Register a plugin descriptor linked into the binary or a test (no dlopen).
 * Same checks as load_file; `origin` names it in logs. */
int jd_registry_add(struct jd_registry *r, jd_plugin_entry_fn entry, const char *origin,
                    struct jd_error *err);
/* No more loading; lookups are lock-free from here on. */
void jd_registry_freeze(struct jd_registry *r);
void jd_registry_destroy(struct jd_registry *r);

/* Commands served outside any plugin (the job layer's remote commands):
 * when no loaded plugin has `name`, jd_registry_command asks lookup(ctx,
 * name), which returns a command (valid for the registry's life) or NULL.
 * Set once at start-up before other threads look anything up; lookup must
 * be thread-safe and must not block. */
void jd_registry_set_fallback(struct jd_registry *r,
                              const struct jd_command *(*lookup)(void *ctx, const char *name),
                              void *ctx);

/* Lookups (NULL if unknown). The returned pointers live as long as r. */
const struct jd_command *jd_registry_command(const struct jd_registry *r, const char *name);
const struct jd_process_type *jd_registry_process_type(const struct jd_registry *r,
                                                       const char *name);
/* Walk loaded plugins in load order: index 0..n-1; NULL past the end. */
const struct jd_plugin *jd_registry_plugin(const struct jd_registry *r, size_t index);

/* Run the command's validate hook. 0, or JD_EINVAL (unknown command:
 * message 'unknown handler "x"'; bad args: the hook's message, and its
 * pointer appended to ptr_prefix, e.g. "/steps/2/args" + "/argv/0"). */
int jd_registry_validate(const struct jd_registry *r, const char *command, const char *args_json,
                         const char *ptr_prefix, struct jd_error *err);

/* The host table handed to plugins (also what plugin process types use to
 * emit step outputs: step_* write into a struct jd_step_out). */
const struct jd_host *jd_registry_host(const struct jd_registry *r);

/* ---- calls ---- */

struct jd_retry_policy {
    uint32_t max_attempts;   /* total attempts, >= 1 (1: no retry) */
    uint64_t backoff_ms;     /* delay before attempt 2 */
    double factor;           /* multiplier per attempt, >= 1 */
    uint64_t max_backoff_ms; /* cap; 0: none */
};

/* Delay before attempt `attempt` (>= 2): backoff_ms * factor^(attempt-2),
 * capped, with "equal jitter" from rand64: half fixed, half random. A pure
 * function, so a restart that knows the recorded attempt continues the
 * sequence. attempt < 2 gives 0. */
uint64_t jd_retry_delay_ms(const struct jd_retry_policy *p, uint32_t attempt, uint64_t rand64);

/* How a call ended. Strings borrowed for the callback. */
struct jd_call_result {
    bool ok;
    const char *result_json; /* ok: the handler's result (may be "null") */
    const char
        *error_json; /* !ok: {"kind":..,"message":..,"retryable":..,"attempt":..[,"details":..]} */
    const char
        *error_kind;  /* !ok: "timeout", "cancelled", "unknown_command", or the handler's kind */
    bool retryable;   /* !ok */
    uint32_t attempt; /* the attempt that produced this result */
};

struct jd_call_request {
    const char *command;          /* copied */
    const char *args_json;        /* copied; NULL means {} */
    const char *idempotency_key;  /* copied; e.g. "42:3" */
    uint32_t first_attempt;       /* attempt number of the first try (recorded attempts + 1) */
    int64_t timeout_ms;           /* per attempt; 0: the command's default; <0: none */
    struct jd_retry_policy retry; /* max_attempts counts from attempt 1, so a restart
                                     with first_attempt 3 and max 3 gets one try */
    /* Before each attempt starts (may be NULL): lets the caller record the
     * dispatch with its attempt number. Runs on the dispatching thread or
     * the timer thread; must not block. */
    void (*on_attempt)(void *arg, uint32_t attempt);
    /* Exactly once, when the call ends (success, non-retryable failure,
     * retries exhausted, timeout, cancel). Any thread; must not block. */
    void (*done)(void *arg, const struct jd_call_result *res);
    void *arg;
};

struct jd_call_handle; /* one logical call across its attempts */

/* Start a call. An unknown command is not an error here: done() fires (on
 * this thread) with kind "unknown_command", not retryable. *out (may be NULL)
 * receives a handle for jd_registry_call_cancel, valid until done() ran and
 * jd_registry_call_release was called. Returns 0 (done will fire) or a JD_E*
 * code (it will not). */
int jd_registry_call(struct jd_registry *r, const struct jd_call_request *req,
                     struct jd_call_handle **out);
/* Cancel: done() fires with kind "cancelled" (unless it already fired) and
 * the handler's cancel hook runs. */
void jd_registry_call_cancel(struct jd_registry *r, struct jd_call_handle *h);
/* Drop the caller's reference from jd_registry_call(..., &h). */
void jd_registry_call_release(struct jd_call_handle *h);

/* ---- plugin process types (additive) ---- */

struct jd_process_ops;
/* Wrap plugin process type `type` as a scheduler process, after freeze.
 * *ops (borrowed, lives as long as r) and *self go to jd_sched_spawn, which
 * takes ownership of self (ops->close frees it). ops->init checks the method
 * against the type's list (JD_EINVAL, pointer "/method") and calls create
 * (refusal: JD_EINVAL, pointer "/input"); ops->step translates events and
 * applies the ABI's rule for a step that sets no status. JD_ENOENT if no
 * such type (or not frozen yet). */
int jd_registry_process_new(const struct jd_registry *r, const char *type,
                            const struct jd_process_ops **ops, void **self);

struct jd_registry_stats {
    uint64_t calls, ok, failed, timeouts, cancelled, retries, late_dropped, unknown_command;
};
void jd_registry_stats(const struct jd_registry *r, struct jd_registry_stats *out);

#endif
