/*
 * The task and workflow processes and the plugin process-type adapter
 * (server/workflow.c), driven directly through init/step with hand-made
 * events: order, parallel groups, sleeps, waits with messages and timeouts,
 * substitution, failures, cancel, and the determinism of tags that replay
 * depends on.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "server/jobdef.h"
#include "server/workflow.h"
#include "test_plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct wf_run {
    const struct jd_process_ops *ops;
    void *self;
    struct jd_step_out out;
};

static void run_start(struct wf_run *r, const struct jd_process_ops *ops, const char *def)
{
    memset(r, 0, sizeof *r);
    r->ops = ops;
    r->self = jd_workflow_new(42);
    struct jd_error err;
    jd_error_clear(&err);
    int rc = ops->init(r->self, "run", def, &err);
    if (rc)
        fail_msg("init: %d %s", rc, err.message);
}

static void run_end(struct wf_run *r)
{
    jd_step_out_reset(&r->out);
    free(r->out.yields);
    r->ops->close(r->self);
}

static void step(struct wf_run *r, struct jd_event *ev, size_t n)
{
    jd_step_out_reset(&r->out);
    assert_int_equal(r->ops->step(r->self, ev, n, &r->out), 0);
    for (size_t i = 0; i < n; i++) {
        free(ev[i].data);
        free(ev[i].error);
        ev[i].data = ev[i].error = NULL;
    }
}

static struct jd_event done_ev(uint32_t tag, const char *data)
{
    return (struct jd_event){
        .type = JD_EVENT_YIELD_COMPLETE, .tag = tag, .data = data ? strdup(data) : NULL};
}

static struct jd_event fail_ev(uint32_t tag, const char *error)
{
    return (struct jd_event){.type = JD_EVENT_YIELD_COMPLETE, .tag = tag, .error = strdup(error)};
}

static struct jd_event msg_ev(const char *topic, const char *data)
{
    char buf[256];
    snprintf(buf, sizeof buf, "{\"topic\":\"%s\",\"data\":%s}", topic, data);
    return (struct jd_event){.type = JD_EVENT_MESSAGE, .data = strdup(buf)};
}

static void expect_yield(struct wf_run *r, size_t i, uint32_t tag, const char *cmd,
                         const char *args)
{
    assert_true(i < r->out.nyields);
    assert_int_equal(r->out.yields[i].tag, tag);
    assert_string_equal(r->out.yields[i].command, cmd);
    if (args)
        assert_string_equal(r->out.yields[i].args, args);
}

static void test_sequential_steps_run_in_order_with_substitution(void **state)
{
    (void)state;
    struct wf_run r;
    run_start(&r, &jd_workflow_ops,
              "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":{\"n\":\"${input.n}\"}},"
              "{\"id\":\"b\",\"call\":\"t.echo\",\"args\":{\"prev\":\"${steps.a.output.n}\","
              "\"msg\":\"job ${job.id} got ${steps.a.output.n}\"},\"timeout_ms\":700}],"
              "\"input\":{\"n\":7}}");
    step(&r, NULL, 0);
    assert_int_equal(r.out.status, JD_STEP_WAIT);
    assert_int_equal(r.out.nyields, 1);
    expect_yield(&r, 0, 1, "t.echo", "{\"n\":7}");
    struct jd_event e = done_ev(1, "{\"n\":8}");
    step(&r, &e, 1);
    assert_int_equal(r.out.nyields, 1);
    expect_yield(&r, 0, 2, "t.echo", "{\"prev\":8,\"msg\":\"job 42 got 8\"}");
    assert_int_equal(r.out.yields[0].timeout_ms, 700);
    e = done_ev(2, "\"fine\"");
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_DONE);
    assert_string_equal(r.out.result, "{\"a\":{\"n\":8},\"b\":\"fine\"}");
    run_end(&r);
}

static void test_parallel_group_dispatches_all_and_waits_for_all(void **state)
{
    (void)state;
    struct wf_run r;
    run_start(&r, &jd_workflow_ops,
              "{\"steps\":[{\"id\":\"g\",\"parallel\":[{\"id\":\"x\",\"call\":\"t.echo\"},"
              "{\"id\":\"y\",\"call\":\"t.echo\",\"args\":{\"k\":1}},{\"id\":\"z\","
              "\"sleep_ms\":50}]},{\"id\":\"after\",\"call\":\"t.echo\",\"args\":{\"x\":"
              "\"${steps.x.output}\"}}]}");
    step(&r, NULL, 0);
    assert_int_equal(r.out.status, JD_STEP_WAIT);
    assert_int_equal(r.out.nyields, 3);
    expect_yield(&r, 0, 2, "t.echo", "{}");
    expect_yield(&r, 1, 3, "t.echo", "{\"k\":1}");
    expect_yield(&r, 2, 4, JD_CMD_SLEEP, "{\"ms\":50}");
    /* Completions in any order; nothing new until all are in. */
    struct jd_event e = done_ev(4, "null");
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_WAIT);
    assert_int_equal(r.out.nyields, 0);
    struct jd_event two[2] = {done_ev(3, "1"), done_ev(2, "\"X\"")};
    step(&r, two, 2);
    assert_int_equal(r.out.nyields, 1);
    expect_yield(&r, 0, 5, "t.echo", "{\"x\":\"X\"}");
    e = done_ev(5, "{}");
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_DONE);
    assert_string_equal(r.out.result, "{\"y\":1,\"x\":\"X\",\"after\":{}}");
    run_end(&r);
}

