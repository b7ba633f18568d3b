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
    /* unique */
    {"{\"handler\":\"t.echo\",\"unique\":[]}", JD_EINVAL, "/unique", "must be an object"},
    {"{\"handler\":\"t.echo\",\"unique\":{}}", JD_EINVAL, "/unique/key", "missing key"},
    {"{\"handler\":\"t.echo\",\"unique\":{\"key\":\"\"}}", JD_EINVAL, "/unique/key",
     "1 to 256 bytes"},
    {"{\"handler\":\"t.echo\",\"unique\":{\"key\":\"k\",\"while\":\"done\"}}", JD_EINVAL,
     "/unique/while", "\"active\" or \"queued\""},
    {"{\"handler\":\"t.echo\",\"unique\":{\"key\":\"k\",\"for_ms\":0}}", JD_EINVAL,
     "/unique/for_ms", "between 1 and"},
    {"{\"handler\":\"t.echo\",\"unique\":{\"key\":\"k\",\"on_conflict\":1}}", JD_EINVAL,
     "/unique/on_conflict", "must be"},
    {"{\"handler\":\"t.echo\",\"unique\":{\"key\":\"k\",\"key\":\"j\"}}", JD_EINVAL, "/unique/key",
     "duplicate member"},
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
    assert_false(d->has_unique);
    jd_jobdef_free(d);

    d = good("{\"handler\":\"t.echo\",\"unique\":{\"key\":\"user-42\"}}");
    assert_true(d->has_unique);
    assert_string_equal(d->unique_key, "user-42");
    assert_false(d->unique_while_queued);
    assert_int_equal(d->unique_for_ms, 0);
    assert_int_equal(d->unique_on, JD_UNIQUE_RETURN_EXISTING);
    jd_jobdef_free(d);
    d = good("{\"handler\":\"t.echo\",\"unique\":{\"key\":\"k\",\"while\":\"queued\","
             "\"for_ms\":5000,\"on_conflict\":\"replace\"}}");
    assert_true(d->unique_while_queued);
    assert_int_equal(d->unique_for_ms, 5000);
    assert_int_equal(d->unique_on, JD_UNIQUE_REPLACE);
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

/* A growable string for building large bodies. */
struct text {
    char *p;
    size_t n, cap;
};

static void add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (t->p && (size_t)k < t->cap - t->n) {
            t->n += (size_t)k;
            return;
        }
        t->cap = (t->cap + (size_t)k + 1) * 2;
        t->p = realloc(t->p, t->cap);
    }
}

static void add_repeat(struct text *t, const char *s, int times)
{
    for (int i = 0; i < times; i++)
        add(t, "%s", s);
}

/* jd_jobdef_parse with the default limits: rc, and err filled. */
static int parse_default(const struct text *t, struct jd_error *err)
{
    struct jd_jobdef *d = NULL;
    jd_error_clear(err);
    int rc = jd_jobdef_parse(t->p, t->n, NULL, reg, &d, err);
    jd_jobdef_free(d);
    return rc;
}

/* Objects with 60,000 to 90,000 members (bodies near 1 MiB) get the same answers as
 * small ones: the first unknown member, the first repeat, the 65th label.
 * (bench/parse.c times these; here only the answers are asserted.) */
