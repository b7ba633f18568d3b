/*
 * problem+json rendering, bearer-token comparison and the JSON content-type
 * check: what every error response and every authenticated request rely on.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "api/problem.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static void test_problem_fields(void **state)
{
    char *s = jd_problem_json(422, "unknown handler \"htp\"", "/steps/2/call", "/v1/jobs", "r1");
    size_t n = strlen(s);
    assert_true(n > 0 && s[n - 1] == '\n');
    cJSON *o = cJSON_Parse(s);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "title")->valuestring, "Unprocessable Content");
    assert_int_equal(cJSON_GetObjectItem(o, "status")->valueint, 422);
    assert_string_equal(cJSON_GetObjectItem(o, "detail")->valuestring, "unknown handler \"htp\"");
    assert_string_equal(cJSON_GetObjectItem(o, "pointer")->valuestring, "/steps/2/call");
    assert_string_equal(cJSON_GetObjectItem(o, "instance")->valuestring, "/v1/jobs");
    assert_string_equal(cJSON_GetObjectItem(o, "request_id")->valuestring, "r1");
    /* No type URI of ours (nothing would serve it): the status is the type. */
    assert_string_equal(cJSON_GetObjectItem(o, "type")->valuestring, "about:blank");
    cJSON_Delete(o);
    free(s);
}

static void test_problem_omits_empty_and_escapes(void **state)
{
    char *s = jd_problem_json(404, "a\nb\"c\\", "", NULL, NULL);
    cJSON *o = cJSON_Parse(s);
    assert_non_null(o);
    assert_null(cJSON_GetObjectItem(o, "pointer"));
    assert_null(cJSON_GetObjectItem(o, "instance"));
    assert_string_equal(cJSON_GetObjectItem(o, "detail")->valuestring, "a\nb\"c\\");
    cJSON_Delete(o);
    free(s);
    assert_string_equal(jd_http_reason(413), "Content Too Large");
    assert_string_equal(jd_http_reason(999), "Error");
}

static void test_bearer(void **state)
{
    assert_true(jd_auth_bearer_ok("Bearer s3cret", "s3cret"));
    assert_true(jd_auth_bearer_ok("bearer s3cret", "s3cret"));
    assert_false(jd_auth_bearer_ok("Bearer s3cre", "s3cret"));
    assert_false(jd_auth_bearer_ok("Bearer s3crett", "s3cret"));
    assert_false(jd_auth_bearer_ok("Bearer S3cret", "s3cret"));
    assert_false(jd_auth_bearer_ok("Basic s3cret", "s3cret"));
    assert_false(jd_auth_bearer_ok("s3cret", "s3cret"));
    assert_false(jd_auth_bearer_ok("Bearer ", "s3cret"));
    assert_false(jd_auth_bearer_ok(NULL, "s3cret"));
    assert_false(jd_auth_bearer_ok("Bearer ", ""));
    /* a prefix repeated cyclically must not match */
    assert_false(jd_auth_bearer_ok("Bearer abab", "ab"));
}

static void test_content_type(void **state)
{
    assert_true(jd_content_type_is_json("application/json"));
    assert_true(jd_content_type_is_json("application/json; charset=utf-8"));
    assert_true(jd_content_type_is_json("Application/JSON"));
    assert_true(jd_content_type_is_json("application/merge-patch+json"));
    assert_true(jd_content_type_is_json(NULL));
    assert_true(jd_content_type_is_json(""));
    assert_false(jd_content_type_is_json("application/x-www-form-urlencoded"));
    assert_false(jd_content_type_is_json("text/plain"));
    assert_false(jd_content_type_is_json("application/jsonx"));
    assert_false(jd_content_type_is_json("multipart/form-data; boundary=x"));
}

static void test_utf8(void **state)
{
    assert_true(jd_utf8_valid("", 0));
    assert_true(jd_utf8_valid("plain", 5));
    assert_true(jd_utf8_valid("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x90\xa6", 14));
    assert_false(jd_utf8_valid("\xff", 1));
    assert_false(jd_utf8_valid("\xc3", 1));             /* truncated */
    assert_false(jd_utf8_valid("\xc0\xaf", 2));         /* overlong '/' */
    assert_false(jd_utf8_valid("\xe0\x80\xaf", 3));     /* overlong */
    assert_false(jd_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    assert_false(jd_utf8_valid("\xf4\x90\x80\x80", 4)); /* over U+10FFFF */
    assert_false(jd_utf8_valid("a\x80", 2));            /* stray continuation */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_problem_fields),
        cmocka_unit_test(test_problem_omits_empty_and_escapes),
        cmocka_unit_test(test_bearer),
        cmocka_unit_test(test_content_type),
        cmocka_unit_test(test_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