static void test_a_failed_branch_fails_the_group_and_job(void **state)
{
    (void)state;
    struct wf_run r;
    run_start(&r, &jd_workflow_ops,
              "{\"steps\":[{\"id\":\"g\",\"parallel\":[{\"id\":\"x\",\"call\":\"t.echo\"},"
              "{\"id\":\"y\",\"call\":\"t.echo\"}]},{\"id\":\"never\",\"call\":\"t.echo\"}]}");
    step(&r, NULL, 0);
    struct jd_event e = fail_ev(3, "{\"kind\":\"exit_status\",\"message\":\"exit 2\"}");
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_FAIL);
    assert_int_equal(r.out.nyields, 0);
    cJSON *err = cJSON_Parse(r.out.error);
    assert_string_equal(cJSON_GetObjectItem(err, "kind")->valuestring, "exit_status");
    assert_string_equal(cJSON_GetObjectItem(err, "step")->valuestring, "y");
    assert_string_equal(cJSON_GetObjectItem(err, "message")->valuestring,
                        "step \"y\" failed: exit 2");
    assert_non_null(cJSON_GetObjectItem(err, "cause"));
    cJSON_Delete(err);
    run_end(&r);
}

static void test_wait_takes_the_first_message_of_its_topic(void **state)
{
    (void)state;
    struct wf_run r;
    run_start(&r, &jd_workflow_ops,
              "{\"steps\":[{\"id\":\"s\",\"sleep_ms\":10},{\"id\":\"ok\",\"wait\":\"approval\"},"
              "{\"id\":\"ok2\",\"wait\":\"approval\"},{\"id\":\"use\",\"call\":\"t.echo\","
              "\"args\":{\"by\":\"${steps.ok.output.by}\"}}]}");
    step(&r, NULL, 0);
    expect_yield(&r, 0, 1, JD_CMD_SLEEP, "{\"ms\":10}");
    /* A message that arrives early is buffered. */
    struct jd_event m = msg_ev("approval", "{\"by\":\"ann\"}");
    step(&r, &m, 1);
    assert_int_equal(r.out.status, JD_STEP_WAIT);
    struct jd_event e = done_ev(1, "null");
    step(&r, &e, 1);
    /* ok took the buffered message; ok2 has nothing: idle (waiting). */
    assert_int_equal(r.out.status, JD_STEP_IDLE);
    assert_int_equal(r.out.nyields, 0);
    m = msg_ev("other", "1");
    step(&r, &m, 1);
    assert_int_equal(r.out.status, JD_STEP_IDLE);
    m = msg_ev("approval", "{\"by\":\"bob\"}");
    step(&r, &m, 1);
    assert_int_equal(r.out.status, JD_STEP_WAIT);
    expect_yield(&r, 0, 4, "t.echo", "{\"by\":\"ann\"}");
    e = done_ev(4, "{}");
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_DONE);
    assert_string_equal(r.out.result,
                        "{\"ok\":{\"by\":\"ann\"},\"ok2\":{\"by\":\"bob\"},\"use\":{}}");
    run_end(&r);
}

