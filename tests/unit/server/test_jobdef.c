/*
 * Job definition validation (server/jobdef.c) and substitution
 * (server/subst.c): a table of bad definitions, each with the code, JSON
 * pointer and message a user gets, and good definitions of every shape with
 * what they parse to. Handler validate hooks come from the in-process test
 * plugin (test_plugin.h) through a real registry.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "server/jobdef.h"
#include "test_plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct jd_registry *reg;
static const struct jd_job_limits limits = {
    .max_definition_bytes = 4096, .max_depth = 32, .max_steps = 8, .max_string = 1000};

static int setup(void **state)
{
    (void)state;
    struct jd_plugin_env env = {0};
    if (jd_registry_create(&env, &reg) != 0)
        return -1;
    if (tp_register(NULL, reg) != 0)
        return -1;
    jd_registry_freeze(reg);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    jd_registry_destroy(reg);
    return 0;
}

struct bad {
    const char *json;
    int code;
    const char *pointer;
    const char *message; /* substring of the message */
};

static char long_queue[] = "{\"handler\":\"t.echo\",\"queue\":"
                           "\"qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq\"}";

static const struct bad bads[] = {
    /* shape */
    {"[]", JD_EINVAL, "", "must be a JSON object"},
    {"{}", JD_EINVAL, "", "needs \"handler\", \"steps\" or \"process\""},
    {"{\"handler\":\"t.echo\",\"steps\":[]}", JD_EINVAL, "", "only one of"},
    {"{\"handler\":\"t.echo\",\"bogus\":1}", JD_EINVAL, "/bogus", "unknown member \"bogus\""},
    {"{\"handler\":\"t.echo\",\"handler\":\"t.echo\"}", JD_EINVAL, "/handler",
     "duplicate member \"handler\""},
    /* handler shape */
    {"{\"handler\":\"htp\"}", JD_EINVAL, "/handler", "unknown handler \"htp\""},
    {"{\"handler\":5}", JD_EINVAL, "/handler", "handler must be a handler name"},
    {"{\"handler\":\"t.echo\",\"args\":[1]}", JD_EINVAL, "/args", "args must be an object"},
    {"{\"handler\":\"t.echo\",\"args\":{\"bad\":1}}", JD_EINVAL, "/args/bad", "bad is not allowed"},
    {"{\"handler\":\"t.echo\",\"method\":\"x\"}", JD_EINVAL, "/method",
     "belongs to a \"process\" job"},
    {"{\"handler\":\"t.echo\",\"args\":{\"v\":\"${nope}\"}}", JD_EINVAL, "/args/v",
     "unknown reference \"${nope}\""},
    /* common options */
    {"{\"handler\":\"t.echo\",\"queue\":\"\"}", JD_EINVAL, "/queue", "must not be empty"},
    {"{\"handler\":\"t.echo\",\"queue\":\"a b\"}", JD_EINVAL, "/queue", "may only use"},
    {"{\"handler\":\"t.echo\",\"queue\":7}", JD_EINVAL, "/queue", "queue must be a string"},
    {long_queue, JD_EINVAL, "/queue", "longer than 64 characters"},
    {"{\"handler\":\"t.echo\",\"priority\":1.5}", JD_EINVAL, "/priority", "must be an integer"},
    {"{\"handler\":\"t.echo\",\"priority\":\"high\"}", JD_EINVAL, "/priority",
     "must be an integer"},
    {"{\"handler\":\"t.echo\",\"priority\":2000000}", JD_EINVAL, "/priority",
     "between -1000000 and 1000000"},
    {"{\"handler\":\"t.echo\",\"delay_ms\":-1}", JD_EINVAL, "/delay_ms", "between 0 and"},
    {"{\"handler\":\"t.echo\",\"delay_ms\":5,\"run_at\":\"2030-01-01T00:00:00Z\"}", JD_EINVAL,
     "/run_at", "either delay_ms or run_at"},
    {"{\"handler\":\"t.echo\",\"run_at\":\"tomorrow\"}", JD_EINVAL, "/run_at", "RFC 3339"},
    {"{\"handler\":\"t.echo\",\"run_at\":12}", JD_EINVAL, "/run_at", "RFC 3339"},
    {"{\"handler\":\"t.echo\",\"timeout_ms\":0}", JD_EINVAL, "/timeout_ms", "between 1 and"},
    {"{\"handler\":\"t.echo\",\"retry\":3}", JD_EINVAL, "/retry", "retry must be an object"},
    {"{\"handler\":\"t.echo\",\"retry\":{\"max_attempts\":0}}", JD_EINVAL, "/retry/max_attempts",
     "between 1 and 100"},
    {"{\"handler\":\"t.echo\",\"retry\":{\"tries\":3}}", JD_EINVAL, "/retry/tries",
     "unknown member \"tries\" in retry"},
    {"{\"handler\":\"t.echo\",\"retry\":{\"factor\":0.5}}", JD_EINVAL, "/retry/factor",
     "from 1 to 100"},
    {"{\"handler\":\"t.echo\",\"retry\":{\"backoff_ms\":-5}}", JD_EINVAL, "/retry/backoff_ms",
     "between 0 and"},
    {"{\"handler\":\"t.echo\",\"labels\":[]}", JD_EINVAL, "/labels", "must be an object"},
    {"{\"handler\":\"t.echo\",\"labels\":{\"team\":1}}", JD_EINVAL, "/labels/team",
     "label values must be strings"},
    {"{\"handler\":\"t.echo\",\"labels\":{\"a/b\":1}}", JD_EINVAL, "/labels/a~1b",
     "label values must be strings"},
    /* steps */
    {"{\"steps\":[]}", JD_EINVAL, "/steps", "non-empty array"},
    {"{\"steps\":{}}", JD_EINVAL, "/steps", "non-empty array"},
    {"{\"steps\":[1]}", JD_EINVAL, "/steps/0", "a step must be an object"},
    {"{\"steps\":[{\"call\":\"t.echo\"}]}", JD_EINVAL, "/steps/0/id", "missing step id"},
    {"{\"steps\":[{\"id\":\"a b\",\"call\":\"t.echo\"}]}", JD_EINVAL, "/steps/0/id",
     "may only use"},
    {"{\"steps\":[{\"id\":\"a\"}]}", JD_EINVAL, "/steps/0", "needs one of"},
    {"{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"sleep_ms\":5}]}", JD_EINVAL, "/steps/0",
     "exactly one of"},
    {"{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\"},{\"id\":\"a\",\"call\":\"t.echo\"}]}",
     JD_EINVAL, "/steps/1/id", "duplicate step id \"a\""},
    {"{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\"},{\"id\":\"b\",\"sleep_ms\":1},"
     "{\"id\":\"c\",\"call\":\"htp\"}]}",
     JD_EINVAL, "/steps/2/call", "unknown handler \"htp\""},
    {"{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":{\"x\":{\"bad\":true}}}]}", JD_EINVAL,
     "/steps/0/args/bad", "bad is not allowed"},
    {"{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"bogus\":1}]}", JD_EINVAL, "/steps/0/bogus",
     "unknown member \"bogus\" in a step"},
    {"{\"steps\":[{\"id\":\"a\",\"sleep_ms\":-1}]}", JD_EINVAL, "/steps/0/sleep_ms",
     "between 0 and"},
    {"{\"steps\":[{\"id\":\"a\",\"sleep_ms\":\"5s\"}]}", JD_EINVAL, "/steps/0/sleep_ms",
     "must be an integer"},
    {"{\"steps\":[{\"id\":\"a\",\"wait\":\"\"}]}", JD_EINVAL, "/steps/0/wait", "must not be empty"},
    {"{\"steps\":[{\"id\":\"a\",\"wait\":\"x\",\"timeout_ms\":0}]}", JD_EINVAL,
     "/steps/0/timeout_ms", "between 1 and"},
    {"{\"steps\":[{\"id\":\"a\",\"parallel\":[]}]}", JD_EINVAL, "/steps/0/parallel",
     "non-empty array of steps"},
    {"{\"steps\":[{\"id\":\"a\",\"parallel\":[{\"id\":\"b\",\"parallel\":[{\"id\":\"c\","
     "\"sleep_ms\":1}]}]}]}",
     JD_EINVAL, "/steps/0/parallel/0/parallel", "cannot be nested"},
    {"{\"steps\":[{\"id\":\"a\",\"sleep_ms\":5,\"args\":{}}]}", JD_EINVAL, "/steps/0/args",
     "belongs to a \"call\" step"},
    {"{\"steps\":[{\"id\":\"a\",\"sleep_ms\":5,\"timeout_ms\":5}]}", JD_EINVAL,
     "/steps/0/timeout_ms", "belongs to a \"call\" or \"wait\" step"},
    {"{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"retry\":{\"max_attempts\":500}}]}", JD_EINVAL,
     "/steps/0/retry/max_attempts", "between 1 and 100"},
    {"{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":{\"v\":\"${steps.b.output}\"}},"
     "{\"id\":\"b\",\"call\":\"t.echo\"}]}",
     JD_EINVAL, "/steps/0/args/v", "names no earlier step \"b\""},
    {"{\"steps\":[{\"id\":\"g\",\"parallel\":[{\"id\":\"a\",\"call\":\"t.echo\"},{\"id\":\"b\","
     "\"call\":\"t.echo\",\"args\":{\"v\":\"${steps.a.output}\"}}]}]}",
     JD_EINVAL, "/steps/0/parallel/1/args/v", "names no earlier step \"a\""},
    {"{\"steps\":[{\"id\":\"s\",\"sleep_ms\":1},{\"id\":\"b\",\"call\":\"t.echo\",\"args\":{"
     "\"v\":[\"${steps.s.output}\"]}}]}",
     JD_EINVAL, "/steps/1/args/v/0", "names no earlier step \"s\""},
    {"{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":{\"v\":\"${input.x\"}}]}", JD_EINVAL,
     "/steps/0/args/v", "unterminated reference"},
    {"{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\"}],\"args\":{}}", JD_EINVAL, "/args",
     "does not belong to a \"steps\" job"},
    /* process shape */
    {"{\"process\":\"nope\",\"method\":\"m\"}", JD_EINVAL, "/process",
     "unknown process type \"nope\""},
    {"{\"process\":\"t.counter\"}", JD_EINVAL, "/method", "missing method"},
    {"{\"process\":\"t.counter\",\"method\":\"count_down\"}", JD_EINVAL, "/method",
     "has no method \"count_down\""},
    {"{\"process\":\"t.counter\",\"method\":\"count_to\",\"input\":{\"n\":-1}}", JD_EINVAL,
     "/input", "n must be >= 0"},
    {"{\"process\":\"t.counter\",\"method\":\"count_to\",\"args\":{}}", JD_EINVAL, "/args",
     "use \"input\""},
    /* syntax and limits */
    {"{\"handler\":", JD_EPARSE, "", "malformed JSON"},
    {"{\"handler\":\"t.echo\"} x", JD_EPARSE, "", "unexpected data after the JSON value"},
    {"{\"handler\":\"t.echo\",\"input\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]"
     "]]]]]]]]]]]]]]]]]]}",
     JD_ETOOBIG, "", "nested deeper than 32 levels"},
    {"{\"steps\":[{\"id\":\"a1\",\"sleep_ms\":1},{\"id\":\"a2\",\"sleep_ms\":1},{\"id\":\"a3\","
     "\"sleep_ms\":1},{\"id\":\"a4\",\"sleep_ms\":1},{\"id\":\"g\",\"parallel\":[{\"id\":\"b1\","
     "\"sleep_ms\":1},{\"id\":\"b2\",\"sleep_ms\":1},{\"id\":\"b3\",\"sleep_ms\":1},{\"id\":"
     "\"b4\",\"sleep_ms\":1}]}]}",
     JD_ETOOBIG, "/steps/4/parallel/3", "more than 8 steps"},
};

static void check_bad(const struct bad *b, size_t i)
{
    struct jd_jobdef *d = NULL;
    struct jd_error err;
    jd_error_clear(&err);
    int rc = jd_jobdef_parse(b->json, strlen(b->json), &limits, reg, &d, &err);
    if (rc != b->code || strcmp(err.pointer, b->pointer) != 0 || !strstr(err.message, b->message))
        fail_msg("bad[%zu] %s\n  got rc %d pointer \"%s\" message \"%s\"\n  want rc %d pointer "
                 "\"%s\" message containing \"%s\"",
                 i, b->json, rc, err.pointer, err.message, b->code, b->pointer, b->message);
    assert_null(d);
    assert_int_equal(err.code, b->code);
}

static void test_bad_definitions_name_the_place(void **state)
{
    (void)state;
    size_t n = sizeof bads / sizeof bads[0];
    assert_true(n >= 40);
    for (size_t i = 0; i < n; i++)
        check_bad(&bads[i], i);
}

static void test_size_and_string_limits(void **state)
{
    (void)state;
    struct jd_error err;
    struct jd_jobdef *d = NULL;
    /* Definition over max_definition_bytes. */
    size_t n = 5000;
    char *big = malloc(n + 1);
    int k = snprintf(big, n, "{\"handler\":\"t.echo\",\"input\":\"");
    memset(big + k, 'x', n - (size_t)k - 2);
    memcpy(big + n - 2, "\"}", 3);
    assert_int_equal(jd_jobdef_parse(big, n, &limits, reg, &d, &err), JD_ETOOBIG);
    assert_string_equal(err.pointer, "");
    assert_non_null(strstr(err.message, "the limit is 4096"));
    /* A string over max_string, pointer at the string. */
    struct jd_job_limits l2 = limits;
    l2.max_definition_bytes = 1 << 20;
    assert_int_equal(jd_jobdef_parse(big, n, &l2, reg, &d, &err), JD_ETOOBIG);
    assert_string_equal(err.pointer, "/input");
    assert_non_null(strstr(err.message, "the limit is 1000"));
    free(big);
    /* Defaults are filled in for zero limits. */
    struct jd_job_limits z = jd_jobdef_limits(NULL);
    assert_int_equal(z.max_definition_bytes, 1 << 20);
    assert_int_equal(z.max_depth, 32);
    assert_int_equal(z.max_steps, 256);
    assert_int_equal(z.max_string, 64 << 10);
    assert_int_equal(z.max_batch, 1000);
}

static struct jd_jobdef *good(const char *json)
{
    struct jd_jobdef *d = NULL;
    struct jd_error err;
    jd_error_clear(&err);
    int rc = jd_jobdef_parse(json, strlen(json), &limits, reg, &d, &err);
    if (rc)
        fail_msg("%s\n  rejected: %d %s: %s", json, rc, err.pointer, err.message);
    return d;
}

static void test_good_task(void **state)
{
    (void)state;
    struct jd_jobdef *d = good("{\"handler\":\"t.echo\",\"args\":{\"v\":\"${input.x}\"},"
                               "\"input\":{\"x\":1},\"queue\":\"mail\",\"priority\":-5,"
                               "\"timeout_ms\":1000,\"labels\":{\"team\":\"a\"},"
                               "\"retry\":{\"max_attempts\":3,\"backoff_ms\":10}}");
    assert_int_equal(d->shape, JD_JOBDEF_TASK);
    assert_string_equal(d->queue, "mail");
    assert_int_equal(d->priority, -5);
    assert_int_equal(d->timeout_ms, 1000);
    assert_int_equal(d->nsteps, 1);
    assert_string_equal(d->steps[0].call, "t.echo");
    struct jd_retry_policy p = jd_jobdef_retry_for_tag(d, 1);
    assert_int_equal(p.max_attempts, 3);
    assert_int_equal(p.backoff_ms, 10);
    assert_true(p.factor == 2.0);
    assert_non_null(d->labels);
    assert_non_null(strstr(d->text, "\"queue\":\"mail\""));
    jd_jobdef_free(d);

    d = good("{\"handler\":\"t.echo\"}");
    assert_string_equal(d->queue, "default");
    assert_int_equal(d->priority, 0);
    assert_int_equal(d->run_at_ms, 0);
    assert_int_equal(jd_jobdef_retry_for_tag(d, 1).max_attempts, 1);
    jd_jobdef_free(d);

    d = good("{\"handler\":\"t.echo\",\"run_at\":\"2030-01-02T03:04:05Z\"}");
    assert_int_equal(d->run_at_ms, 1893553445000LL);
    jd_jobdef_free(d);
    d = good("{\"handler\":\"t.echo\",\"delay_ms\":250}");
    assert_int_equal(d->delay_ms, 250);
    jd_jobdef_free(d);
}

static void test_good_workflow_flattens_steps_into_tags(void **state)
{
    (void)state;
    struct jd_jobdef *d =
        good("{\"steps\":[{\"id\":\"fetch\",\"call\":\"t.echo\",\"args\":{\"status\":200},"
             "\"retry\":{\"max_attempts\":4},\"timeout_ms\":500},"
             "{\"id\":\"both\",\"parallel\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":{\"v\":"
             "\"${steps.fetch.output.status}\"}},{\"id\":\"b\",\"sleep_ms\":50}]},"
             "{\"id\":\"ok\",\"wait\":\"approval\",\"timeout_ms\":600000},"
             "{\"id\":\"report\",\"call\":\"t.echo\",\"args\":{\"who\":\"${input.name}\",\"ok\":"
             "\"${steps.ok.output}\",\"job\":\"${job.id}\"}}],"
             "\"input\":{\"name\":\"x\"},\"retry\":{\"max_attempts\":2}}");
    assert_int_equal(d->shape, JD_JOBDEF_WORKFLOW);
    assert_int_equal(d->nsteps, 6);
    const char *ids[] = {"fetch", "both", "a", "b", "ok", "report"};
    const enum jd_jobdef_step_kind kinds[] = {JD_JSTEP_CALL,  JD_JSTEP_PARALLEL, JD_JSTEP_CALL,
                                              JD_JSTEP_SLEEP, JD_JSTEP_WAIT,     JD_JSTEP_CALL};
    for (size_t i = 0; i < 6; i++) {
        assert_string_equal(d->steps[i].id, ids[i]);
        assert_int_equal(d->steps[i].kind, kinds[i]);
    }
    assert_int_equal(d->steps[1].nchildren, 2);
    assert_int_equal(d->steps[2].parent, 1);
    assert_int_equal(d->steps[4].parent, -1);
    assert_int_equal(d->steps[3].sleep_ms, 50);
    assert_string_equal(d->steps[4].topic, "approval");
    assert_int_equal(d->steps[4].timeout_ms, 600000);
    assert_int_equal(d->steps[0].timeout_ms, 500);
    /* step retry wins over the job's; the job's is the default */
    assert_int_equal(jd_jobdef_retry_for_tag(d, 1).max_attempts, 4);
    assert_int_equal(jd_jobdef_retry_for_tag(d, 6).max_attempts, 2);
    jd_jobdef_free(d);
}

static void test_good_process(void **state)
{
    (void)state;
    struct jd_jobdef *d =
        good("{\"process\":\"t.counter\",\"method\":\"count_to\",\"input\":{\"n\":10}}");
    assert_int_equal(d->shape, JD_JOBDEF_PROCESS);
    assert_string_equal(d->process, "t.counter");
    assert_string_equal(d->method, "count_to");
    assert_non_null(d->input);
    jd_jobdef_free(d);
}

static char *subst_text(const char *tmpl, const char *input, const char *steps,
                        struct jd_error *err)
{
    cJSON *t = cJSON_Parse(tmpl);
    cJSON *in = input ? cJSON_Parse(input) : NULL;
    cJSON *st = steps ? cJSON_Parse(steps) : NULL;
    struct jd_subst_ctx ctx = {.input = in, .steps = st, .job_id = "42"};
    cJSON *r = jd_subst(t, &ctx, err);
    char *s = r ? cJSON_PrintUnformatted(r) : NULL;
    cJSON_Delete(r);
    cJSON_Delete(t);
    cJSON_Delete(in);
    cJSON_Delete(st);
    return s;
}

static void test_substitution(void **state)
{
    (void)state;
    struct jd_error err;
    char *s;
    /* A whole-string reference keeps the value's type. */
    s = subst_text("{\"n\":\"${input.n}\",\"o\":\"${input.o}\",\"all\":\"${input}\"}",
                   "{\"n\":5,\"o\":{\"k\":[1,2]}}", NULL, &err);
    assert_string_equal(s, "{\"n\":5,\"o\":{\"k\":[1,2]},\"all\":{\"n\":5,\"o\":{\"k\":[1,2]}}}");
    free(s);
    /* Inside text: strings spliced raw, others as JSON; arrays by index. */
    s = subst_text("{\"m\":\"job ${job.id}: ${input.name} has ${input.o.k} (${input.o.k.1})\"}",
                   "{\"name\":\"ann\",\"o\":{\"k\":[1,2]}}", NULL, &err);
    assert_string_equal(s, "{\"m\":\"job 42: ann has [1,2] (2)\"}");
    free(s);
    /* Step outputs. */
    s = subst_text("[\"${steps.fetch.output.status}\",\"${steps.fetch.output}\"]", NULL,
                   "{\"fetch\":{\"status\":200}}", &err);
    assert_string_equal(s, "[200,{\"status\":200}]");
    free(s);
    /* $${ is a literal ${ */
    s = subst_text("[\"cost: $${input.x}\"]", "{\"x\":1}", NULL, &err);
    assert_string_equal(s, "[\"cost: ${input.x}\"]");
    free(s);
    /* A reference that does not resolve is an error naming it. */
    jd_error_clear(&err);
    assert_null(subst_text("[\"${input.missing}\"]", "{\"x\":1}", NULL, &err));
    assert_int_equal(err.code, JD_EINVAL);
    assert_non_null(strstr(err.message, "${input.missing}"));
    jd_error_clear(&err);
    assert_null(subst_text("[\"a ${steps.z.output.q} b\"]", NULL, "{\"z\":{}}", &err));
    assert_non_null(strstr(err.message, "steps.z.output.q"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_definitions_name_the_place),
        cmocka_unit_test(test_size_and_string_limits),
        cmocka_unit_test(test_good_task),
        cmocka_unit_test(test_good_workflow_flattens_steps_into_tags),
        cmocka_unit_test(test_good_process),
        cmocka_unit_test(test_substitution),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
