/*
 * fail: a command that fails on purpose, for testing retry policies and
 * error paths.
 *
 *   {"message": "boom", "retryable": true, "kind": "flaky"}  always fails
 *   {"fail_attempts": 2, ...}  fails attempts 1 and 2, then succeeds with
 *                              {"attempt": 3}
 *
 * Defaults: message "failed on purpose", retryable false, kind "fail".
 * Threading: handle() finishes on the calling thread; no state.
 */
#include "plugins/builtin.h"

static const struct jd_host *host;

static int fail_validate(const char *args_json, char *err, size_t errlen, char *ptr, size_t ptrlen)
{
    struct jd_pjson *a = jd_builtin_parse_args(args_json, err, errlen);
    struct jd_pjson *v;
    int64_t n;
    int rc = 1;
    if (!a)
        return 1;
    if ((v = jd_pjson_get(a, "message")) && !jd_pjson_is(v, JD_PJSON_STRING)) {
        snprintf(err, errlen, "message must be a string");
        snprintf(ptr, ptrlen, "/message");
        goto out;
    }
    if ((v = jd_pjson_get(a, "kind")) && !jd_pjson_is(v, JD_PJSON_STRING)) {
        snprintf(err, errlen, "kind must be a string");
        snprintf(ptr, ptrlen, "/kind");
        goto out;
    }
    if ((v = jd_pjson_get(a, "retryable")) && jd_pjson_bool(v, -1) < 0) {
        snprintf(err, errlen, "retryable must be true or false");
        snprintf(ptr, ptrlen, "/retryable");
        goto out;
    }
    if ((v = jd_pjson_get(a, "fail_attempts")) && (!jd_pjson_int(v, &n) || n < 0)) {
        snprintf(err, errlen, "fail_attempts must be a non-negative integer");
        snprintf(ptr, ptrlen, "/fail_attempts");
        goto out;
    }
    rc = 0;
out:
    jd_pjson_free(a);
    return rc;
}

static void fail_handle(const struct jd_call_info *info)
{
    struct jd_pjson *a = jd_pjson_parse(info->args_json, NULL, 0);
    const char *msg = jd_pjson_str(jd_pjson_get(a, "message"));
    const char *kind = jd_pjson_str(jd_pjson_get(a, "kind"));
    int retryable = jd_pjson_bool(jd_pjson_get(a, "retryable"), 0);
    int64_t fail_attempts = -1;
    if (jd_pjson_int(jd_pjson_get(a, "fail_attempts"), &fail_attempts) &&
        (int64_t)info->attempt > fail_attempts) {
        char result[64];
        snprintf(result, sizeof result, "{\"attempt\":%u}", info->attempt);
        host->complete(info->call, result);
    } else {
        host->fail(info->call, kind ? kind : "fail", msg ? msg : "failed on purpose", retryable,
                   NULL);
    }
    jd_pjson_free(a);
}

static const struct jd_command commands[] = {
    {.name = "fail", .validate = fail_validate, .handle = fail_handle},
};

JD_BUILTIN_PLUGIN("fail", commands, 1, NULL, 0)
