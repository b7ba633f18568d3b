/*
 * Parse benchmark: the slowest job definitions a client can send.
 *
 * Builds hostile bodies as large as the server accepts (a single definition
 * up to the 1 MiB definition limit, a batch up to the default --max-body of
 * 4 MiB), each aimed at one check of the parse and validate path: many object
 * members (unknown, duplicate, labels, retry, step members), references that
 * index big arrays and objects, splices that multiply a string, whole-value
 * references, deep nesting, many steps. Each body goes through what a submit
 * does before anything is stored: jd_jobdef_parse (or jd_jobdef_parse_batch)
 * with the real plugins from $JD_BUILD/plugins and the default limits.
 *
 * Prints one line per body: its size, the best of --reps runs, the answer
 * (0 or a JD_E* code with its pointer), and the peak RSS so far; then the
 * slowest body. Exits 1 if the slowest takes longer than --budget-ms
 * (default 1000), so a regression to quadratic checks fails loudly.
 * --only TEXT runs the bodies whose name contains TEXT.
 *
 * Threading: single-threaded.
 */
#include "common/alloc.h"
#include "common/error.h"
#include "plugins/registry.h"
#include "server/jobdef.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define DEF_LIMIT ((size_t)1 << 20) /* jd_jobdef_limits' default definition limit */
#define MAX_BODY ((size_t)4 << 20)  /* server/config.c's default --max-body */

struct buf {
    char *p;
    size_t n, cap;
};

