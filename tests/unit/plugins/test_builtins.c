/*
 * Tests for the built-in plugins, loaded from $JD_BUILD/plugins the way
 * jackdawd loads them: echo, fail, sleep, counter (its process type driven
 * directly), exec (real programs: exit codes, output caps, stdin/env/cwd,
 * timeout and cancel killing the whole process group, allow-list refusal,
 * orphan reaping as a child subreaper) and http (against a loopback HTTP
 * server this test runs on 127.0.0.1:0; response headers are checked with
 * cJSON, a parser independent of the plugin's own JSON writer).
 *
 * Uses a real timer thread (plugin_env.h), so these tests take real time;
 * every wait is bounded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "common/error.h"
#include "plugin_env.h"
#include "plugins/jackdaw_json.h"
#include "plugins/registry.h"
#include "scheduler/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* Under ASan (GCC <= 13 runtimes), the __tls_get_addr interceptor takes a
 * dynamic TLS block that malloc happens to place 16 bytes past a page
 * boundary for a glibc 2.19 header and reads garbage bounds from it; the
 * exit-time leak check then crashes ("Tracer caught signal 11") after every
 * test passed. libcurl's TLS stack (gnutls, p11-kit) uses dynamic TLS, so
 * whether it fires depends on heap layout. Turning the interceptor off is
 * the known workaround (google/sanitizers#1322); leaks are still checked.
 * Without ASan nothing calls this. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "intercept_tls_get_addr=0";
}

struct fx {
    struct penv env;
    struct jd_registry *r;
};

static struct fx *fx_new(const char *exec_allow, const char *http_allow, const char *cap)
{
    struct fx *f = calloc(1, sizeof *f);
    struct jd_error err;
    unsigned loaded = 0;
    char *dir = pbuild_path("plugins");
    penv_init(&f->env, true);
    f->env.exec_allow = exec_allow;
    f->env.http_allow = http_allow;
    f->env.output_cap = cap;
    struct jd_plugin_env env = penv_env(&f->env);
    assert_int_equal(jd_registry_create(&env, &f->r), 0);
    int rc = jd_registry_load_dir(f->r, dir, &loaded, &err);
    if (rc != 0)
        fprintf(stderr, "load_dir %s: %s\n", dir, err.message);
    assert_int_equal(rc, 0);
    assert_int_equal(loaded, 6);
    jd_registry_freeze(f->r);
    free(dir);
    return f;
}

static void fx_free(struct fx *f)
{
    jd_registry_destroy(f->r);
    penv_fini(&f->env);
    free(f);
}

/* Call and wait for done; rec must be prec_init'ed. */
static void call_wait(struct fx *f, const char *cmd, const char *args, int64_t timeout_ms,
                      struct precord *rec)
{
    struct jd_call_request req = {.command = cmd,
                                  .args_json = args,
                                  .idempotency_key = "1:1",
                                  .timeout_ms = timeout_ms,
                                  .done = prec_done,
                                  .arg = rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    assert_true(prec_wait(rec, 20000));
}

static struct jd_pjson *parse(const char *s)
{
    struct jd_pjson *v = jd_pjson_parse(s, NULL, 0);
    assert_non_null(v);
    return v;
}

static int64_t geti(struct jd_pjson *v, const char *key)
{
    int64_t n = -999;
    assert_true(jd_pjson_int(jd_pjson_get(v, key), &n));
    return n;
}

/* ---- echo, fail ---- */

static void test_echo(void **state)
{
    (void)state;
    struct fx *f = fx_new(NULL, NULL, NULL);
    struct precord rec;
    prec_init(&rec);
    call_wait(f, "echo", "{\"v\":[1,\"two\",{\"three\":3}]}", 0, &rec);
    assert_true(rec.ok);
    assert_string_equal(rec.result, "{\"v\":[1,\"two\",{\"three\":3}]}");
    prec_fini(&rec);
    fx_free(f);
}

static void test_fail(void **state)
{
    (void)state;
    struct fx *f = fx_new(NULL, NULL, NULL);
    struct precord rec;
    struct jd_error err;
    prec_init(&rec);
    call_wait(f, "fail", "{\"message\":\"boom\",\"retryable\":true,\"kind\":\"flaky\"}", 0, &rec);
    assert_false(rec.ok);
    assert_string_equal(rec.kind, "flaky");
    assert_true(rec.retryable);
    assert_non_null(strstr(rec.result, "\"message\":\"boom\""));
    prec_fini(&rec);

    /* fail_attempts: fails attempts 1 and 2, then succeeds, under a retry policy. */
    prec_init(&rec);
    struct jd_call_request req = {.command = "fail",
                                  .args_json = "{\"fail_attempts\":2,\"retryable\":true}",
                                  .retry = {.max_attempts = 5, .backoff_ms = 2, .factor = 2},
                                  .done = prec_done,
                                  .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    assert_true(prec_wait(&rec, 5000));
    assert_true(rec.ok);
    assert_int_equal(rec.attempt, 3);
    assert_string_equal(rec.result, "{\"attempt\":3}");
    prec_fini(&rec);

    assert_int_equal(jd_registry_validate(f->r, "fail", "{\"retryable\":\"yes\"}", "/args", &err),
                     JD_EINVAL);
    assert_string_equal(err.pointer, "/args/retryable");
    fx_free(f);
}

/* ---- sleep ---- */

static void test_sleep(void **state)
{
    (void)state;
    struct fx *f = fx_new(NULL, NULL, NULL);
    struct precord rec;
    struct jd_error err;
    uint64_t t0 = penv_mono_ms();
    prec_init(&rec);
    call_wait(f, "sleep", "{\"ms\":40}", 0, &rec);
    assert_true(penv_mono_ms() - t0 >= 40);
    assert_true(rec.ok);
    assert_string_equal(rec.result, "{\"slept_ms\":40}");
    assert_int_equal(f->env.blocking_started, 0); /* no thread held */
    prec_fini(&rec);

    /* A deadline shorter than the sleep: timeout, and the timer is stopped. */
    prec_init(&rec);
    t0 = penv_mono_ms();
    call_wait(f, "sleep", "{\"ms\":60000}", 50, &rec);
    assert_true(penv_mono_ms() - t0 < 5000);
    assert_string_equal(rec.kind, "timeout");
    assert_int_equal(penv_pending(&f->env), 0);
    prec_fini(&rec);

    /* Cancel. */
    struct jd_call_handle *h;
    prec_init(&rec);
    struct jd_call_request req = {
        .command = "sleep", .args_json = "{\"ms\":60000}", .done = prec_done, .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, &h), 0);
    jd_registry_call_cancel(f->r, h);
    assert_int_equal(prec_count(&rec), 1);
    assert_string_equal(rec.kind, "cancelled");
    assert_int_equal(penv_pending(&f->env), 0);
    jd_registry_call_release(h);
    prec_fini(&rec);

    struct jd_registry_stats st;
    jd_registry_stats(f->r, &st);
    assert_int_equal(st.late_dropped, 2); /* the two releases after timeout and cancel */

    assert_int_equal(jd_registry_validate(f->r, "sleep", "{\"ms\":-1}", "", &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/ms");
    assert_int_equal(jd_registry_validate(f->r, "sleep", "{\"ms\":5}", "", &err), 0);
    fx_free(f);
}

/* ---- counter ---- */

static void test_counter_count_to(void **state)
{
    (void)state;
    struct fx *f = fx_new(NULL, NULL, NULL);
    const struct jd_process_ops *ops;
    void *self;
    struct jd_error err;
    struct jd_step_out out = {0};
    assert_int_equal(jd_registry_process_new(f->r, "counter", &ops, &self), 0);
    assert_int_equal(ops->init(self, "count_to", "{\"n\":3}", &err), 0);
    assert_int_equal(ops->step(self, NULL, 0, &out), 0);
    for (uint32_t i = 1; i <= 3; i++) {
        char args[32];
        assert_int_equal(out.status, JD_STEP_WAIT);
        assert_int_equal(out.nyields, 1);
        assert_int_equal(out.yields[0].tag, i);
        assert_string_equal(out.yields[0].command, "echo");
        snprintf(args, sizeof args, "{\"i\":%u}", i);
        assert_string_equal(out.yields[0].args, args);
        jd_step_out_reset(&out);
        if (i == 2) {
            /* A stray message does not advance it. */
            struct jd_event m = {.type = JD_EVENT_MESSAGE, .data = "7"};
            assert_int_equal(ops->step(self, &m, 1, &out), 0);
            assert_int_equal(out.status, JD_STEP_WAIT);
            assert_int_equal(out.nyields, 0);
            jd_step_out_reset(&out);
        }
        struct jd_event ev = {.type = JD_EVENT_YIELD_COMPLETE, .tag = i, .data = args};
        assert_int_equal(ops->step(self, &ev, 1, &out), 0);
    }
    assert_int_equal(out.status, JD_STEP_DONE);
    assert_string_equal(out.result, "{\"count\":3}");
    jd_step_out_reset(&out);
    ops->close(self);

    /* Unknown method, bad input. */
    assert_int_equal(jd_registry_process_new(f->r, "counter", &ops, &self), 0);
    assert_int_equal(ops->init(self, "count_down", "{\"n\":3}", &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/method");
    assert_int_equal(ops->init(self, "count_to", "{\"n\":-3}", &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/input");
    ops->close(self);

    /* A failed yield fails the process with the handler's error. */
    assert_int_equal(jd_registry_process_new(f->r, "counter", &ops, &self), 0);
    assert_int_equal(ops->init(self, "count_to", "{\"n\":2}", &err), 0);
    assert_int_equal(ops->step(self, NULL, 0, &out), 0);
    jd_step_out_reset(&out);
    struct jd_event bad = {.type = JD_EVENT_YIELD_COMPLETE, .tag = 1, .error = "{\"kind\":\"x\"}"};
    assert_int_equal(ops->step(self, &bad, 1, &out), 0);
    assert_int_equal(out.status, JD_STEP_FAIL);
    assert_string_equal(out.error, "{\"kind\":\"x\"}");
    jd_step_out_reset(&out);
    ops->close(self);
    free(out.yields);
    fx_free(f);
}

static void test_counter_count_messages(void **state)
{
    (void)state;
    struct fx *f = fx_new(NULL, NULL, NULL);
    const struct jd_process_ops *ops;
    void *self;
    struct jd_error err;
    struct jd_step_out out = {0};
    assert_int_equal(jd_registry_process_new(f->r, "counter", &ops, &self), 0);
    assert_int_equal(ops->init(self, "count_messages", "{\"n\":3}", &err), 0);
    assert_int_equal(ops->step(self, NULL, 0, &out), 0);
    assert_int_equal(out.status, JD_STEP_IDLE);
    jd_step_out_reset(&out);
    struct jd_event m1 = {.type = JD_EVENT_MESSAGE, .data = "5"};
    assert_int_equal(ops->step(self, &m1, 1, &out), 0);
    assert_int_equal(out.status, JD_STEP_IDLE);
    jd_step_out_reset(&out);
    struct jd_event m23[2] = {{.type = JD_EVENT_MESSAGE, .data = "{\"value\": 2.5}"},
                              {.type = JD_EVENT_MESSAGE, .data = "\"hi\""}};
    assert_int_equal(ops->step(self, m23, 2, &out), 0);
    assert_int_equal(out.status, JD_STEP_DONE);
    assert_string_equal(out.result,
                        "{\"count\":3,\"sum\":7.5,\"messages\":[5,{\"value\":2.5},\"hi\"]}");
    jd_step_out_reset(&out);
    ops->close(self);

    /* Cancel while idle fails it. */
    assert_int_equal(jd_registry_process_new(f->r, "counter", &ops, &self), 0);
    assert_int_equal(ops->init(self, "count_messages", "{\"n\":3}", &err), 0);
    struct jd_event c = {.type = JD_EVENT_CANCEL};
    assert_int_equal(ops->step(self, &c, 1, &out), 0);
    assert_int_equal(out.status, JD_STEP_FAIL);
    assert_non_null(strstr(out.error, "cancelled"));
    jd_step_out_reset(&out);
    ops->close(self);
    free(out.yields);
    fx_free(f);
}

/* ---- exec ---- */

static void test_exec_allow_list(void **state)
{
    (void)state;
    struct jd_error err;
    struct precord rec;
    /* Unset: exec is unusable and says so. */
    struct fx *f = fx_new(NULL, NULL, NULL);
    assert_int_equal(
        jd_registry_validate(f->r, "exec", "{\"argv\":[\"/bin/echo\",\"x\"]}", "/args", &err),
        JD_EINVAL);
    assert_string_equal(err.pointer, "/args/argv/0");
    assert_non_null(strstr(err.message, "exec is disabled"));
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/bin/echo\",\"x\"]}", 0, &rec);
    assert_false(rec.ok);
    assert_string_equal(rec.kind, "not_allowed");
    assert_false(rec.retryable);
    prec_fini(&rec);
    fx_free(f);

    /* A list: only what is on it. */
    f = fx_new("/bin/sh, /bin/true", NULL, NULL);
    assert_int_equal(jd_registry_validate(f->r, "exec", "{\"argv\":[\"/bin/true\"]}", "", &err), 0);
    assert_int_equal(jd_registry_validate(f->r, "exec", "{\"argv\":[\"/bin/echo\"]}", "", &err),
                     JD_EINVAL);
    assert_string_equal(err.pointer, "/argv/0");
    assert_non_null(strstr(err.message, "not in the exec allow-list"));
    assert_int_equal(jd_registry_validate(f->r, "exec", "{\"argv\":[]}", "", &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/argv");
    assert_int_equal(jd_registry_validate(f->r, "exec",
                                          "{\"argv\":[\"/bin/true\"],\"env\":{\"A\":1}}", "", &err),
                     JD_EINVAL);
    assert_string_equal(err.pointer, "/env/A");
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/bin/echo\",\"x\"]}", 0, &rec);
    assert_string_equal(rec.kind, "not_allowed");
    prec_fini(&rec);
    fx_free(f);
}

/* A relative allow-list entry would resolve against the job's own cwd, so
 * a job could run any file of that name anywhere: it must never match. */
static void test_exec_allow_list_refuses_relative_paths(void **state)
{
    (void)state;
    struct jd_error err;
    struct precord rec;
    struct fx *f = fx_new("bin/sh, ./true, /bin/echo", NULL, NULL);
    assert_int_equal(jd_registry_validate(f->r, "exec",
                                          "{\"argv\":[\"bin/sh\",\"-c\",\"exit 0\"],\"cwd\":\"/\"}",
                                          "", &err),
                     JD_EINVAL);
    assert_string_equal(err.pointer, "/argv/0");
    assert_non_null(strstr(err.message, "must be absolute paths"));
    assert_int_equal(
        jd_registry_validate(f->r, "exec", "{\"argv\":[\"./true\"],\"cwd\":\"/bin\"}", "", &err),
        JD_EINVAL);
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"bin/sh\",\"-c\",\"exit 0\"],\"cwd\":\"/\"}", 0, &rec);
    assert_false(rec.ok);
    assert_string_equal(rec.kind, "not_allowed");
    prec_fini(&rec);
    /* Absolute entries in the same list still work. */
    assert_int_equal(jd_registry_validate(f->r, "exec", "{\"argv\":[\"/bin/echo\"]}", "", &err), 0);
    fx_free(f);
}

static void test_exec_exit_codes_and_output(void **state)
{
    (void)state;
    struct fx *f = fx_new("*", NULL, NULL);
    struct precord rec;
    struct jd_pjson *v, *d;
    prec_init(&rec);
    call_wait(f, "exec",
              "{\"argv\":[\"/bin/sh\",\"-c\",\"cat; echo \\\"[$FOO]\\\"; pwd; echo err >&2\"],"
              "\"stdin\":\"hello\\n\",\"env\":{\"FOO\":\"bar baz\"},\"cwd\":\"/tmp\"}",
              0, &rec);
    assert_true(rec.ok);
    v = parse(rec.result);
    assert_int_equal(geti(v, "exit_code"), 0);
    assert_true(jd_pjson_is(jd_pjson_get(v, "signal"), JD_PJSON_NULL));
    assert_string_equal(jd_pjson_str(jd_pjson_get(v, "stdout")), "hello\n[bar baz]\n/tmp\n");
    assert_string_equal(jd_pjson_str(jd_pjson_get(v, "stderr")), "err\n");
    assert_int_equal(jd_pjson_bool(jd_pjson_get(v, "truncated"), -1), 0);
    jd_pjson_free(v);
    prec_fini(&rec);

    /* Numbers and booleans in argv (e.g. a substituted step output) are
     * passed as their text. */
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/bin/echo\",42,2.5,true,false]}", 0, &rec);
    assert_true(rec.ok);
    v = parse(rec.result);
    assert_string_equal(jd_pjson_str(jd_pjson_get(v, "stdout")), "42 2.5 true false\n");
    jd_pjson_free(v);
    prec_fini(&rec);

    /* Non-zero exit: an exit_status error with the output in details. */
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/bin/sh\",\"-c\",\"echo out; echo oops >&2; exit 3\"]}", 0,
              &rec);
    assert_false(rec.ok);
    assert_string_equal(rec.kind, "exit_status");
    v = parse(rec.result);
    d = jd_pjson_get(v, "details");
    assert_int_equal(geti(d, "exit_code"), 3);
    assert_string_equal(jd_pjson_str(jd_pjson_get(d, "stdout")), "out\n");
    assert_string_equal(jd_pjson_str(jd_pjson_get(d, "stderr")), "oops\n");
    assert_non_null(strstr(jd_pjson_str(jd_pjson_get(v, "message")), "status 3"));
    jd_pjson_free(v);
    prec_fini(&rec);

    /* Death by a signal. */
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/bin/sh\",\"-c\",\"kill -TERM $$\"]}", 0, &rec);
    assert_string_equal(rec.kind, "exit_status");
    v = parse(rec.result);
    d = jd_pjson_get(v, "details");
    assert_int_equal(geti(d, "signal"), SIGTERM);
    assert_true(jd_pjson_is(jd_pjson_get(d, "exit_code"), JD_PJSON_NULL));
    jd_pjson_free(v);
    prec_fini(&rec);

    /* A program that does not exist. */
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/nonexistent/prog\"]}", 0, &rec);
    assert_string_equal(rec.kind, "spawn_failed");
    assert_false(rec.retryable);
    prec_fini(&rec);

    /* The server's environment is not passed on. */
    setenv("JD_SECRET_FOR_TEST", "s3cret", 1);
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/bin/sh\",\"-c\",\"echo \\\"[$JD_SECRET_FOR_TEST]\\\"\"]}",
              0, &rec);
    assert_true(rec.ok);
    assert_non_null(strstr(rec.result, "\"stdout\":\"[]\\n\""));
    prec_fini(&rec);
    fx_free(f);
}

static void test_exec_output_cap(void **state)
{
    (void)state;
    struct fx *f = fx_new("/bin/sh", NULL, "100");
    struct precord rec;
    prec_init(&rec);
    call_wait(f, "exec",
              "{\"argv\":[\"/bin/sh\",\"-c\",\"head -c 300000 /dev/zero | tr '\\\\000' a; "
              "echo done >&2\"]}",
              0, &rec);
    assert_true(rec.ok);
    struct jd_pjson *v = parse(rec.result);
    const char *out = jd_pjson_str(jd_pjson_get(v, "stdout"));
    assert_int_equal(strlen(out), 100);
    assert_int_equal(strspn(out, "a"), 100);
    assert_int_equal(jd_pjson_bool(jd_pjson_get(v, "truncated"), -1), 1);
    assert_string_equal(jd_pjson_str(jd_pjson_get(v, "stderr")), "done\n");
    jd_pjson_free(v);
    prec_fini(&rec);
    fx_free(f);
}

/* 1 if pid is gone or a zombie (dead, maybe not yet reaped by its new parent). */
static int pid_dead(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *fp = fopen(path, "r");
    if (!fp)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

static pid_t read_pid(const char *path)
{
    FILE *fp = fopen(path, "r");
    int pid = 0;
    if (fp) {
        if (fscanf(fp, "%d", &pid) != 1)
            pid = 0;
        fclose(fp);
    }
    return (pid_t)pid;
}

static int wait_dead(pid_t pid, uint64_t ms)
{
    uint64_t end = penv_mono_ms() + ms;
    while (!pid_dead(pid) && penv_mono_ms() < end)
        usleep(10000);
    return pid_dead(pid);
}

static void test_exec_timeout_kills_group(void **state)
{
    (void)state;
    struct fx *f = fx_new("/bin/sh", NULL, NULL);
    struct precord rec;
    char args[512];
    char pidfile[] = "/tmp/jd_exec_pid_XXXXXX";
    int fd = mkstemp(pidfile);
    close(fd);

    /* The args' own timeout_ms. */
    snprintf(args, sizeof args,
             "{\"argv\":[\"/bin/sh\",\"-c\",\"sleep 30 & echo $! > %s; sleep 30\"],"
             "\"timeout_ms\":300}",
             pidfile);
    uint64_t t0 = penv_mono_ms();
    prec_init(&rec);
    call_wait(f, "exec", args, 0, &rec);
    assert_true(penv_mono_ms() - t0 < 10000);
    assert_false(rec.ok);
    assert_string_equal(rec.kind, "timeout");
    assert_true(rec.retryable);
    pid_t bg = read_pid(pidfile);
    assert_true(bg > 0);
    assert_true(wait_dead(bg, 3000)); /* the grandchild died with the group */
    prec_fini(&rec);

    /* The host's deadline: cancel hook, same result. */
    snprintf(args, sizeof args,
             "{\"argv\":[\"/bin/sh\",\"-c\",\"sleep 30 & echo $! > %s; sleep 30\"]}", pidfile);
    unlink(pidfile);
    t0 = penv_mono_ms();
    prec_init(&rec);
    call_wait(f, "exec", args, 300, &rec);
    assert_string_equal(rec.kind, "timeout");
    assert_true(penv_wait_blocking(&f->env, 10000)); /* the pool thread came back */
    assert_true(penv_mono_ms() - t0 < 10000);
    bg = read_pid(pidfile);
    if (bg > 0) /* the shell may not have written it before the kill */
        assert_true(wait_dead(bg, 3000));
    prec_fini(&rec);

    /* Cancel. */
    struct jd_call_handle *h;
    prec_init(&rec);
    struct jd_call_request req = {.command = "exec",
                                  .args_json = "{\"argv\":[\"/bin/sh\",\"-c\",\"sleep 30\"]}",
                                  .done = prec_done,
                                  .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, &h), 0);
    usleep(100000);
    jd_registry_call_cancel(f->r, h);
    assert_int_equal(prec_count(&rec), 1);
    assert_string_equal(rec.kind, "cancelled");
    assert_true(penv_wait_blocking(&f->env, 10000));
    jd_registry_call_release(h);
    prec_fini(&rec);
    unlink(pidfile);
    fx_free(f);
}

static void test_exec_reaps_orphans_as_subreaper(void **state)
{
    (void)state;
    struct fx *f = fx_new("/bin/sh", NULL, NULL);
    struct precord rec;
    /* As PID 1 would, we inherit orphans; exec must reap them. */
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/bin/sh\",\"-c\",\"sleep 0.2 & echo $!\"]}", 0, &rec);
    assert_true(rec.ok);
    struct jd_pjson *v = parse(rec.result);
    pid_t orphan = (pid_t)atoi(jd_pjson_str(jd_pjson_get(v, "stdout")));
    jd_pjson_free(v);
    assert_true(orphan > 0);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d", (int)orphan);
    uint64_t end = penv_mono_ms() + 5000;
    struct stat sb;
    while (stat(path, &sb) == 0 && penv_mono_ms() < end)
        usleep(10000);
    assert_int_not_equal(stat(path, &sb), 0); /* reaped, not a lingering zombie */
    /* Our own children still get their statuses. */
    prec_fini(&rec);
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/bin/sh\",\"-c\",\"exit 7\"]}", 0, &rec);
    assert_string_equal(rec.kind, "exit_status");
    assert_non_null(strstr(rec.result, "\"exit_code\":7"));
    prec_fini(&rec);
    prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
    fx_free(f);
}

