/*
 * The throughput series (server/stats.c): ends land in the second they
 * happened, under their queue and state; old seconds fall out of the window
 * instead of being counted again a lap later; the number of queues tracked
 * is capped; the JSON is what /v1/stats and the dashboard read.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "server/stats.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T0 1795600000000LL /* a wall-clock instant, ms */

static cJSON *series(struct jd_stats *s, int seconds, int64_t now_ms)
{
    char *text = jd_stats_json(s, seconds, now_ms);
    cJSON *o = cJSON_Parse(text);
    if (o == NULL)
        fail_msg("not JSON: %s", text);
    free(text);
    return o;
}

static const cJSON *queue_of(const cJSON *o, const char *name)
{
    const cJSON *q;
    cJSON_ArrayForEach(q, cJSON_GetObjectItem(o, "queues"))
    {
        if (strcmp(cJSON_GetObjectItem(q, "name")->valuestring, name) == 0)
            return q;
    }
    return NULL;
}

static int at(const cJSON *q, const char *kind, int i)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItem(q, kind), i)->valueint;
}

static void test_ends_counted_by_second_queue_and_state(void **state)
{
    struct jd_stats *s = jd_stats_create();
    jd_stats_job_end(s, "mail", JD_JOB_SUCCEEDED, T0);
    jd_stats_job_end(s, "mail", JD_JOB_SUCCEEDED, T0 + 999);
    jd_stats_job_end(s, "mail", JD_JOB_FAILED, T0 + 1000);
    jd_stats_job_end(s, "mail", JD_JOB_CANCELLED, T0 + 2500);
    jd_stats_job_end(s, "video", JD_JOB_FAILED, T0 + 2000);
    jd_stats_job_end(s, "mail", JD_JOB_RUNNING, T0); /* not an end: ignored */

    cJSON *o = series(s, 3, T0 + 2999); /* the seconds T0, T0+1, T0+2 */
    assert_int_equal(cJSON_GetObjectItem(o, "seconds")->valueint, 3);
    assert_int_equal(cJSON_GetObjectItem(o, "bucket_seconds")->valueint, 1);
    const cJSON *mail = queue_of(o, "mail"), *video = queue_of(o, "video");
    assert_non_null(mail);
    assert_non_null(video);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(mail, "succeeded")), 3);
    assert_int_equal(at(mail, "succeeded", 0), 2);
    assert_int_equal(at(mail, "succeeded", 1), 0);
    assert_int_equal(at(mail, "failed", 1), 1);
    assert_int_equal(at(mail, "cancelled", 2), 1);
    assert_int_equal(at(video, "failed", 2), 1);
    assert_int_equal(at(video, "succeeded", 2), 0);
    const cJSON *tot = cJSON_GetObjectItem(mail, "totals");
    assert_int_equal(cJSON_GetObjectItem(tot, "succeeded")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(tot, "failed")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(tot, "cancelled")->valueint, 1);
    /* queues sorted by name */
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "queues"), 0), "name")
            ->valuestring,
        "mail");
    cJSON_Delete(o);
    jd_stats_destroy(s);
}

/* Queues are listed by name whatever order they first appeared in, each
 * with its own counts. */
static void test_sorted_by_name_with_their_counts(void **state)
{
    struct jd_stats *s = jd_stats_create();
    jd_stats_job_end(s, "zeta", JD_JOB_SUCCEEDED, T0);
    jd_stats_job_end(s, "alpha", JD_JOB_FAILED, T0);
    jd_stats_job_end(s, "alpha", JD_JOB_FAILED, T0);
    cJSON *o = series(s, 1, T0);
    const cJSON *qs = cJSON_GetObjectItem(o, "queues");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(qs, 0), "name")->valuestring,
                        "alpha");
    assert_int_equal(at(cJSON_GetArrayItem(qs, 0), "failed", 0), 2);
    assert_int_equal(at(cJSON_GetArrayItem(qs, 0), "succeeded", 0), 0);
    assert_int_equal(at(cJSON_GetArrayItem(qs, 1), "succeeded", 0), 1);
    cJSON_Delete(o);
    jd_stats_destroy(s);
}

static void test_old_seconds_fall_out_of_the_window(void **state)
{
    struct jd_stats *s = jd_stats_create();
    jd_stats_job_end(s, "q", JD_JOB_SUCCEEDED, T0);
    /* the oldest second still inside the window is counted */
    cJSON *o = series(s, JD_STATS_WINDOW, T0 + (JD_STATS_WINDOW - 1) * 1000LL);
    assert_int_equal(at(queue_of(o, "q"), "succeeded", 0), 1);
    cJSON_Delete(o);
    /* exactly one lap later the same ring slot is read: it must be zero */
    o = series(s, JD_STATS_WINDOW, T0 + JD_STATS_WINDOW * 1000LL);
    const cJSON *q = queue_of(o, "q");
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(q, "totals"), "succeeded")->valueint,
                     0);
    cJSON_Delete(o);
    /* and a new end in that slot starts from zero, not from the old count */
    jd_stats_job_end(s, "q", JD_JOB_SUCCEEDED, T0 + JD_STATS_WINDOW * 1000LL);
    o = series(s, 1, T0 + JD_STATS_WINDOW * 1000LL);
    assert_int_equal(at(queue_of(o, "q"), "succeeded", 0), 1);
    cJSON_Delete(o);
    jd_stats_destroy(s);
}

static void test_seconds_clamped(void **state)
{
    struct jd_stats *s = jd_stats_create();
    jd_stats_job_end(s, "q", JD_JOB_FAILED, T0);
    cJSON *o = series(s, 100000, T0);
    assert_int_equal(cJSON_GetObjectItem(o, "seconds")->valueint, JD_STATS_WINDOW);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(queue_of(o, "q"), "failed")),
                     JD_STATS_WINDOW);
    cJSON_Delete(o);
    jd_stats_destroy(s);
}

static void test_queue_names_capped(void **state)
{
    struct jd_stats *s = jd_stats_create();
    for (int i = 0; i < JD_STATS_MAX_QUEUES + 50; i++) {
        char name[16];
        snprintf(name, sizeof name, "q%03d", i);
        jd_stats_job_end(s, name, JD_JOB_SUCCEEDED, T0);
    }
    jd_stats_job_end(s, "bad\"name", JD_JOB_SUCCEEDED, T0); /* never written unescaped */
    cJSON *o = series(s, 1, T0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "queues")), JD_STATS_MAX_QUEUES + 1);
    const cJSON *other = queue_of(o, JD_STATS_OTHER);
    assert_non_null(other);
    assert_int_equal(at(other, "succeeded", 0), 51);
    cJSON_Delete(o);
    jd_stats_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ends_counted_by_second_queue_and_state),
        cmocka_unit_test(test_sorted_by_name_with_their_counts),
        cmocka_unit_test(test_old_seconds_fall_out_of_the_window),
        cmocka_unit_test(test_seconds_clamped),
        cmocka_unit_test(test_queue_names_capped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
