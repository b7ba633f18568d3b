/*
 * Cron expressions and intervals (common/cron.h). The next fire time is
 * found in local wall-clock time (seconds since 1970 as if the zone were
 * UTC), one calendar unit at a time, then mapped to an instant with
 * jd_tz_local_to_utc, which applies the daylight-saving rules.
 */
#include "common/cron.h"

#include "common/error.h"
#include "common/tz.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

struct field {
    const char *name;
    int lo, hi;
    const char *const *names; /* names[i] is value lo + i, or NULL */
};

static const char *const month_names[] = {"jan", "feb", "mar", "apr", "may", "jun", "jul",
                                          "aug", "sep", "oct", "nov", "dec", NULL};
static const char *const dow_names[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat", NULL};

static const struct field fields[5] = {
    {"minute", 0, 59, NULL},          {"hour", 0, 23, NULL},
    {"day-of-month", 1, 31, NULL},    {"month", 1, 12, month_names},
    {"day-of-week", 0, 7, dow_names},
};

/* One value: a number or (month, weekday) a name. *end past it. */
static int parse_value(const struct field *f, const char *s, const char *lim, const char **end,
                       int *out, struct jd_error *err)
{
    const char *p = s;
    if (isdigit((unsigned char)*p)) {
        int v = 0;
        while (p < lim && isdigit((unsigned char)*p)) {
            if (v > 1000)
                break;
            v = v * 10 + (*p++ - '0');
        }
        if (v < f->lo || v > f->hi)
            return jd_error_set(err, JD_EINVAL, NULL, "%s: %d is out of range %d-%d", f->name, v,
                                f->lo, f->hi);
        *out = v;
        *end = p;
        return 0;
    }
    while (p < lim && isalpha((unsigned char)*p))
        p++;
    if (p == s)
        return jd_error_set(err, JD_EINVAL, NULL, "%s: expected a number at \"%.*s\"", f->name,
                            (int)(lim - s), s);
    for (int i = 0; f->names && f->names[i]; i++)
        if (p - s == 3 && strncasecmp(s, f->names[i], 3) == 0) {
            *out = f->lo + i;
            *end = p;
            return 0;
        }
    if (!f->names)
        return jd_error_set(err, JD_EINVAL, NULL, "%s: \"%.*s\" is not a number", f->name,
                            (int)(p - s), s);
    return jd_error_set(err, JD_EINVAL, NULL, "%s: unknown name \"%.*s\"", f->name, (int)(p - s),
                        s);
}

/* One field (s..lim) into *bits; *star if it starts with '*'. */
static int parse_field(const struct field *f, const char *s, const char *lim, uint64_t *bits,
                       bool *star, struct jd_error *err)
{
    *bits = 0;
    *star = *s == '*';
    while (s <= lim) {
        const char *item_end = memchr(s, ',', (size_t)(lim - s));
        if (!item_end)
            item_end = lim;
        if (item_end == s)
            return jd_error_set(err, JD_EINVAL, NULL, "%s: empty list item", f->name);
        const char *p = s;
        int lo, hi, step = 1;
        bool open_end = false;
        int rc;
        if (*p == '*') {
            lo = f->lo;
            hi = f->hi;
            p++;
        } else {
            if ((rc = parse_value(f, p, item_end, &p, &lo, err)) != 0)
                return rc;
            hi = lo;
            if (p < item_end && *p == '-') {
                p++;
                if ((rc = parse_value(f, p, item_end, &p, &hi, err)) != 0)
                    return rc;
                if (hi < lo)
                    return jd_error_set(err, JD_EINVAL, NULL, "%s: range %d-%d runs backwards",
                                        f->name, lo, hi);
            } else {
                open_end = true; /* "5/15" runs to the end of the field */
            }
        }
        if (p < item_end && *p == '/') {
            p++;
            const char *q = p;
            step = 0;
            while (p < item_end && isdigit((unsigned char)*p) && step <= 1000)
                step = step * 10 + (*p++ - '0');
            if (p == q || (p < item_end && !isdigit((unsigned char)*p)))
                return jd_error_set(err, JD_EINVAL, NULL, "%s: step must be a number", f->name);
            if (step < 1 || step > f->hi - f->lo + 1)
                return jd_error_set(err, JD_EINVAL, NULL, "%s: step %d is out of range 1-%d",
                                    f->name, step, f->hi - f->lo + 1);
            if (open_end)
                hi = f->hi;
        }
        if (p != item_end)
            return jd_error_set(err, JD_EINVAL, NULL, "%s: unexpected \"%.*s\"", f->name,
                                (int)(item_end - p), p);
        for (int v = lo; v <= hi; v += step)
            *bits |= 1ull << v;
        s = item_end + 1;
    }
    return 0;
}

static const struct {
    const char *name, *expr;
} macros[] = {
    {"@yearly", "0 0 1 1 *"}, {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
    {"@weekly", "0 0 * * 0"}, {"@daily", "0 0 * * *"},    {"@midnight", "0 0 * * *"},
    {"@hourly", "0 * * * *"},
};

int jd_cron_parse(const char *expr, struct jd_cron *out, struct jd_error *err)
{
    if (!expr)
        return jd_error_set(err, JD_EINVAL, NULL, "cron expression missing");
    size_t len = strnlen(expr, JD_CRON_MAX_LEN + 1);
    if (len > JD_CRON_MAX_LEN)
        return jd_error_set(err, JD_EINVAL, NULL, "cron expression longer than %d characters",
                            JD_CRON_MAX_LEN);
    if (expr[0] == '@') {
        for (size_t i = 0; i < sizeof macros / sizeof macros[0]; i++)
            if (strcasecmp(expr, macros[i].name) == 0)
                return jd_cron_parse(macros[i].expr, out, err);
        return jd_error_set(err, JD_EINVAL, NULL,
                            "unknown macro \"%.32s\" (known: @yearly, @annually, @monthly, "
                            "@weekly, @daily, @midnight, @hourly)",
                            expr);
    }
    const char *start[6], *end[6];
    int n = 0;
    const char *p = expr;
    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        if (n == 5) {
            n++;
            break;
        }
        start[n] = p;
        while (*p && *p != ' ' && *p != '\t')
            p++;
        end[n++] = p;
    }
    if (n != 5)
        return jd_error_set(err, JD_EINVAL, NULL,
                            "expected 5 fields (minute hour day-of-month month day-of-week), "
                            "got %s%d",
                            n > 5 ? "more than " : "", n > 5 ? 5 : n);
    uint64_t bits[5];
    bool star[5];
    for (int i = 0; i < 5; i++) {
        int rc = parse_field(&fields[i], start[i], end[i], &bits[i], &star[i], err);
        if (rc != 0)
            return rc;
    }
    struct jd_cron c = {0};
    c.minute = bits[0];
    c.hour = (uint32_t)bits[1];
    c.dom = (uint32_t)bits[2];
    c.month = (uint16_t)bits[3];
    c.dow = (uint8_t)((bits[4] | bits[4] >> 7) & 0x7f); /* 7 is Sunday too */
    c.dom_star = star[2];
    c.dow_star = star[4];
    /* When the day of the month alone decides (the other day field is
     * unrestricted or ANDed with it), "31 in April" would never fire. */
    if (c.dom_star || c.dow_star) {
        bool any = false;
        for (int m = 1; m <= 12 && !any; m++)
            if (c.month >> m & 1)
                any = (c.dom & ((2ull << (m == 2 ? 29 : jd_days_in_month(2001, m))) - 2)) != 0;
        if (!any)
            return jd_error_set(err, JD_EINVAL, NULL,
                                "day-of-month: no selected month has any of the selected days, "
                                "so the expression never fires");
    }
    *out = c;
    return 0;
}

static bool day_matches(const struct jd_cron *c, int d, int wday)
{
    bool dom = c->dom >> d & 1, dow = c->dow >> wday & 1;
    if (c->dom_star || c->dow_star)
        return dom && dow;
    return dom || dow;
}

/* The first local minute >= local_s (a whole minute) that matches, or
 * INT64_MIN past the horizon. */
static int64_t next_local(const struct jd_cron *c, int64_t local_s, int64_t horizon_s)
{
    while (local_s < horizon_s) {
        int64_t days = local_s / 86400 - (local_s % 86400 < 0), y;
        int m, d;
        jd_civil_from_days(days, &y, &m, &d);
        int64_t sec = local_s - days * 86400;
        int h = (int)(sec / 3600), mi = (int)(sec % 3600 / 60);
        if (!(c->month >> m & 1)) {
            local_s = jd_days_from_civil(m == 12 ? y + 1 : y, m == 12 ? 1 : m + 1, 1) * 86400;
            continue;
        }
        if (!day_matches(c, d, jd_weekday(days))) {
            local_s = (days + 1) * 86400;
            continue;
        }
        if (!(c->hour >> h & 1)) {
            local_s = days * 86400 + (int64_t)(h + 1) * 3600;
            continue;
        }
        uint64_t rest = c->minute >> mi;
        if (!rest) {
            local_s = days * 86400 + (int64_t)(h + 1) * 3600;
            continue;
        }
        return local_s + (int64_t)__builtin_ctzll(rest) * 60;
    }
    return INT64_MIN;
}

int64_t jd_cron_next(const struct jd_cron *c, const struct jd_tz *tz, int64_t after_ms)
{
    int64_t after_s = after_ms / 1000 - (after_ms % 1000 < 0);
    /* Start at the local wall time of `after`: no matching local time
     * before it can have its first instant after `after`. */
    int64_t local = after_s + jd_tz_offset(tz, after_s);
    local -= ((local % 60) + 60) % 60;
    int64_t horizon = local + 30LL * 366 * 86400; /* Feb 29 on a Monday: 28 years apart */
    /* A repeated hour can hold 60 already-passed matches; a gap maps many
     * to one instant. Either way a few hundred candidates settle it. */
    for (int i = 0; i < 1000; i++) {
        local = next_local(c, local, horizon);
        if (local == INT64_MIN)
            return -1;
        int64_t t = jd_tz_local_to_utc(tz, local, NULL);
        if (t * 1000 > after_ms)
            return t * 1000;
        local += 60;
    }
    return -1;
}

static const struct {
    const char *unit;
    int64_t ms;
} units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000}};

