/*
 * Route matching: the path is split on '/' into at most MAXSEG segments and
 * compared with the patterns of a route table, segment by segment. No
 * allocation, no global state but the constant table; every input
 * (including garbage from the fuzzer) ends in a 0, 404 or 405.
 */
#include "api/router.h"

#include "common/error.h"

#include <stdbool.h>
#include <string.h>

static const struct jd_route_def table[] = {
#define JD_ROUTE_ROW(id, method, pattern, handler, flags) {id, method, pattern, flags},
    JD_ROUTES(JD_ROUTE_ROW)
#undef JD_ROUTE_ROW
};

#define NPAT (sizeof table / sizeof table[0])
#define MAXSEG 16 /* deeper than any route but a rest-of-path one needs */

struct seg {
    const char *p;
    size_t n;
};

/* Split "/a/b/c" into segments; a trailing slash is ignored ("/v1/jobs/"
 * is "/v1/jobs"; "/" is no segment). Returns the count, or -1 when there are too many or the
 * path does not start with '/' or has an empty segment. */
static int split(const char *path, struct seg *segs)
{
    if (path == NULL || path[0] != '/')
        return -1;
    const char *p = path + 1;
    int n = 0;
    while (*p != '\0') {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 0)
            return -1;
        if (n == MAXSEG)
            return -1;
        segs[n].p = p;
        segs[n].n = len;
        n++;
        if (slash == NULL)
            break;
        p = slash + 1;
    }
    return n;
}

static unsigned method_bit(const char *method)
{
    if (method == NULL)
        return 0;
    if (strcmp(method, "GET") == 0)
        return JD_M_GET;
    if (strcmp(method, "HEAD") == 0)
        return JD_M_HEAD;
    if (strcmp(method, "POST") == 0)
        return JD_M_POST;
    if (strcmp(method, "PUT") == 0)
        return JD_M_PUT;
    if (strcmp(method, "DELETE") == 0)
        return JD_M_DELETE;
    return 0;
}

enum how { NO_MATCH = 0, VIA_REST, VIA_PARAM, LITERAL };

/* How pattern matches segs[0..n); *param is the index of the {name}
 * segment, or -1; *rest the index where "*" took over, or -1. A literal
 * segment is compared in place (no search for its end: most patterns fail
 * on their first or second segment). */
static enum how pattern_match(const char *pattern, const struct seg *segs, int n, int *param,
                              int *rest)
{
    enum how how = LITERAL;
    const char *p = pattern + 1; /* patterns start with '/' */
    *param = *rest = -1;
    for (int k = 0;; k++) {
        if (*p == '\0')
            return k == n ? how : NO_MATCH;
        if (p[0] == '*' && (p[1] == '\0' || p[1] == '/')) {
            *rest = k;
            return VIA_REST;
        }
        if (k == n)
            return NO_MATCH;
        if (p[0] == '{') {
            *param = k;
            how = VIA_PARAM;
            const char *slash = strchr(p, '/');
            p = slash ? slash : p + strlen(p);
        } else {
            /* compared in place: the segment holds no 0, so the loop stops
             * at the pattern's end at the latest (no strncmp call per row) */
            size_t len = segs[k].n, i = 0;
            const char *q = segs[k].p;
            while (i < len && p[i] == q[i])
                i++;
            if (i != len || (p[len] != '/' && p[len] != '\0'))
                return NO_MATCH;
            p += len;
        }
        if (*p == '/')
            p++;
    }
}

/* The first letters of a request path's first segment and, for a path
 * under "/v1/", of its second one (0 otherwise). */
struct lead {
    char first, second;
};

static struct lead lead_of(const char *path)
{
    struct lead l = {.first = path[1]};
    if (path[1] == 'v' && path[2] == '1' && path[3] == '/')
        l.second = path[4];
    return l;
}

/* Whether pattern cannot match the path l came from (split: no empty
 * segments) by those letters: most rows are skipped without a full
 * pattern_match. */
static bool quick_reject(const char *pattern, struct lead l)
{
    char c = pattern[1];
    if (c != '{' && c != '*' && c != l.first)
        return true;
    if (!l.second || c != 'v' || pattern[2] != '1' || pattern[3] != '/')
        return false;
    c = pattern[4];
    return c != '{' && c != '*' && c != l.second;
}

/* Copy the parameter into m: one segment, or segs[rest..n) joined by '/'.
 * JD_ENOENT if it is too long, or the rest holds a "." or ".." segment. */
