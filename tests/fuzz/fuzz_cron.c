/*
 * libFuzzer harness for the schedule time parsers: jd_cron_parse and
 * jd_every_parse on arbitrary text. Invariants: only JD_EINVAL comes back
 * on a rejection, always with a message; an accepted expression always has
 * a next fire time, strictly later, in every zone tried (including two with
 * daylight saving and one with a 30-minute shift), and asking again from
 * that time moves forward. Calls come from libFuzzer's one thread.
 */
#include "common/cron.h"
#include "common/error.h"
#include "common/tz.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 512)
        return 0;
    char text[513];
    memcpy(text, data, size);
    text[size] = '\0';
    struct jd_error err;
    memset(&err, 0, sizeof err);
    int64_t ms;
    int rc = jd_every_parse(text, &ms, &err);
    if (rc != 0 && (rc != JD_EINVAL || err.message[0] == '\0'))
        abort();
    if (rc == 0 && (ms < JD_EVERY_MIN_MS || ms > JD_EVERY_MAX_MS))
        abort();
    struct jd_cron c;
    memset(&err, 0, sizeof err);
    rc = jd_cron_parse(text, &c, &err);
    if (rc != 0) {
        if (rc != JD_EINVAL || err.message[0] == '\0')
            abort();
        return 0;
    }
    static const char *const zones[] = {"UTC", "Europe/Berlin", "America/New_York",
                                        "Australia/Lord_Howe"};
    /* 2026-03-08 (a spring-forward night) and 2026-11-01 (a fall-back one) */
    static const int64_t starts[] = {1772928000000LL, 1793491200000LL, 0};
    for (size_t z = 0; z < sizeof zones / sizeof zones[0]; z++) {
        const struct jd_tz *tz;
        if (jd_tz_get(zones[z], &tz, NULL) != 0)
            continue; /* no tz database here */
        for (size_t s = 0; s < sizeof starts / sizeof starts[0]; s++) {
            int64_t t = starts[s];
            for (int k = 0; k < 3; k++) {
                int64_t next = jd_cron_next(&c, tz, t);
                if (next <= t || next % 1000 != 0)
                    abort();
                t = next;
            }
        }
    }
    return 0;
}
