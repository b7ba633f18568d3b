/*
 * TZif reader (RFC 8536) and POSIX TZ rule evaluator. See common/tz.h for
 * why this does not go through localtime_r.
 *
 * Invariants: a struct jd_tz is never modified after load_zone returns it;
 * the cache only grows (under cache_mu) and its entries live until exit.
 */
#include "common/tz.h"

#include "common/alloc.h"
#include "common/error.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TZ_FILE_MAX (256 * 1024) /* the largest zone file in tzdata is under 4 KiB (fat: 8) */
#define TZ_MAX_TIMES 5000        /* RFC 8536 sets no bound; tzdata's fat files hold < 2000 */
#define TZ_MAX_TYPES 256         /* a type index is one byte */
#define WINDOW_S                                                                                   \
    (3 * 86400) /* offsets are within +-26 h, so a local time's instants are                       \
                   within this of it */

/* A POSIX date rule: Jn (julian, no Feb 29), n (zero-based, with Feb 29),
 * Mm.w.d (weekday d of week w of month m; w 5 = last). */
struct rule_date {
    char kind; /* 'J', 'D' or 'M' */
    int n, m, w, d;
    int32_t time_s; /* local time of day of the change, may be < 0 or > 24 h */
};

struct jd_tz {
    char name[JD_TZ_NAME_MAX + 1];
    size_t ntimes;
    int64_t *times;   /* transition instants, ascending */
    uint8_t *idx;     /* type in effect from times[i] on */
    int32_t *utoff;   /* per type */
    int32_t off_none; /* before the first transition (type 0) */
    /* the footer rule, for instants after the last transition */
    bool has_rule, has_dst;
    int32_t std_off, dst_off; /* east positive */
    struct rule_date start, end;
};

struct trans {
    int64_t at;
    int32_t before, after;
};

/* ---- calendar ---- */

/* Howard Hinnant's days_from_civil: exact for the proleptic Gregorian
 * calendar over the whole int64 range we use. */
int64_t jd_days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

void jd_civil_from_days(int64_t z, int64_t *y, int *m, int *d)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

int jd_weekday(int64_t days)
{
    int64_t w = (days + 4) % 7; /* 1970-01-01 was a Thursday */
    return (int)(w < 0 ? w + 7 : w);
}

int jd_days_in_month(int64_t y, int m)
{
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return days[m - 1] + (m == 2 && leap);
}

static int64_t floor_div(int64_t a, int64_t b)
{
    return a / b - (a % b != 0 && (a < 0) != (b < 0));
}

/* ---- the POSIX rule ---- */

/* Day number (since 1970) a rule date falls on in year y. */
static int64_t rule_day(const struct rule_date *r, int64_t y)
{
    int64_t jan1 = jd_days_from_civil(y, 1, 1);
    if (r->kind == 'J') {
        bool leap = jd_days_in_month(y, 2) == 29;
        return jan1 + r->n - 1 + (leap && r->n >= 60);
    }
    if (r->kind == 'D')
        return jan1 + r->n;
    int64_t first = jd_days_from_civil(y, r->m, 1);
    int64_t day = first + (r->d - jd_weekday(first) + 7) % 7 + 7 * (r->w - 1);
    int64_t last = first + jd_days_in_month(y, r->m) - 1;
    while (day > last)
        day -= 7;
    return day;
}

/* The rule's two transitions in each of the years y-1..y+1, ascending. */
static size_t rule_transitions(const struct jd_tz *tz, int64_t y, struct trans out[6])
{
    size_t n = 0;
    for (int64_t yy = y - 1; yy <= y + 1; yy++) {
        struct trans s = {rule_day(&tz->start, yy) * 86400 + tz->start.time_s - tz->std_off,
                          tz->std_off, tz->dst_off};
        struct trans e = {rule_day(&tz->end, yy) * 86400 + tz->end.time_s - tz->dst_off,
                          tz->dst_off, tz->std_off};
        /* insertion sort; on a tie (a zone in DST all year) the end goes
         * first, so the start that follows it decides */
        struct trans two[2] = {e, s};
        for (int k = 0; k < 2; k++) {
            size_t i = n++;
            while (i > 0 && out[i - 1].at > two[k].at) {
                out[i] = out[i - 1];
                i--;
            }
            out[i] = two[k];
        }
    }
    return n;
}

