/*
 * Tests for the plugin registry (plugins/registry.c, loader.c, call.c):
 * the loader (good plugin, wrong ABI, missing entry symbol, duplicate
 * command and process-type names, directories, freeze), validation, and
 * call dispatch (unknown command, double completion, completion after
 * timeout, cancel, retries with backoff checked against a fake clock,
 * blocking handlers, the process-type adapter).
 *
 * Test plugins come from $JD_BUILD/tests/plugins; dispatch tests register an
 * in-process "manual" plugin whose calls the test completes by hand.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/error.h"
#include "plugin_env.h"
#include "plugins/registry.h"
#include "scheduler/process.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the manual plugin ---- */

#define MAX_CALLS 64

static const struct jd_host *mhost;
static pthread_mutex_t m_mu = PTHREAD_MUTEX_INITIALIZER;
static struct jd_call *m_calls[MAX_CALLS];
static uint32_t m_attempts[MAX_CALLS];
static int m_ncalls;
static int m_cancels;
static struct jd_call *m_cancelled_call;
static pthread_t m_handle_thread;
static int m_fail_mode; /* 1: fail retryable at once; 2: fail non-retryable at once */

static void manual_reset(void)
{
    pthread_mutex_lock(&m_mu);
    m_ncalls = 0;
    m_cancels = 0;
    m_cancelled_call = NULL;
    m_fail_mode = 0;
    pthread_mutex_unlock(&m_mu);
}

static void manual_handle(const struct jd_call_info *info)
{
    int mode;
    pthread_mutex_lock(&m_mu);
    if (m_ncalls < MAX_CALLS) {
        m_attempts[m_ncalls] = info->attempt;
        m_calls[m_ncalls++] = info->call;
    }
    m_handle_thread = pthread_self();
    mode = m_fail_mode;
    pthread_mutex_unlock(&m_mu);
    if (mode == 1)
        (mhost->fail)(info->call, "flaky", "try again", 1, "{\"n\":1}");
    else if (mode == 2)
        (mhost->fail)(info->call, "broken", "do not retry", 0, NULL);
}

static void manual_cancel(struct jd_call *call)
{
    pthread_mutex_lock(&m_mu);
    m_cancels++;
    m_cancelled_call = call;
    pthread_mutex_unlock(&m_mu);
}

static void blocking_handle(const struct jd_call_info *info)
{
    char buf[64];
    pthread_mutex_lock(&m_mu);
    m_handle_thread = pthread_self();
    pthread_mutex_unlock(&m_mu);
    snprintf(buf, sizeof buf, "{\"attempt\":%u}", info->attempt);
    mhost->complete(info->call, buf);
}

static int manual_validate(const char *args, char *err, size_t errlen, char *ptr, size_t ptrlen)
{
    if (strstr(args, "\"bad\""))
        return snprintf(err, errlen, "x is bad"), snprintf(ptr, ptrlen, "/x"), 1;
    return 0;
}

/* "slowcancel": a cancel hook that takes 100 ms, to check that a racing
 * completion waits for it. */
static _Atomic int slow_hook_state; /* 0 idle, 1 running, 2 returned (seq_cst: test only) */

static void slow_cancel(struct jd_call *call)
{
    (void)call;
    atomic_store(&slow_hook_state, 1);
    usleep(100000);
    atomic_store(&slow_hook_state, 2);
}

static const struct jd_command manual_cmds[] = {
    {.name = "manual",
     .validate = manual_validate,
     .handle = manual_handle,
     .cancel = manual_cancel},
    {.name = "manual.deadline", .default_timeout_ms = 50, .handle = manual_handle},
    {.name = "blocker", .flags = JD_CMD_BLOCKING, .handle = blocking_handle},
    {.name = "slowcancel", .handle = manual_handle, .cancel = slow_cancel},
};

static const struct jd_plugin manual_plugin = {
    .abi_version = JD_PLUGIN_ABI_VERSION,
    .name = "manual",
    .version = "1",
    .commands = manual_cmds,
    .ncommands = 4,
};

