/*
 * Unit tests for common/cron.c and common/tz.c: parsing (with the field and
 * reason in every error), and next fire times against a table of known
 * answers, including the spring-forward and fall-back nights of 2026 in
 * Europe/Berlin, America/New_York and Australia/Lord_Howe (a 30-minute
 * shift), and dates past the zone files' tables (the POSIX footer rule).
 * The instants were checked against an independent implementation
 * (Python's zoneinfo) when the table was written.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/clock.h"
#include "common/cron.h"
#include "common/error.h"
#include "common/tz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t at(const char *rfc3339)
{
    int64_t ms;
    if (jd_time_parse(rfc3339, &ms) != 0)
        fail_msg("bad time in table: %s", rfc3339);
    return ms;
}

static const struct jd_tz *zone(const char *name)
{
    const struct jd_tz *tz;
    struct jd_error err;
    if (jd_tz_get(name, &tz, &err) != 0)
        fail_msg("zone %s: %s", name, err.message);
    return tz;
}

struct known {
    const char *zone, *expr, *after, *want;
};

static const struct known table[] = {
    /* plain arithmetic in UTC */
    {"UTC", "*/5 * * * *", "2026-01-01T00:02:30Z", "2026-01-01T00:05:00Z"},
    {"UTC", "*/5 * * * *", "2026-01-01T00:05:00Z", "2026-01-01T00:10:00Z"},
    {"UTC", "0 9 * * mon-fri", "2026-01-02T10:00:00Z", "2026-01-05T09:00:00Z"},
    {"UTC", "0 0 29 2 *", "2026-01-01T00:00:00Z", "2028-02-29T00:00:00Z"},
    {"UTC", "@yearly", "2026-06-01T00:00:00Z", "2027-01-01T00:00:00Z"},
    {"UTC", "@annually", "2026-12-31T23:59:59.999Z", "2027-01-01T00:00:00Z"},
    {"UTC", "@monthly", "2026-01-31T12:00:00Z", "2026-02-01T00:00:00Z"},
    {"UTC", "@weekly", "2026-01-01T00:00:00Z", "2026-01-04T00:00:00Z"},
    {"UTC", "@daily", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"},
    {"UTC", "@midnight", "2026-01-01T23:00:00Z", "2026-01-02T00:00:00Z"},
    {"UTC", "@hourly", "2026-01-01T00:59:59Z", "2026-01-01T01:00:00Z"},
    {"UTC", "15,45 1-3/2 * JAN,Jul *", "2026-01-01T01:15:00Z", "2026-01-01T01:45:00Z"},
    {"UTC", "15,45 1-3/2 * JAN,Jul *", "2026-01-01T01:45:00Z", "2026-01-01T03:15:00Z"},
    {"UTC", "15,45 1-3/2 * JAN,Jul *", "2026-01-31T03:45:00Z", "2026-07-01T01:15:00Z"},
    {"UTC", "5/20 * * * *", "2026-01-01T00:45:00Z", "2026-01-01T01:05:00Z"},
    {"UTC", "0 0 * * 7", "2026-01-01T00:00:00Z", "2026-01-04T00:00:00Z"}, /* 7 = Sunday */
    {"UTC", "0 0 * * 5-7", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"},
    /* Vixie: both day fields restricted -> either matches (13th OR Friday) */
    {"UTC", "0 0 13 * 5", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"},
    {"UTC", "0 0 13 * 5", "2026-01-09T00:00:00Z", "2026-01-13T00:00:00Z"},
    /* one day field starts with '*': both must match (Sundays in Jan/Jul) */
    {"UTC", "0 12 * jan,jul sun", "2026-01-05T00:00:00Z", "2026-01-11T12:00:00Z"},
    {"UTC", "0 0 */2 * mon", "2026-01-01T00:00:00Z", "2026-01-05T00:00:00Z"},
    {"UTC", "0 0 */2 * mon", "2026-01-05T00:00:00Z", "2026-01-19T00:00:00Z"},
    /* a plain day in a zone: midnight New York is 04:00Z in summer */
    {"America/New_York", "0 0 * * *", "2026-11-01T00:00:00Z", "2026-11-01T04:00:00Z"},

    /* Europe/Berlin, spring forward 2026-03-29: 02:00 CET -> 03:00 CEST at 01:00Z */
    {"Europe/Berlin", "30 2 * * *", "2026-03-28T12:00:00Z", "2026-03-29T01:00:00Z"},
    {"Europe/Berlin", "30 2 * * *", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"},
    {"Europe/Berlin", "0 3 * * *", "2026-03-28T12:00:00Z", "2026-03-29T01:00:00Z"},
    /* four skipped times and the first real one share one instant: one fire */
    {"Europe/Berlin", "*/15 2-3 * * *", "2026-03-29T00:50:00Z", "2026-03-29T01:00:00Z"},
    {"Europe/Berlin", "*/15 2-3 * * *", "2026-03-29T01:00:00Z", "2026-03-29T01:15:00Z"},
    {"Europe/Berlin", "0 * * * *", "2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z"},
    {"Europe/Berlin", "0 * * * *", "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"},
    /* Europe/Berlin, fall back 2026-10-25: 03:00 CEST -> 02:00 CET at 01:00Z */
    {"Europe/Berlin", "30 2 * * *", "2026-10-24T12:00:00Z", "2026-10-25T00:30:00Z"},
    {"Europe/Berlin", "30 2 * * *", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"},
    /* asked from inside the repeated hour: the first 02:30 has passed */
    {"Europe/Berlin", "30 2 * * *", "2026-10-25T01:10:00Z", "2026-10-26T01:30:00Z"},
    {"Europe/Berlin", "0 * * * *", "2026-10-24T23:30:00Z", "2026-10-25T00:00:00Z"},
    {"Europe/Berlin", "0 * * * *", "2026-10-25T00:00:00Z", "2026-10-25T02:00:00Z"},

    /* America/New_York, spring forward 2026-03-08: 02:00 EST -> 03:00 EDT at 07:00Z */
    {"America/New_York", "30 2 * * *", "2026-03-07T12:00:00Z", "2026-03-08T07:00:00Z"},
    {"America/New_York", "30 2 * * *", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"},
    {"America/New_York", "59 2 8 3 *", "2026-01-01T00:00:00Z", "2026-03-08T07:00:00Z"},
    /* America/New_York, fall back 2026-11-01: 02:00 EDT -> 01:00 EST at 06:00Z */
    {"America/New_York", "30 1 * * *", "2026-10-31T12:00:00Z", "2026-11-01T05:30:00Z"},
    {"America/New_York", "30 1 * * *", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"},
    {"America/New_York", "*/20 1 * * *", "2026-11-01T05:40:00Z", "2026-11-02T06:00:00Z"},

    /* Australia/Lord_Howe: +10:30 <-> +11, a 30-minute shift.
     * Spring forward 2026-10-04 02:00 -> 02:30 (15:30Z on the 3rd). */
    {"Australia/Lord_Howe", "15 2 * * *", "2026-10-03T12:00:00Z", "2026-10-03T15:30:00Z"},
    {"Australia/Lord_Howe", "15 2 * * *", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"},
    /* Fall back 2026-04-05 02:00 -> 01:30 (15:00Z on the 4th) */
    {"Australia/Lord_Howe", "45 1 * * *", "2026-04-04T12:00:00Z", "2026-04-04T14:45:00Z"},
    {"Australia/Lord_Howe", "45 1 * * *", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"},

    /* Past the zone files' tables (2037): the POSIX footer rule decides */
    {"Europe/Berlin", "30 2 * * *", "2100-03-27T12:00:00Z", "2100-03-28T01:00:00Z"},
    {"Europe/Berlin", "30 2 * * *", "2100-10-30T12:00:00Z", "2100-10-31T00:30:00Z"},
    {"Europe/Berlin", "30 2 * * *", "2100-10-31T00:30:00Z", "2100-11-01T01:30:00Z"},
    {"America/New_York", "30 2 * * *", "2100-03-13T12:00:00Z", "2100-03-14T07:00:00Z"},
    {"America/New_York", "30 1 * * *", "2100-11-06T12:00:00Z", "2100-11-07T05:30:00Z"},
    {"America/New_York", "0 12 1 7 *", "2100-01-01T00:00:00Z", "2100-07-01T16:00:00Z"},
};

static void test_known_answers(void **state)
{
    (void)state;
    int bad = 0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const struct known *k = &table[i];
        struct jd_cron c;
        struct jd_error err;
        if (jd_cron_parse(k->expr, &c, &err) != 0)
            fail_msg("%s: %s", k->expr, err.message);
        int64_t got = jd_cron_next(&c, zone(k->zone), at(k->after));
        char buf[40];
        jd_time_format(got, buf, sizeof buf);
        if (got != at(k->want)) {
            print_error("%s %-22s after %s: got %s, want %s\n", k->zone, k->expr, k->after, buf,
                        k->want);
            bad++;
        }
    }
    assert_int_equal(bad, 0);
}

/* Walking every fire through a whole DST night never repeats or skips a
 * day: "30 2 * * *" fires exactly once per local day across both changes. */
static void test_once_per_day_through_the_year(void **state)
{
    (void)state;
    const char *zones[] = {"Europe/Berlin", "America/New_York", "Australia/Lord_Howe"};
    struct jd_cron c;
    assert_int_equal(jd_cron_parse("30 2 * * *", &c, NULL), 0);
    for (size_t z = 0; z < 3; z++) {
        const struct jd_tz *tz = zone(zones[z]);
        int64_t t = at("2026-01-01T00:00:00Z");
        int64_t prev_day = -1;
        for (int i = 0; i < 365; i++) {
            int64_t next = jd_cron_next(&c, tz, t);
            assert_true(next > t);
            int64_t s = next / 1000;
            int64_t local_day = (s + jd_tz_offset(tz, s)) / 86400;
            if (prev_day >= 0)
                assert_int_equal(local_day, prev_day + 1);
            prev_day = local_day;
            t = next;
        }
    }
}

static void test_offsets(void **state)
{
    (void)state;
    assert_int_equal(jd_tz_offset(zone("Europe/Berlin"), at("2026-01-15T00:00:00Z") / 1000), 3600);
    assert_int_equal(jd_tz_offset(zone("Europe/Berlin"), at("2026-07-15T00:00:00Z") / 1000), 7200);
    assert_int_equal(jd_tz_offset(zone("Europe/Berlin"), at("2026-03-29T00:59:59Z") / 1000), 3600);
    assert_int_equal(jd_tz_offset(zone("Europe/Berlin"), at("2026-03-29T01:00:00Z") / 1000), 7200);
    assert_int_equal(jd_tz_offset(zone("Australia/Lord_Howe"), at("2026-07-01T00:00:00Z") / 1000),
                     37800);
    assert_int_equal(jd_tz_offset(zone("UTC"), 0), 0);
    bool skipped = false;
    /* 02:30 on the spring-forward night is skipped; 02:30 on the fall-back
     * night is the first of two */
    int64_t local = (at("2026-03-29T02:30:00Z")) / 1000;
    assert_true(jd_tz_local_to_utc(zone("Europe/Berlin"), local, &skipped) * 1000 ==
                at("2026-03-29T01:00:00Z"));
    assert_true(skipped);
    local = at("2026-10-25T02:30:00Z") / 1000;
    assert_true(jd_tz_local_to_utc(zone("Europe/Berlin"), local, &skipped) * 1000 ==
                at("2026-10-25T00:30:00Z"));
    assert_false(skipped);
}

static void expect_error(const char *expr, const char *want)
{
    struct jd_cron c;
    struct jd_error err;
    jd_error_clear(&err);
    assert_int_equal(jd_cron_parse(expr, &c, &err), JD_EINVAL);
    if (!strstr(err.message, want))
        fail_msg("%s: message \"%s\" lacks \"%s\"", expr, err.message, want);
}

static void test_errors_name_field_and_reason(void **state)
{
    (void)state;
    expect_error("60 * * * *", "minute: 60 is out of range 0-59");
    expect_error("* 24 * * *", "hour: 24 is out of range 0-23");
    expect_error("* * 0 * *", "day-of-month: 0 is out of range 1-31");
    expect_error("* * * 13 *", "month: 13 is out of range 1-12");
    expect_error("* * * * 8", "day-of-week: 8 is out of range 0-7");
    expect_error("* * * foo *", "month: unknown name \"foo\"");
    expect_error("* * * * fr", "day-of-week: unknown name \"fr\"");
    expect_error("mon * * * *", "minute: \"mon\" is not a number");
    expect_error("30-10 * * * *", "minute: range 30-10 runs backwards");
    expect_error("*/0 * * * *", "minute: step 0 is out of range 1-60");
    expect_error("*/x * * * *", "minute: step must be a number");
    expect_error("1,,2 * * * *", "minute: empty list item");
    expect_error("1, * * * *", "minute: empty list item");
    expect_error("1-2-3 * * * *", "minute: unexpected \"-3\"");
    expect_error("* * * *", "expected 5 fields");
    expect_error("* * * * * *", "got more than 5");
    expect_error("", "got 0");
    expect_error("@reboot", "unknown macro");
    expect_error("0 0 31 4,6 *", "never fires");
    expect_error("0 0 30 2 *", "never fires");
    char longer[400];
    memset(longer, '1', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    expect_error(longer, "longer than 256");
    /* feasible only through the weekday (Vixie OR): accepted */
    struct jd_cron c;
    assert_int_equal(jd_cron_parse("0 0 30 2 mon", &c, NULL), 0);
}

static void test_zone_names(void **state)
{
    (void)state;
    const struct jd_tz *tz;
    struct jd_error err;
    const char *bad[] = {"../../etc/passwd",
                         "/etc/localtime",
                         "Europe/../../etc/passwd",
                         "Nowhere/City",
                         "Europe//Berlin",
                         "zone.tab",
                         "Europe/",
                         "",
                         ".hidden",
                         "Europe/Berlin\n",
                         "right/UTC"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        jd_error_clear(&err);
        if (jd_tz_get(bad[i], &tz, &err) != JD_EINVAL)
            fail_msg("zone \"%s\" accepted", bad[i]);
        assert_true(err.message[0] != '\0');
    }
    assert_int_equal(jd_tz_get("Europe/Berlin", &tz, &err), 0);
    assert_string_equal(jd_tz_name(tz), "Europe/Berlin");
    const struct jd_tz *again;
    assert_int_equal(jd_tz_get("Europe/Berlin", &again, &err), 0);
    assert_ptr_equal(tz, again); /* cached: one load per name */
    assert_int_equal(jd_tz_get("Etc/GMT+5", &tz, &err), 0);
    assert_int_equal(jd_tz_offset(tz, 0), -5 * 3600);
}

static void test_every(void **state)
{
    (void)state;
    int64_t ms;
    struct jd_error err;
    assert_int_equal(jd_every_parse("30s", &ms, &err), 0);
    assert_true(ms == 30000);
    assert_int_equal(jd_every_parse("1h30m", &ms, &err), 0);
    assert_true(ms == 5400000);
    assert_int_equal(jd_every_parse("1s500ms", &ms, &err), 0);
    assert_true(ms == 1500);
    assert_int_equal(jd_every_parse("2d", &ms, &err), 0);
    assert_true(ms == 172800000);
    const char *bad[] = {"",
                         "30",
                         "s",
                         "1x",
                         "-5s",
                         "1.5s",
                         "999ms",
                         "0s",
                         "367d",
                         "99999999999999999999s",
                         "999999999999d",
                         "1d999999999999h",
                         "1h 30m"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (jd_every_parse(bad[i], &ms, &err) != JD_EINVAL)
            fail_msg("interval \"%s\" accepted", bad[i]);
    assert_non_null(strstr((jd_every_parse("500ms", &ms, &err), err.message), "shorter than 1s"));

    assert_true(jd_every_next(0, 30000, 29999) == 30000);
    assert_true(jd_every_next(0, 30000, 30000) == 60000);
    assert_true(jd_every_next(1000, 30000, -5) == 1000);
    assert_true(jd_every_next(1000, 30000, 999) == 1000);
    assert_true(jd_every_next(50000, 30000, 10000) == 20000); /* anchors work both ways */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_answers), cmocka_unit_test(test_once_per_day_through_the_year),
        cmocka_unit_test(test_offsets),       cmocka_unit_test(test_errors_name_field_and_reason),
        cmocka_unit_test(test_zone_names),    cmocka_unit_test(test_every),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