static void test_wait_timeout_fails_and_timer_is_always_yielded(void **state)
{
    (void)state;
    struct wf_run r;
    const char *def = "{\"steps\":[{\"id\":\"w\",\"wait\":\"go\",\"timeout_ms\":30},"
                      "{\"id\":\"n\",\"call\":\"t.echo\"}]}";
    run_start(&r, &jd_workflow_ops, def);
    step(&r, NULL, 0);
    assert_int_equal(r.out.status, JD_STEP_IDLE);
    expect_yield(&r, 0, 1, JD_CMD_TIMER, "{\"ms\":30}");
    struct jd_event e = done_ev(1, "null");
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_FAIL);
    assert_non_null(strstr(r.out.error, "\"kind\":\"timeout\""));
    assert_non_null(strstr(r.out.error, "\"step\":\"w\""));
    run_end(&r);

    /* Same definition, message already there: the timer is still yielded
     * (tag 1), so tags never depend on when messages arrived; the later
     * timer completion is ignored. */
    run_start(&r, &jd_workflow_ops, def);
    struct jd_event m = msg_ev("go", "true");
    step(&r, &m, 1);
    assert_int_equal(r.out.nyields, 2);
    expect_yield(&r, 0, 1, JD_CMD_TIMER, NULL);
    expect_yield(&r, 1, 2, "t.echo", NULL);
    e = done_ev(1, "null");
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_WAIT);
    e = done_ev(2, "5");
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_DONE);
    assert_string_equal(r.out.result, "{\"w\":true,\"n\":5}");
    run_end(&r);
}