static const struct jd_plugin *manual_entry(const struct jd_host *h)
{
    mhost = h;
    return &manual_plugin;
}

static struct jd_call *manual_call(int i)
{
    struct jd_call *c;
    pthread_mutex_lock(&m_mu);
    c = i < m_ncalls ? m_calls[i] : NULL;
    pthread_mutex_unlock(&m_mu);
    return c;
}

static int manual_ncalls(void)
{
    int n;
    pthread_mutex_lock(&m_mu);
    n = m_ncalls;
    pthread_mutex_unlock(&m_mu);
    return n;
}

/* ---- fixtures ---- */

struct fx {
    struct penv env;
    struct jd_registry *r;
};

static int setup_fake(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    penv_init(&f->env, false);
    struct jd_plugin_env env = penv_env(&f->env);
    assert_int_equal(jd_registry_create(&env, &f->r), 0);
    manual_reset();
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    jd_registry_destroy(f->r);
    penv_fini(&f->env);
    free(f);
    return 0;
}

static int setup_manual(void **state)
{
    setup_fake(state);
    struct fx *f = *state;
    struct jd_error err;
    assert_int_equal(jd_registry_add(f->r, manual_entry, "manual (test)", &err), 0);
    jd_registry_freeze(f->r);
    return 0;
}

static char *tplugin(const char *name)
{
    char rel[128];
    snprintf(rel, sizeof rel, "tests/plugins/%s.so", name);
    return pbuild_path(rel);
}

/* ---- loader ---- */