/* Issue 12 item 2: allowing one harmless bash script (ldd) must not let
 * env make it run another program. */
static void test_exec_env_deny_list(void **state)
{
    (void)state;
    struct jd_error err;
    struct precord rec;
    struct fx *f = fx_new("/usr/bin/ldd, /bin/sh", NULL, NULL);
    const char *bypass = "{\"argv\":[\"/usr/bin/ldd\",\"--version\"],"
                         "\"env\":{\"BASH_FUNC_printf%%\":\"() { /usr/bin/id; }\"}}";
    assert_int_equal(jd_registry_validate(f->r, "exec", bypass, "/args", &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/args/env/BASH_FUNC_printf%%");
    /* Arriving at run time (e.g. through a substitution): the step fails
     * and nothing runs. */
    prec_init(&rec);
    call_wait(f, "exec", bypass, 0, &rec);
    assert_false(rec.ok);
    assert_string_equal(rec.kind, "not_allowed");
    assert_false(rec.retryable);
    assert_null(strstr(rec.result, "uid="));
    prec_fini(&rec);

    static const char *const refused[] = {
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_LIBRARY_PATH",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "PS4",
        "PERL5OPT",
        "PERL5LIB",
        "PYTHONSTARTUP",
        "PYTHONPATH",
        "PYTHONHOME",
        "NODE_OPTIONS",
        "RUBYOPT",
        "GCONV_PATH",
        "LOCPATH",
        "MALLOC_CHECK_",
        "GLIBC_TUNABLES",
        "IFS",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "GIT_SSH_COMMAND",
        "GIT_CONFIG_PARAMETERS",
        "BASH_FUNC_x",
        "x%%",
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        char args[256], want[128];
        snprintf(args, sizeof args, "{\"argv\":[\"/bin/sh\"],\"env\":{\"%s\":\"v\"}}", refused[i]);
        snprintf(want, sizeof want, "/env/%s", refused[i]);
        assert_int_equal(jd_registry_validate(f->r, "exec", args, "", &err), JD_EINVAL);
        assert_string_equal(err.pointer, want);
        assert_non_null(strstr(err.message, "refused"));
    }
    /* Ordinary names pass, and reach the child. */
    assert_int_equal(
        jd_registry_validate(f->r, "exec",
                             "{\"argv\":[\"/bin/sh\"],\"env\":{\"LANG\":\"C\",\"TMPDIR\":\"/tmp\","
                             "\"PATH\":\"/bin\",\"LDX\":\"1\",\"APP_MODE\":\"x\"}}",
                             "", &err),
        0);

    /* --exec-env-allow: only the names listed (exact, or PREFIX*). */
    f->env.exec_env_allow = "LANG, APP_*, LD_LIBRARY_PATH";
    assert_int_equal(jd_registry_validate(f->r, "exec",
                                          "{\"argv\":[\"/bin/sh\"],\"env\":{\"LANG\":\"C\","
                                          "\"APP_MODE\":\"x\",\"LD_LIBRARY_PATH\":\"/opt\"}}",
                                          "", &err),
                     0);
    assert_int_equal(jd_registry_validate(f->r, "exec",
                                          "{\"argv\":[\"/bin/sh\"],\"env\":{\"TMPDIR\":\"/x\"}}",
                                          "", &err),
                     JD_EINVAL);
    assert_string_equal(err.pointer, "/env/TMPDIR");
    assert_non_null(strstr(err.message, "allow-list"));
    /* A pointer token is escaped (RFC 6901). */
    assert_int_equal(jd_registry_validate(f->r, "exec",
                                          "{\"argv\":[\"/bin/sh\"],\"env\":{\"a/b~c\":\"x\"}}", "",
                                          &err),
                     JD_EINVAL);
    assert_string_equal(err.pointer, "/env/a~1b~0c");
    /* Bash's function syntax is refused even when a prefix would allow it. */
    f->env.exec_env_allow = "BASH_FUNC_*";
    assert_int_equal(
        jd_registry_validate(
            f->r, "exec", "{\"argv\":[\"/bin/sh\"],\"env\":{\"BASH_FUNC_f%%\":\"x\"}}", "", &err),
        JD_EINVAL);
    prec_init(&rec);
    call_wait(f, "exec",
              "{\"argv\":[\"/bin/sh\",\"-c\",\"echo $BASH_FUNC_ok\"],"
              "\"env\":{\"BASH_FUNC_ok\":\"fine\"}}",
              0, &rec);
    assert_true(rec.ok);
    assert_non_null(strstr(rec.result, "\"stdout\":\"fine\\n\""));
    prec_fini(&rec);
    f->env.exec_env_allow = NULL;
    fx_free(f);
}

/* Item 3: a child sees 0, 1 and 2 and nothing else of the server's. */
static void test_exec_child_gets_only_stdio(void **state)
{
    (void)state;
    struct fx *f = fx_new("/bin/ls", NULL, NULL);
    struct precord rec;
    int leak = dup(2); /* not close-on-exec, as a descriptor jackdawd inherited */
    int pfd[2];
    assert_true(leak > 2);
    assert_int_equal(pipe(pfd), 0);
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/bin/ls\",\"/proc/self/fd\"]}", 0, &rec);
    assert_true(rec.ok);
    struct jd_pjson *v = parse(rec.result);
    /* 3 is the directory ls itself opens to list. */
    assert_string_equal(jd_pjson_str(jd_pjson_get(v, "stdout")), "0\n1\n2\n3\n");
    jd_pjson_free(v);
    prec_fini(&rec);
    close(leak);
    close(pfd[0]);
    close(pfd[1]);
    fx_free(f);
}

/* Item 4: background children die with their job. */
static void test_exec_kills_group_when_leader_exits(void **state)
{
    (void)state;
    struct fx *f = fx_new("/bin/sh", NULL, NULL);
    struct precord rec;
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/bin/sh\",\"-c\",\"sleep 1000 & echo $!\"]}", 0, &rec);
    assert_true(rec.ok);
    struct jd_pjson *v = parse(rec.result);
    pid_t bg = (pid_t)atoi(jd_pjson_str(jd_pjson_get(v, "stdout")));
    jd_pjson_free(v);
    assert_true(bg > 0);
    int dead = wait_dead(bg, 3000);
    if (!dead)
        kill(bg, SIGKILL); /* do not leave it behind when the test fails */
    assert_true(dead);
    prec_fini(&rec);
    fx_free(f);
}

