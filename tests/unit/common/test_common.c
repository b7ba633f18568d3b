/*
 * Unit tests for common/: error table, time parsing/formatting, durations.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static void test_error_codes_map_to_http(void **state)
{
    (void)state;
    assert_int_equal(jd_error_http_status(JD_EINVAL), 422);
    assert_int_equal(jd_error_http_status(JD_EPARSE), 400);
    assert_int_equal(jd_error_http_status(JD_ENOENT), 404);
    assert_int_equal(jd_error_http_status(JD_ECONFLICT), 409);
    assert_int_equal(jd_error_http_status(JD_ETOOBIG), 413);
    assert_int_equal(jd_error_http_status(JD_EFULL), 429);
    assert_int_equal(jd_error_http_status(JD_ESHUTDOWN), 503);
    assert_int_equal(jd_error_http_status(-999), 500);
    assert_string_equal(jd_strerror(JD_ENOENT), "not found");
}

static void test_error_set_keeps_pointer_and_message(void **state)
{
    (void)state;
    struct jd_error e;
    int rc = jd_error_set(&e, JD_EINVAL, "/steps/2/call", "unknown handler \"%s\"", "htp");
    assert_int_equal(rc, JD_EINVAL);
    assert_string_equal(e.pointer, "/steps/2/call");
    assert_string_equal(e.message, "unknown handler \"htp\"");
    jd_error_clear(&e);
    assert_int_equal(e.code, 0);
    assert_string_equal(e.message, "");
    assert_int_equal(jd_error_set(NULL, JD_EIO, NULL, "x"), JD_EIO);
}

static void test_time_roundtrip(void **state)
{
    (void)state;
    int64_t ms;
    assert_int_equal(jd_time_parse("2026-11-21T23:27:37.123Z", &ms), 0);
    char buf[40];
    jd_time_format(ms, buf, sizeof buf);
    assert_string_equal(buf, "2026-11-21T23:27:37.123Z");
    int64_t ms2;
    assert_int_equal(jd_time_parse("2026-11-22T00:27:37.123+01:00", &ms2), 0);
    assert_true(ms == ms2);
    assert_int_equal(jd_time_parse("1970-01-01T00:00:00Z", &ms), 0);
    assert_true(ms == 0);
}

static void test_time_rejects_garbage(void **state)
{
    (void)state;
    int64_t ms;
    const char *bad[] = {"", "tomorrow", "2026-13-01T00:00:00Z", "2026-11-21",
                         "2026-11-21T10:00:00", "2026-11-21T10:00:00Zjunk", "2026-11-21T25:00:00Z",
                         /* days a month does not have: timegm would roll them over */
                         "2026-02-29T00:00:00Z", "2026-04-31T00:00:00Z",
                         "2026-11-21T10:00:00+24:00", "2026-11-21T10:00:00+01:60"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(jd_time_parse(bad[i], &ms), JD_EINVAL);
}

static void test_durations(void **state)
{
    (void)state;
    int64_t ms;
    assert_int_equal(jd_duration_parse("30s", &ms), 0);
    assert_true(ms == 30000);
    assert_int_equal(jd_duration_parse("250ms", &ms), 0);
    assert_true(ms == 250);
    assert_int_equal(jd_duration_parse("7d", &ms), 0);
    assert_true(ms == 7LL * 86400000);
    assert_int_equal(jd_duration_parse("2", &ms), 0);
    assert_true(ms == 2000);
    assert_int_equal(jd_duration_parse("-1s", &ms), JD_EINVAL);
    assert_int_equal(jd_duration_parse("5 parsecs", &ms), JD_EINVAL);
}

/* ?wait= and the duration flags come from users: nothing they type may
 * reach an undefined float-to-integer conversion. */
