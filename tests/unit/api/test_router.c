/*
 * Router: the routes of api/routes.h resolve, unknown paths are
 * 404, known paths with the wrong method are 405 with the right Allow set,
 * literal segments beat parameters, and parameters are bounded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "api/router.h"
#include "common/error.h"

#include <stdio.h>
#include <string.h>

static void expect_route(const char *method, const char *path, enum jd_route want,
                         const char *param)
{
    struct jd_route_match m;
    int rc = jd_router_match(method, path, &m);
    if (rc != 0 || m.route != want)
        fail_msg("%s %s: rc %d route %d, want route %d", method, path, rc, m.route, want);
    assert_string_equal(m.param, param);
}

static void test_every_route(void **state)
{
    expect_route("POST", "/v1/jobs", JD_ROUTE_JOB_SUBMIT, "");
    expect_route("GET", "/v1/jobs", JD_ROUTE_JOB_LIST, "");
    expect_route("POST", "/v1/jobs/batch", JD_ROUTE_JOB_BATCH, "");
    expect_route("GET", "/v1/jobs/42", JD_ROUTE_JOB_GET, "42");
    expect_route("GET", "/v1/jobs/42/events", JD_ROUTE_JOB_EVENTS, "42");
    expect_route("POST", "/v1/jobs/42/cancel", JD_ROUTE_JOB_CANCEL, "42");
    expect_route("POST", "/v1/jobs/42/messages", JD_ROUTE_JOB_MESSAGE, "42");
    expect_route("POST", "/v1/jobs/42/retry", JD_ROUTE_JOB_RETRY, "42");
    expect_route("GET", "/v1/handlers", JD_ROUTE_HANDLERS, "");
    expect_route("GET", "/v1/queues", JD_ROUTE_QUEUES, "");
    expect_route("POST", "/v1/queues/emails/pause", JD_ROUTE_QUEUE_PAUSE, "emails");
    expect_route("POST", "/v1/queues/emails/resume", JD_ROUTE_QUEUE_RESUME, "emails");
    expect_route("GET", "/v1/openapi.yaml", JD_ROUTE_OPENAPI, "");
    expect_route("GET", "/livez", JD_ROUTE_LIVEZ, "");
    expect_route("GET", "/readyz", JD_ROUTE_READYZ, "");
    expect_route("GET", "/metrics", JD_ROUTE_METRICS, "");
    /* HEAD is GET without a body; a trailing slash is tolerated */
    expect_route("HEAD", "/v1/jobs/7", JD_ROUTE_JOB_GET, "7");
    expect_route("GET", "/v1/jobs/", JD_ROUTE_JOB_LIST, "");
    /* the dashboard: "/" is a route of its own; under /ui/ the rest is the param */
    expect_route("GET", "/", JD_ROUTE_UI_ROOT, "");
    expect_route("GET", "/ui/", JD_ROUTE_UI_FILE, "");
    expect_route("GET", "/ui", JD_ROUTE_UI_FILE, "");
    expect_route("GET", "/ui/app.js", JD_ROUTE_UI_FILE, "app.js");
    expect_route("GET", "/v1/stats", JD_ROUTE_STATS, "");
}

static void test_unknown_paths_404(void **state)
{
    const char *paths[] = {"",
                           "v1/jobs",
                           "/v2/jobs",
                           "/v1",
                           "/v1/jobs//1",
                           "/v1/jobs/1/nope",
                           "/v1/jobs/1/events/x",
                           "/livez/x",
                           "/a/b/c/d/e/f/g",
                           "/METRICS",
                           "/ui/../v1/jobs",
                           "/ui/a/./b",
                           "/uix",
                           "/v1/job",
                           "/v1/jobsx",
                           "/v1/jobs/1/event",
                           "/livez*",
                           NULL};
    for (int i = 0; paths[i] != NULL; i++) {
        struct jd_route_match m;
        if (jd_router_match("GET", paths[i], &m) != JD_ENOENT)
            fail_msg("GET \"%s\" should be 404", paths[i]);
    }
    struct jd_route_match m;
    assert_int_equal(jd_router_match("GET", NULL, &m), JD_ENOENT);
}