/* Item 8: with no timeout_ms in args, the configured default deadline
 * (--exec-timeout) ends a hung child; the args' own value wins over it. */
static void test_exec_default_deadline(void **state)
{
    (void)state;
    struct fx *f = fx_new("/bin/sh", NULL, NULL);
    struct precord rec;
    f->env.exec_timeout_ms = "300";
    uint64_t t0 = penv_mono_ms();
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/bin/sh\",\"-c\",\"sleep 30\"]}", 0, &rec);
    assert_true(penv_mono_ms() - t0 < 10000);
    assert_string_equal(rec.kind, "timeout");
    assert_non_null(strstr(rec.result, "--exec-timeout"));
    assert_true(penv_wait_blocking(&f->env, 10000)); /* the pool thread is back */
    prec_fini(&rec);
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/bin/sh\",\"-c\",\"sleep 0.6\"],\"timeout_ms\":5000}", 0,
              &rec);
    assert_true(rec.ok);
    prec_fini(&rec);
    fx_free(f);
}

/* Item 10: a huge timeout_ms is a long deadline, not an overflow: the
 * call runs normally and poll() is not spun. 1e300 is no integer: 422. */
static void test_exec_huge_timeout(void **state)
{
    (void)state;
    struct fx *f = fx_new("/bin/sh", NULL, NULL);
    struct precord rec;
    struct jd_error err;
    static const char *const huge[] = {"5000", "9200000000000000000", "4294967296", "4294967396",
                                       "2147483648"};
    for (size_t i = 0; i < sizeof huge / sizeof *huge; i++) {
        char args[200];
        struct timespec c0, c1;
        snprintf(args, sizeof args,
                 "{\"argv\":[\"/bin/sh\",\"-c\",\"sleep 0.3; echo ok\"],\"timeout_ms\":%s}",
                 huge[i]);
        assert_int_equal(jd_registry_validate(f->r, "exec", args, "", &err), 0);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        prec_init(&rec);
        call_wait(f, "exec", args, 0, &rec);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        assert_true(rec.ok);
        assert_non_null(strstr(rec.result, "\"stdout\":\"ok\\n\""));
        double cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) / 1e9;
        assert_true(cpu < 0.25);
        prec_fini(&rec);
    }
    /* Past 9.2e18 (INT64_MAX itself included) a number is no int64: 422. */
    assert_int_equal(jd_registry_validate(f->r, "exec",
                                          "{\"argv\":[\"/bin/sh\"],"
                                          "\"timeout_ms\":9223372036854775807}",
                                          "", &err),
                     JD_EINVAL);
    assert_string_equal(err.pointer, "/timeout_ms");
    assert_int_equal(jd_registry_validate(
                         f->r, "exec", "{\"argv\":[\"/bin/sh\"],\"timeout_ms\":1e300}", "", &err),
                     JD_EINVAL);
    assert_string_equal(err.pointer, "/timeout_ms");
    prec_init(&rec);
    call_wait(f, "exec", "{\"argv\":[\"/bin/sh\"],\"timeout_ms\":1e300}", 0, &rec);
    assert_string_equal(rec.kind, "invalid_args");
    prec_fini(&rec);
    fx_free(f);
}