static int64_t year_of(int64_t s)
{
    int64_t y;
    int m, d;
    jd_civil_from_days(floor_div(s, 86400), &y, &m, &d);
    return y;
}

static int32_t rule_offset(const struct jd_tz *tz, int64_t t)
{
    if (!tz->has_dst)
        return tz->std_off;
    struct trans tr[6];
    size_t n = rule_transitions(tz, year_of(t + tz->std_off), tr);
    int32_t off = tz->std_off;
    for (size_t i = 0; i < n && tr[i].at <= t; i++)
        off = tr[i].after;
    return off;
}

/* ---- lookups ---- */

/* Index of the last transition at or before t, or -1. */
static ptrdiff_t find_transition(const struct jd_tz *tz, int64_t t)
{
    size_t lo = 0, hi = tz->ntimes;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (tz->times[mid] <= t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (ptrdiff_t)lo - 1;
}

int32_t jd_tz_offset(const struct jd_tz *tz, int64_t t)
{
    ptrdiff_t i = find_transition(tz, t);
    if (tz->has_rule && (size_t)(i + 1) == tz->ntimes && (tz->ntimes == 0 || t > tz->times[i]))
        return rule_offset(tz, t);
    return i < 0 ? tz->off_none : tz->utoff[tz->idx[i]];
}

/* Every transition with lo <= at <= hi (a few at most), ascending. */
static size_t transitions_in(const struct jd_tz *tz, int64_t lo, int64_t hi, struct trans *out,
                             size_t max)
{
    size_t n = 0;
    ptrdiff_t i = find_transition(tz, lo - 1) + 1;
    for (; (size_t)i < tz->ntimes && tz->times[i] <= hi && n < max; i++) {
        int32_t before = i == 0 ? tz->off_none : tz->utoff[tz->idx[i - 1]];
        out[n++] = (struct trans){tz->times[i], before, tz->utoff[tz->idx[i]]};
    }
    if (!tz->has_rule || !tz->has_dst)
        return n;
    int64_t last = tz->ntimes ? tz->times[tz->ntimes - 1] : INT64_MIN;
    for (int64_t y = year_of(lo); y <= year_of(hi) + 1; y += 3) {
        struct trans tr[6];
        size_t k = rule_transitions(tz, y, tr);
        for (size_t j = 0; j < k && n < max; j++) {
            if (tr[j].at < lo || tr[j].at > hi || tr[j].at <= last || tr[j].before == tr[j].after)
                continue;
            bool dup = false;
            for (size_t m = 0; m < n; m++)
                dup |= out[m].at == tr[j].at;
            if (!dup)
                out[n++] = tr[j];
        }
    }
    /* the rule's years may interleave: sort (n is tiny) */
    for (size_t a = 1; a < n; a++)
        for (size_t b = a; b > 0 && out[b - 1].at > out[b].at; b--) {
            struct trans x = out[b];
            out[b] = out[b - 1];
            out[b - 1] = x;
        }
    return n;
}

int64_t jd_tz_local_to_utc(const struct jd_tz *tz, int64_t local_s, bool *skipped)
{
    struct trans tr[16];
    size_t n = transitions_in(tz, local_s - WINDOW_S, local_s + WINDOW_S, tr, 16);
    /* Every offset in force near local_s is a candidate; an instant
     * local_s - o is a solution when o is really in force then. */
    int64_t best = INT64_MAX;
    int32_t cand = jd_tz_offset(tz, local_s - WINDOW_S);
    for (size_t i = 0; i <= n; i++) {
        if (i > 0)
            cand = tr[i - 1].after;
        int64_t t = local_s - cand;
        if (jd_tz_offset(tz, t) == cand && t < best)
            best = t;
    }
    if (skipped)
        *skipped = best == INT64_MAX;
    if (best != INT64_MAX)
        return best;
    /* In a gap: the clock jumped from before local_s to after it at a
     * transition; that instant is the first one after the gap. */
    for (size_t i = 0; i < n; i++)
        if (tr[i].at + tr[i].before <= local_s && local_s < tr[i].at + tr[i].after)
            return tr[i].at;
    return local_s - jd_tz_offset(tz, local_s); /* unreachable with sane data */
}

const char *jd_tz_name(const struct jd_tz *tz)
{
    return tz->name;
}

/* ---- parsing the POSIX TZ footer ("CET-1CEST,M3.5.0,M10.5.0/3") ---- */

static bool parse_abbr(const char **p)
{
    const char *s = *p;
    if (*s == '<') {
        const char *e = strchr(s, '>');
        if (!e || e - s < 4)
            return false;
        *p = e + 1;
        return true;
    }
    size_t n = 0;
    while ((s[n] >= 'A' && s[n] <= 'Z') || (s[n] >= 'a' && s[n] <= 'z'))
        n++;
    *p = s + n;
    return n >= 3;
}

/* [+-]hh[:mm[:ss]], hours up to max_h. */
static bool parse_hms(const char **p, int max_h, int32_t *out)
{
    const char *s = *p;
    int sign = 1;
    if (*s == '+' || *s == '-')
        sign = *s++ == '-' ? -1 : 1;
    int part[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++) {
        if (k > 0) {
            if (*s != ':')
                break;
            s++;
        }
        int digits = 0, v = 0;
        while (*s >= '0' && *s <= '9' && digits < 3) {
            v = v * 10 + (*s++ - '0');
            digits++;
        }
        if (digits == 0 || (k == 0 ? v > max_h : v > 59))
            return false;
        part[k] = v;
    }
    *out = sign * (part[0] * 3600 + part[1] * 60 + part[2]);
    *p = s;
    return true;
}

static bool parse_int(const char **p, int lo, int hi, int *out)
{
    const char *s = *p;
    int v = 0, digits = 0;
    while (*s >= '0' && *s <= '9' && digits < 4) {
        v = v * 10 + (*s++ - '0');
        digits++;
    }
    if (digits == 0 || v < lo || v > hi)
        return false;
    *out = v;
    *p = s;
    return true;
}

static bool parse_rule_date(const char **p, struct rule_date *r)
{
    const char *s = *p;
    if (*s == 'J') {
        s++;
        r->kind = 'J';
        if (!parse_int(&s, 1, 365, &r->n))
            return false;
    } else if (*s == 'M') {
        s++;
        r->kind = 'M';
        if (!parse_int(&s, 1, 12, &r->m) || *s++ != '.' || !parse_int(&s, 1, 5, &r->w) ||
            *s++ != '.' || !parse_int(&s, 0, 6, &r->d))
            return false;
    } else {
        r->kind = 'D';
        if (!parse_int(&s, 0, 365, &r->n))
            return false;
    }
    r->time_s = 2 * 3600;
    if (*s == '/') {
        s++;
        if (!parse_hms(&s, 167, &r->time_s)) /* RFC 8536 3.3.1 extends hours to 167 */
            return false;
    }
    *p = s;
    return true;
}

static bool parse_posix(const char *s, struct jd_tz *tz)
{
    int32_t off;
    if (!parse_abbr(&s) || !parse_hms(&s, 24, &off))
        return false;
    tz->std_off = -off; /* POSIX offsets are west positive */
    tz->has_rule = true;
    if (*s == '\0')
        return true;
    if (!parse_abbr(&s))
        return false;
    tz->has_dst = true;
    tz->dst_off = tz->std_off + 3600;
    if (*s != ',' && *s != '\0') {
        if (!parse_hms(&s, 24, &off))
            return false;
        tz->dst_off = -off;
    }
    if (*s == '\0') { /* no rule given: POSIX leaves it to the implementation; use the US one */
        tz->start = (struct rule_date){'M', 0, 3, 2, 0, 7200};
        tz->end = (struct rule_date){'M', 0, 11, 1, 0, 7200};
        return true;
    }
    if (*s++ != ',' || !parse_rule_date(&s, &tz->start) || *s++ != ',' ||
        !parse_rule_date(&s, &tz->end))
        return false;
    return *s == '\0';
}

/* ---- parsing TZif ---- */

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int64_t be64(const unsigned char *p)
{
    return (int64_t)((uint64_t)be32(p) << 32 | be32(p + 4));
}

static void tz_free(struct jd_tz *tz)
{
    if (!tz)
        return;
    free(tz->times);
    free(tz->idx);
    free(tz->utoff);
    free(tz);
}

/* Parse buf (len bytes) into tz. false with *why set on a malformed file. */
static bool parse_tzif(const unsigned char *buf, size_t len, struct jd_tz *tz, const char **why)
{
    *why = "not a TZif file";
    if (len < 44 || memcmp(buf, "TZif", 4) != 0)
        return false;
    /* The v1 block uses 32-bit times; v2+ repeats the data with 64-bit
     * times after it, then a footer. Skip to the v2 block when there is one. */
    const unsigned char *h = buf;
    int time_size = 4;
    uint32_t c[6];
    for (int pass = 0; pass < 2; pass++) {
        if ((size_t)(h - buf) + 44 > len || memcmp(h, "TZif", 4) != 0)
            return false;
        for (int k = 0; k < 6; k++)
            c[k] = be32(h + 20 + 4 * k);
        /* isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt */
        if (c[3] > TZ_MAX_TIMES || c[4] == 0 || c[4] > TZ_MAX_TYPES || c[5] > 4096 || c[2] > 1000 ||
            c[0] > c[4] || c[1] > c[4]) {
            *why = "TZif counts out of range";
            return false;
        }
        size_t body = (size_t)c[3] * time_size + c[3] + (size_t)c[4] * 6 + c[5] +
                      (size_t)c[2] * (time_size + 4) + c[1] + c[0];
        if ((size_t)(h - buf) + 44 + body > len) {
            *why = "truncated TZif file";
            return false;
        }
        if (pass == 1 || h[4] < '2')
            break;
        h += 44 + body;
        time_size = 8;
    }
    if (c[2] != 0) {
        *why = "zones with leap seconds (right/...) are not supported";
        return false;
    }
    const unsigned char *p = h + 44;
    tz->ntimes = c[3];
    tz->times = jd_xcalloc(c[3] + 1, sizeof *tz->times);
    tz->idx = jd_xcalloc(c[3] + 1, 1);
    tz->utoff = jd_xcalloc(c[4], sizeof *tz->utoff);
    for (uint32_t i = 0; i < c[3]; i++, p += time_size) {
        tz->times[i] = time_size == 8 ? be64(p) : (int32_t)be32(p);
        if (i > 0 && tz->times[i] <= tz->times[i - 1]) {
            *why = "TZif transitions out of order";
            return false;
        }
    }
    for (uint32_t i = 0; i < c[3]; i++) {
        tz->idx[i] = *p++;
        if (tz->idx[i] >= c[4]) {
            *why = "TZif type index out of range";
            return false;
        }
    }
    for (uint32_t i = 0; i < c[4]; i++, p += 6) {
        int32_t off = (int32_t)be32(p);
        if (off < -25 * 3600 || off > 26 * 3600) {
            *why = "TZif offset out of range";
            return false;
        }
        tz->utoff[i] = off;
    }
    tz->off_none = tz->utoff[0];
    p += c[5] + c[1] + c[0];
    if (time_size == 8 && (size_t)(p - buf) < len && *p == '\n') {
        const unsigned char *e = memchr(p + 1, '\n', len - (size_t)(p + 1 - buf));
        if (e && e - p - 1 > 0 && e - p - 1 < 128) {
            char footer[128];
            memcpy(footer, p + 1, (size_t)(e - p - 1));
            footer[e - p - 1] = '\0';
            if (!parse_posix(footer, tz)) {
                *why = "TZif footer is not a POSIX TZ rule we understand";
                return false;
            }
        }
    }
    return true;
}

/* Zone names: IANA spellings only, so a name can never leave the zone
 * directory ("../../etc/passwd") or name something odd ("./", "a//b"). */
static bool valid_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > JD_TZ_NAME_MAX || name[0] == '/' || name[n - 1] == '/')
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
                  (ch >= '0' && ch <= '9') || ch == '/' || ch == '_' || ch == '-' || ch == '+' ||
                  ch == '.';
        if (!ok || (ch == '/' && name[i + 1] == '/'))
            return false;
        /* a component may not start with '.' (no ".", "..", hidden files) */
        if (ch == '.' && (i == 0 || name[i - 1] == '/'))
            return false;
    }
    return true;
}