static void test_cancel_and_substitution_failures(void **state)
{
    (void)state;
    struct wf_run r;
    run_start(&r, &jd_workflow_ops, "{\"steps\":[{\"id\":\"w\",\"wait\":\"go\"}]}");
    step(&r, NULL, 0);
    struct jd_event c = {.type = JD_EVENT_CANCEL};
    step(&r, &c, 1);
    assert_int_equal(r.out.status, JD_STEP_FAIL);
    assert_non_null(strstr(r.out.error, "\"kind\":\"cancelled\""));
    run_end(&r);

    run_start(&r, &jd_workflow_ops,
              "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":{\"v\":\"${input.nope}\"}}],"
              "\"input\":{}}");
    step(&r, NULL, 0);
    assert_int_equal(r.out.status, JD_STEP_FAIL);
    assert_non_null(strstr(r.out.error, "\"kind\":\"substitution\""));
    assert_non_null(strstr(r.out.error, "${input.nope}"));
    run_end(&r);
}

/* The poison job: step a splices ${input.s} (1,000 bytes) into a
 * 60,000-byte string, b splices a's output 300 times (18 MB in one string),
 * c splices b's output thousands of times. The job fails at b with a
 * substitution error naming the step and the limit; nothing large is
 * built. A variant splices a's output into many strings, each under the
 * string limit, and fails on the args limit instead. */
static void test_substitution_bounds_fail_the_step(void **state)
{
    (void)state;
    size_t cap = 1 << 20, n = 0;
    char *def = malloc(cap);
    n += (size_t)snprintf(def + n, cap - n,
                          "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":{\"v\":\"");
    for (int i = 0; i < 60; i++)
        n += (size_t)snprintf(def + n, cap - n, "${input.s}");
    n += (size_t)snprintf(def + n, cap - n,
                          "\"}},{\"id\":\"b\",\"call\":\"t.echo\",\"args\":{\"v\":\"");
    for (int i = 0; i < 300; i++)
        n += (size_t)snprintf(def + n, cap - n, "${steps.a.output.v}");
    n += (size_t)snprintf(def + n, cap - n,
                          "\"}},{\"id\":\"c\",\"call\":\"t.echo\",\"args\":{\"v\":\"");
    for (int i = 0; i < 3000; i++)
        n += (size_t)snprintf(def + n, cap - n, "${steps.b.output.v}");
    n += (size_t)snprintf(def + n, cap - n, "\"}}],\"input\":{\"s\":\"%01000d\"}}", 0);

    struct wf_run r;
    run_start(&r, &jd_workflow_ops, def);
    step(&r, NULL, 0);
    assert_int_equal(r.out.nyields, 1);
    expect_yield(&r, 0, 1, "t.echo", NULL);
    assert_int_equal(strlen(r.out.yields[0].args), 60000 + 8); /* {"v":"..."} */
    struct jd_event e = done_ev(1, r.out.yields[0].args);      /* echo: output = args */
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_FAIL);
    assert_int_equal(r.out.nyields, 0);
    cJSON *err = cJSON_Parse(r.out.error);
    assert_string_equal(cJSON_GetObjectItem(err, "kind")->valuestring, "substitution");
    assert_string_equal(cJSON_GetObjectItem(err, "step")->valuestring, "b");
    assert_string_equal(cJSON_GetObjectItem(err, "at")->valuestring, "/v");
    const char *msg = cJSON_GetObjectItem(err, "message")->valuestring;
    assert_non_null(strstr(msg, "step \"b\""));
    assert_non_null(strstr(msg, "65536-byte string limit"));
    cJSON_Delete(err);
    run_end(&r);

    /* b splices a's output into 100 strings of 60,000 bytes: 6 MB of args. */
    n = 0;
    n += (size_t)snprintf(def + n, cap - n,
                          "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":{\"v\":\"");
    for (int i = 0; i < 60; i++)
        n += (size_t)snprintf(def + n, cap - n, "${input.s}");
    n += (size_t)snprintf(def + n, cap - n, "\"}},{\"id\":\"b\",\"call\":\"t.echo\",\"args\":{");
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(def + n, cap - n, "%s\"v%d\":\"${steps.a.output.v}\"", i ? "," : "",
                              i);
    n += (size_t)snprintf(def + n, cap - n, "}}],\"input\":{\"s\":\"%01000d\"}}", 0);
    run_start(&r, &jd_workflow_ops, def);
    step(&r, NULL, 0);
    e = done_ev(1, r.out.yields[0].args);
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_FAIL);
    err = cJSON_Parse(r.out.error);
    assert_string_equal(cJSON_GetObjectItem(err, "kind")->valuestring, "substitution");
    assert_string_equal(cJSON_GetObjectItem(err, "step")->valuestring, "b");
    assert_string_equal(cJSON_GetObjectItem(err, "at")->valuestring, "/v17");
    assert_non_null(strstr(cJSON_GetObjectItem(err, "message")->valuestring, "1048576-byte limit"));
    cJSON_Delete(err);
    run_end(&r);
    free(def);
}

static void test_task_output_is_the_call_result(void **state)
{
    (void)state;
    struct wf_run r;
    run_start(&r, &jd_task_ops, "{\"handler\":\"t.echo\",\"args\":{\"id\":\"${job.id}\"}}");
    step(&r, NULL, 0);
    expect_yield(&r, 0, 1, "t.echo", "{\"id\":\"42\"}");
    struct jd_event e = done_ev(1, "{\"id\":\"42\"}");
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_DONE);
    assert_string_equal(r.out.result, "{\"id\":\"42\"}");
    run_end(&r);

    run_start(&r, &jd_task_ops, "{\"handler\":\"t.echo\"}");
    step(&r, NULL, 0);
    e = fail_ev(1, "{\"kind\":\"flaky\",\"message\":\"no\"}");
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_FAIL);
    assert_string_equal(r.out.error, "{\"kind\":\"flaky\",\"message\":\"no\"}");
    run_end(&r);

    /* A workflow definition is refused by the task type, and bad methods. */
    void *self = jd_workflow_new(1);
    struct jd_error err;
    assert_int_equal(
        jd_task_ops.init(self, "run", "{\"steps\":[{\"id\":\"a\",\"sleep_ms\":1}]}", &err),
        JD_EINVAL);
    jd_task_ops.close(self);
    self = jd_workflow_new(1);
    assert_int_equal(jd_workflow_ops.init(self, "go", "{}", &err), JD_EINVAL);
    assert_non_null(strstr(err.message, "unknown method"));
    jd_workflow_ops.close(self);
}