/* ---- http, against a loopback server ---- */

struct srv {
    int lfd;
    int port;
    pthread_t thread;
};

static void send_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static void respond(int fd, int status, const char *ctype, const char *body, size_t len)
{
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "X-Server: loop\r\nConnection: close\r\n\r\n",
                     status, ctype, len);
    send_all(fd, head, (size_t)n);
    send_all(fd, body, len);
}

static void *conn_main(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char buf[65536];
    size_t len = 0;
    char *end = NULL;
    /* Read the head, then Content-Length bytes of body. */
    while (len < sizeof buf - 1) {
        ssize_t n = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
        buf[len] = '\0';
        if ((end = strstr(buf, "\r\n\r\n"))) {
            char *cl = strcasestr(buf, "content-length:");
            size_t want = cl ? (size_t)atol(cl + 15) : 0;
            size_t have = len - (size_t)(end + 4 - buf);
            if (have >= want)
                break;
        }
    }
    if (!end)
        goto out;
    char method[16] = "", path[256] = "";
    sscanf(buf, "%15s %255s", method, path);
    char *body = end + 4;
    if (strcmp(path, "/json") == 0) {
        const char *b = "{\"hello\": \"world\", \"n\": [1, 2]}";
        respond(fd, 200, "application/json", b, strlen(b));
    } else if (strcmp(path, "/text") == 0) {
        respond(fd, 200, "text/plain", "hi there", 8);
    } else if (strcmp(path, "/500") == 0) {
        respond(fd, 503, "text/plain", "down", 4);
    } else if (strcmp(path, "/404") == 0) {
        respond(fd, 404, "text/plain", "nope", 4);
    } else if (strcmp(path, "/echo") == 0) {
        char out[4096];
        char *xt = strcasestr(buf, "x-test:");
        char *ct = strcasestr(buf, "content-type:");
        char xv[64] = "", cv[64] = "";
        if (xt)
            sscanf(xt + 7, " %63[^\r]", xv);
        if (ct)
            sscanf(ct + 13, " %63[^\r]", cv);
        int n = snprintf(out, sizeof out, "%s|%s|%s|%s", method, xv, cv, body);
        respond(fd, 200, "text/plain", out, (size_t)n);
    } else if (strcmp(path, "/big") == 0) {
        size_t n = 200000;
        char *b = malloc(n);
        memset(b, 'x', n);
        respond(fd, 200, "application/json", b, n);
        free(b);
    } else if (strcmp(path, "/hdrs") == 0) {
        /* Repeated fields (Vary in two spellings, Set-Cookie with a comma
         * inside), a value with a quote and a backslash, a control byte, a
         * byte that is not UTF-8, OWS around a value, an obs-fold, and a
         * name that is not a token (dropped, with its continuation). */
        const char *r = "HTTP/1.1 200 OK\r\n"
                        "Content-Type: text/plain\r\n"
                        "Set-Cookie: a=1; Path=/\r\n"
                        "Vary: Accept\r\n"
                        "X-Quote: say \"hi\" \\ back\r\n"
                        "Set-Cookie: b=2, c=3; Expires=Wed, 21 Oct 2037 07:28:00 GMT\r\n"
                        "VARY: Accept-Encoding\r\n"
                        "X-Ctl: a\x01"
                        "b\r\n"
                        "X-Bytes: caf\xe9 \xc3\xa9\r\n"
                        "X-Ows: \t padded \t\r\n"
                        "X-Empty:\r\n"
                        "X-Fold: one\r\n"
                        "  two\r\n"
                        "Bad Name: dropped\r\n"
                        " with its continuation\r\n"
                        "Content-Length: 2\r\nConnection: close\r\n\r\nok";
        send_all(fd, r, strlen(r));
    } else if (strcmp(path, "/continue") == 0) {
        /* An interim 100 with fields of its own, then the final answer. */
        const char *r = "HTTP/1.1 100 Continue\r\nX-Interim: yes\r\nSet-Cookie: interim=1\r\n\r\n"
                        "HTTP/1.1 200 OK\r\nSet-Cookie: only=1\r\nContent-Type: text/plain\r\n"
                        "Content-Length: 4\r\nConnection: close\r\n\r\nfine";
        send_all(fd, r, strlen(r));
    } else if (strcmp(path, "/flood") == 0) {
        /* 2000 lines of 70 bytes: past the plugin's 64 KiB of header lines. */
        struct jd_pjson_buf b = {0};
        jd_pjson_buf_cat(&b, "HTTP/1.1 200 OK\r\nX-First: 1\r\n");
        for (int i = 0; i < 2000; i++)
            jd_pjson_buf_printf(&b, "X-Many: %04d-%058d\r\n", i, 0);
        jd_pjson_buf_cat(&b, "X-Last: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        send_all(fd, b.p, b.len);
        jd_pjson_buf_free(&b);
    } else if (strcmp(path, "/slow") == 0) {
        /* Never answer; end when the client goes away (or after 10 s). */
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, 10000);
    } else {
        respond(fd, 404, "text/plain", "", 0);
    }
out:
    close(fd);
    return NULL;
}