static int load_zone(const char *name, struct jd_tz **out, struct jd_error *err)
{
    const char *dir = getenv("TZDIR");
    if (!dir || !*dir)
        dir = "/usr/share/zoneinfo";
    char *path = jd_xasprintf("%s/%s", dir, name);
    unsigned char *buf = NULL;
    struct jd_tz *tz = NULL;
    int rc = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = jd_error_set(err, JD_EINVAL, NULL, "unknown time zone \"%s\" (not in %s)", name, dir);
        goto fail;
    }
    if (st.st_size > TZ_FILE_MAX) {
        rc = jd_error_set(err, JD_EINVAL, NULL, "time zone file %s is too large", path);
        goto fail;
    }
    buf = jd_xmalloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    tz = jd_xcalloc(1, sizeof *tz);
    snprintf(tz->name, sizeof tz->name, "%s", name);
    const char *why;
    if (!parse_tzif(buf, got, tz, &why)) {
        rc = jd_error_set(err, JD_EINVAL, NULL, "time zone \"%s\": %s", name, why);
        goto fail;
    }
    *out = tz;
    tz = NULL;
fail:
    tz_free(tz);
    free(buf);
    if (fd >= 0)
        close(fd);
    free(path);
    return rc;
}

/* ---- the cache ---- */