int jd_every_parse(const char *s, int64_t *ms, struct jd_error *err)
{
    if (!s || !*s)
        return jd_error_set(err, JD_EINVAL, NULL, "an interval such as \"30s\" or \"1h30m\"");
    int64_t total = 0;
    const char *p = s;
    while (*p) {
        int64_t v = 0;
        const char *q = p;
        while (isdigit((unsigned char)*p) && p - q < 12)
            v = v * 10 + (*p++ - '0');
        size_t k = 0;
        if (p != q)
            for (; k < sizeof units / sizeof units[0]; k++)
                if (strncmp(p, units[k].unit, strlen(units[k].unit)) == 0)
                    break;
        if (p == q || k == sizeof units / sizeof units[0])
            return jd_error_set(err, JD_EINVAL, NULL,
                                "\"%.40s\" is not an interval such as \"30s\", \"5m\" or "
                                "\"1h30m\" (units ms, s, m, h, d)",
                                s);
        p += strlen(units[k].unit);
        /* Compare before multiplying: 12 digits of days would overflow int64. */
        if (v > JD_EVERY_MAX_MS / units[k].ms)
            return jd_error_set(err, JD_EINVAL, NULL, "interval \"%.40s\" is longer than 366d", s);
        total += v * units[k].ms;
        if (total > JD_EVERY_MAX_MS)
            return jd_error_set(err, JD_EINVAL, NULL, "interval \"%.40s\" is longer than 366d", s);
    }
    if (total < JD_EVERY_MIN_MS)
        return jd_error_set(err, JD_EINVAL, NULL, "interval \"%.40s\" is shorter than 1s", s);
    *ms = total;
    return 0;
}

int64_t jd_every_next(int64_t anchor_ms, int64_t every_ms, int64_t after_ms)
{
    int64_t d = after_ms - anchor_ms;
    int64_t k = d / every_ms - (d % every_ms < 0);
    return anchor_ms + (k + 1) * every_ms;
}