static void test_wrong_method_405_with_allow(void **state)
{
    struct jd_route_match m;
    assert_int_equal(jd_router_match("DELETE", "/v1/jobs/1/events", &m), JD_ECONFLICT);
    assert_string_equal(jd_router_allow_text(m.allow), "GET, HEAD");
    assert_int_equal(jd_router_match("GET", "/v1/jobs/1/cancel", &m), JD_ECONFLICT);
    assert_string_equal(jd_router_allow_text(m.allow), "POST");
    assert_int_equal(jd_router_match("PUT", "/v1/jobs", &m), JD_ECONFLICT);
    assert_string_equal(jd_router_allow_text(m.allow), "GET, HEAD, POST");
    assert_int_equal(jd_router_match("POST", "/livez", &m), JD_ECONFLICT);
    assert_string_equal(jd_router_allow_text(m.allow), "GET, HEAD");
    assert_int_equal(jd_router_match(NULL, "/metrics", &m), JD_ECONFLICT);
}

static void test_literal_beats_parameter(void **state)
{
    struct jd_route_match m;
    /* "batch" is not a job id: GET on it is 405 (POST only), never job "batch" */
    assert_int_equal(jd_router_match("GET", "/v1/jobs/batch", &m), JD_ECONFLICT);
    assert_string_equal(jd_router_allow_text(m.allow), "POST");
}

static void test_parameter_length_bounded(void **state)
{
    char path[512];
    char id[300];
    memset(id, '9', sizeof id - 1);
    id[sizeof id - 1] = '\0';
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    struct jd_route_match m;
    assert_int_equal(jd_router_match("GET", path, &m), JD_ENOENT);
}

static void test_route_names_and_v1(void **state)
{
    assert_string_equal(jd_route_name(JD_ROUTE_JOB_GET), "/v1/jobs/{id}");
    assert_string_equal(jd_route_name(JD_ROUTE_NONE), "other");
    assert_true(jd_route_is_v1(JD_ROUTE_JOB_SUBMIT));
    assert_true(jd_route_is_v1(JD_ROUTE_OPENAPI));
    assert_false(jd_route_is_v1(JD_ROUTE_LIVEZ));
    assert_false(jd_route_is_v1(JD_ROUTE_METRICS));
    assert_false(jd_route_is_v1(JD_ROUTE_NONE));
}

/* A table of the shape the coming features use: PUT/GET/DELETE on one
 * resource, a POST action under it, and a rest-of-path prefix route. */
static const struct jd_route_def feature_rows[] = {
    {JD_ROUTE_JOB_GET, JD_M_PUT, "/v1/things/{id}", JD_RF_V1 | JD_RF_JSON},
    {JD_ROUTE_JOB_LIST, JD_M_GET, "/v1/things/{id}", JD_RF_V1},
    {JD_ROUTE_JOB_CANCEL, JD_M_DELETE, "/v1/things/{id}", JD_RF_V1 | JD_RF_WRITE},
    {JD_ROUTE_JOB_RETRY, JD_M_POST, "/v1/things/{id}/pause", JD_RF_V1},
    {JD_ROUTE_OPENAPI, JD_M_GET, "/ui/*", 0},
    {JD_ROUTE_LIVEZ, JD_M_GET, "/ui/health", 0},
};
#define NFEATURE (sizeof feature_rows / sizeof feature_rows[0])

