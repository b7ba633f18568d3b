/*
 * The token bucket (bucket.h). Tokens are a double: limit is at most a
 * million and per_ms at most a day, so the refill rate and any count of
 * tokens are exact enough; the refill is computed from the elapsed time
 * each call, never accumulated per tick.
 */
#include "common/bucket.h"

#include <math.h>

/* Refill sums carry rounding error: a token short by less than this is whole. */
#define JD_BUCKET_EPS 1e-9

void jd_bucket_init(struct jd_bucket *b, uint32_t limit, int64_t per_ms, int64_t now_ms, bool full)
{
    b->limit = limit;
    b->per_ms = per_ms > 0 ? per_ms : 1;
    b->tokens = full ? (double)limit : 0.0;
    b->at_ms = now_ms;
}

static void refill(struct jd_bucket *b, int64_t now_ms)
{
    if (now_ms <= b->at_ms)
        return; /* a clock that stood still (or a caller's older now) adds nothing */
    b->tokens += (double)(now_ms - b->at_ms) * b->limit / (double)b->per_ms;
    if (b->tokens > b->limit)
        b->tokens = b->limit;
    b->at_ms = now_ms;
}

void jd_bucket_set(struct jd_bucket *b, uint32_t limit, int64_t per_ms, int64_t now_ms)
{
    refill(b, now_ms);
    b->limit = limit;
    b->per_ms = per_ms > 0 ? per_ms : 1;
    if (b->tokens > limit)
        b->tokens = limit;
}

bool jd_bucket_ready(struct jd_bucket *b, int64_t now_ms)
{
    if (b->limit == 0)
        return true;
    refill(b, now_ms);
    return b->tokens >= 1.0 - JD_BUCKET_EPS;
}

void jd_bucket_take(struct jd_bucket *b)
{
    if (b->limit == 0)
        return;
    b->tokens -= 1.0;
    if (b->tokens < 0)
        b->tokens = 0;
}

int64_t jd_bucket_wait_ms(struct jd_bucket *b, int64_t now_ms)
{
    if (jd_bucket_ready(b, now_ms))
        return 0;
    double ms = (1.0 - b->tokens) * (double)b->per_ms / b->limit;
    int64_t w = (int64_t)ceil(ms - JD_BUCKET_EPS * (double)b->per_ms);
    return w > 0 ? w : 1;
}
