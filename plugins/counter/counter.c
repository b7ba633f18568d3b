/*
 * counter: the worked example of a plugin process type (plugins/README.md).
 *
 * Process type "counter", two methods:
 *   count_to        {"n": N}  yields the command "echo" N times, one after
 *                   the other, with tags 1..N and args {"i": i}; finishes
 *                   with {"count": N}.
 *   count_messages  {"n": N}  idles until N messages have arrived; finishes
 *                   with {"count": N, "sum": S, "messages": [...]}, where S
 *                   adds up the messages that are numbers (or objects with a
 *                   numeric "value" or "data").
 * A cancel event fails the process with {"kind":"cancelled"}.
 *
 * Invariants: tags are deterministic (1..N in order), so a replay after a
 * restart yields the same tags. Threading: the host never calls one
 * instance from two threads at once; there is no shared state.
 */
#include "plugins/builtin.h"

#define COUNTER_MAX_N 1000000 /* keeps a typo from making a job that never ends */

static const struct jd_host *host;

enum method { COUNT_TO, COUNT_MESSAGES };

struct counter {
    enum method method;
    int64_t n;
    int started;
    int64_t i;                /* count_to: the tag last yielded; count_messages: messages seen */
    double sum;               /* count_messages */
    struct jd_pjson_buf list; /* count_messages: the messages as a JSON array body */
};

static const char *const methods[] = {"count_to", "count_messages", NULL};

static void *counter_create(const char *method, const char *input_json, char *err, size_t errlen)
{
    struct jd_pjson *in = jd_pjson_parse(input_json, err, errlen);
    struct counter *c = NULL;
    int64_t n;
    if (!in)
        return NULL;
    if (!jd_pjson_int(jd_pjson_get(in, "n"), &n) || n < 0 || n > COUNTER_MAX_N) {
        snprintf(err, errlen, "input.n must be an integer from 0 to %d", COUNTER_MAX_N);
        goto out;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    c->method = strcmp(method, "count_to") == 0 ? COUNT_TO : COUNT_MESSAGES;
    c->n = n;
out:
    jd_pjson_free(in);
    return c;
}

static void yield_next(struct counter *c, void *out)
{
    char args[48];
    c->i++;
    snprintf(args, sizeof args, "{\"i\":%lld}", (long long)c->i);
    host->step_yield(out, (uint32_t)c->i, "echo", args, 0);
    host->step_wait(out);
}

static void done_count_to(struct counter *c, void *out)
{
    char result[48];
    snprintf(result, sizeof result, "{\"count\":%lld}", (long long)c->n);
    host->step_done(out, result);
}

static void add_message(struct counter *c, const char *data_json)
{
    struct jd_pjson *v = jd_pjson_parse(data_json, NULL, 0);
    struct jd_pjson *num = v;
    if (jd_pjson_is(v, JD_PJSON_OBJECT)) {
        num = jd_pjson_get(v, "value");
        if (!num)
            num = jd_pjson_get(v, "data");
    }
    if (jd_pjson_is(num, JD_PJSON_NUMBER))
        c->sum += num->number;
    if (c->i > 0)
        jd_pjson_buf_cat(&c->list, ",");
    jd_pjson_buf_value(&c->list, v); /* re-serialised, so the output is valid JSON */
    jd_pjson_free(v);
    c->i++;
}

static int counter_step(void *self, const struct jd_plugin_event *ev, size_t n, void *out)
{
    struct counter *c = self;
    int advance = !c->started; /* count_to: first step, or our yield completed */
    c->started = 1;
    for (size_t k = 0; k < n; k++) {
        if (ev[k].type == JD_PEVENT_CANCEL) {
            host->step_fail(out, "{\"kind\":\"cancelled\",\"message\":\"counter cancelled\"}");
            return 0;
        }
        if (ev[k].type == JD_PEVENT_COMPLETE && ev[k].error_json) {
            /* Pass the handler's error object through unchanged. */
            host->step_fail(out, ev[k].error_json);
            return 0;
        }
        if (ev[k].type == JD_PEVENT_COMPLETE && ev[k].tag == (uint32_t)c->i)
            advance = 1;
        if (ev[k].type == JD_PEVENT_MESSAGE && c->method == COUNT_MESSAGES && c->i < c->n)
            add_message(c, ev[k].data_json);
    }
    if (c->method == COUNT_TO) {
        /* First step, or the completion of tag i: go on. Anything else
         * (a stray message) leaves us waiting. */
        if (!advance)
            host->step_wait(out);
        else if (c->i >= c->n)
            done_count_to(c, out);
        else
            yield_next(c, out);
        return 0;
    }
    if (c->i < c->n) {
        host->step_idle(out);
        return 0;
    }
    struct jd_pjson_buf r = {0};
    jd_pjson_buf_printf(&r, "{\"count\":%lld,\"sum\":", (long long)c->n);
    jd_pjson_buf_number(&r, c->sum);
    jd_pjson_buf_cat(&r, ",\"messages\":[");
    if (c->list.len)
        jd_pjson_buf_cat(&r, c->list.p);
    jd_pjson_buf_cat(&r, "]}");
    host->step_done(out, r.p);
    jd_pjson_buf_free(&r);
    return 0;
}

static void counter_destroy(void *self)
{
    struct counter *c = self;
    jd_pjson_buf_free(&c->list);
    free(c);
}

static const struct jd_process_type types[] = {
    {
        .name = "counter",
        .methods = methods,
        .create = counter_create,
        .step = counter_step,
        .destroy = counter_destroy,
    },
};

JD_BUILTIN_PLUGIN("counter", NULL, 0, types, 1)