static void *srv_main(void *arg)
{
    struct srv *s = arg;
    for (;;) {
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0)
            return NULL; /* listening socket shut down */
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_create(&t, &at, conn_main, (void *)(intptr_t)fd);
        pthread_attr_destroy(&at);
    }
}

static void srv_start(struct srv *s)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t alen = sizeof a;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s->lfd >= 0);
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s->lfd, 64), 0);
    assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&a, &alen), 0);
    s->port = ntohs(a.sin_port);
    pthread_create(&s->thread, NULL, srv_main, s);
}

static void srv_stop(struct srv *s)
{
    shutdown(s->lfd, SHUT_RDWR);
    pthread_join(s->thread, NULL);
    close(s->lfd);
}

static void http_call(struct fx *f, struct srv *s, const char *fmt_args, int64_t timeout,
                      struct precord *rec)
{
    char args[1024];
    snprintf(args, sizeof args, fmt_args, s->port);
    prec_init(rec);
    call_wait(f, "http", args, timeout, rec);
}

static void test_http(void **state)
{
    (void)state;
    struct srv s;
    struct precord rec;
    struct jd_pjson *v;
    srv_start(&s);
    struct fx *f = fx_new(NULL, NULL, "1000");

    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/json\"}", 0, &rec);
    assert_true(rec.ok);
    v = parse(rec.result);
    assert_int_equal(geti(v, "status"), 200);
    assert_string_equal(jd_pjson_str(jd_pjson_get(jd_pjson_get(v, "body"), "hello")), "world");
    assert_string_equal(jd_pjson_str(jd_pjson_get(jd_pjson_get(v, "headers"), "x-server")), "loop");
    assert_int_equal(jd_pjson_bool(jd_pjson_get(v, "truncated"), -1), 0);
    jd_pjson_free(v);
    prec_fini(&rec);

    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/text\"}", 0, &rec);
    v = parse(rec.result);
    assert_string_equal(jd_pjson_str(jd_pjson_get(v, "body")), "hi there");
    jd_pjson_free(v);
    prec_fini(&rec);

    http_call(f, &s,
              "{\"url\":\"http://127.0.0.1:%d/echo\",\"method\":\"PUT\","
              "\"headers\":{\"X-Test\":\"abc\"},\"body\":{\"k\":[1,true]}}",
              0, &rec);
    assert_true(rec.ok);
    v = parse(rec.result);
    assert_string_equal(jd_pjson_str(jd_pjson_get(v, "body")),
                        "PUT|abc|application/json|{\"k\":[1,true]}");
    jd_pjson_free(v);
    prec_fini(&rec);

    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/echo\",\"body\":\"raw\"}", 0, &rec);
    assert_non_null(strstr(rec.result, "POST|||raw"));
    prec_fini(&rec);

    /* 5xx: retryable; 4xx: not; the response is in details. */
    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/500\"}", 0, &rec);
    assert_false(rec.ok);
    assert_string_equal(rec.kind, "http_status");
    assert_true(rec.retryable);
    v = parse(rec.result);
    assert_int_equal(geti(jd_pjson_get(v, "details"), "status"), 503);
    jd_pjson_free(v);
    prec_fini(&rec);
    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/404\"}", 0, &rec);
    assert_string_equal(rec.kind, "http_status");
    assert_false(rec.retryable);
    prec_fini(&rec);

    /* Capped body: cut, returned as a string even though it claims JSON. */
    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/big\"}", 0, &rec);
    assert_true(rec.ok);
    v = parse(rec.result);
    assert_int_equal(strlen(jd_pjson_str(jd_pjson_get(v, "body"))), 1000);
    assert_int_equal(jd_pjson_bool(jd_pjson_get(v, "truncated"), -1), 1);
    jd_pjson_free(v);
    prec_fini(&rec);

    /* The args' timeout_ms: curl gives up, retryable http_error. */
    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/slow\",\"timeout_ms\":200}", 0, &rec);
    assert_string_equal(rec.kind, "http_error");
    assert_true(rec.retryable);
    prec_fini(&rec);

    /* The host's deadline: the transfer is aborted via cancel. */
    uint64_t t0 = penv_mono_ms();
    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/slow\"}", 200, &rec);
    assert_string_equal(rec.kind, "timeout");
    assert_true(penv_mono_ms() - t0 < 5000);
    prec_fini(&rec);

    /* Cancel. */
    char args[256];
    struct jd_call_handle *h;
    snprintf(args, sizeof args, "{\"url\":\"http://127.0.0.1:%d/slow\"}", s.port);
    prec_init(&rec);
    struct jd_call_request req = {
        .command = "http", .args_json = args, .done = prec_done, .arg = &rec};
    assert_int_equal(jd_registry_call(f->r, &req, &h), 0);
    usleep(50000);
    jd_registry_call_cancel(f->r, h);
    assert_int_equal(prec_count(&rec), 1);
    assert_string_equal(rec.kind, "cancelled");
    jd_registry_call_release(h);
    prec_fini(&rec);

    srv_stop(&s);
    /* Connection refused: retryable. */
    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/json\"}", 0, &rec);
    assert_string_equal(rec.kind, "http_error");
    assert_true(rec.retryable);
    prec_fini(&rec);
    /* Give the loop a moment to release the cancelled/timed-out handles. */
    usleep(100000);
    struct jd_registry_stats st;
    jd_registry_stats(f->r, &st);
    assert_int_equal(st.late_dropped, 2);
    fx_free(f);
}