static void test_many_members_get_the_first_problem(void **state)
{
    (void)state;
    struct jd_error err;
    struct text t = {0};
    add(&t, "{\"handler\":\"t.echo\"");
    for (int i = 0; i < 90000; i++)
        add(&t, ",\"k%d\":0", i);
    add(&t, "}");
    assert_int_equal(parse_default(&t, &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/k0");
    assert_non_null(strstr(err.message, "unknown member \"k0\" in a job definition"));

    /* Known names repeated: the second occurrence is the one named. */
    t.n = 0;
    add(&t, "{\"handler\":\"t.echo\"");
    for (int i = 0; i < 80000; i++)
        add(&t, ",\"queue\":\"q\"");
    add(&t, "}");
    assert_int_equal(parse_default(&t, &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/queue");
    assert_non_null(strstr(err.message, "duplicate member \"queue\""));

    /* A repeat and an unknown member: whichever comes first. */
    t.n = 0;
    add(&t, "{\"handler\":\"t.echo\",\"zz\":1,\"handler\":\"t.echo\"}");
    assert_int_equal(parse_default(&t, &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/zz");

    /* Step and retry objects are checked the same way. */
    t.n = 0;
    add(&t, "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"retry\":{\"max_attempts\":2");
    for (int i = 0; i < 60000; i++)
        add(&t, ",\"max_attempts\":2");
    add(&t, "}}]}");
    assert_int_equal(parse_default(&t, &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/steps/0/retry/max_attempts");
    assert_non_null(strstr(err.message, "duplicate member"));

    /* 80,000 labels: the 65th is over the count. */
    t.n = 0;
    add(&t, "{\"handler\":\"t.echo\",\"labels\":{");
    for (int i = 0; i < 80000; i++)
        add(&t, "%s\"l%d\":\"\"", i ? "," : "", i);
    add(&t, "}}");
    assert_int_equal(parse_default(&t, &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/labels/l64");
    assert_non_null(strstr(err.message, "more than 64 labels"));

    /* Duplicate labels: the first member that repeats an earlier one. */
    t.n = 0;
    add(&t, "{\"handler\":\"t.echo\",\"labels\":{\"b\":\"\",\"c\":\"\",\"a\":\"\","
            "\"c\":\"\",\"b\":\"\",\"a\":\"\"}}");
    assert_int_equal(parse_default(&t, &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/labels/c");
    assert_non_null(strstr(err.message, "duplicate member \"c\""));
    free(t.p);
}

/* The issue's submit-time attack: a handler job whose args splice a large
 * ${input.s} many times is refused with 422 and a pointer, without building
 * the result. */
static void test_submit_refuses_what_substitution_would_blow_up(void **state)
{
    (void)state;
    struct jd_error err;
    struct text t = {0};
    char s[1001];
    memset(s, 'x', 1000);
    s[1000] = '\0';
    /* One string: 100 x 1,000 bytes passes the 64 KiB string limit. */
    add(&t, "{\"handler\":\"t.echo\",\"input\":{\"s\":\"%s\"},\"args\":{\"x\":\"", s);
    add_repeat(&t, "${input.s}", 100);
    add(&t, "\"}}");
    assert_int_equal(parse_default(&t, &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/args/x");
    assert_non_null(strstr(err.message, "65536-byte string limit"));

    /* Many strings each under the string limit, together past 1 MiB. */
    t.n = 0;
    add(&t, "{\"handler\":\"t.echo\",\"input\":{\"s\":\"%s\"},\"args\":{", s);
    for (int i = 0; i < 100; i++) {
        add(&t, "%s\"s%d\":\"", i ? "," : "", i);
        add_repeat(&t, "${input.s}", 60);
        add(&t, "\"");
    }
    add(&t, "}}");
    assert_int_equal(parse_default(&t, &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/args/s17"); /* 18 x 60,000 bytes pass 1 MiB */
    assert_non_null(strstr(err.message, "1048576-byte limit"));

    /* Whole-value references to a big value, many times over. */
    t.n = 0;
    add(&t, "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":{");
    for (int i = 0; i < 30; i++)
        add(&t, "%s\"x%d\":\"${input}\"", i ? "," : "", i);
    add(&t, "}}],\"input\":{\"l\":[\"%s\"", s);
    for (int i = 0; i < 40; i++)
        add(&t, ",\"%s\"", s);
    add(&t, "]}}");
    assert_int_equal(parse_default(&t, &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/steps/0/args/x25"); /* 26 x 41 KB pass 1 MiB */

    /* Under the limits the same shapes are accepted. */
    t.n = 0;
    add(&t, "{\"handler\":\"t.echo\",\"input\":{\"s\":\"%s\"},\"args\":{\"x\":\"", s);
    add_repeat(&t, "${input.s}", 65);
    add(&t, "\"}}");
    assert_int_equal(parse_default(&t, &err), 0);
    free(t.p);
}

/* Each job of a batch is held to the definition limit (422 at /jobs/N),
 * and a batch's jobs together to what a batch may take after substitution. */
static void test_batch_jobs_are_held_to_the_limits(void **state)
{
    (void)state;
    struct jd_error err;
    struct jd_jobdef **defs = NULL;
    size_t n = 0;
    struct text t = {0};
    char big[5001];
    memset(big, 'y', 5000);
    big[5000] = '\0';
    struct jd_job_limits l = limits; /* 4096-byte definitions, 64 KiB batches */
    l.max_string = 10000;
    add(&t, "{\"jobs\":[{\"handler\":\"t.echo\"},{\"handler\":\"t.echo\",\"input\":\"%s\"}]}", big);
    jd_error_clear(&err);
    assert_int_equal(jd_jobdef_parse_batch(t.p, t.n, &l, reg, &defs, &n, &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/jobs/1");
    assert_non_null(strstr(err.message, "the limit is 4096"));
    assert_null(defs);
    assert_int_equal(n, 0);

    /* 20 jobs of 130 bytes, each asking for 3,600 bytes: 72 KB in all. */
    t.n = 0;
    add(&t, "{\"jobs\":[");
    for (int j = 0; j < 20; j++) {
        add(&t, "%s{\"handler\":\"t.echo\",\"input\":{\"s\":\"%.100s\"},\"args\":{\"v\":\"",
            j ? "," : "", big);
        add_repeat(&t, "${input.s}", 36);
        add(&t, "\"}}");
    }
    add(&t, "]}");
    jd_error_clear(&err);
    assert_int_equal(jd_jobdef_parse_batch(t.p, t.n, &l, reg, &defs, &n, &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/jobs/18/args/v");
    assert_non_null(strstr(err.message, "65536 bytes in all, the limit for a batch"));

    /* The same jobs, fewer of them, are accepted. */
    t.n = 0;
    add(&t, "{\"jobs\":[");
    for (int j = 0; j < 3; j++) {
        add(&t, "%s{\"handler\":\"t.echo\",\"input\":{\"s\":\"%.100s\"},\"args\":{\"v\":\"",
            j ? "," : "", big);
        add_repeat(&t, "${input.s}", 36);
        add(&t, "\"}}");
    }
    add(&t, "]}");
    jd_error_clear(&err);
    assert_int_equal(jd_jobdef_parse_batch(t.p, t.n, &l, reg, &defs, &n, &err), 0);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++)
        jd_jobdef_free(defs[i]);
    free(defs);
    free(t.p);
}

/* jd_subst with explicit bounds: the result's size is counted exactly (as
 * compact JSON), strings and totals fail with the place and the limit. */
static void test_substitution_bounds(void **state)
{
    (void)state;
    struct jd_error err;
    cJSON *in = cJSON_Parse("{\"s\":\"0123456789\",\"o\":{\"k\":[1,2]},\"q\":\"a\\\"b\"}");
    cJSON *t = cJSON_Parse("{\"a\":\"${input.s}\"}"); /* {"a":"0123456789"}: 18 bytes */
    struct jd_subst_ctx ctx = {.input = in, .max_bytes = 18};
    size_t bytes = 0;
    ctx.bytes = &bytes;
    cJSON *r = jd_subst(t, &ctx, &err);
    assert_non_null(r);
    assert_int_equal(bytes, 18);
    cJSON_Delete(r);
    ctx.max_bytes = 17;
    jd_error_clear(&err);
    assert_null(jd_subst(t, &ctx, &err));
    assert_int_equal(err.code, JD_ETOOBIG);
    assert_string_equal(err.pointer, "/a");
    assert_non_null(strstr(err.message, "17-byte limit"));
    cJSON_Delete(t);

    /* Escapes count as printed; spliced values as their JSON. */
    t = cJSON_Parse("[\"${input.q}\",\"v=${input.o}\",\"${input.o}\",5,true,null]");
    ctx = (struct jd_subst_ctx){.input = in, .bytes = &bytes};
    r = jd_subst(t, &ctx, &err);
    char *p = cJSON_PrintUnformatted(r);
    assert_string_equal(p, "[\"a\\\"b\",\"v={\\\"k\\\":[1,2]}\",{\"k\":[1,2]},5,true,null]");
    assert_int_equal(bytes, strlen(p));
    free(p);
    cJSON_Delete(r);
    cJSON_Delete(t);

    /* The string limit, on raw bytes as the definition's own strings. */
    t = cJSON_Parse("{\"o\":{\"x\":[\"${input.s}${input.s}\"]}}");
    ctx = (struct jd_subst_ctx){.input = in, .max_string = 20};
    r = jd_subst(t, &ctx, &err);
    assert_non_null(r);
    cJSON_Delete(r);
    ctx.max_string = 19;
    jd_error_clear(&err);
    assert_null(jd_subst(t, &ctx, &err));
    assert_int_equal(err.code, JD_ETOOBIG);
    assert_string_equal(err.pointer, "/o/x/0");
    assert_non_null(strstr(err.message, "19-byte string limit"));
    cJSON_Delete(t);
    cJSON_Delete(in);
}

/* Array indexes are bounded unsigned values: one past any array is "not
 * found", never wrapped to a small index. Big containers (indexed, not
 * scanned) resolve as small ones, the first of duplicate keys winning. */
static void test_reference_paths(void **state)
{
    (void)state;
    struct jd_error err;
    static const char *const far[] = {
        "4294967296", "4294967297", "18446744073709551617", "99999999999999999999", "-1",
        "+1",         "1x"};
    for (size_t i = 0; i < sizeof far / sizeof far[0]; i++) {
        char tmpl[96];
        snprintf(tmpl, sizeof tmpl, "[\"${input.a.%s}\"]", far[i]);
        jd_error_clear(&err);
        char *s = subst_text(tmpl, "{\"a\":[10,20]}", NULL, &err);
        if (s)
            fail_msg("%s resolved to %s", tmpl, s);
        assert_int_equal(err.code, JD_EINVAL);
        assert_non_null(strstr(err.message, "does not resolve"));
    }
    char *s = subst_text("[\"${input.a.01}\"]", "{\"a\":[10,20]}", NULL, &err);
    assert_string_equal(s, "[20]");
    free(s);

    struct text in = {0};
    add(&in, "{\"a\":[");
    for (int i = 0; i < 1000; i++)
        add(&in, "%s%d", i ? "," : "", i);
    add(&in, "],\"o\":{");
    for (int i = 0; i < 1000; i++)
        add(&in, "%s\"k%d\":%d", i ? "," : "", i, i);
    add(&in, ",\"k7\":-1}}");
    s = subst_text("[\"${input.a.999}\",\"${input.a.17}\",\"${input.a.3}\",\"${input.o.k999}\","
                   "\"${input.o.k7}\",\"${input.o.k0} ${input.a.998}\"]",
                   in.p, NULL, &err);
    assert_string_equal(s, "[999,17,3,999,7,\"0 998\"]");
    free(s);
    jd_error_clear(&err);
    assert_null(subst_text("[\"${input.a.1000}\"]", in.p, NULL, &err));
    assert_null(subst_text("[\"${input.o.k1000}\"]", in.p, NULL, &err));
    free(in.p);

    /* At submit, a far index is refused with a pointer to the string. */
    static const char def[] = "{\"handler\":\"t.echo\",\"input\":{\"a\":[10,20]},"
                              "\"args\":{\"v\":\"${input.a.4294967297}\"}}";
    struct jd_jobdef *d = NULL;
    jd_error_clear(&err);
    assert_int_equal(jd_jobdef_parse(def, strlen(def), &limits, reg, &d, &err), JD_EINVAL);
    assert_string_equal(err.pointer, "/args/v");
    assert_non_null(strstr(err.message, "does not resolve"));
}

/* jd_jobdef_slim: args without "${" become their text; args with
 * references, and the input they read, stay trees; strings survive the tree;
 * a process job's input becomes text. */
static void test_slim_keeps_what_a_live_job_needs(void **state)
{
    (void)state;
    struct jd_jobdef *d = NULL;
    struct jd_error err;
    const char *wf = "{\"steps\":[{\"id\":\"a\",\"call\":\"t.echo\",\"args\":{\"x\":[1,\"y\"]}},"
                     "{\"id\":\"b\",\"call\":\"t.echo\",\"args\":{\"v\":\"${input.v}\"}},"
                     "{\"id\":\"c\",\"call\":\"t.echo\",\"args\":{\"lit\":\"$${not}\"}},"
                     "{\"id\":\"d\",\"call\":\"t.echo\"},"
                     "{\"id\":\"w\",\"wait\":\"go\"}],"
                     "\"input\":{\"v\":1},\"queue\":\"q1\",\"labels\":{\"k\":\"v\"}}";
    assert_int_equal(jd_jobdef_parse(wf, strlen(wf), &limits, reg, &d, &err), 0);
    jd_jobdef_slim(d);
    jd_jobdef_slim(d); /* idempotent */
    assert_null(d->root);
    assert_null(d->labels);
    assert_true(d->slim);
    assert_string_equal(d->queue, "q1");
    assert_int_equal(d->nsteps, 5);
    assert_string_equal(d->steps[0].id, "a");
    assert_string_equal(d->steps[0].call, "t.echo");
    assert_string_equal(d->steps[0].args_text, "{\"x\":[1,\"y\"]}");
    assert_null(d->steps[0].args);
    assert_null(d->steps[1].args_text); /* a reference: substituted at run time */
    assert_non_null(d->steps[1].args);
    assert_null(d->steps[2].args_text); /* "$${" is unescaped by substitution */
    assert_non_null(d->steps[2].args);
    assert_string_equal(d->steps[3].args_text, "{}");
    assert_string_equal(d->steps[4].topic, "go");
    assert_non_null(d->input); /* step b reads it */
    assert_true(d->mem > strlen(d->text));
    assert_non_null(strstr(d->text, "\"labels\":{\"k\":\"v\"}")); /* what is stored is whole */
    jd_jobdef_free(d);

    const char *task = "{\"handler\":\"t.echo\",\"args\":{\"a\":1},\"input\":{\"big\":[1,2,3]},"
                       "\"unique\":{\"key\":\"k1\"}}";
    assert_int_equal(jd_jobdef_parse(task, strlen(task), &limits, reg, &d, &err), 0);
    jd_jobdef_slim(d);
    assert_string_equal(d->steps[0].args_text, "{\"a\":1}");
    assert_null(d->input); /* no step reads it */
    assert_string_equal(d->unique_key, "k1");
    jd_jobdef_free(d);

    const char *proc = "{\"process\":\"t.counter\",\"method\":\"count_to\",\"input\":{\"n\":3}}";
    if (jd_jobdef_parse(proc, strlen(proc), &limits, NULL, &d, &err) == 0) {
        jd_jobdef_slim(d);
        assert_string_equal(d->process, "t.counter");
        assert_string_equal(d->method, "count_to");
        assert_string_equal(d->input_text, "{\"n\":3}");
        assert_null(d->input);
        jd_jobdef_free(d);
    } else {
        fail_msg("process definition: %s", err.message);
    }
}

/* What the issue measured: a large definition of many members costs about
 * its text once slimmed, not the ~7x of its parsed tree; and its charge
 * comes back when it is freed. */
static void test_slim_is_far_smaller_than_the_tree(void **state)
{
    (void)state;
    size_t n = 20000, cap = n * 24 + 64, len = 0;
    char *t = malloc(cap);
    len += (size_t)snprintf(t + len, cap - len, "{\"handler\":\"t.echo\",\"args\":{\"k\":0");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(t + len, cap - len, ",\"k%zu\":%zu", i, i);
    len += (size_t)snprintf(t + len, cap - len, "}}");
    struct jd_job_limits big = {.max_definition_bytes = 1 << 20};
    struct jd_jobdef *d = NULL;
    struct jd_error err;
    assert_int_equal(jd_jobdef_parse(t, len, &big, reg, &d, &err), 0);
    _Atomic size_t held = 0;
    jd_jobdef_charge(d, &held);
    assert_true(d->slim);
    assert_int_equal(held, d->mem);
    /* text and args text, each about len, plus small change */
    assert_true(d->mem < 3 * len);
    assert_true(d->mem >= 2 * len);
    jd_jobdef_free(d);
    assert_int_equal(held, 0);
    free(t);
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
        cmocka_unit_test(test_many_members_get_the_first_problem),
        cmocka_unit_test(test_submit_refuses_what_substitution_would_blow_up),
        cmocka_unit_test(test_batch_jobs_are_held_to_the_limits),
        cmocka_unit_test(test_substitution_bounds),
        cmocka_unit_test(test_reference_paths),
        cmocka_unit_test(test_slim_keeps_what_a_live_job_needs),
        cmocka_unit_test(test_slim_is_far_smaller_than_the_tree),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