static int take_param(struct jd_route_match *m, const struct seg *segs, int n, int param, int rest)
{
    if (param >= 0) {
        if (segs[param].n >= JD_ROUTE_PARAM_MAX)
            return JD_ENOENT;
        memcpy(m->param, segs[param].p, segs[param].n);
        m->param[segs[param].n] = '\0';
    }
    if (rest >= 0 && rest < n) {
        for (int k = rest; k < n; k++)
            if ((segs[k].n == 1 && segs[k].p[0] == '.') ||
                (segs[k].n == 2 && segs[k].p[0] == '.' && segs[k].p[1] == '.'))
                return JD_ENOENT;
        size_t len = (size_t)(segs[n - 1].p + segs[n - 1].n - segs[rest].p);
        if (len >= JD_ROUTE_PARAM_MAX)
            return JD_ENOENT;
        memcpy(m->param, segs[rest].p, len);
        m->param[len] = '\0';
    }
    return 0;
}

int jd_router_match_in(const struct jd_route_def *rows, size_t nrows, const char *method,
                       const char *path, struct jd_route_match *m)
{
    struct seg segs[MAXSEG];
    memset(m, 0, sizeof *m);
    int n = split(path, segs);
    if (n < 0) /* "/" is zero segments: only the pattern "/" matches it */
        return JD_ENOENT;
    unsigned mb = method_bit(method);
    unsigned lookup = mb == JD_M_HEAD ? JD_M_GET : mb;

    /* The best (most literal) kind of match decides which patterns count.
     * Each pattern is matched once; the results are kept for the second
     * walk (a table longer than MAXROWS is matched again instead). */
    enum { MAXROWS = 128 };
    struct {
        unsigned char how;
        signed char param, rest;
    } seen[MAXROWS];
    enum how best = NO_MATCH;
    struct lead lead = lead_of(path);
    for (size_t i = 0; i < nrows; i++) {
        int param = -1, rest = -1;
        enum how how = quick_reject(rows[i].pattern, lead)
                           ? NO_MATCH
                           : pattern_match(rows[i].pattern, segs, n, &param, &rest);
        if (i < MAXROWS) {
            seen[i].how = (unsigned char)how;
            seen[i].param = (signed char)param; /* both < MAXSEG */
            seen[i].rest = (signed char)rest;
        }
        if (how > best)
            best = how;
    }
    if (best == NO_MATCH)
        return JD_ENOENT;
    for (size_t i = 0; i < nrows; i++) {
        int param, rest;
        enum how how;
        if (i < MAXROWS) {
            how = (enum how)seen[i].how;
            param = seen[i].param;
            rest = seen[i].rest;
        } else {
            how = pattern_match(rows[i].pattern, segs, n, &param, &rest);
        }
        if (how != best)
            continue;
        m->allow |= rows[i].method;
        if (rows[i].method == JD_M_GET)
            m->allow |= JD_M_HEAD;
        if (lookup != 0 && rows[i].method == lookup && m->route == JD_ROUTE_NONE) {
            if (take_param(m, segs, n, param, rest) != 0)
                return JD_ENOENT;
            m->route = rows[i].route;
            m->flags = rows[i].flags;
        }
    }
    return m->route == JD_ROUTE_NONE ? JD_ECONFLICT : 0;
}

int jd_router_match(const char *method, const char *path, struct jd_route_match *m)
{
    return jd_router_match_in(table, NPAT, method, path, m);
}

const char *jd_router_allow_text(unsigned allow)
{
    /* Indexed by GET+HEAD (both or neither), POST, PUT, DELETE. */
    static const char *const text[16] = {
        "",
        "GET, HEAD",
        "POST",
        "GET, HEAD, POST",
        "PUT",
        "GET, HEAD, PUT",
        "POST, PUT",
        "GET, HEAD, POST, PUT",
        "DELETE",
        "GET, HEAD, DELETE",
        "POST, DELETE",
        "GET, HEAD, POST, DELETE",
        "PUT, DELETE",
        "GET, HEAD, PUT, DELETE",
        "POST, PUT, DELETE",
        "GET, HEAD, POST, PUT, DELETE",
    };
    unsigned get = allow & (JD_M_GET | JD_M_HEAD);
    if (get != 0 && get != (JD_M_GET | JD_M_HEAD))
        return ""; /* a GET route always answers HEAD too */
    unsigned i = (get ? 1u : 0u) | (allow & JD_M_POST ? 2u : 0u) | (allow & JD_M_PUT ? 4u : 0u) |
                 (allow & JD_M_DELETE ? 8u : 0u);
    return text[i];
}

const char *jd_route_name(enum jd_route r)
{
    for (size_t i = 0; i < NPAT; i++)
        if (table[i].route == r)
            return table[i].pattern;
    return "other";
}

int jd_route_is_v1(enum jd_route r)
{
    for (size_t i = 0; i < NPAT; i++)
        if (table[i].route == r)
            return (table[i].flags & JD_RF_V1) != 0;
    return 0;
}