/* Member `name` of the result's "headers" object; fails the test unless the
 * object holds it exactly once (duplicate keys are what this guards). */
static const cJSON *one_header(const cJSON *root, const char *name)
{
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(root, "headers");
    const cJSON *it, *found = NULL;
    int n = 0;
    assert_true(cJSON_IsObject(h));
    cJSON_ArrayForEach(it, h)
    {
        if (strcmp(it->string, name) == 0) {
            found = it;
            n++;
        }
    }
    assert_int_equal(n, 1);
    return found;
}

static int header_count(const cJSON *root)
{
    return cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(root, "headers"));
}

static void assert_cookies(const cJSON *root, int n, const char *const *want)
{
    const cJSON *c = one_header(root, "set-cookie");
    assert_true(cJSON_IsArray(c));
    assert_int_equal(cJSON_GetArraySize(c), n);
    for (int i = 0; i < n; i++)
        assert_string_equal(cJSON_GetStringValue(cJSON_GetArrayItem(c, i)), want[i]);
}

static void test_http_response_headers(void **state)
{
    (void)state;
    struct srv s;
    struct precord rec;
    cJSON *root;
    srv_start(&s);
    struct fx *f = fx_new(NULL, NULL, NULL);

    /* Repeated fields: one key each; Set-Cookie an array, never comma-joined
     * (its values hold commas); others joined with ", " in order received,
     * names compared case-insensitively. Values are escaped, not mangled. */
    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/hdrs\"}", 0, &rec);
    assert_true(rec.ok);
    root = cJSON_Parse(rec.result);
    assert_non_null(root);
    static const char *const cookies[] = {"a=1; Path=/",
                                          "b=2, c=3; Expires=Wed, 21 Oct 2037 07:28:00 GMT"};
    assert_cookies(root, 2, cookies);
    assert_string_equal(cJSON_GetStringValue(one_header(root, "vary")), "Accept, Accept-Encoding");
    assert_string_equal(cJSON_GetStringValue(one_header(root, "x-quote")), "say \"hi\" \\ back");
    assert_string_equal(cJSON_GetStringValue(one_header(root, "x-ctl")), "a\x01"
                                                                         "b");
    assert_non_null(strstr(rec.result, "\"a\\u0001b\""));
    /* Not UTF-8: U+FFFD in its place, as for bodies; valid UTF-8 kept. */
    assert_string_equal(cJSON_GetStringValue(one_header(root, "x-bytes")),
                        "caf\xEF\xBF\xBD \xC3\xA9");
    assert_string_equal(cJSON_GetStringValue(one_header(root, "x-ows")), "padded");
    assert_string_equal(cJSON_GetStringValue(one_header(root, "x-empty")), "");
    assert_string_equal(cJSON_GetStringValue(one_header(root, "x-fold")), "one two");
    assert_string_equal(cJSON_GetStringValue(one_header(root, "content-type")), "text/plain");
    assert_string_equal(cJSON_GetStringValue(one_header(root, "content-length")), "2");
    assert_string_equal(cJSON_GetStringValue(one_header(root, "connection")), "close");
    assert_int_equal(header_count(root), 11);
    cJSON_Delete(root);
    prec_fini(&rec);

    /* Only the final response's fields survive an interim 100; a single
     * Set-Cookie is still an array. */
    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/continue\"}", 0, &rec);
    assert_true(rec.ok);
    root = cJSON_Parse(rec.result);
    assert_non_null(root);
    assert_null(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "headers"),
                                                 "x-interim"));
    static const char *const only[] = {"only=1"};
    assert_cookies(root, 1, only);
    assert_string_equal(cJSON_GetStringValue(one_header(root, "content-length")), "4");
    assert_int_equal(header_count(root), 4); /* set-cookie, content-type, -length, connection */
    assert_int_equal(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(root, "status")), 200);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "body")),
                        "fine");
    cJSON_Delete(root);
    prec_fini(&rec);

    /* Past 64 KiB of header lines the rest is dropped; what is kept is a
     * whole prefix, in order, and still one key per name. */
    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/flood\"}", 0, &rec);
    assert_true(rec.ok);
    root = cJSON_Parse(rec.result);
    assert_non_null(root);
    assert_string_equal(cJSON_GetStringValue(one_header(root, "x-first")), "1");
    const char *many = cJSON_GetStringValue(one_header(root, "x-many"));
    assert_non_null(many);
    assert_int_equal(strncmp(many, "0000-", 5), 0);
    size_t kept = (strlen(many) + 2) / 65; /* "NNNN-<58 digits>" joined by ", " */
    assert_int_equal(strlen(many), kept * 65 - 2);
    assert_true(kept > 800 && kept < 1000); /* 64 KiB / 70-byte lines, about 936 */
    char last[8];
    snprintf(last, sizeof last, "%04zu-", kept - 1);
    assert_int_equal(strncmp(many + (kept - 1) * 65, last, 5), 0);
    assert_null(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "headers"),
                                                 "x-last"));
    cJSON_Delete(root);
    prec_fini(&rec);

    srv_stop(&s);
    fx_free(f);
}