static void test_load_good(void **state)
{
    struct fx *f = *state;
    struct jd_error err;
    char *p = tplugin("good");
    assert_int_equal(jd_registry_load_file(f->r, p, &err), 0);
    jd_registry_freeze(f->r);
    const struct jd_command *c = jd_registry_command(f->r, "tgood");
    assert_non_null(c);
    assert_string_equal(c->name, "tgood");
    assert_non_null(jd_registry_process_type(f->r, "tproc"));
    assert_null(jd_registry_command(f->r, "nope"));
    assert_string_equal(jd_registry_plugin(f->r, 0)->name, "good");
    assert_string_equal(jd_registry_plugin(f->r, 0)->version, "0.1.0");
    assert_null(jd_registry_plugin(f->r, 1));

    struct precord rec;
    prec_init(&rec);
    struct jd_call_request req = {.command = "tgood", .done = prec_done, .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    assert_int_equal(rec.done_count, 1);
    assert_true(rec.ok);
    assert_string_equal(rec.result, "{\"good\":true}");
    prec_fini(&rec);
    free(p);
}

static void test_load_bad_abi(void **state)
{
    struct fx *f = *state;
    struct jd_error err;
    char *p = tplugin("badabi");
    assert_int_equal(jd_registry_load_file(f->r, p, &err), JD_EINVAL);
    assert_non_null(strstr(err.message, "ABI version"));
    assert_non_null(strstr(err.message, "badabi.so"));
    assert_null(jd_registry_command(f->r, "tbadabi"));
    assert_null(jd_registry_plugin(f->r, 0));
    free(p);
}

static void test_load_missing_symbol(void **state)
{
    struct fx *f = *state;
    struct jd_error err;
    char *p = tplugin("nosym");
    assert_int_equal(jd_registry_load_file(f->r, p, &err), JD_EINVAL);
    assert_non_null(strstr(err.message, "jd_plugin_entry"));
    assert_non_null(strstr(err.message, "nosym.so"));
    assert_null(jd_registry_plugin(f->r, 0));
    free(p);
    assert_int_equal(jd_registry_load_file(f->r, "/nonexistent/x.so", &err), JD_EINVAL);
    assert_non_null(strstr(err.message, "/nonexistent/x.so"));
}

static void test_load_duplicate_command(void **state)
{
    struct fx *f = *state;
    struct jd_error err;
    char *good = tplugin("good"), *dup = tplugin("dupcmd");
    assert_int_equal(jd_registry_load_file(f->r, good, &err), 0);
    assert_int_equal(jd_registry_load_file(f->r, dup, &err), JD_EINVAL);
    assert_non_null(strstr(err.message, "duplicate command name \"tgood\""));
    assert_non_null(strstr(err.message, "dupcmd.so"));
    /* Refused as a whole: its other command is not registered either. */
    assert_null(jd_registry_command(f->r, "tother"));
    assert_null(jd_registry_plugin(f->r, 1));
    free(good);
    free(dup);
}

static void test_load_duplicate_process_type(void **state)
{
    struct fx *f = *state;
    struct jd_error err;
    char *good = tplugin("good"), *dup = tplugin("duppt");
    assert_int_equal(jd_registry_load_file(f->r, good, &err), 0);
    assert_int_equal(jd_registry_load_file(f->r, dup, &err), JD_EINVAL);
    assert_non_null(strstr(err.message, "duplicate process type \"tproc\""));
    assert_null(jd_registry_plugin(f->r, 1));
    /* The same plugin twice is a duplicate too. */
    assert_int_equal(jd_registry_load_file(f->r, good, &err), JD_EINVAL);
    free(good);
    free(dup);
}

static void test_load_dir(void **state)
{
    struct fx *f = *state;
    struct jd_error err;
    char dir[] = "/tmp/jd_plugdir_XXXXXX";
    char link1[128], link2[128], other[128];
    char cwd[1024];
    assert_non_null(mkdtemp(dir));
    assert_non_null(getcwd(cwd, sizeof cwd));
    char *good = tplugin("good"), *bad = tplugin("badabi");
    char absg[1200], absb[1200];
    snprintf(absg, sizeof absg, "%s%s%s", good[0] == '/' ? "" : cwd, good[0] == '/' ? "" : "/",
             good);
    snprintf(absb, sizeof absb, "%s%s%s", bad[0] == '/' ? "" : cwd, bad[0] == '/' ? "" : "/", bad);
    snprintf(link1, sizeof link1, "%s/a_good.so", dir);
    snprintf(link2, sizeof link2, "%s/b_badabi.so", dir);
    snprintf(other, sizeof other, "%s/readme.txt", dir);
    assert_int_equal(symlink(absg, link1), 0);
    assert_int_equal(symlink(absb, link2), 0);
    FILE *fp = fopen(other, "w");
    fputs("not a plugin\n", fp);
    fclose(fp);
    unsigned loaded = 99;
    assert_int_equal(jd_registry_load_dir(f->r, dir, &loaded, &err), JD_EINVAL);
    assert_int_equal(loaded, 1);
    assert_non_null(strstr(err.message, "b_badabi.so"));
    assert_non_null(jd_registry_command(f->r, "tgood"));
    assert_int_equal(jd_registry_load_dir(f->r, "/nonexistent-dir", &loaded, &err), JD_EIO);
    /* The operator learns why and which flag to fix. */
    assert_non_null(strstr(err.message, "No such file or directory"));
    assert_non_null(strstr(err.message, "--plugin-dir"));
    unlink(link1);
    unlink(link2);
    unlink(other);
    rmdir(dir);
    free(good);
    free(bad);
}

static void test_freeze_refuses_loading(void **state)
{
    struct fx *f = *state;
    struct jd_error err;
    char *good = tplugin("good");
    jd_registry_freeze(f->r);
    assert_int_equal(jd_registry_load_file(f->r, good, &err), JD_EINVAL);
    assert_non_null(strstr(err.message, "frozen"));
    assert_int_equal(jd_registry_add(f->r, manual_entry, "late", &err), JD_EINVAL);
    assert_null(jd_registry_command(f->r, "manual"));
    free(good);
}

static void test_validate(void **state)
{
    struct fx *f = *state;
    struct jd_error err;
    assert_int_equal(jd_registry_validate(f->r, "manual", "{\"x\":1}", "/args", &err), 0);
    assert_int_equal(jd_registry_validate(f->r, "manual", "{\"x\":\"bad\"}", "/steps/2/args", &err),
                     JD_EINVAL);
    assert_string_equal(err.message, "x is bad");
    assert_string_equal(err.pointer, "/steps/2/args/x");
    assert_int_equal(jd_registry_validate(f->r, "htp", "{}", "/args", &err), JD_EINVAL);
    assert_string_equal(err.message, "unknown handler \"htp\"");
    /* No validate hook: anything goes. */
    assert_int_equal(jd_registry_validate(f->r, "blocker", NULL, "", &err), 0);
}

/* ---- dispatch ---- */

static void test_unknown_command(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    struct jd_registry_stats st;
    struct jd_call_handle *h = NULL;
    prec_init(&rec);
    struct jd_call_request req = {
        .command = "no.such", .retry = {.max_attempts = 5}, .done = prec_done, .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, &h), 0);
    assert_non_null(h);
    assert_int_equal(rec.done_count, 1); /* on this thread, before call returned */
    assert_false(rec.ok);
    assert_string_equal(rec.kind, "unknown_command");
    assert_false(rec.retryable);
    assert_non_null(strstr(rec.result, "\"kind\":\"unknown_command\""));
    assert_non_null(strstr(rec.result, "no.such"));
    jd_registry_call_cancel(f->r, h); /* after done: a no-op */
    assert_int_equal(rec.done_count, 1);
    jd_registry_call_release(h);
    jd_registry_stats(f->r, &st);
    assert_int_equal(st.unknown_command, 1);
    assert_int_equal(st.retries, 0);
    prec_fini(&rec);
}

