/*
 * A token bucket: at most `limit` starts per `per_ms`, with bursts of up to
 * `limit`. Tokens refill continuously at limit / per_ms; taking one needs a
 * whole token. Time is passed in (monotonic milliseconds), so callers and
 * tests choose the clock.
 *
 * Threading: none inside; the owner serialises calls (the job layer holds
 * its mutex).
 */
#ifndef JD_COMMON_BUCKET_H
#define JD_COMMON_BUCKET_H

#include <stdbool.h>
#include <stdint.h>

struct jd_bucket {
    uint32_t limit; /* capacity and tokens per period; 0: no limit (always ready) */
    int64_t per_ms; /* the period, > 0 when limit > 0 */
    double tokens;  /* 0..limit, as of at_ms */
    int64_t at_ms;
};

/* Set the rate. full: start with limit tokens (a new limit); else empty
 * (e.g. after a restart, when the starts just before it are not known, so
 * the stream of starts still conforms across it). */
void jd_bucket_init(struct jd_bucket *b, uint32_t limit, int64_t per_ms, int64_t now_ms, bool full);
/* Change the rate keeping what is in the bucket (capped at the new limit). */
void jd_bucket_set(struct jd_bucket *b, uint32_t limit, int64_t per_ms, int64_t now_ms);
/* Refill up to now; true if a whole token is there (or there is no limit). */
bool jd_bucket_ready(struct jd_bucket *b, int64_t now_ms);
/* Take one token (after jd_bucket_ready said true). */
void jd_bucket_take(struct jd_bucket *b);
/* Milliseconds until jd_bucket_ready turns true (0: it is), rounded up so
 * that a timer armed for it never fires early. */
int64_t jd_bucket_wait_ms(struct jd_bucket *b, int64_t now_ms);

#endif