static void test_put_and_delete(void **state)
{
    struct jd_route_match m;
    assert_int_equal(jd_router_match_in(feature_rows, NFEATURE, "PUT", "/v1/things/a1", &m), 0);
    assert_int_equal(m.route, JD_ROUTE_JOB_GET);
    assert_string_equal(m.param, "a1");
    assert_int_equal(m.flags, JD_RF_V1 | JD_RF_JSON);
    assert_int_equal(jd_router_match_in(feature_rows, NFEATURE, "DELETE", "/v1/things/a1", &m), 0);
    assert_int_equal(m.route, JD_ROUTE_JOB_CANCEL);
    assert_int_equal(m.flags, JD_RF_V1 | JD_RF_WRITE);
    assert_int_equal(jd_router_match_in(feature_rows, NFEATURE, "HEAD", "/v1/things/a1", &m), 0);
    assert_int_equal(m.route, JD_ROUTE_JOB_LIST);
    /* 405 lists every method of the path, in a fixed order */
    assert_int_equal(jd_router_match_in(feature_rows, NFEATURE, "POST", "/v1/things/a1", &m),
                     JD_ECONFLICT);
    assert_string_equal(jd_router_allow_text(m.allow), "GET, HEAD, PUT, DELETE");
    assert_int_equal(m.flags, 0);
    assert_int_equal(
        jd_router_match_in(feature_rows, NFEATURE, "DELETE", "/v1/things/a1/pause", &m),
        JD_ECONFLICT);
    assert_string_equal(jd_router_allow_text(m.allow), "POST");
    assert_int_equal(jd_router_match_in(feature_rows, NFEATURE, "PATCH", "/v1/things/a1", &m),
                     JD_ECONFLICT);
    /* a job has GET and (for a finished one) DELETE, no PUT */
    assert_int_equal(jd_router_match("PUT", "/v1/jobs/1", &m), JD_ECONFLICT);
    assert_string_equal(jd_router_allow_text(m.allow), "GET, HEAD, DELETE");
    assert_string_equal(jd_router_allow_text(JD_M_GET | JD_M_HEAD | JD_M_POST | JD_M_DELETE),
                        "GET, HEAD, POST, DELETE");
    assert_string_equal(jd_router_allow_text(JD_M_PUT | JD_M_DELETE), "PUT, DELETE");
}

static void expect_rest(const char *path, const char *want)
{
    struct jd_route_match m;
    int rc = jd_router_match_in(feature_rows, NFEATURE, "GET", path, &m);
    if (rc != 0 || m.route != JD_ROUTE_OPENAPI)
        fail_msg("GET %s: rc %d route %d, want the /ui/* route", path, rc, m.route);
    assert_string_equal(m.param, want);
}

static void test_prefix_route_carries_the_rest(void **state)
{
    expect_rest("/ui", "");
    expect_rest("/ui/", "");
    expect_rest("/ui/index.html", "index.html");
    expect_rest("/ui/assets/js/app.js", "assets/js/app.js");
    expect_rest("/ui/a/b/c/d/e/f/g/h/i/j/k/l/m/n/o", "a/b/c/d/e/f/g/h/i/j/k/l/m/n/o");
    expect_rest("/ui/health/x", "health/x");
    /* a literal row beats the prefix */
    struct jd_route_match m;
    assert_int_equal(jd_router_match_in(feature_rows, NFEATURE, "GET", "/ui/health", &m), 0);
    assert_int_equal(m.route, JD_ROUTE_LIVEZ);
    /* the rest never climbs out of its folder, and is bounded */
    const char *bad[] = {"/ui/../etc/passwd", "/ui/a/../../x", "/ui/./a",
                         "/ui/a//b",          "/uix/a",        NULL};
    for (int i = 0; bad[i] != NULL; i++)
        if (jd_router_match_in(feature_rows, NFEATURE, "GET", bad[i], &m) != JD_ENOENT)
            fail_msg("GET \"%s\" should be 404", bad[i]);
    char path[512] = "/ui/";
    memset(path + 4, 'a', 200);
    path[204] = '\0';
    assert_int_equal(jd_router_match_in(feature_rows, NFEATURE, "GET", path, &m), JD_ENOENT);
    assert_int_equal(jd_router_match_in(feature_rows, NFEATURE, "POST", "/ui/x", &m), JD_ECONFLICT);
    assert_string_equal(jd_router_allow_text(m.allow), "GET, HEAD");
}

