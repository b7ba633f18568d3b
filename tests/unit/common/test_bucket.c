/*
 * Unit tests for common/bucket.c, the token bucket behind a queue's rate
 * limit, driven by a fake clock (times passed in).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/bucket.h"

/* Take as many tokens as are ready at now. */
static int drain(struct jd_bucket *b, int64_t now)
{
    int n = 0;
    while (jd_bucket_ready(b, now)) {
        jd_bucket_take(b);
        n++;
    }
    return n;
}

static void test_full_bucket_allows_a_burst_of_limit(void **state)
{
    (void)state;
    struct jd_bucket b;
    jd_bucket_init(&b, 5, 1000, 100, true);
    assert_int_equal(drain(&b, 100), 5);
    assert_false(jd_bucket_ready(&b, 100));
    assert_int_equal(jd_bucket_wait_ms(&b, 100), 200); /* one token per 200 ms */
}

static void test_refills_at_limit_per_period(void **state)
{
    (void)state;
    struct jd_bucket b;
    jd_bucket_init(&b, 5, 1000, 0, true);
    drain(&b, 0);
    assert_false(jd_bucket_ready(&b, 199));
    assert_int_equal(jd_bucket_wait_ms(&b, 199), 1);
    assert_int_equal(drain(&b, 200), 1);
    /* Over any long stretch: limit per period, never more. */
    int total = 0;
    for (int64_t t = 201; t <= 10200; t += 7)
        total += drain(&b, t);
    total += drain(&b, 10200);
    assert_int_equal(total, 50);
    /* Idle for long: capped at limit, not the time's worth. */
    assert_int_equal(drain(&b, 1000000), 5);
}

static void test_empty_start_waits_a_token_interval(void **state)
{
    (void)state;
    struct jd_bucket b;
    jd_bucket_init(&b, 2, 3000, 5000, false);
    assert_false(jd_bucket_ready(&b, 5000));
    assert_int_equal(jd_bucket_wait_ms(&b, 5000), 1500);
    assert_false(jd_bucket_ready(&b, 6499));
    assert_int_equal(drain(&b, 6500), 1);
}

static void test_clock_going_back_adds_nothing(void **state)
{
    (void)state;
    struct jd_bucket b;
    jd_bucket_init(&b, 1, 1000, 5000, true);
    assert_int_equal(drain(&b, 5000), 1);
    assert_int_equal(drain(&b, 4000), 0);
    assert_int_equal(drain(&b, 5999), 0);
    assert_int_equal(drain(&b, 6000), 1);
}

static void test_set_keeps_tokens_capped(void **state)
{
    (void)state;
    struct jd_bucket b;
    jd_bucket_init(&b, 10, 1000, 0, true);
    jd_bucket_set(&b, 3, 1000, 0);
    assert_int_equal(drain(&b, 0), 3);
    jd_bucket_set(&b, 100, 1000, 0); /* raising the limit does not add tokens */
    assert_int_equal(drain(&b, 0), 0);
    assert_int_equal(drain(&b, 10), 1);
}

static void test_no_limit_is_always_ready(void **state)
{
    (void)state;
    struct jd_bucket b;
    jd_bucket_init(&b, 0, 0, 0, false);
    for (int i = 0; i < 100; i++) {
        assert_true(jd_bucket_ready(&b, 0));
        jd_bucket_take(&b);
    }
    assert_int_equal(jd_bucket_wait_ms(&b, 0), 0);
}

static void test_extreme_rates_stay_sane(void **state)
{
    (void)state;
    struct jd_bucket b;
    jd_bucket_init(&b, 1000000, 1, 0, true); /* a million per ms */
    assert_int_equal(drain(&b, 0), 1000000);
    assert_int_equal(jd_bucket_wait_ms(&b, 0), 1);
    jd_bucket_init(&b, 1, 86400000, 0, false); /* one a day */
    assert_int_equal(jd_bucket_wait_ms(&b, 0), 86400000);
    assert_int_equal(jd_bucket_wait_ms(&b, 86399999), 1);
    assert_true(jd_bucket_ready(&b, 86400000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_bucket_allows_a_burst_of_limit),
        cmocka_unit_test(test_refills_at_limit_per_period),
        cmocka_unit_test(test_empty_start_waits_a_token_interval),
        cmocka_unit_test(test_clock_going_back_adds_nothing),
        cmocka_unit_test(test_set_keeps_tokens_capped),
        cmocka_unit_test(test_no_limit_is_always_ready),
        cmocka_unit_test(test_extreme_rates_stay_sane),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