static void test_http_allow_list(void **state)
{
    (void)state;
    struct fx *f = fx_new(NULL, "example.com, localhost", NULL);
    struct jd_error err;
    struct precord rec;
    assert_int_equal(
        jd_registry_validate(f->r, "http", "{\"url\":\"http://localhost:1/x\"}", "/args", &err), 0);
    assert_int_equal(
        jd_registry_validate(f->r, "http", "{\"url\":\"http://127.0.0.1:1/x\"}", "/args", &err),
        JD_EINVAL);
    assert_string_equal(err.pointer, "/args/url");
    assert_non_null(strstr(err.message, "allow-list"));
    assert_int_equal(
        jd_registry_validate(f->r, "http", "{\"url\":\"ftp://example.com/x\"}", "", &err),
        JD_EINVAL);
    assert_int_equal(jd_registry_validate(f->r, "http",
                                          "{\"url\":\"http://example.com\",\"method\":\"get\"}", "",
                                          &err),
                     JD_EINVAL);
    assert_string_equal(err.pointer, "/method");
    prec_init(&rec);
    call_wait(f, "http", "{\"url\":\"http://127.0.0.1:1/x\"}", 0, &rec);
    assert_string_equal(rec.kind, "not_allowed");
    assert_false(rec.retryable);
    prec_fini(&rec);
    fx_free(f);
}

/* Item 9: ports in allow entries, link-local refused, framing headers
 * refused, curl's sockets close-on-exec, a default deadline. */
static void test_http_allow_ports_and_link_local(void **state)
{
    (void)state;
    struct srv s;
    struct precord rec;
    struct jd_error err;
    char list[128], url[256];
    srv_start(&s);
    snprintf(list, sizeof list, "127.0.0.1:%d, [::1]:%d, localhost", s.port, s.port);
    struct fx *f = fx_new(NULL, list, NULL);

    snprintf(url, sizeof url, "{\"url\":\"http://127.0.0.1:%d/text\"}", s.port);
    assert_int_equal(jd_registry_validate(f->r, "http", url, "/args", &err), 0);
    snprintf(url, sizeof url, "{\"url\":\"http://127.0.0.1:%d/text\"}", s.port + 1);
    assert_int_equal(jd_registry_validate(f->r, "http", url, "/args", &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/args/url");
    assert_non_null(strstr(err.message, "allow-list"));
    assert_int_equal(
        jd_registry_validate(f->r, "http", "{\"url\":\"http://127.0.0.1/x\"}", "", &err),
        JD_EINVAL); /* port 80, not the one listed */
    snprintf(url, sizeof url, "{\"url\":\"http://[::1]:%d/x\"}", s.port);
    assert_int_equal(jd_registry_validate(f->r, "http", url, "", &err), 0);
    assert_int_equal(jd_registry_validate(f->r, "http", "{\"url\":\"http://[::1]:1/x\"}", "", &err),
                     JD_EINVAL);
    /* A name entry without a port: any port. */
    assert_int_equal(
        jd_registry_validate(f->r, "http", "{\"url\":\"http://localhost:1/x\"}", "", &err), 0);
    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/text\"}", 0, &rec);
    assert_true(rec.ok);
    prec_fini(&rec);
    http_call(f, &s, "{\"url\":\"http://localhost:%d/text\"}", 0, &rec);
    assert_true(rec.ok || strcmp(rec.kind, "http_error") == 0); /* ::1 may not listen */
    prec_fini(&rec);
    fx_free(f);

    /* Link-local and metadata addresses: refused with no list at all, in
     * any spelling, at submit and at run time. */
    f = fx_new(NULL, NULL, NULL);
    static const char *const meta[] = {
        "http://169.254.169.254/latest/meta-data/",
        "http://169.254.1.1:8080/",
        "http://[fe80::1]/",
        "http://[fd00:ec2::254]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://0xa9fea9fe/",
        "http://2852039166/",
    };
    for (size_t i = 0; i < sizeof meta / sizeof *meta; i++) {
        char args[200];
        snprintf(args, sizeof args, "{\"url\":\"%s\"}", meta[i]);
        prec_init(&rec);
        call_wait(f, "http", args, 0, &rec);
        if (rec.ok || strcmp(rec.kind, "not_allowed") != 0)
            fprintf(stderr, "not refused: %s (%s)\n", meta[i], rec.kind);
        assert_false(rec.ok);
        assert_string_equal(rec.kind, "not_allowed");
        assert_false(rec.retryable);
        prec_fini(&rec);
    }
    assert_int_equal(
        jd_registry_validate(f->r, "http", "{\"url\":\"http://169.254.169.254/\"}", "/args", &err),
        JD_EINVAL);
    assert_string_equal(err.pointer, "/args/url");
    assert_non_null(strstr(err.message, "link-local"));
    /* Ordinary addresses still pass with no list. */
    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/text\"}", 0, &rec);
    assert_true(rec.ok);
    prec_fini(&rec);
    fx_free(f);
    /* Listed explicitly: allowed. */
    f = fx_new(NULL, "169.254.169.254, 127.0.0.1", NULL);
    assert_int_equal(
        jd_registry_validate(f->r, "http", "{\"url\":\"http://169.254.169.254/latest\"}", "", &err),
        0);
    fx_free(f);
    srv_stop(&s);
}