/* A definition handed over already parsed runs without its text (the server
 * path), gives the same yields as the parsed-from-text path, and close leaves
 * the borrowed definition to its owner. */
static void test_a_handed_over_definition_runs_without_its_text(void **state)
{
    (void)state;
    const char *text = "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":"
                       "{\"n\":\"${input.n}\",\"j\":\"${job.id}\"}}],\"input\":{\"n\":3}}";
    struct jd_jobdef *d = NULL;
    struct jd_error err;
    jd_error_clear(&err);
    assert_int_equal(jd_jobdef_parse(text, strlen(text), NULL, NULL, &d, &err), 0);

    struct wf_run r = {.ops = &jd_workflow_ops, .self = jd_workflow_new_def(9, d)};
    assert_int_equal(jd_workflow_ops.init(r.self, "run", NULL, &err), 0);
    step(&r, NULL, 0);
    assert_int_equal(r.out.status, JD_STEP_WAIT);
    expect_yield(&r, 0, 1, "t.echo", "{\"n\":3,\"j\":\"9\"}");
    struct jd_event e = done_ev(1, "{\"ok\":true}");
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_DONE);
    run_end(&r);
    /* Still the caller's: usable after close, freed once by its owner. */
    assert_int_equal(d->nsteps, 1);

    /* The task type refuses a handed-over workflow definition too. */
    void *self = jd_workflow_new_def(9, d);
    assert_int_equal(jd_task_ops.init(self, "run", NULL, &err), JD_EINVAL);
    jd_task_ops.close(self);
    jd_jobdef_free(d);
}

