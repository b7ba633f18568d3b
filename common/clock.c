/*
 * The real clocks and time formatting/parsing helpers.
 */
#include "common/clock.h"
#include "common/error.h"
#include "common/tz.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t jd_clock_real_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t jd_clock_real_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct jd_clock jd_clock = {jd_clock_real_mono_ns, jd_clock_real_wall_ms};

void jd_time_format(int64_t wall_ms, char *buf, size_t len)
{
    time_t secs = (time_t)(wall_ms / 1000);
    int ms = (int)(wall_ms % 1000);
    if (ms < 0) {
        ms += 1000;
        secs -= 1;
    }
    struct tm tm;
    gmtime_r(&secs, &tm);
    snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

static int digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)**p))
            return -1;
        v = v * 10 + (**p - '0');
        (*p)++;
    }
    *out = v;
    return 0;
}

int jd_time_parse(const char *s, int64_t *wall_ms)
{
    const char *p = s;
    int y, mo, d, h, mi, se, ms = 0;
    if (!s || digits(&p, 4, &y) || *p++ != '-' || digits(&p, 2, &mo) || *p++ != '-' ||
        digits(&p, 2, &d) || (*p != 'T' && *p != 't' && *p != ' '))
        return JD_EINVAL;
    p++;
    if (digits(&p, 2, &h) || *p++ != ':' || digits(&p, 2, &mi) || *p++ != ':' || digits(&p, 2, &se))
        return JD_EINVAL;
    if (mo < 1 || mo > 12 || d < 1 || d > jd_days_in_month(y, mo) || h > 23 || mi > 59 || se > 60)
        return JD_EINVAL;
    if (*p == '.') {
        p++;
        int n = 0, frac = 0;
        while (isdigit((unsigned char)*p)) {
            if (n < 3)
                frac = frac * 10 + (*p - '0');
            n++;
            p++;
        }
        if (n == 0)
            return JD_EINVAL;
        for (; n < 3; n++)
            frac *= 10;
        ms = frac;
    }
    int offset_min = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p == '-' ? -1 : 1, oh, om;
        p++;
        if (digits(&p, 2, &oh) || *p++ != ':' || digits(&p, 2, &om) || oh > 23 || om > 59)
            return JD_EINVAL;
        offset_min = sign * (oh * 60 + om);
    } else {
        return JD_EINVAL;
    }
    if (*p != '\0')
        return JD_EINVAL;
    struct tm tm = {0};
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = se;
    time_t t = timegm(&tm);
    *wall_ms = ((int64_t)t - (int64_t)offset_min * 60) * 1000 + ms;
    return 0;
}

int jd_duration_parse(const char *s, int64_t *ms)
{
    if (!s || !*s)
        return JD_EINVAL;
    char *end;
    /* Plain decimal only: strtod alone would also take "nan", "inf", hex,
     * exponents and leading blanks, and converting NaN to int64_t is
     * undefined. */
    size_t n = strspn(s, "0123456789.");
    if (n == 0)
        return JD_EINVAL;
    double v = strtod(s, &end);
    if (end != s + n || !isfinite(v) || v < 0 || v > 1e12)
        return JD_EINVAL;
    double mul;
    if (!strcmp(end, "") || !strcmp(end, "s"))
        mul = 1000;
    else if (!strcmp(end, "ms"))
        mul = 1;
    else if (!strcmp(end, "m"))
        mul = 60000;
    else if (!strcmp(end, "h"))
        mul = 3600000;
    else if (!strcmp(end, "d"))
        mul = 86400000;
    else
        return JD_EINVAL;
    /* 1e12 days does not fit in int64_t ms; the cast would be undefined.
     * 2^62 ms is some 146 million years: more than any timeout needs. */
    if (v * mul >= 4.6e18)
        return JD_EINVAL;
    *ms = (int64_t)(v * mul);
    return 0;
}
