/*
 * Time: a monotonic clock in nanoseconds for deadlines and durations, and the
 * wall clock in milliseconds since the epoch for what is stored and shown.
 * Both go through a replaceable function pointer so tests can drive a fake
 * clock (docs/architecture.md, "Testing"). Setting the clock is not thread-safe: do it before
 * starting threads.
 */
#ifndef JD_COMMON_CLOCK_H
#define JD_COMMON_CLOCK_H

#include <stddef.h>
#include <stdint.h>

struct jd_clock {
    uint64_t (*mono_ns)(void); /* monotonic nanoseconds */
    int64_t (*wall_ms)(void);  /* milliseconds since 1970-01-01 UTC */
};

/* The clock in use; defaults to the real one. */
extern struct jd_clock jd_clock;

static inline uint64_t jd_now_ns(void)
{
    return jd_clock.mono_ns();
}

static inline int64_t jd_wall_ms(void)
{
    return jd_clock.wall_ms();
}

uint64_t jd_clock_real_mono_ns(void);
int64_t jd_clock_real_wall_ms(void);

/* Format ms since the epoch as RFC 3339 UTC with milliseconds
 * ("2026-11-21T23:27:37.123Z") into buf (at least 32 bytes). */
void jd_time_format(int64_t wall_ms, char *buf, size_t len);

/* Parse RFC 3339 ("2026-11-21T23:27:37Z", optional fraction, Z or +hh:mm).
 * A day the month does not have ("2026-02-30") is refused, not rolled over.
 * Returns 0 and sets *wall_ms, or JD_EINVAL. */
int jd_time_parse(const char *s, int64_t *wall_ms);

/* Parse a duration: "30s", "500ms", "2m", "1h", "7d", "1.5s" or a bare
 * number of seconds (plain decimal: no sign, exponent, hex, NaN or
 * infinity). Returns 0 and sets *ms, or JD_EINVAL. */
int jd_duration_parse(const char *s, int64_t *ms);

#endif
