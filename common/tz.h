/*
 * Time zones from the system tz database (TZif files, RFC 8536), read by
 * our own parser rather than through localtime_r/mktime: those read the
 * zone from the process-global TZ variable, so converting a time for one
 * schedule in Europe/Berlin and another in America/New_York at once would
 * need a global lock around setenv+tzset (and setenv races every getenv in
 * the process). A parsed zone is immutable, so any thread may use it
 * without a lock.
 *
 * A zone holds its transition table (64-bit section of TZif v2+) and the
 * footer's POSIX TZ rule, which decides every instant after the last listed
 * transition (the "slim" files some distributions ship list no future
 * transitions at all).
 *
 * Zones are loaded once per name and kept for the life of the process (a
 * few hundred names exist, so this is bounded by the database, not by
 * clients: a name that does not load is not kept). Threading: every
 * function is safe from any thread.
 */
#ifndef JD_COMMON_TZ_H
#define JD_COMMON_TZ_H

#include <stdbool.h>
#include <stdint.h>

struct jd_error;
struct jd_tz;

#define JD_TZ_NAME_MAX 64 /* the longest IANA name is 32 characters */

/* The zone named name ("Europe/Berlin", "UTC"), from $TZDIR or
 * /usr/share/zoneinfo. 0 and *out (borrowed, valid until exit), or
 * JD_EINVAL with err naming the reason (bad characters, unknown zone, not a
 * TZif file). "UTC" works without a tz database. */
int jd_tz_get(const char *name, const struct jd_tz **out, struct jd_error *err);

/* The built-in UTC zone (never fails). */
const struct jd_tz *jd_tz_utc(void);

/* The name the zone was loaded as (borrowed). */
const char *jd_tz_name(const struct jd_tz *tz);

/* The UTC offset in seconds (east positive) in effect at utc_s. */
int32_t jd_tz_offset(const struct jd_tz *tz, int64_t utc_s);

/*
 * The instant a local wall-clock time (seconds since 1970-01-01 00:00 as if
 * the local clock were UTC) happens. A time that happens twice (the hour
 * repeated when clocks go back) gives the first; a time that does not
 * happen (skipped when clocks go forward) gives the first instant after the
 * gap, i.e. the transition itself, and sets *skipped (may be NULL).
 */
int64_t jd_tz_local_to_utc(const struct jd_tz *tz, int64_t local_s, bool *skipped);

/* Proleptic Gregorian calendar arithmetic (no time zone): days since
 * 1970-01-01 for a date (month 1-12, day 1-31) and back, and weekday
 * (0 = Sunday) of a day number. */
int64_t jd_days_from_civil(int64_t y, int m, int d);
void jd_civil_from_days(int64_t days, int64_t *y, int *m, int *d);
int jd_weekday(int64_t days);
int jd_days_in_month(int64_t y, int m);

#endif
