/*
 * Task ids (server/tasks.h, jd_task_id_parse): the two shapes this server
 * makes, "<job>-<seq>-<32 hex>" on one node and "<node>.<job>-<seq>-<32
 * hex>" on a cluster node (and the older ones without the seq or the job),
 * and everything else refused, so that a forged id can never name a node
 * it does not spell exactly (api/forward.c routes by it) nor a job or an
 * event (the store finds a claimed task's dispatch event by them).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "server/tasks.h"

#define HEX "0123456789abcdef0123456789abcdef"

static void test_the_shapes_made_here(void **state)
{
    (void)state;
    int64_t node = -1;
    assert_true(jd_task_id_parse(HEX, &node));
    assert_int_equal(node, 0);
    assert_true(jd_task_id_parse("7." HEX, &node));
    assert_int_equal(node, 7);
    assert_true(jd_task_id_parse("9223372036854775807." HEX, &node));
    assert_int_equal(node, INT64_MAX);
    assert_int_equal(jd_task_id_job(HEX), 0); /* made before ids named their job */
    assert_int_equal(jd_task_id_job("7." HEX), 0);
    assert_true(jd_task_id_parse("15-" HEX, &node));
    assert_int_equal(node, 0);
    assert_int_equal(jd_task_id_job("15-" HEX), 15);
    assert_true(jd_task_id_parse("7.15-" HEX, &node));
    assert_int_equal(node, 7);
    assert_int_equal(jd_task_id_job("7.15-" HEX), 15);
    assert_int_equal(jd_task_id_job("7.9223372036854775807-" HEX), INT64_MAX);
    assert_true(jd_task_id_parse("15-42-" HEX, &node));
    assert_int_equal(node, 0);
    assert_int_equal(jd_task_id_job("15-42-" HEX), 15);
    assert_true(jd_task_id_parse("7.15-42-" HEX, &node));
    assert_int_equal(node, 7);
    assert_int_equal(jd_task_id_job("7.15-42-" HEX), 15);
    assert_true(jd_task_id_parse("9223372036854775807.9223372036854775807-9223372036854775807-" HEX,
                                 &node));
    assert_int_equal(strlen("9223372036854775807.9223372036854775807-9223372036854775807-" HEX),
                     JD_TASK_ID_MAX);
}

/* What the store looks up for an id: the id its claim's dispatch event
 * names, and that event's seq. */
static void test_the_claim_an_id_names(void **state)
{
    (void)state;
    char base[JD_TASK_ID_MAX + 1];
    assert_int_equal(jd_task_id_claim("15-42-" HEX, base), 42);
    assert_string_equal(base, "15-" HEX);
    assert_int_equal(jd_task_id_claim("7.15-42-" HEX, base), 42);
    assert_string_equal(base, "7.15-" HEX);
    assert_int_equal(jd_task_id_claim("15-" HEX, base), 0); /* handed out before the seq */
    assert_string_equal(base, "15-" HEX);
    assert_int_equal(jd_task_id_claim("7.15-" HEX, base), 0);
    assert_string_equal(base, "7.15-" HEX);
    assert_int_equal(jd_task_id_claim(HEX, base), -1); /* no job: its row answers */
    assert_int_equal(jd_task_id_claim("7." HEX, base), -1);
    assert_int_equal(jd_task_id_claim("15-0-" HEX, base), -1);
}

static void test_everything_else_is_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        ".",
        "7.",
        "." HEX,
        "07." HEX,                      /* a leading zero: two spellings of one node */
        "0." HEX,                       /* no node 0 */
        "-7." HEX,                      /* a sign */
        "+7." HEX,                      /* a sign */
        " 7." HEX,                      /* space */
        "9223372036854775808." HEX,     /* past INT64_MAX */
        "99999999999999999999999." HEX, /* far past it */
        "7.7." HEX,                     /* two dots */
        "7."
        "0123456789ABCDEF0123456789abcdef", /* upper case */
        "7."
        "0123456789abcdef0123456789abcde", /* 31 digits */
        "7." HEX "0",                      /* 33 digits */
        "7."
        "0123456789abcdef0123456789abcdeg",
        "7/../x." HEX,
        "7%2e" HEX,
        "-" HEX,                    /* an empty job */
        "7.-" HEX,                  /* an empty job */
        "0-" HEX,                   /* no job 0 */
        "015-" HEX,                 /* a leading zero */
        "7.15--" HEX,               /* two dashes */
        "15-7." HEX,                /* job before node */
        "9223372036854775808-" HEX, /* past INT64_MAX */
        "7.15-" HEX "0",            /* 33 digits */
        "7.15-x" HEX,
        "15-0-" HEX,                   /* no seq 0 */
        "15-042-" HEX,                 /* a leading zero */
        "15-4-2-" HEX,                 /* three dashes */
        "15--" HEX,                    /* an empty seq */
        "15-9223372036854775808-" HEX, /* past INT64_MAX */
        "7.15-42-" HEX "0",            /* 33 digits */
        "42-" HEX "-1",                /* seq after the hex */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t node = -1;
        if (jd_task_id_parse(bad[i], &node))
            fail_msg("accepted \"%s\"", bad[i]);
        if (jd_task_id_job(bad[i]) != 0)
            fail_msg("found a job in \"%s\"", bad[i]);
    }
    int64_t node;
    assert_false(jd_task_id_parse(NULL, &node));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_shapes_made_here),
        cmocka_unit_test(test_everything_else_is_refused),
        cmocka_unit_test(test_the_claim_an_id_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