static void test_call_info_and_success(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    prec_init(&rec);
    struct jd_call_request req = {.command = "manual",
                                  .args_json = "{\"a\":[1,2]}",
                                  .idempotency_key = "42:3",
                                  .first_attempt = 2,
                                  .retry = {.max_attempts = 3},
                                  .on_attempt = prec_on_attempt,
                                  .done = prec_done,
                                  .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    assert_int_equal(manual_ncalls(), 1);
    assert_int_equal(m_attempts[0], 2);
    assert_int_equal(rec.nattempts, 1);
    assert_int_equal(rec.attempts_seen[0], 2);
    assert_int_equal(rec.done_count, 0);
    assert_false(mhost->is_cancelled(manual_call(0)));
    assert_int_equal(mhost->complete(manual_call(0), "{\"v\": \"x\"}"), JD_PLUGIN_OK);
    assert_int_equal(rec.done_count, 1);
    assert_true(rec.ok);
    assert_int_equal(rec.attempt, 2);
    assert_string_equal(rec.result, "{\"v\": \"x\"}");
    prec_fini(&rec);
}

static void test_double_completion(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    struct jd_registry_stats st;
    prec_init(&rec);
    struct jd_call_request req = {.command = "manual", .done = prec_done, .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    struct jd_call *c = manual_call(0);
    assert_int_equal(mhost->complete(c, "1"), JD_PLUGIN_OK);
    assert_int_equal(mhost->complete(c, "2"), JD_PLUGIN_ESTALE);
    assert_int_equal((mhost->fail)(c, "x", "y", 1, NULL), JD_PLUGIN_ESTALE);
    assert_int_equal(rec.done_count, 1);
    assert_string_equal(rec.result, "1");
    assert_true(mhost->is_cancelled(c)); /* a released handle reads as finished */
    jd_registry_stats(f->r, &st);
    assert_int_equal(st.late_dropped, 2);
    assert_int_equal(st.ok, 1);
    prec_fini(&rec);
}

static void test_completion_after_timeout(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    struct jd_registry_stats st;
    prec_init(&rec);
    struct jd_call_request req = {
        .command = "manual", .timeout_ms = 100, .done = prec_done, .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    struct jd_call *c = manual_call(0);
    penv_advance(&f->env, 99);
    assert_int_equal(rec.done_count, 0);
    assert_false(mhost->is_cancelled(c));
    penv_advance(&f->env, 1);
    assert_int_equal(rec.done_count, 1);
    assert_false(rec.ok);
    assert_string_equal(rec.kind, "timeout");
    assert_true(rec.retryable);
    assert_int_equal(m_cancels, 1); /* the handler's cancel hook ran */
    assert_ptr_equal(m_cancelled_call, c);
    assert_true(mhost->is_cancelled(c));
    /* The plugin's late completion releases the handle and is dropped. */
    assert_int_equal(mhost->complete(c, "\"late\""), JD_PLUGIN_ESTALE);
    assert_int_equal(rec.done_count, 1);
    assert_string_equal(rec.kind, "timeout");
    jd_registry_stats(f->r, &st);
    assert_int_equal(st.timeouts, 1);
    assert_int_equal(st.late_dropped, 1);
    prec_fini(&rec);
}

static void test_completion_cancels_timeout(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    prec_init(&rec);
    struct jd_call_request req = {
        .command = "manual", .timeout_ms = 100, .done = prec_done, .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    assert_int_equal(penv_pending(&f->env), 1);
    assert_int_equal(mhost->complete(manual_call(0), "true"), JD_PLUGIN_OK);
    assert_int_equal(penv_pending(&f->env), 0); /* the deadline timer is gone */
    penv_advance(&f->env, 1000);
    assert_int_equal(rec.done_count, 1);
    assert_true(rec.ok);
    assert_int_equal(m_cancels, 0);
    prec_fini(&rec);
}

static void test_default_timeout(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    prec_init(&rec);
    /* timeout_ms 0: the command's default (50 ms). */
    struct jd_call_request req = {.command = "manual.deadline", .done = prec_done, .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    penv_advance(&f->env, 49);
    assert_int_equal(rec.done_count, 0);
    penv_advance(&f->env, 1);
    assert_int_equal(rec.done_count, 1);
    assert_string_equal(rec.kind, "timeout");
    assert_int_equal(mhost->complete(manual_call(0), NULL), JD_PLUGIN_ESTALE);
    /* timeout_ms < 0: none at all. */
    struct precord rec2;
    prec_init(&rec2);
    req.timeout_ms = -1;
    req.arg = &rec2;
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    penv_advance(&f->env, 100000);
    assert_int_equal(rec2.done_count, 0);
    assert_int_equal(mhost->complete(manual_call(1), NULL), JD_PLUGIN_OK);
    assert_int_equal(rec2.done_count, 1);
    assert_string_equal(rec2.result, "null");
    prec_fini(&rec);
    prec_fini(&rec2);
}

static void test_cancel(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    struct jd_call_handle *h;
    struct jd_registry_stats st;
    prec_init(&rec);
    struct jd_call_request req = {.command = "manual",
                                  .timeout_ms = 500,
                                  .retry = {.max_attempts = 3, .backoff_ms = 10, .factor = 2},
                                  .done = prec_done,
                                  .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, &h), 0);
    struct jd_call *c = manual_call(0);
    jd_registry_call_cancel(f->r, h);
    assert_int_equal(rec.done_count, 1);
    assert_string_equal(rec.kind, "cancelled");
    assert_false(rec.retryable);
    assert_int_equal(m_cancels, 1);
    assert_true(mhost->is_cancelled(c));
    assert_int_equal(penv_pending(&f->env), 0); /* the deadline timer was stopped */
    jd_registry_call_cancel(f->r, h);           /* twice: nothing more */
    assert_int_equal(mhost->complete(c, NULL), JD_PLUGIN_ESTALE);
    penv_advance(&f->env, 10000);
    assert_int_equal(rec.done_count, 1);
    assert_int_equal(manual_ncalls(), 1); /* a cancel is not retried */
    jd_registry_call_release(h);
    jd_registry_stats(f->r, &st);
    assert_int_equal(st.cancelled, 1);
    prec_fini(&rec);
}

static void test_invalid_result_json(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    prec_init(&rec);
    struct jd_call_request req = {.command = "manual", .done = prec_done, .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    assert_int_equal(mhost->complete(manual_call(0), "{not json"), JD_PLUGIN_OK);
    assert_false(rec.ok);
    assert_string_equal(rec.kind, "bad_result");
    prec_fini(&rec);
}

static void test_fail_details(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    prec_init(&rec);
    struct jd_call_request req = {.command = "manual", .done = prec_done, .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    assert_int_equal(
        (mhost->fail)(manual_call(0), "http_status", "got \"500\"", 0, "{\"status\":500}"),
        JD_PLUGIN_OK);
    assert_string_equal(rec.result, "{\"kind\":\"http_status\",\"message\":\"got \\\"500\\\"\","
                                    "\"retryable\":false,\"attempt\":1,"
                                    "\"details\":{\"status\":500}}");
    prec_fini(&rec);
}

static void test_retry_delay_arithmetic(void **state)
{
    (void)state;
    struct jd_retry_policy p = {.max_attempts = 10, .backoff_ms = 100, .factor = 2};
    assert_int_equal(jd_retry_delay_ms(&p, 0, 0), 0);
    assert_int_equal(jd_retry_delay_ms(&p, 1, 12345), 0);
    /* Equal jitter: base/2 fixed plus rand % (base/2 + 1). */
    assert_int_equal(jd_retry_delay_ms(&p, 2, 0), 50);
    assert_int_equal(jd_retry_delay_ms(&p, 2, 50), 100);
    assert_int_equal(jd_retry_delay_ms(&p, 2, 51), 50);
    assert_int_equal(jd_retry_delay_ms(&p, 3, 0), 100);
    assert_int_equal(jd_retry_delay_ms(&p, 5, 0), 400);   /* base 800 */
    assert_int_equal(jd_retry_delay_ms(&p, 5, 400), 800); /* the top of the range */
    p.max_backoff_ms = 300;
    assert_int_equal(jd_retry_delay_ms(&p, 5, 0), 150);
    assert_int_equal(jd_retry_delay_ms(&p, 5, 150), 300);
    assert_int_equal(jd_retry_delay_ms(&p, 4000000000u, 7), 157); /* no overflow */
    p.max_backoff_ms = 0;
    uint64_t big = jd_retry_delay_ms(&p, 4000000000u, 0);
    assert_true(big >= 4000000000000000ULL && big <= 9000000000000000ULL);
    p.factor = 1; /* constant backoff */
    assert_int_equal(jd_retry_delay_ms(&p, 9, 0), 50);
    /* Every random value stays inside [base/2, base]. */
    p.factor = 3;
    for (uint64_t r = 0; r < 2000; r += 7) {
        uint64_t d = jd_retry_delay_ms(&p, 3, r * 0x9E3779B97F4A7C15ULL);
        assert_true(d >= 150 && d <= 300);
    }
}

static void test_retries_with_backoff(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    struct jd_registry_stats st;
    prec_init(&rec);
    m_fail_mode = 1; /* every attempt fails, retryable */
    struct jd_call_request req = {
        .command = "manual",
        .idempotency_key = "7:1",
        .retry = {.max_attempts = 4, .backoff_ms = 100, .factor = 2, .max_backoff_ms = 300},
        .on_attempt = prec_on_attempt,
        .done = prec_done,
        .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    const uint64_t lo[] = {0, 0, 50, 100, 150}, hi[] = {0, 0, 100, 200, 300};
    for (uint32_t next = 2; next <= 4; next++) {
        assert_int_equal(manual_ncalls(), (int)next - 1);
        assert_int_equal(rec.done_count, 0);
        uint64_t d = f->env.last_delay_ms;
        assert_true(d >= lo[next] && d <= hi[next]);
        penv_advance(&f->env, d - 1); /* not a millisecond early */
        assert_int_equal(manual_ncalls(), (int)next - 1);
        penv_advance(&f->env, 1);
        assert_int_equal(manual_ncalls(), (int)next);
        assert_int_equal(m_attempts[next - 1], next);
    }
    assert_int_equal(rec.done_count, 1); /* attempt 4 was the last */
    assert_false(rec.ok);
    assert_string_equal(rec.kind, "flaky");
    assert_int_equal(rec.attempt, 4);
    assert_non_null(strstr(rec.result, "\"attempt\":4"));
    assert_non_null(strstr(rec.result, "\"details\":{\"n\":1}"));
    assert_int_equal(rec.nattempts, 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(rec.attempts_seen[i], i + 1);
    jd_registry_stats(f->r, &st);
    assert_int_equal(st.retries, 3);
    assert_int_equal(st.failed, 1);
    prec_fini(&rec);
}

static void test_retry_continues_from_recorded_attempt(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    prec_init(&rec);
    m_fail_mode = 1;
    struct jd_call_request req = {.command = "manual",
                                  .first_attempt = 3,
                                  .retry = {.max_attempts = 3, .backoff_ms = 10, .factor = 2},
                                  .done = prec_done,
                                  .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    assert_int_equal(manual_ncalls(), 1);
    assert_int_equal(m_attempts[0], 3);
    assert_int_equal(rec.done_count, 1); /* one try only */
    assert_int_equal(rec.attempt, 3);
    assert_int_equal(penv_pending(&f->env), 0);
    prec_fini(&rec);
}

static void test_non_retryable_not_retried(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    prec_init(&rec);
    m_fail_mode = 2;
    struct jd_call_request req = {.command = "manual",
                                  .retry = {.max_attempts = 5, .backoff_ms = 10, .factor = 2},
                                  .done = prec_done,
                                  .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    assert_int_equal(rec.done_count, 1);
    assert_string_equal(rec.kind, "broken");
    assert_false(rec.retryable);
    assert_int_equal(manual_ncalls(), 1);
    prec_fini(&rec);
}

static void test_timeout_is_retried(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    prec_init(&rec);
    struct jd_call_request req = {.command = "manual",
                                  .timeout_ms = 100,
                                  .retry = {.max_attempts = 2, .backoff_ms = 10, .factor = 1},
                                  .done = prec_done,
                                  .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    penv_advance(&f->env, 100); /* attempt 1 times out */
    assert_int_equal(rec.done_count, 0);
    penv_advance(&f->env, 10); /* backoff over: attempt 2 */
    assert_int_equal(manual_ncalls(), 2);
    assert_int_equal(mhost->complete(manual_call(0), "1"), JD_PLUGIN_ESTALE);
    assert_int_equal(mhost->complete(manual_call(1), "2"), JD_PLUGIN_OK);
    assert_int_equal(rec.done_count, 1);
    assert_true(rec.ok);
    assert_int_equal(rec.attempt, 2);
    assert_string_equal(rec.result, "2");
    prec_fini(&rec);
}

static void test_cancel_during_backoff(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    struct jd_call_handle *h;
    prec_init(&rec);
    m_fail_mode = 1;
    struct jd_call_request req = {.command = "manual",
                                  .retry = {.max_attempts = 5, .backoff_ms = 60000, .factor = 2},
                                  .done = prec_done,
                                  .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, &h), 0);
    assert_int_equal(penv_pending(&f->env), 1); /* the retry timer */
    jd_registry_call_cancel(f->r, h);
    assert_int_equal(rec.done_count, 1); /* at once, not after the backoff */
    assert_string_equal(rec.kind, "cancelled");
    assert_int_equal(penv_pending(&f->env), 0);
    penv_advance(&f->env, 1000000);
    assert_int_equal(manual_ncalls(), 1);
    jd_registry_call_release(h);
    prec_fini(&rec);
}

struct racer_arg {
    struct jd_call *call;
    int rc;
    int hook_state_after;
};

static void *complete_while_hook_runs(void *arg)
{
    struct racer_arg *a = arg;
    while (atomic_load(&slow_hook_state) != 1)
        usleep(1000);
    a->rc = mhost->complete(a->call, "\"late\"");
    a->hook_state_after = atomic_load(&slow_hook_state);
    return NULL;
}

static void test_complete_waits_for_cancel_hook(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    struct jd_call_handle *h;
    pthread_t t;
    prec_init(&rec);
    atomic_store(&slow_hook_state, 0);
    struct jd_call_request req = {.command = "slowcancel", .done = prec_done, .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, &h), 0);
    struct racer_arg a = {.call = manual_call(0)};
    pthread_create(&t, NULL, complete_while_hook_runs, &a);
    jd_registry_call_cancel(f->r, h); /* runs the 100 ms hook on this thread */
    pthread_join(t, NULL);
    assert_int_equal(a.rc, JD_PLUGIN_ESTALE);
    assert_int_equal(a.hook_state_after, 2); /* complete() returned only after the hook */
    assert_int_equal(rec.done_count, 1);
    assert_string_equal(rec.kind, "cancelled");
    jd_registry_call_release(h);
    prec_fini(&rec);
}

static void test_blocking_runs_on_pool(void **state)
{
    struct fx *f = *state;
    struct precord rec;
    prec_init(&rec);
    struct jd_call_request req = {.command = "blocker", .done = prec_done, .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    assert_true(prec_wait(&rec, 5000));
    assert_true(penv_wait_blocking(&f->env, 5000));
    assert_true(rec.ok);
    assert_string_equal(rec.result, "{\"attempt\":1}");
    pthread_mutex_lock(&m_mu);
    assert_false(pthread_equal(m_handle_thread, pthread_self()));
    pthread_mutex_unlock(&m_mu);
    assert_int_equal(f->env.blocking_started, 1);
    prec_fini(&rec);
}

static void test_process_type_adapter(void **state)
{
    struct fx *f = *state;
    struct jd_error err;
    const struct jd_process_ops *ops;
    void *self;
    char *good = tplugin("good");
    struct jd_step_out out = {0};
    assert_int_equal(jd_registry_load_file(f->r, good, &err), 0);
    assert_int_equal(jd_registry_process_new(f->r, "tproc", &ops, &self), JD_ENOENT); /* unfrozen */
    jd_registry_freeze(f->r);
    assert_int_equal(jd_registry_process_new(f->r, "nope", &ops, &self), JD_ENOENT);
    assert_int_equal(jd_registry_process_new(f->r, "tproc", &ops, &self), 0);
    assert_string_equal(ops->type_name, "tproc");
    assert_int_equal(ops->init(self, "walk", NULL, &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/method");
    assert_int_equal(ops->init(self, "run", "{}", &err), 0);
    assert_int_equal(ops->step(self, NULL, 0, &out), 0);
    assert_int_equal(out.status, JD_STEP_DONE);
    assert_string_equal(out.result, "{\"ran\":true}");
    jd_step_out_reset(&out);
    free(out.yields);
    ops->close(self);
    free(good);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_load_good, setup_fake, teardown),
        cmocka_unit_test_setup_teardown(test_load_bad_abi, setup_fake, teardown),
        cmocka_unit_test_setup_teardown(test_load_missing_symbol, setup_fake, teardown),
        cmocka_unit_test_setup_teardown(test_load_duplicate_command, setup_fake, teardown),
        cmocka_unit_test_setup_teardown(test_load_duplicate_process_type, setup_fake, teardown),
        cmocka_unit_test_setup_teardown(test_load_dir, setup_fake, teardown),
        cmocka_unit_test_setup_teardown(test_freeze_refuses_loading, setup_fake, teardown),
        cmocka_unit_test_setup_teardown(test_validate, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_command, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_call_info_and_success, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_double_completion, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_completion_after_timeout, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_completion_cancels_timeout, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_default_timeout, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_result_json, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_fail_details, setup_manual, teardown),
        cmocka_unit_test(test_retry_delay_arithmetic),
        cmocka_unit_test_setup_teardown(test_retries_with_backoff, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_retry_continues_from_recorded_attempt, setup_manual,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_non_retryable_not_retried, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_timeout_is_retried, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_during_backoff, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_complete_waits_for_cancel_hook, setup_manual,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_blocking_runs_on_pool, setup_manual, teardown),
        cmocka_unit_test_setup_teardown(test_process_type_adapter, setup_fake, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