static void test_table_flags(void **state)
{
    struct jd_route_match m;
    assert_int_equal(jd_router_match("POST", "/v1/jobs", &m), 0);
    assert_int_equal(m.flags, JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_JSON);
    assert_int_equal(jd_router_match("POST", "/v1/jobs/3/cancel", &m), 0);
    assert_int_equal(m.flags, JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE);
    assert_int_equal(jd_router_match("GET", "/v1/jobs/3", &m), 0);
    assert_int_equal(m.flags, JD_RF_V1 | JD_RF_JOBS);
    assert_int_equal(jd_router_match("GET", "/v1/openapi.yaml", &m), 0);
    assert_int_equal(m.flags, JD_RF_V1);
    assert_int_equal(jd_router_match("GET", "/livez", &m), 0);
    assert_int_equal(m.flags, 0);
    assert_string_equal(jd_route_name(JD_ROUTE_QUEUE_PAUSE), "/v1/queues/{queue}/pause");
}

/* Rows are skipped by the first letters of the path's first and (under
 * /v1/) second segments; parameters and rest-of-path segments in those
 * places still match anything. */
static const struct jd_route_def lead_rows[] = {
    {JD_ROUTE_JOB_GET, JD_M_GET, "/{p}/y", 0},
    {JD_ROUTE_JOB_LIST, JD_M_GET, "/v1/{a}/x", JD_RF_V1},
    {JD_ROUTE_JOB_CANCEL, JD_M_GET, "/v1/*", JD_RF_V1},
    {JD_ROUTE_LIVEZ, JD_M_GET, "/z", 0},
};
#define NLEAD (sizeof lead_rows / sizeof lead_rows[0])

static void test_rows_skipped_by_leading_letters_only_when_literal(void **state)
{
    (void)state;
    struct jd_route_match m;
    assert_int_equal(jd_router_match_in(lead_rows, NLEAD, "GET", "/anything/y", &m), 0);
    assert_int_equal(m.route, JD_ROUTE_JOB_GET);
    assert_string_equal(m.param, "anything");
    assert_int_equal(jd_router_match_in(lead_rows, NLEAD, "GET", "/v1/b/x", &m), 0);
    assert_int_equal(m.route, JD_ROUTE_JOB_LIST);
    assert_string_equal(m.param, "b");
    assert_int_equal(jd_router_match_in(lead_rows, NLEAD, "GET", "/v1/q/r/s", &m), 0);
    assert_int_equal(m.route, JD_ROUTE_JOB_CANCEL);
    assert_string_equal(m.param, "q/r/s");
    assert_int_equal(jd_router_match_in(lead_rows, NLEAD, "GET", "/z", &m), 0);
    assert_int_equal(m.route, JD_ROUTE_LIVEZ);
    assert_int_equal(jd_router_match_in(lead_rows, NLEAD, "GET", "/zz", &m), JD_ENOENT);
    assert_int_equal(jd_router_match_in(lead_rows, NLEAD, "POST", "/z/", &m), JD_ECONFLICT);
    assert_int_equal(m.allow, JD_M_GET | JD_M_HEAD);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_route),
        cmocka_unit_test(test_unknown_paths_404),
        cmocka_unit_test(test_wrong_method_405_with_allow),
        cmocka_unit_test(test_literal_beats_parameter),
        cmocka_unit_test(test_parameter_length_bounded),
        cmocka_unit_test(test_route_names_and_v1),
        cmocka_unit_test(test_put_and_delete),
        cmocka_unit_test(test_prefix_route_carries_the_rest),
        cmocka_unit_test(test_table_flags),
        cmocka_unit_test(test_rows_skipped_by_leading_letters_only_when_literal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
