/*
 * /metrics text: the families the issue names are present, counters land
 * under their route and status, histograms are cumulative and end in +Inf.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "api/metrics.h"
#include "scheduler/sched.h"
#include "server/jobs.h"
#include "server/schedules.h"
#include "storage/store.h"

#include <stdlib.h>
#include <string.h>

static void test_http_counters(void **state)
{
    static struct jd_http_metrics m;
    jd_http_metrics_observe(&m, JD_ROUTE_JOB_SUBMIT, 201, 800);  /* 0.8 ms */
    jd_http_metrics_observe(&m, JD_ROUTE_JOB_SUBMIT, 201, 3000); /* 3 ms */
    jd_http_metrics_observe(&m, JD_ROUTE_JOB_SUBMIT, 422, 200);
    jd_http_metrics_observe(&m, JD_ROUTE_NONE, 418, 10); /* uncounted code */
    struct jd_metrics_sources src = {.http = &m, .ready = 1};
    char *t = jd_metrics_render(&src);
    assert_non_null(strstr(t, "jackdaw_up 1\n"));
    assert_non_null(strstr(t, "jackdaw_http_requests_total{route=\"/v1/jobs\",code=\"201\"} 2\n"));
    assert_non_null(strstr(t, "jackdaw_http_requests_total{route=\"/v1/jobs\",code=\"422\"} 1\n"));
    assert_non_null(strstr(t, "jackdaw_http_requests_total{route=\"other\",code=\"other\"} 1\n"));
    assert_non_null(strstr(
        t, "jackdaw_http_request_duration_seconds_bucket{route=\"/v1/jobs\",le=\"0.001\"} 2\n"));
    assert_non_null(strstr(
        t, "jackdaw_http_request_duration_seconds_bucket{route=\"/v1/jobs\",le=\"0.005\"} 3\n"));
    assert_non_null(strstr(
        t, "jackdaw_http_request_duration_seconds_bucket{route=\"/v1/jobs\",le=\"+Inf\"} 3\n"));
    assert_non_null(
        strstr(t, "jackdaw_http_request_duration_seconds_count{route=\"/v1/jobs\"} 3\n"));
    /* no job-layer families without their snapshot */
    assert_null(strstr(t, "jackdaw_jobs_submitted_total"));
    free(t);
}

/* A histogram's _sum keeps its precision however large it grows: with six
 * significant digits it would stop moving and rate(_sum) would be noise. */
static void test_histogram_sum_keeps_precision(void **state)
{
    (void)state;
    static struct jd_http_metrics m;
    jd_http_metrics_observe(&m, JD_ROUTE_JOB_GET, 200, 1234567890123ull); /* ~14 days */
    jd_http_metrics_observe(&m, JD_ROUTE_JOB_GET, 200, 1);
    struct jd_metrics_sources src = {.http = &m, .ready = 1};
    char *t = jd_metrics_render(&src);
    assert_non_null(strstr(
        t, "jackdaw_http_request_duration_seconds_sum{route=\"/v1/jobs/{id}\"} 1234567.890124\n"));
    free(t);
}

static void test_all_families(void **state)
{
    struct jd_jobs_stats js = {.submitted = 5, .succeeded = 3, .failed = 1, .running = 1};
    js.duration_hist[0] = 2;
    js.duration_hist[11] = 1;
    struct jd_sched_stats ss = {
        .steals = 7, .parks = 9, .global_depth = 4, .stuck_events = 1, .unstacks = 3, .workers = 2};
    struct jd_store_stats st = {.commits = 11, .records = 20};
    st.batch_hist[1] = 11;
    st.commit_us_hist[3] = 11;
    struct jd_jobs_call_stats rs = {.calls = 6, .ok = 5, .failed = 1};
    struct jd_queue_counts qc[2] = {{.queue = "default"}, {.queue = "we\"ird\n", .paused = true}};
    qc[0].counts[JD_JOB_SUCCEEDED] = 12;
    struct jd_schedules_stats sch = {.schedules = 4, .fires = 30, .skips = 2, .caught_up = 1};
    sch.lag_hist[0] = 25; /* <= 1 ms */
    sch.lag_hist[5] = 4;  /* <= 100 ms */
    sch.lag_hist[JD_SCHED_LAG_BUCKETS - 1] = 1;
    struct jd_metrics_sources src = {.jobs = &js,
                                     .schedules = &sch,
                                     .sched = &ss,
                                     .store = &st,
                                     .calls = &rs,
                                     .queues = qc,
                                     .nqueues = 2,
                                     .ready = 0};
    char *t = jd_metrics_render(&src);
    const char *want[] = {
        "jackdaw_up 0\n",
        "jackdaw_jobs_submitted_total 5\n",
        "jackdaw_jobs_finished_total{state=\"succeeded\"} 3\n",
        "jackdaw_jobs{state=\"running\"} 1\n",
        "jackdaw_job_duration_seconds_bucket{le=\"0.001\"} 2\n",
        "jackdaw_job_duration_seconds_bucket{le=\"300\"} 2\n",
        "jackdaw_job_duration_seconds_bucket{le=\"+Inf\"} 3\n",
        "jackdaw_sched_steals_total 7\n",
        "jackdaw_sched_parks_total 9\n",
        "jackdaw_sched_stuck_total 1\n",
        "jackdaw_sched_unstacks_total 3\n",
        "jackdaw_sched_queue_depth{queue=\"global\"} 4\n",
        "jackdaw_store_commits_total 11\n",
        "jackdaw_store_batch_size_bucket{le=\"4\"} 11\n",
        "jackdaw_store_commit_seconds_bucket{le=\"0.001\"} 11\n",
        "jackdaw_plugin_calls_total{result=\"ok\"} 5\n",
        "jackdaw_plugin_calls_total{result=\"failed\"} 1\n",
        "jackdaw_queue_jobs{queue=\"default\",state=\"succeeded\"} 12\n",
        "jackdaw_queue_jobs{queue=\"default\",state=\"queued\"} 0\n",
        "jackdaw_queue_paused{queue=\"we\\\"ird\\n\"} 1\n",
        "jackdaw_schedules 4\n",
        "jackdaw_schedule_fires_total 30\n",
        "jackdaw_schedule_skips_total 2\n",
        "jackdaw_schedule_fire_lag_seconds_bucket{le=\"0.001\"} 25\n",
        "jackdaw_schedule_fire_lag_seconds_bucket{le=\"0.1\"} 29\n",
        "jackdaw_schedule_fire_lag_seconds_bucket{le=\"+Inf\"} 30\n",
        NULL,
    };
    for (int i = 0; want[i]; i++)
        if (strstr(t, want[i]) == NULL)
            fail_msg("metrics lack \"%s\"", want[i]);
    /* every family is declared once */
    const char *p = strstr(t, "# TYPE jackdaw_store_batch_size histogram");
    assert_non_null(p);
    assert_null(strstr(p + 1, "# TYPE jackdaw_store_batch_size histogram"));
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_http_counters),
        cmocka_unit_test(test_histogram_sum_keeps_precision),
        cmocka_unit_test(test_all_families),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
