/*
 * Tests of server/render.c's direct job rendering: jd_render_job_json must
 * produce exactly the text of cJSON_PrintUnformatted(jd_render_job(row)) --
 * clients see one or the other depending on the path (POST answers and
 * long-poll answers use the direct one, lists the tree) -- for every field,
 * labels nested or absent, odd strings, numbers beyond int, and definitions
 * that are not compact JSON (which take the tree path).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "server/jobs_impl.h"

#include "common/clock.h"

#include <stdlib.h>
#include <string.h>

static void check_same(struct jd_job *row)
{
    cJSON *o = jd_render_job(row);
    char *want = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    char *got = jd_render_job_json(row);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
    free(want);
}

static char *compact(const char *text)
{
    cJSON *v = cJSON_Parse(text);
    assert_non_null(v);
    char *t = cJSON_PrintUnformatted(v);
    cJSON_Delete(v);
    return t;
}

static void test_fresh_job_matches_the_tree_rendering(void **state)
{
    (void)state;
    char *def = compact("{\"handler\":\"echo\",\"args\":{\"v\":1}}");
    struct jd_job row = {.id = 42,
                         .queue = "default",
                         .state = JD_JOB_QUEUED,
                         .definition = def,
                         .run_at_ms = 1700000000123,
                         .version = 1,
                         .created_ms = 1700000000123,
                         .updated_ms = 1700000000123};
    check_same(&row);
    char *got = jd_render_job_json(&row);
    cJSON *o = cJSON_Parse(got);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "id")->valuestring, "42");
    assert_true(cJSON_IsObject(cJSON_GetObjectItem(o, "labels")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "started_at")));
    cJSON_Delete(o);
    free(got);
    free(def);
}

/* A schedule's job says which schedule and which fire time made it. */
static void test_schedule_jobs_name_their_fire_time(void **state)
{
    (void)state;
    char *def = compact("{\"handler\":\"echo\",\"labels\":{\"schedule\":\"n\"}}");
    struct jd_job row = {.id = 7,
                         .queue = "default",
                         .state = JD_JOB_QUEUED,
                         .definition = def,
                         .version = 1,
                         .created_ms = 1700000000123,
                         .updated_ms = 1700000000123,
                         .idempotency_key = "schedule:n:1700000000000",
                         .schedule_id = "n"};
    check_same(&row);
    char *got = jd_render_job_json(&row);
    assert_non_null(strstr(got, ",\"schedule\":{\"id\":\"n\",\"fire_time\":"
                                "\"2023-11-14T22:13:20.000Z\"}}"));
    free(got);
    row.idempotency_key = "schedule:n:trigger:1700000000000:7";
    check_same(&row);
    got = jd_render_job_json(&row);
    assert_non_null(strstr(got, "\"fire_time\":null"));
    free(got);
    row.idempotency_key = "schedule:nn:1700000000000"; /* another schedule's key shape */
    check_same(&row);
    row.schedule_id = NULL;
    check_same(&row);
    got = jd_render_job_json(&row);
    assert_null(strstr(got, "\"schedule\":{"));
    free(got);
    free(def);
}

static void test_every_field_and_odd_values_match(void **state)
{
    (void)state;
    char *def = compact("{\"steps\":[{\"id\":\"a\",\"call\":\"echo\",\"args\":{\"labels\":1}}],"
                        "\"labels\":{\"team\":\"x\\\"y\\n\\u0001é\",\"n\":[1,2.5,-3e+40,true,"
                        "null,{}]},\"labels\":{\"dup\":1},\"priority\":5000000000}");
    struct jd_job row = {.id = INT64_MAX,
                         .queue = "q\"\\\t\x02z",
                         .priority = 5000000000,
                         .state = JD_JOB_SUCCEEDED,
                         .definition = def,
                         .run_at_ms = 1,
                         .attempts = 3,
                         .version = -7,
                         .output = "{ \"a\" : [1, 2.50, \"\\u0041\"] }",
                         .error = "not json",
                         .created_ms = 5,
                         .updated_ms = 6,
                         .started_ms = 7,
                         .finished_ms = 8};
    check_same(&row);
    row.priority = -2147483648LL;
    row.version = 2147483647;
    row.output = NULL;
    row.error = "{\"kind\":\"failed\",\"message\":\"m\"}";
    check_same(&row);
    row.priority = -2147483649LL;
    check_same(&row);
    free(def);
}