/* An address entry is checked against the address curl connects to, not
 * only against the URL's text: here the URL is listed, but a proxy from the
 * environment would take the connection to an address that is not. */
static void test_http_connect_address_checked(void **state)
{
    (void)state;
    struct srv s;
    struct precord rec;
    char list[64], proxy[64];
    srv_start(&s);
    snprintf(list, sizeof list, "127.0.0.1:%d", s.port);
    snprintf(proxy, sizeof proxy, "http://127.0.0.2:%d", s.port);
    struct fx *f = fx_new(NULL, list, NULL);
    setenv("http_proxy", proxy, 1);
    unsetenv("no_proxy");
    unsetenv("NO_PROXY");
    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/text\"}", 0, &rec);
    unsetenv("http_proxy");
    assert_false(rec.ok);
    assert_string_equal(rec.kind, "not_allowed");
    assert_non_null(strstr(rec.result, "127.0.0.2"));
    prec_fini(&rec);
    /* Without the proxy the same request goes through. */
    http_call(f, &s, "{\"url\":\"http://127.0.0.1:%d/text\"}", 0, &rec);
    assert_true(rec.ok);
    prec_fini(&rec);
    fx_free(f);
    srv_stop(&s);
}

static void test_http_framing_headers_refused(void **state)
{
    (void)state;
    struct fx *f = fx_new(NULL, NULL, NULL);
    struct jd_error err;
    struct precord rec;
    static const char *const names[] = {"Host",       "content-length", "Transfer-Encoding",
                                        "Connection", "Upgrade",        "TE",
                                        "Expect",     "Trailer",        "Keep-Alive"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char args[256], want[64];
        snprintf(args, sizeof args,
                 "{\"url\":\"http://127.0.0.1:1/\",\"headers\":{\"X-Ok\":\"1\",\"%s\":\"x\"}}",
                 names[i]);
        snprintf(want, sizeof want, "/args/headers/%s", names[i]);
        assert_int_equal(jd_registry_validate(f->r, "http", args, "/args", &err), JD_EINVAL);
        assert_string_equal(err.pointer, want);
        prec_init(&rec);
        call_wait(f, "http", args, 0, &rec);
        assert_string_equal(rec.kind, "not_allowed");
        prec_fini(&rec);
    }
    /* A name that is not a token is malformed, not refused. */
    assert_int_equal(
        jd_registry_validate(f->r, "http",
                             "{\"url\":\"http://127.0.0.1:1/\",\"headers\":{\"a\\tb\":\"x\"}}", "",
                             &err),
        JD_EINVAL);
    fx_free(f);
}

/* 1 if every socket of ours connected to port is close-on-exec (and there
 * is at least one). */
static int client_sockets_cloexec(int port)
{
    int found = 0, all = 1;
    for (int fd = 3; fd < 1024; fd++) {
        struct sockaddr_in peer;
        socklen_t len = sizeof peer;
        if (getpeername(fd, (struct sockaddr *)&peer, &len) != 0 || peer.sin_family != AF_INET ||
            ntohs(peer.sin_port) != port)
            continue;
        found++;
        if (!(fcntl(fd, F_GETFD) & FD_CLOEXEC))
            all = 0;
    }
    return found && all;
}

static void test_http_sockets_cloexec_and_default_deadline(void **state)
{
    (void)state;
    struct srv s;
    struct precord rec;
    char args[256];
    srv_start(&s);
    struct fx *f = fx_new(NULL, NULL, NULL);
    f->env.http_timeout_ms = "1500";
    snprintf(args, sizeof args, "{\"url\":\"http://127.0.0.1:%d/slow\"}", s.port);
    prec_init(&rec);
    struct jd_call_request req = {
        .command = "http", .args_json = args, .done = prec_done, .arg = &rec};
    uint64_t t0 = penv_mono_ms();
    assert_int_equal(jd_registry_call(f->r, &req, NULL), 0);
    int ok = 0;
    for (int i = 0; i < 100 && !ok; i++) {
        usleep(10000);
        ok = client_sockets_cloexec(s.port);
    }
    assert_true(ok);
    /* No timeout_ms anywhere: --http-timeout ends it. */
    assert_true(prec_wait(&rec, 20000));
    assert_true(penv_mono_ms() - t0 < 5000);
    assert_string_equal(rec.kind, "http_error");
    prec_fini(&rec);
    fx_free(f);
    srv_stop(&s);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_echo),
        cmocka_unit_test(test_fail),
        cmocka_unit_test(test_sleep),
        cmocka_unit_test(test_counter_count_to),
        cmocka_unit_test(test_counter_count_messages),
        cmocka_unit_test(test_exec_allow_list),
        cmocka_unit_test(test_exec_allow_list_refuses_relative_paths),
        cmocka_unit_test(test_exec_exit_codes_and_output),
        cmocka_unit_test(test_exec_output_cap),
        cmocka_unit_test(test_exec_timeout_kills_group),
        cmocka_unit_test(test_http),
        cmocka_unit_test(test_http_response_headers),
        cmocka_unit_test(test_http_allow_list),
        cmocka_unit_test(test_exec_reaps_orphans_as_subreaper),
        cmocka_unit_test(test_exec_env_deny_list),
        cmocka_unit_test(test_exec_child_gets_only_stdio),
        cmocka_unit_test(test_exec_kills_group_when_leader_exits),
        cmocka_unit_test(test_exec_default_deadline),
        cmocka_unit_test(test_exec_huge_timeout),
        cmocka_unit_test(test_http_allow_ports_and_link_local),
        cmocka_unit_test(test_http_connect_address_checked),
        cmocka_unit_test(test_http_framing_headers_refused),
        cmocka_unit_test(test_http_sockets_cloexec_and_default_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
