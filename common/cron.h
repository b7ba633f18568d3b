/*
 * Cron expressions and fixed intervals: parsing, and the next fire time in
 * a time zone (common/tz.h).
 *
 * Cron: five fields, minute hour day-of-month month day-of-week, each a
 * comma list of "*", "N", "N-M", each with an optional "/STEP" ("1-30/2";
 * "5/15" means from 5 to the end in steps of 15); months and weekdays also by
 * English name ("jan", "mon-fri", case-insensitive); day-of-week 0 and 7 are
 * both Sunday. Macros: @yearly (@annually), @monthly, @weekly, @daily
 * (@midnight), @hourly. As in Vixie cron, when both day fields are
 * restricted a day matches if EITHER matches; a day field counts as
 * unrestricted when it starts with "*" (so "*" with a step counts as
 * unrestricted, as there).
 *
 * Daylight saving: a matching local time that does not exist fires once, at
 * the first instant after the gap; one that happens twice fires once, at its
 * first occurrence.
 *
 * Intervals ("30s", "1h30m", "250ms"): a sum of <integer><unit> with units
 * ms, s, m, h, d; at least JD_EVERY_MIN_MS. They fire at anchor + k*interval.
 *
 * Threading: a parsed struct jd_cron is plain data; every function is safe
 * from any thread.
 */
#ifndef JD_COMMON_CRON_H
#define JD_COMMON_CRON_H

#include <stdbool.h>
#include <stdint.h>

struct jd_error;
struct jd_tz;

#define JD_CRON_MAX_LEN 256                /* longer than any sane expression */
#define JD_EVERY_MIN_MS 1000               /* a schedule is not a busy loop */
#define JD_EVERY_MAX_MS (366LL * 86400000) /* a year; longer belongs in cron */

struct jd_cron {
    uint64_t minute;         /* bit i: minute i */
    uint32_t hour;           /* bit i: hour i */
    uint32_t dom;            /* bit i: day i (1-31) */
    uint16_t month;          /* bit i: month i (1-12) */
    uint8_t dow;             /* bit i: weekday i (0 = Sunday) */
    bool dom_star, dow_star; /* the field started with '*' */
};

/* Parse expr. 0, or JD_EINVAL with err->message naming the field and the
 * reason ("hour: 24 is out of range 0-23"); err->pointer is left empty for
 * the caller to set. */
int jd_cron_parse(const char *expr, struct jd_cron *out, struct jd_error *err);

/* The first fire time strictly after after_ms (UTC ms; the result is a
 * whole second), in zone tz. -1 if none within 30 years (cannot happen for
 * an expression jd_cron_parse accepted). */
int64_t jd_cron_next(const struct jd_cron *c, const struct jd_tz *tz, int64_t after_ms);

/* Parse an interval. 0 and *ms, or JD_EINVAL with the reason. */
int jd_every_parse(const char *s, int64_t *ms, struct jd_error *err);

/* The first anchor_ms + k*every_ms (k any integer) strictly after after_ms. */
int64_t jd_every_next(int64_t anchor_ms, int64_t every_ms, int64_t after_ms);

#endif