static void test_definitions_without_labels_or_not_compact_match(void **state)
{
    (void)state;
    struct jd_job row = {.id = 1, .queue = NULL, .state = JD_JOB_RUNNING, .version = 2};
    const char *defs[] = {
        "{}",
        "{\"handler\":\"echo\"}",
        "{\"labels\":{}}",
        "{\"labels\":\"text\"}",
        "{\"labels\":[1,{\"a\":[]}]}",
        "{\"a\":{\"labels\":{\"inner\":1}}}",
        "{ \"labels\" : {\"a\": 1} }",
        "{\"labels\":{\"a\":1.0}}",
        "{\"labels\":{\"a\":{\"b\":[1,-2,0,true,false,null,\"x\\\"\\u001f\\n\"]}},"
        "\"labels\":{\"dup\":1}}",
        "{\"x\":\"\\u0041\",\"labels\":{\"a\":1}}",
        "{\"labels\":{\"a\":-0,\"b\":0123}}",
        "{\"labels\":{\"a\":123456789,\"b\":-123456789}}",
        "{\"labels\":{\"a\":1234567890}}",
        "{\"args\":{\"t\":12345678901234},\"labels\":{\"a\":-999999999999999}}",
        "{\"labels\":{\"a\":100000000000000,\"b\":123456789012345}}",
        "{\"labels\":{\"a\":1234567890123456}}",
        "{\"labels\":{\"a\":-9007199254740993}}",
        "[1,2]",
        "not json",
        "{\"labels\":{\"a\":1}",
        "{\"labels\":{\"a\":1}}trailing",
        "",
    };
    for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++) {
        row.definition = (char *)defs[i];
        check_same(&row);
    }
    row.definition = NULL;
    check_same(&row);
}

/* jd_sb_json (event data: results, args) embeds text as cJSON reprints it,
 * whether or not the text is already in cJSON's compact form. */
static void test_embedded_json_matches_cjson_reprint(void **state)
{
    (void)state;
    const char *texts[] = {
        "null",
        "true",
        "false",
        "0",
        "-1",
        "123456789",
        "1234567890",
        "999999999999999",
        "-100000000000000",
        "1000000000000000",
        "9007199254740993",
        "1.5",
        "-0",
        "1e3",
        "\"s\"",
        "\"a\\\"b\\\\c\\n\\u0001\\u0041\\/\"",
        "{}",
        "[]",
        "{\"a\":[1,{\"b\":null}],\"a\":2}",
        " {\"a\":1}",
        "{\"a\":1} ",
        "[1,]",
        "{\"a\"}",
        "nul",
        "",
        "{\"v\":\"\\u001F\"}",
        "{\"v\":\"\\u001f\"}",
        "{\"v\":\"\\u0008\"}",
        "\"\xc3\xa9\x7f\"",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        cJSON *v = cJSON_Parse(texts[i]);
        char *want = v ? cJSON_PrintUnformatted(v) : NULL;
        cJSON_Delete(v);
        struct jd_sbuf b = {0};
        jd_sb_json(&b, texts[i], "OTHER");
        assert_string_equal(b.p, want ? want : "OTHER");
        free(b.p);
        free(want);
    }
    struct jd_sbuf b = {0};
    jd_sb_json(&b, NULL, "{}");
    jd_sb_number(&b, 3000000000LL);
    jd_sb_number(&b, -5);
    jd_sb_number(&b, 0);
    jd_sb_number(&b, 10);
    jd_sb_string(&b, "x\"");
    assert_string_equal(b.p, "{}3000000000-5010\"x\\\"\"");
    free(b.p);
}