static void test_durations_reject_non_numbers_and_overflow(void **state)
{
    (void)state;
    int64_t ms = 42;
    const char *bad[] = {"nan",  "NaN",   "inf",   "infinity",       "-0", " 5s", "0x10",
                         "1e3s", "1e12d", "1e12h", "9999999999999d", "."};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(jd_duration_parse(bad[i], &ms), JD_EINVAL);
    assert_true(ms == 42);
    assert_int_equal(jd_duration_parse("1.5s", &ms), 0);
    assert_true(ms == 1500);
    assert_int_equal(jd_duration_parse(".5s", &ms), 0);
    assert_true(ms == 500);
    assert_int_equal(jd_time_parse("2024-02-29T00:00:00Z", &ms), 0); /* a leap day */
    assert_int_equal(jd_time_parse("2000-02-29T00:00:00Z", &ms), 0);
    assert_int_equal(jd_time_parse("1900-02-29T00:00:00Z", &ms), JD_EINVAL);
}

static void test_asprintf(void **state)
{
    (void)state;
    char *s = jd_xasprintf("%s:%d", "job", 42);
    assert_string_equal(s, "job:42");
    free(s);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define OBJCACHE_PASSTHROUGH 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define OBJCACHE_PASSTHROUGH 1
#endif
#endif

#define OC_N 1000
#define OC_SIZE 200

static void *free_all(void *arg)
{
    void **v = arg;
    struct jd_objcache *c = jd_objcache(JD_OC_JOB_WREC, OC_SIZE);
    for (int i = 0; i < OC_N; i++)
        jd_objcache_free(c, v[i]);
    return NULL;
}

/* Blocks come zeroed however they were left, and blocks freed on another
 * thread (which then exits) are what this thread gets next: the cache's
 * point for objects made on one thread and dropped on another. */
static void test_objcache_zeroes_and_reuses_across_threads(void **state)
{
    (void)state;
    struct jd_objcache *c = jd_objcache(JD_OC_JOB_WREC, OC_SIZE);
    static void *v[OC_N], *w[OC_N];
    for (int i = 0; i < OC_N; i++) {
        v[i] = jd_objcache_calloc(c);
        memset(v[i], 0xa5, OC_SIZE);
    }
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, free_all, v), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    unsigned reused = 0;
    for (int i = 0; i < OC_N; i++) {
        w[i] = jd_objcache_calloc(c);
        const unsigned char *b = w[i];
        for (int k = 0; k < OC_SIZE; k++)
            assert_int_equal(b[k], 0);
        for (int k = 0; k < OC_N; k++)
            if (w[i] == v[k]) {
                reused++;
                break;
            }
    }
#ifndef OBJCACHE_PASSTHROUGH
    assert_int_equal(reused, OC_N);
#endif
    for (int i = 0; i < OC_N; i++)
        jd_objcache_free(c, w[i]);
    jd_objcache_free(c, NULL);
}

/* jd_objcache_release frees what the pools hold (the blocks a thread
 * dropped and left behind when it exited), once, and the cache still works
 * after it. */
static void test_objcache_release_empties_the_pools(void **state)
{
    (void)state;
    struct jd_objcache *c = jd_objcache(JD_OC_JOB_WREC, OC_SIZE);
    (void)jd_objcache_release(); /* what earlier tests left */
    static void *v[OC_N];
    for (int i = 0; i < OC_N; i++)
        v[i] = jd_objcache_calloc(c);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, free_all, v), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
#ifndef OBJCACHE_PASSTHROUGH
    assert_int_equal(jd_objcache_release(), OC_N);
#endif
    assert_int_equal(jd_objcache_release(), 0);
    unsigned char *b = jd_objcache_calloc(c);
    for (int k = 0; k < OC_SIZE; k++)
        assert_int_equal(b[k], 0);
    jd_objcache_free(c, b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_codes_map_to_http),
        cmocka_unit_test(test_error_set_keeps_pointer_and_message),
        cmocka_unit_test(test_time_roundtrip),
        cmocka_unit_test(test_time_rejects_garbage),
        cmocka_unit_test(test_durations),
        cmocka_unit_test(test_durations_reject_non_numbers_and_overflow),
        cmocka_unit_test(test_asprintf),
        cmocka_unit_test(test_objcache_zeroes_and_reuses_across_threads),
        cmocka_unit_test(test_objcache_release_empties_the_pools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
