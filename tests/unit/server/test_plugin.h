/*
 * An in-process test plugin for the job layer's unit tests: commands with
 * validate hooks and controllable behaviour, and a small process type. Linked
 * into the test binaries and registered with jd_registry_add (no dlopen).
 *
 *   t.echo   completes with its args; validate refuses a member "bad"
 *            (pointer /bad).
 *   t.fail   {"times": n}: attempts 1..n fail (retryable, kind "flaky"),
 *            later ones succeed with {"attempt": a}. Attempt start times are
 *            kept for backoff checks.
 *   t.hang   never completes by itself; cancel() completes it (counts cancels).
 *   t.slow   {"ms": n}: completes after n ms on a host timer.
 *   t.note   completes with {"attempt": a, "key": "<idempotency key>"}
 *            (counts calls).
 *   t.counter (process type) methods count_to: yields t.echo {"i": k} n times,
 *            then done with {"count": n}; create refuses n < 0.
 *
 * Threading: counters are atomics (relaxed: they are only read after the
 * job they belong to has finished, which orders them).
 */
#ifndef JD_TEST_PLUGIN_H
#define JD_TEST_PLUGIN_H

#include "plugins/jackdaw_json.h"
#include "plugins/jackdaw_plugin.h"
#include "plugins/registry.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const struct jd_host *tp_host;
static _Atomic int tp_echo_calls;
static _Atomic int tp_hang_cancels;
static _Atomic int tp_note_calls;
static _Atomic int tp_hang_started;
static _Atomic long long tp_attempt_ms[16]; /* wall ms when t.fail attempt k started */

static __attribute__((unused)) long long tp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static __attribute__((unused)) int tp_echo_validate(const char *args, char *err, size_t errlen,
                                                    char *ptr, size_t ptrlen)
{
    if (strstr(args, "\"bad\"")) {
        snprintf(err, errlen, "bad is not allowed");
        snprintf(ptr, ptrlen, "/bad");
        return 1;
    }
    return 0;
}

static __attribute__((unused)) void tp_echo_handle(const struct jd_call_info *info)
{
    atomic_fetch_add_explicit(&tp_echo_calls, 1, memory_order_relaxed);
    tp_host->complete(info->call, info->args_json);
}

static __attribute__((unused)) void tp_fail_handle(const struct jd_call_info *info)
{
    struct jd_pjson *a = jd_pjson_parse(info->args_json, NULL, 0);
    int64_t times = 0;
    if (a)
        jd_pjson_int(jd_pjson_get(a, "times"), &times);
    jd_pjson_free(a);
    if (info->attempt < 16)
        atomic_store_explicit(&tp_attempt_ms[info->attempt], tp_now_ms(), memory_order_relaxed);
    if ((int64_t)info->attempt <= times) {
        (tp_host->fail)(info->call, "flaky", "failing on purpose", 1, NULL);
    } else {
        char buf[64];
        snprintf(buf, sizeof buf, "{\"attempt\":%u}", info->attempt);
        tp_host->complete(info->call, buf);
    }
}

static __attribute__((unused)) void tp_hang_handle(const struct jd_call_info *info)
{
    (void)info;
    atomic_fetch_add_explicit(&tp_hang_started, 1, memory_order_relaxed);
}

static __attribute__((unused)) void tp_hang_cancel(struct jd_call *call)
{
    atomic_fetch_add_explicit(&tp_hang_cancels, 1, memory_order_relaxed);
    (tp_host->fail)(call, "cancelled", "cancelled", 0, NULL);
}

struct tp_slow {
    struct jd_call *call;
};

static __attribute__((unused)) void tp_slow_fire(void *arg)
{
    struct jd_call *call = arg;
    tp_host->complete(call, "{\"slow\":true}");
}

static __attribute__((unused)) void tp_slow_handle(const struct jd_call_info *info)
{
    struct jd_pjson *a = jd_pjson_parse(info->args_json, NULL, 0);
    int64_t ms = 0;
    if (a)
        jd_pjson_int(jd_pjson_get(a, "ms"), &ms);
    jd_pjson_free(a);
    tp_host->timer_after((uint64_t)ms, tp_slow_fire, info->call);
}

static __attribute__((unused)) void tp_note_handle(const struct jd_call_info *info)
{
    atomic_fetch_add_explicit(&tp_note_calls, 1, memory_order_relaxed);
    char buf[160];
    snprintf(buf, sizeof buf, "{\"attempt\":%u,\"key\":\"%s\"}", info->attempt,
             info->idempotency_key ? info->idempotency_key : "");
    tp_host->complete(info->call, buf);
}

/* t.counter */
struct tp_counter {
    int64_t n, i;
};

static __attribute__((unused)) void *tp_counter_create(const char *method, const char *input,
                                                       char *err, size_t errlen)
{
    if (strcmp(method, "count_to") != 0) {
        snprintf(err, errlen, "unknown method");
        return NULL;
    }
    struct jd_pjson *a = jd_pjson_parse(input ? input : "{}", err, errlen);
    int64_t n = 0;
    if (a)
        jd_pjson_int(jd_pjson_get(a, "n"), &n);
    jd_pjson_free(a);
    if (n < 0) {
        snprintf(err, errlen, "n must be >= 0");
        return NULL;
    }
    struct tp_counter *c = calloc(1, sizeof *c);
    c->n = n;
    return c;
}

static __attribute__((unused)) int tp_counter_step(void *self, const struct jd_plugin_event *ev,
                                                   size_t n, void *out)
{
    struct tp_counter *c = self;
    for (size_t k = 0; k < n; k++)
        if (ev[k].type == JD_PEVENT_COMPLETE)
            c->i++;
    if (c->i >= c->n) {
        char buf[64];
        snprintf(buf, sizeof buf, "{\"count\":%lld}", (long long)c->i);
        tp_host->step_done(out, buf);
        return 0;
    }
    char args[64];
    snprintf(args, sizeof args, "{\"i\":%lld}", (long long)c->i);
    tp_host->step_yield(out, (uint32_t)c->i + 1, "t.echo", args, 0);
    tp_host->step_wait(out);
    return 0;
}

static __attribute__((unused)) void tp_counter_destroy(void *self)
{
    free(self);
}

static const struct jd_command tp_commands[] = {
    {.name = "t.echo", .validate = tp_echo_validate, .handle = tp_echo_handle},
    {.name = "t.fail", .handle = tp_fail_handle},
    {.name = "t.hang", .handle = tp_hang_handle, .cancel = tp_hang_cancel},
    {.name = "t.slow", .handle = tp_slow_handle},
    {.name = "t.note", .handle = tp_note_handle},
};

static const char *const tp_counter_methods[] = {"count_to", NULL};
static const struct jd_process_type tp_types[] = {
    {.name = "t.counter",
     .methods = tp_counter_methods,
     .create = tp_counter_create,
     .step = tp_counter_step,
     .destroy = tp_counter_destroy},
};

static const struct jd_plugin tp_plugin = {
    .abi_version = JD_PLUGIN_ABI_VERSION,
    .name = "test",
    .version = "0.0.1",
    .commands = tp_commands,
    .ncommands = sizeof tp_commands / sizeof tp_commands[0],
    .process_types = tp_types,
    .nprocess_types = 1,
};

static __attribute__((unused)) const struct jd_plugin *tp_entry(const struct jd_host *h)
{
    tp_host = h;
    return &tp_plugin;
}

static __attribute__((unused)) int tp_register(void *arg, struct jd_registry *r)
{
    (void)arg;
    return jd_registry_add(r, tp_entry, "test_plugin.h", NULL);
}

#endif