static void test_time_format_matches_jd_time_format(void **state)
{
    (void)state;
    int64_t fixed[] = {0,
                       1,
                       999,
                       1000,
                       86399999,
                       86400000,
                       951782400000,
                       951868800000,
                       4107542399999,
                       1700000000123,
                       -1,
                       -86400001,
                       253402300799999,
                       253402300800000};
    char want[40], got[32];
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        jd_time_format(fixed[i], want, sizeof want);
        jd_render_time(fixed[i], got);
        assert_string_equal(got, want);
    }
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int64_t ms = (int64_t)(x % 253402300800000ull);
        jd_time_format(ms, want, sizeof want);
        jd_render_time(ms, got);
        assert_string_equal(got, want);
    }
}

/* jd_json_print is cJSON_PrintUnformatted byte for byte: numbers on both
 * sides of its integer shortcut (-0, 1e15, fractions, huge, tiny), escapes
 * and control characters, UTF-8, nesting, empty containers, raw items. */
static void check_print(const cJSON *v)
{
    char *want = cJSON_PrintUnformatted(v);
    char *got = jd_json_print(v);
    if (!want) {
        assert_null(got);
        return;
    }
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
    free(want);
}

static void test_json_print_matches_cjson(void **state)
{
    (void)state;
    static const char *const docs[] = {
        "0",
        "-0",
        "1",
        "-1",
        "12345",
        "2147483647",
        "2147483648",
        "-2147483649",
        "999999999999999",
        "-999999999999999",
        "1000000000000000",
        "1e15",
        "-1e15",
        "1e16",
        "123456789012345678",
        "9007199254740993",
        "0.1",
        "1.5",
        "-2.25",
        "3.141592653589793",
        "1e-7",
        "5e-324",
        "1.7976931348623157e308",
        "1e300",
        "-0.0",
        "100.0",
        "1234567890123.5",
        "\"\"",
        "\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"",
        "\"\\u0001\\u001f\\u007f\"",
        "\"h\\u00e9llo \\u20ac \\ud83d\\ude00\"",
        "true",
        "false",
        "null",
        "{}",
        "[]",
        "[[],{},[{}],{\"a\":[]}]",
        "{\"\":1,\"k\\n\":{\"x\":[1,2.5,-0,\"s\",null,true]}}",
        "{\"handler\":\"echo\",\"args\":{\"n\":12345,\"t\":1764100000123456789},"
        "\"labels\":{\"team\":\"x\"},\"retry\":{\"max_attempts\":5,\"backoff_ms\":200}}",
    };
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        cJSON *v = cJSON_Parse(docs[i]);
        assert_non_null(v);
        check_print(v);
        cJSON_Delete(v);
    }
    /* numbers built in C, beyond what a parse gives */
    const double nums[] = {-0.0,
                           1e15 - 1,
                           1e15,
                           -1e15 + 1,
                           0.5,
                           4503599627370496.0,
                           1e-300,
                           (double)INT64_MAX,
                           (double)INT64_MIN};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        cJSON *v = cJSON_CreateNumber(nums[i]);
        check_print(v);
        cJSON_Delete(v);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "raw", cJSON_CreateRaw("{\"pre\":1}"));
    cJSON_AddItemToObject(o, "s", cJSON_CreateString("x"));
    check_print(o);
    cJSON_Delete(o);
    cJSON *r = cJSON_CreateRaw(NULL);
    check_print(r); /* NULL on both sides */
    cJSON_Delete(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fresh_job_matches_the_tree_rendering),
        cmocka_unit_test(test_json_print_matches_cjson),
        cmocka_unit_test(test_schedule_jobs_name_their_fire_time),
        cmocka_unit_test(test_every_field_and_odd_values_match),
        cmocka_unit_test(test_definitions_without_labels_or_not_compact_match),
        cmocka_unit_test(test_embedded_json_matches_cjson_reprint),
        cmocka_unit_test(test_time_format_matches_jd_time_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