static void put(struct buf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (b->p && (size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        b->cap = (b->cap + (size_t)k + 1) * 2;
        b->p = jd_xrealloc(b->p, b->cap);
    }
}

/* Room left for a filler element of `elem` bytes before the body (with
 * `tail` more bytes to close it) reaches `limit`. */
static bool room(const struct buf *b, size_t elem, size_t tail, size_t limit)
{
    return b->n + elem + tail <= limit;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static long rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024;
}

/* ---- the bodies ---- */

/* {"handler":"echo", <prefix> "k0":0,"k1":0, ... <suffix>} up to the limit. */
static void members(struct buf *b, const char *prefix, const char *fmt, const char *suffix)
{
    put(b, "%s", prefix);
    char elem[64];
    for (unsigned i = 0;; i++) {
        int n = snprintf(elem, sizeof elem, fmt, i);
        if (!room(b, (size_t)n + 1, strlen(suffix), DEF_LIMIT))
            break;
        put(b, "%s%s", i ? "," : "", elem);
    }
    put(b, "%s", suffix);
}

static void body_root_unknown(struct buf *b)
{
    members(b, "{\"handler\":\"echo\",", "\"k%u\":0", "}");
}

static void body_root_unknown_last(struct buf *b)
{
    /* Every member known but repeated, except an unknown one at the end. */
    members(b, "{", "\"queue\":\"q%u\"", ",\"zz\":0,\"handler\":\"echo\"}");
}

static void body_labels(struct buf *b)
{
    members(b, "{\"handler\":\"echo\",\"labels\":{", "\"l%u\":\"\"", "}}");
}

static void body_retry(struct buf *b)
{
    members(b, "{\"handler\":\"echo\",\"retry\":{", "\"r%u\":0", "}}");
}

static void body_step_members(struct buf *b)
{
    members(b, "{\"steps\":[{\"id\":\"a\",\"call\":\"echo\",", "\"m%u\":0", "}]}");
}

static void body_args_members(struct buf *b)
{
    members(b, "{\"handler\":\"echo\",\"args\":{", "\"m%u\":0", "}}");
}

static void body_exec_args_members(struct buf *b)
{
    members(b, "{\"handler\":\"exec\",\"args\":{\"argv\":[\"/bin/true\"],", "\"m%u\":0", "}}");
}

static void body_input_members(struct buf *b)
{
    members(b, "{\"handler\":\"echo\",\"input\":{", "\"m%u\":0", "}}");
}

/* References into a big input array: each walk indexes near its end. */
static void body_array_refs(struct buf *b)
{
    const unsigned n = 40000;
    put(b, "{\"handler\":\"echo\",\"input\":{\"a\":[");
    for (unsigned i = 0; i < n; i++)
        put(b, "%s0", i ? "," : "");
    put(b, "]},\"args\":{");
    char elem[64];
    for (unsigned i = 0;; i++) {
        int k = snprintf(elem, sizeof elem, "\"x%u\":\"${input.a.%u}\"", i, n - 1 - i % 100);
        if (!room(b, (size_t)k + 1, 2, DEF_LIMIT))
            break;
        put(b, "%s%s", i ? "," : "", elem);
    }
    put(b, "}}");
}

/* References into a big input object by key. */
static void body_object_refs(struct buf *b)
{
    const unsigned n = 30000;
    put(b, "{\"handler\":\"echo\",\"input\":{\"o\":{");
    for (unsigned i = 0; i < n; i++)
        put(b, "%s\"k%u\":0", i ? "," : "", i);
    put(b, "}},\"args\":{");
    char elem[64];
    for (unsigned i = 0;; i++) {
        int k = snprintf(elem, sizeof elem, "\"x%u\":\"${input.o.k%u}\"", i, n - 1 - i % 100);
        if (!room(b, (size_t)k + 1, 2, DEF_LIMIT))
            break;
        put(b, "%s%s", i ? "," : "", elem);
    }
    put(b, "}}");
}

/* A 1,000-byte input string spliced into args as often as fits: many
 * strings each just under the string limit. */
static void body_splice_strings(struct buf *b)
{
    put(b, "{\"handler\":\"echo\",\"input\":{\"s\":\"");
    for (int i = 0; i < 1000; i++)
        put(b, "x");
    put(b, "\"},\"args\":{");
    for (unsigned i = 0;; i++) {
        if (!room(b, 16 + 64 * 10, 2, DEF_LIMIT))
            break;
        put(b, "%s\"s%u\":\"", i ? "," : "", i);
        for (int k = 0; k < 64; k++)
            put(b, "${input.s}");
        put(b, "\"");
    }
    put(b, "}}");
}

/* The same splice in one string, as long as the string limit allows. */
static void body_splice_one(struct buf *b)
{
    put(b, "{\"handler\":\"echo\",\"input\":{\"s\":\"");
    for (int i = 0; i < 1000; i++)
        put(b, "x");
    put(b, "\"},\"args\":{\"s\":\"");
    for (int k = 0; k < 6500; k++)
        put(b, "${input.s}");
    put(b, "\"}}");
}

/* A 400 KB input object referenced whole from every args member. */
static void body_whole_refs(struct buf *b)
{
    put(b, "{\"handler\":\"echo\",\"input\":{\"o\":{");
    for (unsigned i = 0; i < 40000; i++)
        put(b, "%s\"k%u\":0", i ? "," : "", i);
    put(b, "}},\"args\":{");
    for (unsigned i = 0;; i++) {
        if (!room(b, 32, 2, DEF_LIMIT))
            break;
        put(b, "%s\"x%u\":\"${input.o}\"", i ? "," : "", i);
    }
    put(b, "}}");
}

/* Nested arrays to the depth limit, as many as fit. */
static void body_nested(struct buf *b)
{
    put(b, "{\"handler\":\"echo\",\"args\":{\"a\":[");
    for (unsigned i = 0;; i++) {
        if (!room(b, 2 * 29 + 2, 3, DEF_LIMIT))
            break;
        put(b, "%s", i ? "," : "");
        for (int d = 0; d < 29; d++)
            put(b, "[");
        put(b, "0");
        for (int d = 0; d < 29; d++)
            put(b, "]");
    }
    put(b, "]}}");
}

/* A batch of `jobs` copies of one single-definition body (each under the
 * definition limit, together under --max-body). */
static void batch_of(struct buf *b, unsigned jobs, void (*one)(struct buf *))
{
    struct buf j = {0};
    one(&j);
    put(b, "{\"jobs\":[");
    for (unsigned i = 0; i < jobs; i++) {
        if (!room(b, j.n + 1, 2, MAX_BODY))
            break;
        put(b, "%s%s", i ? "," : "", j.p);
    }
    put(b, "]}");
    free(j.p);
}

static void body_batch_nested(struct buf *b)
{
    batch_of(b, 4, body_nested);
}

static void body_batch_args_members(struct buf *b)
{
    batch_of(b, 4, body_args_members);
}

/* The most steps allowed; the last one references every earlier one, many
 * times over. */
static void body_step_refs(struct buf *b)
{
    put(b, "{\"steps\":[");
    for (unsigned i = 0; i < 255; i++)
        put(b, "{\"id\":\"s%03u\",\"call\":\"echo\"},", i);
    put(b, "{\"id\":\"last\",\"call\":\"echo\",\"args\":{");
    for (unsigned i = 0;; i++) {
        if (!room(b, 40, 4, DEF_LIMIT))
            break;
        put(b, "%s\"x%u\":\"${steps.s%03u.output}\"", i ? "," : "", i, 254 - i % 255);
    }
    put(b, "}}]}");
}

/* A batch filling --max-body with `jobs` jobs, each splicing its input
 * string of `len` bytes into args, `per` references to a string, as often
 * as its share of the body allows (and at most `refs` times). */
static void batch_splices(struct buf *b, unsigned jobs, int len, int per, int refs)
{
    size_t share = MAX_BODY / jobs - 16;
    put(b, "{\"jobs\":[");
    for (unsigned j = 0; j < jobs; j++) {
        size_t start = b->n;
        put(b, "%s{\"handler\":\"echo\",\"input\":{\"s\":\"", j ? "," : "");
        for (int i = 0; i < len; i++)
            put(b, "x");
        put(b, "\"},\"args\":{");
        int made = 0;
        for (unsigned i = 0; made + per <= refs && b->n - start + 16 + per * 10 + 3 <= share;
             i++, made += per) {
            put(b, "%s\"s%u\":\"", i ? "," : "", i);
            for (int k = 0; k < per; k++)
                put(b, "${input.s}");
            put(b, "\"");
        }
        put(b, "}}");
    }
    put(b, "]}");
}

/* 1,000 jobs (the default --max-batch) of 4 KB, each asking for 300 KB. */
static void body_batch_splices(struct buf *b)
{
    batch_splices(b, 1000, 1000, 60, 1 << 30);
}

/* The most a batch can ask of substitution: a job of L + 10 k bytes asks
 * for k L, most for its size at L near 3 KB, so 640 jobs of 6.5 KB each
 * ask for just under the 1 MiB definition limit: 640 MiB in all. */
static void body_batch_amplify(struct buf *b)
{
    batch_splices(b, 640, 3200, 20, 320);
}

/* A batch whose single job is four times the definition limit. */
static void body_batch_big_member(struct buf *b)
{
    put(b, "{\"jobs\":[{\"handler\":\"echo\",\"args\":{");
    for (unsigned i = 0;; i++) {
        if (!room(b, 1024, 5, MAX_BODY))
            break;
        put(b, "%s\"s%u\":\"", i ? "," : "", i);
        for (int k = 0; k < 1000; k++)
            put(b, "y");
        put(b, "\"");
    }
    put(b, "}}]}");
}

struct body {
    const char *name;
    void (*make)(struct buf *b);
    bool batch;
};

static const struct body bodies[] = {
    {"root: 90k unknown members", body_root_unknown, false},
    {"root: 50k repeated known members", body_root_unknown_last, false},
    {"labels: 90k members", body_labels, false},
    {"retry: 90k members", body_retry, false},
    {"step: 90k members", body_step_members, false},
    {"args: 90k members (echo)", body_args_members, false},
    {"args: 90k members (exec)", body_exec_args_members, false},
    {"input: 90k members", body_input_members, false},
    {"refs: 40k-element array", body_array_refs, false},
    {"refs: 30k-member object", body_object_refs, false},
    {"splice: 1 KB x 64 per string", body_splice_strings, false},
    {"splice: 1 KB x 6500 in one", body_splice_one, false},
    {"whole refs to a 400 KB object", body_whole_refs, false},
    {"nested arrays at the depth limit", body_nested, false},
    {"256 steps, refs to each", body_step_refs, false},
    {"batch: 1000 jobs splicing", body_batch_splices, true},
    {"batch: 640 jobs asking 1 MiB each", body_batch_amplify, true},
    {"batch: one 4 MiB job", body_batch_big_member, true},
    {"batch: 1 MiB jobs of nested arrays", body_batch_nested, true},
    {"batch: 1 MiB jobs of 90k args members", body_batch_args_members, true},
};

static const char *cfg(void *ctx, const char *key)
{
    (void)ctx;
    return strcmp(key, "exec_allow") == 0 ? "/bin/true" : NULL;
}

int main(int argc, char **argv)
{
    int reps = 3;
    double budget_ms = 1000;
    const char *only = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--budget-ms") == 0)
            budget_ms = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--only") == 0)
            only = argv[i + 1];
    }
    const char *build = getenv("JD_BUILD") ? getenv("JD_BUILD") : "build";
    char dir[512];
    snprintf(dir, sizeof dir, "%s/plugins", build);
    struct jd_plugin_env env = {.config = cfg};
    struct jd_registry *reg = NULL;
    struct jd_error err;
    jd_error_clear(&err);
    if (jd_registry_create(&env, &reg) || jd_registry_load_dir(reg, dir, NULL, &err)) {
        fprintf(stderr, "parse: cannot load plugins from %s: %s\n", dir, err.message);
        return 2;
    }
    jd_registry_freeze(reg);

    printf("%-36s %9s %10s  %-28s %s\n", "body", "bytes", "best ms", "answer", "rss MB");
    double worst = 0;
    const char *worst_name = "";
    size_t worst_bytes = 0;
    for (size_t k = 0; k < sizeof bodies / sizeof bodies[0]; k++) {
        if (only && !strstr(bodies[k].name, only))
            continue;
        struct buf b = {0};
        bodies[k].make(&b);
        double best = 1e18;
        int rc = 0;
        for (int r = 0; r < reps; r++) {
            jd_error_clear(&err);
            double t0 = now_ms();
            if (bodies[k].batch) {
                struct jd_jobdef **defs = NULL;
                size_t n = 0;
                rc = jd_jobdef_parse_batch(b.p, b.n, NULL, reg, &defs, &n, &err);
                for (size_t i = 0; i < n; i++)
                    jd_jobdef_free(defs[i]);
                free(defs);
            } else {
                struct jd_jobdef *d = NULL;
                rc = jd_jobdef_parse(b.p, b.n, NULL, reg, &d, &err);
                jd_jobdef_free(d);
            }
            double t = now_ms() - t0;
            if (t < best)
                best = t;
        }
        char answer[64];
        snprintf(answer, sizeof answer, "%s %.20s", rc ? jd_strerror(rc) : "ok",
                 rc ? err.pointer : "");
        printf("%-36s %9zu %10.1f  %-28s %ld\n", bodies[k].name, b.n, best, answer, rss_mb());
        fflush(stdout);
        if (best > worst) {
            worst = best;
            worst_name = bodies[k].name;
            worst_bytes = b.n;
        }
        free(b.p);
    }
    printf("worst: %s, %zu bytes, %.1f ms (budget %.0f ms)\n", worst_name, worst_bytes, worst,
           budget_ms);
    jd_registry_destroy(reg);
    return worst > budget_ms ? 1 : 0;
}