struct cached {
    struct jd_tz *tz;
    struct cached *next;
};
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cached *cache; /* under cache_mu; entries live until exit */

static const struct jd_tz utc_zone = {.name = "UTC", .has_rule = true};

const struct jd_tz *jd_tz_utc(void)
{
    return &utc_zone;
}

int jd_tz_get(const char *name, const struct jd_tz **out, struct jd_error *err)
{
    if (!name || !valid_name(name))
        return jd_error_set(err, JD_EINVAL, NULL,
                            "time zone must be an IANA name such as \"Europe/Berlin\"");
    int rc = 0;
    pthread_mutex_lock(&cache_mu);
    struct cached *c = cache;
    while (c && strcmp(c->tz->name, name) != 0)
        c = c->next;
    if (!c) {
        struct jd_tz *tz = NULL;
        rc = load_zone(name, &tz, err);
        if (rc == JD_EINVAL && strcmp(name, "UTC") == 0) {
            *out = &utc_zone; /* no tz database: UTC still works */
            pthread_mutex_unlock(&cache_mu);
            jd_error_clear(err);
            return 0;
        }
        if (rc == 0) {
            c = jd_xmalloc(sizeof *c);
            c->tz = tz;
            c->next = cache;
            cache = c;
        }
    }
    if (c)
        *out = c->tz;
    pthread_mutex_unlock(&cache_mu);
    return rc;
}