static void test_same_events_give_same_yields(void **state)
{
    (void)state;
    const char *def = "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":{\"i\":1}},"
                      "{\"id\":\"g\",\"parallel\":[{\"id\":\"b\",\"call\":\"t.echo\"},{\"id\":"
                      "\"c\",\"sleep_ms\":5}]},{\"id\":\"d\",\"call\":\"t.echo\",\"args\":{\"b\":"
                      "\"${steps.b.output}\"}}]}";
    char trace[2][512];
    for (int round = 0; round < 2; round++) {
        struct wf_run r;
        run_start(&r, &jd_workflow_ops, def);
        trace[round][0] = '\0';
        struct jd_event evs[3];
        size_t nev = 0;
        step(&r, NULL, 0);
        for (int guard = 0; guard < 10 && r.out.status != JD_STEP_DONE; guard++) {
            nev = 0;
            for (size_t i = 0; i < r.out.nyields; i++) {
                char line[128];
                snprintf(line, sizeof line, "%u:%s:%s;", r.out.yields[i].tag,
                         r.out.yields[i].command, r.out.yields[i].args);
                strncat(trace[round], line, sizeof trace[round] - strlen(trace[round]) - 1);
                evs[nev++] = done_ev(r.out.yields[i].tag, "\"r\"");
            }
            /* Deliver in reverse order the second time: same yields. */
            if (round == 1 && nev == 2) {
                struct jd_event t = evs[0];
                evs[0] = evs[1];
                evs[1] = t;
            }
            step(&r, evs, nev);
        }
        assert_int_equal(r.out.status, JD_STEP_DONE);
        run_end(&r);
    }
    assert_string_equal(trace[0], trace[1]);
    assert_non_null(strstr(trace[0], "5:t.echo:{\"b\":\"r\"}"));
}

/* Build the event a spec names: "m:<topic>:<json>" a message, "c:<tag>:<json>"
 * a completion. */
static struct jd_event spec_ev(const char *spec)
{
    char topic[32];
    const char *json = strchr(spec + 2, ':') + 1;
    if (spec[0] == 'm') {
        snprintf(topic, sizeof topic, "%.*s", (int)(json - 1 - (spec + 2)), spec + 2);
        return msg_ev(topic, json);
    }
    return done_ev((uint32_t)atoi(spec + 2), json);
}

/* Run def: a first step with no events, then evs[0..n) delivered in batches
 * (a new batch starts before event k when bit k-1 of `cuts` is set). Returns
 * what the run decided: every step's status and yields, then the result or
 * error (caller frees). */
static char *run_batched(const char *def, const char *const *evs, size_t n, unsigned cuts)
{
    struct wf_run r;
    run_start(&r, &jd_workflow_ops, def);
    char *trace = calloc(1, 2048);
    struct jd_event batch[8];
    size_t nb = 0;
    bool yielded[16] = {false};
    bool fresh = true; /* a step ran since its yields were last reported */
    step(&r, NULL, 0);
    for (size_t k = 0; k <= n && r.out.status != JD_STEP_DONE && r.out.status != JD_STEP_FAIL;
         k++) {
        /* The yields of the step just run, then the next batch. */
        for (size_t y = 0; fresh && y < r.out.nyields; y++) {
            char line[96];
            snprintf(line, sizeof line, "y%u:%s;", r.out.yields[y].tag, r.out.yields[y].command);
            strncat(trace, line, 2047 - strlen(trace));
            if (r.out.yields[y].tag < 16)
                yielded[r.out.yields[y].tag] = true;
        }
        fresh = false;
        if (k == n)
            break;
        struct jd_event ev = spec_ev(evs[k]);
        if (ev.type == JD_EVENT_YIELD_COMPLETE && ev.tag < 16 && !yielded[ev.tag] && nb > 0) {
            /* A completion cannot come before its yield: the batch so far
             * runs first (its step yields the tag). */
            step(&r, batch, nb);
            fresh = true;
            nb = 0;
            k--;
            free(ev.data);
            continue;
        }
        batch[nb++] = ev;
        if (k + 1 == n || (cuts >> k & 1u)) {
            step(&r, batch, nb);
            fresh = true;
            nb = 0;
        }
    }
    for (size_t i = 0; i < nb; i++) {
        free(batch[i].data);
        free(batch[i].error);
    }
    char line[512];
    snprintf(line, sizeof line, "status %d %s", (int)r.out.status,
             r.out.status == JD_STEP_DONE   ? r.out.result
             : r.out.status == JD_STEP_FAIL ? r.out.error
                                            : "");
    strncat(trace, line, 2047 - strlen(trace));
    run_end(&r);
    return trace;
}

/* Replay delivers the recorded events in their recorded order but batches
 * them as the scheduler pleases, so a workflow must decide from the order of
 * events alone: every batching gives what one-event-per-step gives. In
 * particular a message that came before a wait's timer completion satisfies
 * the wait even when both arrive in one step (before, the batch [message,
 * timer] timed out while the same events one by one took the message). */
static void test_decisions_depend_on_event_order_not_batching(void **state)
{
    (void)state;
    const char *wait_def = "{\"steps\":[{\"id\":\"w\",\"wait\":\"go\",\"timeout_ms\":30},"
                           "{\"id\":\"n\",\"call\":\"t.echo\"}]}";
    const char *par_def = "{\"steps\":[{\"id\":\"g\",\"parallel\":[{\"id\":\"a\",\"wait\":\"x\","
                          "\"timeout_ms\":30},{\"id\":\"b\",\"wait\":\"x\",\"timeout_ms\":30},"
                          "{\"id\":\"c\",\"call\":\"t.echo\"}]},{\"id\":\"d\",\"wait\":\"x\"}]}";
    struct {
        const char *def;
        const char *evs[4];
        size_t n;
        const char *outcome; /* part of the one-by-one result */
    } cases[] = {
        {wait_def, {"m:go:true", "c:1:null", "c:2:5"}, 3, "{\"w\":true,\"n\":5}"},
        {wait_def, {"c:1:null", "m:go:true"}, 2, "\"kind\":\"timeout\""},
        {par_def, {"m:x:1", "c:2:null", "c:4:7", "m:x:2"}, 4, "y4:t.echo;status 2"},
        {par_def, {"m:x:1", "c:3:null"}, 2, "\"step\":\"b\""},
        {par_def, {"m:x:1", "m:x:2", "c:4:7", "m:x:3"}, 4, "{\"a\":1,\"b\":2,\"c\":7,\"d\":3}"},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        size_t n = cases[t].n;
        char *one_by_one = run_batched(cases[t].def, cases[t].evs, n, ~0u);
        if (!strstr(one_by_one, cases[t].outcome))
            fail_msg("case %zu: one by one gave %s", t, one_by_one);
        for (unsigned cuts = 0; cuts < 1u << (n - 1); cuts++) {
            char *got = run_batched(cases[t].def, cases[t].evs, n, cuts);
            if (strcmp(got, one_by_one) != 0)
                fail_msg("case %zu, batching %#x: %s\n  one by one: %s", t, cuts, got, one_by_one);
            free(got);
        }
        free(one_by_one);
    }
}

static void test_plugin_process_type_adapter(void **state)
{
    (void)state;
    struct jd_plugin_env env = {0};
    struct jd_registry *reg;
    assert_int_equal(jd_registry_create(&env, &reg), 0);
    assert_int_equal(tp_register(NULL, reg), 0);
    jd_registry_freeze(reg);
    const struct jd_process_type *pt = jd_registry_process_type(reg, "t.counter");
    assert_non_null(pt);

    void *self = jd_plugin_process_new(pt);
    struct jd_error err;
    assert_int_equal(jd_plugin_process_ops.init(self, "count_to", "{\"n\":2}", &err), 0);
    struct jd_step_out out = {0};
    assert_int_equal(jd_plugin_process_ops.step(self, NULL, 0, &out), 0);
    assert_int_equal(out.status, JD_STEP_WAIT);
    assert_int_equal(out.nyields, 1);
    assert_string_equal(out.yields[0].command, "t.echo");
    for (uint32_t t = 1; t <= 2; t++) {
        jd_step_out_reset(&out);
        struct jd_event e = done_ev(t, "{}");
        assert_int_equal(jd_plugin_process_ops.step(self, &e, 1, &out), 0);
        free(e.data);
    }
    assert_int_equal(out.status, JD_STEP_DONE);
    assert_string_equal(out.result, "{\"count\":2}");
    jd_step_out_reset(&out);
    free(out.yields);
    jd_plugin_process_ops.close(self);

    self = jd_plugin_process_new(pt);
    assert_int_equal(jd_plugin_process_ops.init(self, "count_to", "{\"n\":-3}", &err), JD_EINVAL);
    assert_non_null(strstr(err.message, "n must be >= 0"));
    jd_plugin_process_ops.close(self);
    jd_registry_destroy(reg);
}

/* Step outputs are kept as text and held to JD_WF_OUTPUTS_MAX together:
 * each large output here is over a third of it, so the third large one
 * fails the job with output_too_large naming the step; references into
 * the kept outputs still resolve, and a whole output keeps its type. */
static void test_outputs_are_bounded_together(void **state)
{
    (void)state;
    struct wf_run r;
    run_start(&r, &jd_workflow_ops,
              "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\"},"
              "{\"id\":\"b\",\"call\":\"t.echo\",\"args\":{\"n\":\"${steps.a.output.n}\"}},"
              "{\"id\":\"c\",\"call\":\"t.echo\",\"args\":{\"all\":\"${steps.b.output}\"}},"
              "{\"id\":\"d\",\"call\":\"t.echo\"}]}");
    size_t big = JD_WF_OUTPUTS_MAX / 3 + 16;
    char *data = malloc(big + 64);
    int n = snprintf(data, 64, "{\"n\":5,\"s\":\"");
    memset(data + n, 'x', big);
    strcpy(data + n + big, "\"}");
    step(&r, NULL, 0);
    expect_yield(&r, 0, 1, "t.echo", "{}");
    struct jd_event e = done_ev(1, data);
    step(&r, &e, 1);
    expect_yield(&r, 0, 2, "t.echo", "{\"n\":5}");
    e = done_ev(2, "{\"m\":[1,2]}");
    step(&r, &e, 1);
    expect_yield(&r, 0, 3, "t.echo", "{\"all\":{\"m\":[1,2]}}");
    e = done_ev(3, data);
    step(&r, &e, 1);
    expect_yield(&r, 0, 4, "t.echo", "{}");
    e = done_ev(4, data);
    step(&r, &e, 1);
    assert_int_equal(r.out.status, JD_STEP_FAIL);
    cJSON *err = cJSON_Parse(r.out.error);
    assert_string_equal(cJSON_GetObjectItem(err, "kind")->valuestring, "output_too_large");
    assert_string_equal(cJSON_GetObjectItem(err, "step")->valuestring, "d");
    cJSON_Delete(err);
    run_end(&r);
    free(data);
}

/* With a charged definition (as the job layer runs it), kept outputs and
 * buffered messages count in the job memory counter while the process
 * lives, and come off it when it closes; the output is unchanged. */
static void test_outputs_and_messages_are_charged(void **state)
{
    (void)state;
    const char *def =
        "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\"},{\"id\":\"w\",\"wait\":\"go\"}]}";
    struct jd_jobdef *d = NULL;
    struct jd_error err;
    assert_int_equal(jd_jobdef_parse(def, strlen(def), NULL, NULL, &d, &err), 0);
    _Atomic size_t held = 0;
    jd_jobdef_charge(d, &held);
    size_t base = held;
    struct wf_run r = {.ops = &jd_workflow_ops, .self = jd_workflow_new_def(7, d)};
    assert_int_equal(r.ops->init(r.self, "run", NULL, &err), 0);
    step(&r, NULL, 0);
    expect_yield(&r, 0, 1, "t.echo", "{}");
    struct jd_event ev[2] = {msg_ev("other", "[1, 2]"), done_ev(1, "{\"x\": 1}")};
    step(&r, ev, 2);
    assert_int_equal(held, base + strlen("[1,2]") + strlen("{\"x\":1}"));
    struct jd_event m = msg_ev("go", "{\"y\":2}");
    step(&r, &m, 1);
    assert_int_equal(r.out.status, JD_STEP_DONE);
    assert_string_equal(r.out.result, "{\"a\":{\"x\":1},\"w\":{\"y\":2}}");
    assert_int_equal(held, base + 5 + 7 + 7);
    run_end(&r);
    assert_int_equal(held, base);
    jd_jobdef_free(d);
    assert_int_equal(held, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential_steps_run_in_order_with_substitution),
        cmocka_unit_test(test_a_handed_over_definition_runs_without_its_text),
        cmocka_unit_test(test_parallel_group_dispatches_all_and_waits_for_all),
        cmocka_unit_test(test_a_failed_branch_fails_the_group_and_job),
        cmocka_unit_test(test_wait_takes_the_first_message_of_its_topic),
        cmocka_unit_test(test_wait_timeout_fails_and_timer_is_always_yielded),
        cmocka_unit_test(test_cancel_and_substitution_failures),
        cmocka_unit_test(test_task_output_is_the_call_result),
        cmocka_unit_test(test_substitution_bounds_fail_the_step),
        cmocka_unit_test(test_same_events_give_same_yields),
        cmocka_unit_test(test_plugin_process_type_adapter),
        cmocka_unit_test(test_decisions_depend_on_event_order_not_batching),
        cmocka_unit_test(test_outputs_are_bounded_together),
        cmocka_unit_test(test_outputs_and_messages_are_charged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
