/*
 * Job definition parsing and validation (see jobdef.h). Checks run in a fixed
 * order so that the first problem found is reported: size and nesting limits
 * on the raw text, JSON syntax, string lengths, then the shape, the common
 * options, each step, and finally the handlers' own validate hooks.
 *
 * Threading: pure functions over their arguments.
 */
#include "server/jobdef.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "storage/store.h"

#include <ctype.h>
#include <stdatomic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DELAY_MS (366LL * 24 * 3600 * 1000) /* a year: longer is surely a unit mistake */
#define MAX_PRIORITY 1000000                    /* wide enough; keeps ordering exact in a double */
#define MAX_ATTEMPTS 100                        /* retries beyond this are a loop, not a policy */
#define MAX_NAME 64                             /* queue names, step ids, topics, label keys */
#define MAX_LABELS 64
/* A batch's text, and its jobs' args after substitution, may take this many
 * definitions' worth of bytes (16 MiB by default): room for 1000 ordinary
 * jobs, while a batch of jobs that each splice their input into args up to
 * the definition limit (a 6 KB job can ask for 1 MiB) costs at most this
 * much work at submit, not max_batch MiB. */
#define BATCH_DEFINITIONS 16

struct jd_job_limits jd_jobdef_limits(const struct jd_job_limits *l)
{
    struct jd_job_limits r = l ? *l : (struct jd_job_limits){0};
    if (!r.max_definition_bytes)
        r.max_definition_bytes = 1 << 20;
    if (!r.max_depth)
        r.max_depth = 32;
    if (!r.max_steps)
        r.max_steps = 256;
    if (!r.max_string)
        r.max_string = 64 << 10;
    if (!r.max_batch)
        r.max_batch = 1000;
    if (!r.max_messages)
        r.max_messages = 1000; /* as a batch: far more than wait steps, bounded history */
    if (!r.max_message_bytes)
        r.max_message_bytes = 16 << 20; /* 16 messages at the 1 MiB limit */
    return r;
}

int jd_jobdef_check_text(const char *text, size_t len, const struct jd_job_limits *limits,
                         struct jd_error *err)
{
    struct jd_job_limits l = jd_jobdef_limits(limits);
    if (len > l.max_definition_bytes)
        return jd_error_set(err, JD_ETOOBIG, "", "definition is %zu bytes, the limit is %zu", len,
                            l.max_definition_bytes);
    /* Nesting is measured on the text, before cJSON recurses into it. */
    unsigned depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > l.max_depth)
                return jd_error_set(err, JD_ETOOBIG, "",
                                    "JSON nested deeper than %u levels (at byte %zu)", l.max_depth,
                                    i);
        } else if (c == ']' || c == '}') {
            if (depth)
                depth--;
        }
    }
    return 0;
}

/* ---- generic checks ---- */

static void ptr_join(char *out, size_t cap, const char *base, const char *tok)
{
    size_t n = strnlen(base, cap - 1); /* as snprintf "%s": cut to fit */
    memmove(out, base, n);
    out[n] = '\0';
    jd_ptr_append(out, cap, tok);
}

static void ptr_index(char *out, size_t cap, const char *base, int i)
{
    char idx[24];
    snprintf(idx, sizeof idx, "%d", i);
    ptr_join(out, cap, base, idx);
}

static int check_strings(const cJSON *v, const struct jd_ptr_frame *at, const char *base,
                         size_t max, struct jd_error *err)
{
    char p[JD_ERROR_PTR_MAX];
    if (cJSON_IsString(v) && strnlen(v->valuestring, max + 1) > max) {
        jd_ptr_frame_format(at, base, p, sizeof p);
        return jd_error_set(err, JD_ETOOBIG, p, "string is %zu bytes, the limit is %zu",
                            strlen(v->valuestring), max);
    }
    if (!cJSON_IsArray(v) && !cJSON_IsObject(v))
        return 0;
    size_t i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        if (cJSON_IsObject(v) && strnlen(c->string, max + 1) > max) {
            jd_ptr_frame_format(at, base, p, sizeof p);
            return jd_error_set(err, JD_ETOOBIG, p, "member name is %zu bytes, the limit is %zu",
                                strlen(c->string), max);
        }
        struct jd_ptr_frame f = {.up = at, .key = cJSON_IsObject(v) ? c->string : NULL, .index = i};
        int rc = check_strings(c, &f, base, max, err);
        if (rc)
            return rc;
    }
    return 0;
}

struct member_at {
    const cJSON *m;
    size_t pos; /* place in the object, in document order */
};

static int cmp_member(const void *a, const void *b)
{
    const struct member_at *x = a, *y = b;
    int c = strcmp(x->m->string, y->m->string);
    return c ? c : (x->pos > y->pos) - (x->pos < y->pos);
}

/* Reject an object with two members of one name, naming the first member
 * (in document order) that repeats an earlier one. n log n: the members are
 * sorted by (name, position); in each run of one name, the run's second
 * entry is that name's first repeat. */
static int check_dups(const cJSON *obj, const char *ptr, struct jd_error *err)
{
    size_t n = 0;
    for (const cJSON *c = obj->child; c; c = c->next)
        n++;
    if (n < 2)
        return 0;
    struct member_at *m = jd_xmalloc(n * sizeof *m);
    size_t i = 0;
    for (const cJSON *c = obj->child; c; c = c->next, i++)
        m[i] = (struct member_at){.m = c, .pos = i};
    qsort(m, n, sizeof *m, cmp_member);
    const struct member_at *dup = NULL;
    for (i = 1; i < n; i++)
        if (strcmp(m[i - 1].m->string, m[i].m->string) == 0 &&
            (i < 2 || strcmp(m[i - 2].m->string, m[i].m->string) != 0) &&
            (!dup || m[i].pos < dup->pos))
            dup = &m[i];
    int rc = 0;
    if (dup) {
        char p[JD_ERROR_PTR_MAX];
        ptr_join(p, sizeof p, ptr, dup->m->string);
        rc = jd_error_set(err, JD_EINVAL, p, "duplicate member \"%s\"", dup->m->string);
    }
    free(m);
    return rc;
}

/* Reject members not in the NULL-terminated allowed list (at most 32
 * names), and a member given twice. One pass: each member is matched
 * against the list and marked, so this is linear in the members whatever
 * their number. */
static int check_members(const cJSON *obj, const char *ptr, const char *const *allowed,
                         const char *what, struct jd_error *err)
{
    uint32_t seen = 0;
    for (const cJSON *c = obj->child; c; c = c->next) {
        int k = 0;
        while (allowed[k] && strcmp(allowed[k], c->string) != 0)
            k++;
        char p[JD_ERROR_PTR_MAX];
        if (!allowed[k]) {
            ptr_join(p, sizeof p, ptr, c->string);
            return jd_error_set(err, JD_EINVAL, p, "unknown member \"%s\" in %s", c->string, what);
        }
        if (seen & (UINT32_C(1) << k)) {
            ptr_join(p, sizeof p, ptr, c->string);
            return jd_error_set(err, JD_EINVAL, p, "duplicate member \"%s\"", c->string);
        }
        seen |= UINT32_C(1) << k;
    }
    return 0;
}

/* An integer in [lo, hi]. */
static int get_int(const cJSON *v, const char *ptr, int64_t lo, int64_t hi, int64_t *out,
                   struct jd_error *err)
{
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return jd_error_set(err, JD_EINVAL, ptr, "must be an integer");
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return jd_error_set(err, JD_EINVAL, ptr, "must be between %lld and %lld", (long long)lo,
                            (long long)hi);
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* A name: 1..MAX_NAME of [A-Za-z0-9_.-]. */
static int get_name(const cJSON *v, const char *ptr, const char *what, const char **out,
                    struct jd_error *err)
{
    if (!cJSON_IsString(v))
        return jd_error_set(err, JD_EINVAL, ptr, "%s must be a string", what);
    const char *s = v->valuestring;
    size_t n = strlen(s);
    if (n == 0)
        return jd_error_set(err, JD_EINVAL, ptr, "%s must not be empty", what);
    if (n > MAX_NAME)
        return jd_error_set(err, JD_EINVAL, ptr, "%s is longer than %d characters", what, MAX_NAME);
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-' && *p != '.')
            return jd_error_set(err, JD_EINVAL, ptr,
                                "%s \"%s\" may only use letters, digits, '_', '-' and '.'", what,
                                s);
    *out = s;
    return 0;
}

static int parse_retry(const cJSON *v, const char *ptr, struct jd_retry_policy *out,
                       struct jd_error *err)
{
    static const char *const allowed[] = {"max_attempts", "backoff_ms", "factor", "max_backoff_ms",
                                          NULL};
    if (!cJSON_IsObject(v))
        return jd_error_set(err, JD_EINVAL, ptr, "retry must be an object");
    int rc = check_members(v, ptr, allowed, "retry", err);
    if (rc)
        return rc;
    *out = (struct jd_retry_policy){.max_attempts = 1, .factor = 2.0};
    char p[JD_ERROR_PTR_MAX];
    int64_t x;
    const cJSON *c;
    if ((c = cJSON_GetObjectItemCaseSensitive(v, "max_attempts"))) {
        ptr_join(p, sizeof p, ptr, "max_attempts");
        if ((rc = get_int(c, p, 1, MAX_ATTEMPTS, &x, err)))
            return rc;
        out->max_attempts = (uint32_t)x;
    }
    if ((c = cJSON_GetObjectItemCaseSensitive(v, "backoff_ms"))) {
        ptr_join(p, sizeof p, ptr, "backoff_ms");
        if ((rc = get_int(c, p, 0, MAX_DELAY_MS, &x, err)))
            return rc;
        out->backoff_ms = (uint64_t)x;
    }
    if ((c = cJSON_GetObjectItemCaseSensitive(v, "factor"))) {
        ptr_join(p, sizeof p, ptr, "factor");
        if (!cJSON_IsNumber(c) || !(c->valuedouble >= 1.0 && c->valuedouble <= 100.0))
            return jd_error_set(err, JD_EINVAL, p, "factor must be a number from 1 to 100");
        out->factor = c->valuedouble;
    }
    if ((c = cJSON_GetObjectItemCaseSensitive(v, "max_backoff_ms"))) {
        ptr_join(p, sizeof p, ptr, "max_backoff_ms");
        if ((rc = get_int(c, p, 0, MAX_DELAY_MS, &x, err)))
            return rc;
        out->max_backoff_ms = (uint64_t)x;
    }
    return 0;
}

/* ---- steps ---- */

/* What a batch's jobs' args may take after substitution, in all. */
struct batch_budget {
    size_t cap, left;
};

struct vctx {
    struct jd_jobdef *d;
    const struct jd_job_limits *limits;
    const struct jd_registry *registry;
    size_t cap;
    size_t done_before;         /* steps[0..done_before) are referable (finished earlier) */
    struct batch_budget *batch; /* shared by a batch's jobs; NULL otherwise */
};

static bool step_known(void *arg, const char *id)
{
    struct vctx *v = arg;
    for (size_t i = 0; i < v->done_before; i++)
        if (strcmp(v->d->steps[i].id, id) == 0 &&
            (v->d->steps[i].kind == JD_JSTEP_CALL || v->d->steps[i].kind == JD_JSTEP_WAIT))
            return true;
    return false;
}

/* The handler exists and its validate hook accepts the args. nrefs: the
 * references in args (jd_subst_check); without any, and without a hook,
 * there is nothing to substitute or print, which keeps large plain args
 * cheap. */
static int handler_validate(struct vctx *v, const char *cmd, const cJSON *args, size_t nrefs,
                            const char *ptr, const char *args_ptr, struct jd_error *err)
{
    if (!v->registry)
        return 0;
    const struct jd_command *c = jd_registry_command(v->registry, cmd);
    if (!c)
        return jd_error_set(err, JD_EINVAL, ptr, "unknown handler \"%s\"", cmd);
    char *text = NULL;
    if (nrefs) {
        /* Hooks see the args with ${input..} and ${job.id} filled in as far
         * as they are known at submit time; ${steps..} stay as written. The
         * same bounds as at run time hold, so a job that would fail its step
         * for them is refused here instead. */
        size_t bytes = 0;
        struct jd_subst_ctx sc = {.input = v->d->input,
                                  .job_id = "0",
                                  .keep_unresolved = true,
                                  .max_string = v->limits->max_string,
                                  .max_bytes = v->limits->max_definition_bytes,
                                  .bytes = &bytes};
        bool batch_bound = v->batch && v->batch->left < sc.max_bytes;
        if (batch_bound)
            sc.max_bytes = v->batch->left ? v->batch->left : 1; /* 0 would mean the default */
        struct jd_error serr;
        jd_error_clear(&serr);
        cJSON *a = jd_subst(args, &sc, &serr);
        if (!a) {
            char p[JD_ERROR_PTR_MAX];
            snprintf(p, sizeof p, "%s%s", args_ptr, serr.pointer);
            if (serr.code == JD_ETOOBIG && batch_bound)
                return jd_error_set(err, JD_EINVAL, p,
                                    "substitution makes the args of this batch's jobs larger "
                                    "than %zu bytes in all, the limit for a batch",
                                    v->batch->cap);
            return jd_error_set(err, JD_EINVAL, p, "%s", serr.message);
        }
        if (v->batch)
            v->batch->left -= bytes; /* jd_subst kept it within left */
        if (c->validate)
            text = jd_json_print(a);
        cJSON_Delete(a);
    } else if (c->validate && args) {
        text = jd_json_print(args);
    }
    int rc = c->validate ? jd_registry_validate(v->registry, cmd, text, args_ptr, err) : 0;
    free(text);
    if (rc && err && !err->pointer[0])
        snprintf(err->pointer, sizeof err->pointer, "%s", args_ptr);
    return rc ? JD_EINVAL : 0;
}

static int parse_step(struct vctx *v, const cJSON *s, const char *ptr, int parent,
                      struct jd_error *err);

static size_t add_step(struct vctx *v)
{
    if (v->d->nsteps == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 8;
        v->d->steps = jd_xrealloc(v->d->steps, v->cap * sizeof *v->d->steps);
    }
    memset(&v->d->steps[v->d->nsteps], 0, sizeof *v->d->steps);
    return v->d->nsteps++;
}

static int parse_step(struct vctx *v, const cJSON *s, const char *ptr, int parent,
                      struct jd_error *err)
{
    static const char *const allowed[] = {"id",       "call",     "args", "retry", "timeout_ms",
                                          "parallel", "sleep_ms", "wait", NULL};
    char p[JD_ERROR_PTR_MAX];
    int rc;
    if (!cJSON_IsObject(s))
        return jd_error_set(err, JD_EINVAL, ptr, "a step must be an object");
    if ((rc = check_members(s, ptr, allowed, "a step", err)))
        return rc;
    if (v->d->nsteps >= v->limits->max_steps)
        return jd_error_set(err, JD_ETOOBIG, ptr, "more than %u steps", v->limits->max_steps);

    const cJSON *id = cJSON_GetObjectItemCaseSensitive(s, "id");
    ptr_join(p, sizeof p, ptr, "id");
    if (!id)
        return jd_error_set(err, JD_EINVAL, p, "missing step id");
    const char *idv;
    if ((rc = get_name(id, p, "step id", &idv, err)))
        return rc;
    for (size_t i = 0; i < v->d->nsteps; i++)
        if (strcmp(v->d->steps[i].id, idv) == 0)
            return jd_error_set(err, JD_EINVAL, p, "duplicate step id \"%s\"", idv);

    const cJSON *call = cJSON_GetObjectItemCaseSensitive(s, "call");
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(s, "parallel");
    const cJSON *slp = cJSON_GetObjectItemCaseSensitive(s, "sleep_ms");
    const cJSON *wait = cJSON_GetObjectItemCaseSensitive(s, "wait");
    int kinds = !!call + !!par + !!slp + !!wait;
    if (kinds == 0)
        return jd_error_set(err, JD_EINVAL, ptr,
                            "a step needs one of \"call\", \"parallel\", \"sleep_ms\", \"wait\"");
    if (kinds > 1)
        return jd_error_set(err, JD_EINVAL, ptr,
                            "a step has exactly one of \"call\", \"parallel\", \"sleep_ms\", "
                            "\"wait\"");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(s, "args");
    const cJSON *retry = cJSON_GetObjectItemCaseSensitive(s, "retry");
    const cJSON *tmo = cJSON_GetObjectItemCaseSensitive(s, "timeout_ms");
    if (!call && args) {
        ptr_join(p, sizeof p, ptr, "args");
        return jd_error_set(err, JD_EINVAL, p, "\"args\" belongs to a \"call\" step");
    }
    if (!call && retry) {
        ptr_join(p, sizeof p, ptr, "retry");
        return jd_error_set(err, JD_EINVAL, p, "\"retry\" belongs to a \"call\" step");
    }
    if ((par || slp) && tmo) {
        ptr_join(p, sizeof p, ptr, "timeout_ms");
        return jd_error_set(err, JD_EINVAL, p,
                            "\"timeout_ms\" belongs to a \"call\" or \"wait\" step");
    }

    size_t idx = add_step(v);
    struct jd_jobdef_step *st = &v->d->steps[idx];
    st->id = idv;
    st->parent = parent;
    if (tmo) {
        ptr_join(p, sizeof p, ptr, "timeout_ms");
        if ((rc = get_int(tmo, p, 1, MAX_DELAY_MS, &st->timeout_ms, err)))
            return rc;
    }
    if (call) {
        st->kind = JD_JSTEP_CALL;
        ptr_join(p, sizeof p, ptr, "call");
        if (!cJSON_IsString(call) || !call->valuestring[0])
            return jd_error_set(err, JD_EINVAL, p, "call must be a handler name");
        st->call = call->valuestring;
        char ap[JD_ERROR_PTR_MAX];
        ptr_join(ap, sizeof ap, ptr, "args");
        if (args && !cJSON_IsObject(args))
            return jd_error_set(err, JD_EINVAL, ap, "args must be an object");
        st->args = args;
        if (retry) {
            char rp[JD_ERROR_PTR_MAX];
            ptr_join(rp, sizeof rp, ptr, "retry");
            if ((rc = parse_retry(retry, rp, &st->retry, err)))
                return rc;
            st->has_retry = true;
        }
        size_t nrefs = 0;
        if ((rc = jd_subst_check(args, ap, step_known, v, &nrefs, err)))
            return rc;
        if ((rc = handler_validate(v, st->call, args, nrefs, p, ap, err)))
            return rc;
    } else if (slp) {
        st->kind = JD_JSTEP_SLEEP;
        ptr_join(p, sizeof p, ptr, "sleep_ms");
        if ((rc = get_int(slp, p, 0, MAX_DELAY_MS, &st->sleep_ms, err)))
            return rc;
    } else if (wait) {
        st->kind = JD_JSTEP_WAIT;
        ptr_join(p, sizeof p, ptr, "wait");
        if ((rc = get_name(wait, p, "wait topic", &st->topic, err)))
            return rc;
    } else {
        st->kind = JD_JSTEP_PARALLEL;
        ptr_join(p, sizeof p, ptr, "parallel");
        if (parent >= 0)
            return jd_error_set(err, JD_EINVAL, p, "parallel groups cannot be nested");
        if (!cJSON_IsArray(par) || cJSON_GetArraySize(par) == 0)
            return jd_error_set(err, JD_EINVAL, p, "parallel must be a non-empty array of steps");
        int i = 0;
        for (const cJSON *c = par->child; c; c = c->next, i++) {
            char cp[JD_ERROR_PTR_MAX];
            ptr_index(cp, sizeof cp, p, i);
            if ((rc = parse_step(v, c, cp, (int)idx, err)))
                return rc;
        }
        /* steps may have been reallocated */
        v->d->steps[idx].nchildren = v->d->nsteps - idx - 1;
    }
    return 0;
}

/* ---- top level ---- */

/* "unique": {"key": "...", "while": "active"|"queued", "for_ms": N,
 * "on_conflict": "reject"|"return_existing"|"replace"}. */
static int parse_unique(struct jd_jobdef *d, const cJSON *u, const char *base, struct jd_error *err)
{
    static const char *const allowed[] = {"key", "while", "for_ms", "on_conflict", NULL};
    char p[JD_ERROR_PTR_MAX];
    int rc;
    if (!cJSON_IsObject(u))
        return jd_error_set(err, JD_EINVAL, base,
                            "unique must be an object such as {\"key\": \"user-42-sync\"}");
    if ((rc = check_members(u, base, allowed, "unique", err)))
        return rc;
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(u, "key");
    ptr_join(p, sizeof p, base, "key");
    if (!key)
        return jd_error_set(err, JD_EINVAL, p, "missing key");
    if (!cJSON_IsString(key) || !key->valuestring[0] ||
        strlen(key->valuestring) > JD_UNIQUE_KEY_MAX)
        return jd_error_set(err, JD_EINVAL, p, "key must be a string of 1 to %d bytes",
                            JD_UNIQUE_KEY_MAX);
    d->unique_key = key->valuestring;
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(u, "while");
    if (w) {
        ptr_join(p, sizeof p, base, "while");
        if (!cJSON_IsString(w) ||
            (strcmp(w->valuestring, "active") != 0 && strcmp(w->valuestring, "queued") != 0))
            return jd_error_set(err, JD_EINVAL, p, "while must be \"active\" or \"queued\"");
        d->unique_while_queued = strcmp(w->valuestring, "queued") == 0;
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(u, "for_ms");
    if (f) {
        ptr_join(p, sizeof p, base, "for_ms");
        if ((rc = get_int(f, p, 1, MAX_DELAY_MS, &d->unique_for_ms, err)))
            return rc;
    }
    const cJSON *oc = cJSON_GetObjectItemCaseSensitive(u, "on_conflict");
    if (oc) {
        static const char *const names[] = {"return_existing", "reject", "replace"};
        ptr_join(p, sizeof p, base, "on_conflict");
        int k = 0;
        while (k < 3 && !(cJSON_IsString(oc) && strcmp(oc->valuestring, names[k]) == 0))
            k++;
        if (k == 3)
            return jd_error_set(err, JD_EINVAL, p,
                                "on_conflict must be \"return_existing\", \"reject\" or "
                                "\"replace\"");
        d->unique_on = (enum jd_unique_conflict)k;
    }
    d->has_unique = true;
    return 0;
}

static int parse_common(struct jd_jobdef *d, const cJSON *root, const char *base,
                        struct jd_error *err)
{
    char p[JD_ERROR_PTR_MAX];
    const cJSON *c;
    int rc;
    d->queue = "default";
    if ((c = cJSON_GetObjectItemCaseSensitive(root, "queue"))) {
        ptr_join(p, sizeof p, base, "queue");
        if ((rc = get_name(c, p, "queue", &d->queue, err)))
            return rc;
    }
    if ((c = cJSON_GetObjectItemCaseSensitive(root, "priority"))) {
        ptr_join(p, sizeof p, base, "priority");
        if ((rc = get_int(c, p, -MAX_PRIORITY, MAX_PRIORITY, &d->priority, err)))
            return rc;
    }
    const cJSON *delay = cJSON_GetObjectItemCaseSensitive(root, "delay_ms");
    const cJSON *run_at = cJSON_GetObjectItemCaseSensitive(root, "run_at");
    if (delay && run_at) {
        ptr_join(p, sizeof p, base, "run_at");
        return jd_error_set(err, JD_EINVAL, p, "give either delay_ms or run_at, not both");
    }
    if (delay) {
        ptr_join(p, sizeof p, base, "delay_ms");
        if ((rc = get_int(delay, p, 0, MAX_DELAY_MS, &d->delay_ms, err)))
            return rc;
    }
    if (run_at) {
        ptr_join(p, sizeof p, base, "run_at");
        if (!cJSON_IsString(run_at) || jd_time_parse(run_at->valuestring, &d->run_at_ms) != 0)
            return jd_error_set(err, JD_EINVAL, p,
                                "run_at must be an RFC 3339 time like \"2026-01-02T03:04:05Z\"");
        if (d->run_at_ms <= 0)
            return jd_error_set(err, JD_EINVAL, p, "run_at must be after 1970");
    }
    if ((c = cJSON_GetObjectItemCaseSensitive(root, "timeout_ms"))) {
        ptr_join(p, sizeof p, base, "timeout_ms");
        if ((rc = get_int(c, p, 1, MAX_DELAY_MS, &d->timeout_ms, err)))
            return rc;
    }
    if ((c = cJSON_GetObjectItemCaseSensitive(root, "retry"))) {
        ptr_join(p, sizeof p, base, "retry");
        if ((rc = parse_retry(c, p, &d->retry, err)))
            return rc;
        d->has_retry = true;
    }
    if ((c = cJSON_GetObjectItemCaseSensitive(root, "labels"))) {
        ptr_join(p, sizeof p, base, "labels");
        if (!cJSON_IsObject(c))
            return jd_error_set(err, JD_EINVAL, p, "labels must be an object of strings");
        int n = 0;
        for (const cJSON *l = c->child; l; l = l->next, n++) {
            char lp[JD_ERROR_PTR_MAX];
            ptr_join(lp, sizeof lp, p, l->string);
            if (n >= MAX_LABELS)
                return jd_error_set(err, JD_EINVAL, lp, "more than %d labels", MAX_LABELS);
        }
        if ((rc = check_dups(c, p, err)))
            return rc;
        for (const cJSON *l = c->child; l; l = l->next) {
            char lp[JD_ERROR_PTR_MAX];
            ptr_join(lp, sizeof lp, p, l->string);
            if (!l->string[0] || strlen(l->string) > MAX_NAME)
                return jd_error_set(err, JD_EINVAL, lp, "label names are 1 to %d characters",
                                    MAX_NAME);
            if (!cJSON_IsString(l))
                return jd_error_set(err, JD_EINVAL, lp, "label values must be strings");
            /* Labels are indexed (GET /v1/jobs?label=): keep the index small. */
            if (strlen(l->valuestring) > JD_LABEL_VALUE_MAX)
                return jd_error_set(err, JD_EINVAL, lp, "label values are at most %d characters",
                                    JD_LABEL_VALUE_MAX);
        }
        d->labels = c;
    }
    d->input = cJSON_GetObjectItemCaseSensitive(root, "input");
    if ((c = cJSON_GetObjectItemCaseSensitive(root, "unique"))) {
        ptr_join(p, sizeof p, base, "unique");
        if ((rc = parse_unique(d, c, p, err)))
            return rc;
    }
    return 0;
}

static bool hex_run(const char *s, size_t n, bool *all_zero)
{
    *all_zero = true;
    for (size_t i = 0; i < n; i++) {
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
        if (s[i] != '0')
            *all_zero = false;
    }
    return true;
}

#define TRACEPARENT_MAX 512 /* version 00 is 55; later versions may add fields */

bool jd_traceparent_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    bool zero;
    if (n < 55 || n > TRACEPARENT_MAX || s[2] != '-' || s[35] != '-' || s[52] != '-')
        return false;
    if (!hex_run(s, 2, &zero) || (s[0] == 'f' && s[1] == 'f'))
        return false;
    if (n != 55 && (strncmp(s, "00", 2) == 0 || s[55] != '-'))
        return false; /* version 00 has exactly four fields */
    if (!hex_run(s + 3, 32, &zero) || zero)
        return false;
    if (!hex_run(s + 36, 16, &zero) || zero)
        return false;
    return hex_run(s + 53, 2, &zero);
}

#define NOTIFY_URL_MAX 2048 /* as common browsers and servers cap URLs */

/* "notify": a completion webhook. The URL is checked as an http call to it
 * would be (scheme, --http-allow), so a job cannot name a host the http
 * handler may not reach. */
static int parse_notify(struct jd_jobdef *d, const cJSON *root, const char *base,
                        const struct jd_registry *registry, struct jd_error *err)
{
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "notify");
    if (!n)
        return 0;
    char p[JD_ERROR_PTR_MAX];
    ptr_join(p, sizeof p, base, "notify");
    static const char *const allowed[] = {"url", "on", NULL};
    if (!cJSON_IsObject(n))
        return jd_error_set(err, JD_EINVAL, p,
                            "notify is {\"url\": \"https://...\", \"on\": [\"succeeded\", "
                            "\"failed\"]}");
    int rc = check_members(n, p, allowed, "notify", err);
    if (rc)
        return rc;
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(n, "url");
    char up[JD_ERROR_PTR_MAX];
    ptr_join(up, sizeof up, p, "url");
    if (!cJSON_IsString(url) || strlen(url->valuestring) > NOTIFY_URL_MAX ||
        (strncmp(url->valuestring, "http://", 7) != 0 &&
         strncmp(url->valuestring, "https://", 8) != 0))
        return jd_error_set(err, JD_EINVAL, up,
                            "url must be an http:// or https:// URL of at most %d characters",
                            NOTIFY_URL_MAX);
    if (registry) {
        if (!jd_registry_command(registry, "http"))
            return jd_error_set(err, JD_EINVAL, up,
                                "notify needs the http handler, which is not loaded");
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "method", "POST");
        cJSON_AddStringToObject(a, "url", url->valuestring);
        char *text = jd_json_print(a);
        cJSON_Delete(a);
        struct jd_error e2;
        jd_error_clear(&e2);
        rc = jd_registry_validate(registry, "http", text, "", &e2);
        free(text);
        if (rc)
            return jd_error_set(err, rc, up, "%s", e2.message);
    }
    d->notify_url = url->valuestring;
    d->notify_on = (1u << JD_JOB_SUCCEEDED) | (1u << JD_JOB_FAILED);
    const cJSON *on = cJSON_GetObjectItemCaseSensitive(n, "on");
    if (on) {
        char op[JD_ERROR_PTR_MAX];
        ptr_join(op, sizeof op, p, "on");
        if (!cJSON_IsArray(on) || cJSON_GetArraySize(on) < 1 || cJSON_GetArraySize(on) > 3)
            return jd_error_set(err, JD_EINVAL, op, "on is a list of succeeded, failed, cancelled");
        d->notify_on = 0;
        int i = 0;
        for (const cJSON *e = on->child; e; e = e->next, i++) {
            int st = cJSON_IsString(e) ? jd_job_state_parse(e->valuestring) : -1;
            if (st < 0 || !jd_job_state_terminal((enum jd_job_state)st)) {
                char ep[JD_ERROR_PTR_MAX], num[12];
                snprintf(num, sizeof num, "%d", i);
                ptr_join(ep, sizeof ep, op, num);
                return jd_error_set(err, JD_EINVAL, ep,
                                    "on is a list of succeeded, failed, cancelled");
            }
            d->notify_on |= 1u << st;
        }
    }
    return 0;
}

/* jd_jobdef_from_json; batch as in struct vctx. */
static int from_json(cJSON *root, const char *base, const struct jd_job_limits *limits,
                     const struct jd_registry *registry, struct batch_budget *batch,
                     struct jd_jobdef **out, struct jd_error *err)
{
    static const char *const allowed[] = {"handler",     "args",  "steps",    "process",  "method",
                                          "input",       "queue", "priority", "delay_ms", "run_at",
                                          "timeout_ms",  "retry", "labels",   "unique",   "notify",
                                          "traceparent", NULL};
    struct jd_job_limits l = jd_jobdef_limits(limits);
    struct jd_jobdef *d = jd_xcalloc(1, sizeof *d);
    d->root = root;
    char p[JD_ERROR_PTR_MAX];
    int rc;
    *out = NULL;
    if (!cJSON_IsObject(root)) {
        rc = jd_error_set(err, JD_EINVAL, base, "a job definition must be a JSON object");
        goto fail;
    }
    if ((rc = check_members(root, base, allowed, "a job definition", err)))
        goto fail;
    /* What is stored is the compact text: each job of a batch is held to
     * the definition limit here, as a single body is before parsing. */
    d->text = jd_json_print(root);
    if (strlen(d->text) > l.max_definition_bytes) {
        /* 422, not 413: the request itself was within its limit. */
        rc = jd_error_set(err, JD_EINVAL, base, "definition is %zu bytes, the limit is %zu",
                          strlen(d->text), l.max_definition_bytes);
        goto fail;
    }
    if ((rc = check_strings(root, NULL, base, l.max_string, err)))
        goto fail;
    const cJSON *handler = cJSON_GetObjectItemCaseSensitive(root, "handler");
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(root, "steps");
    const cJSON *process = cJSON_GetObjectItemCaseSensitive(root, "process");
    int shapes = !!handler + !!steps + !!process;
    if (shapes != 1) {
        rc = jd_error_set(err, JD_EINVAL, base,
                          shapes ? "give only one of \"handler\", \"steps\" or \"process\""
                                 : "a job needs \"handler\", \"steps\" or \"process\"");
        goto fail;
    }
    if ((rc = parse_common(d, root, base, err)))
        goto fail;
    if ((rc = parse_notify(d, root, base, registry, err)))
        goto fail;
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "traceparent");
    if (tp) {
        ptr_join(p, sizeof p, base, "traceparent");
        if (!cJSON_IsString(tp) || !jd_traceparent_valid(tp->valuestring)) {
            rc = jd_error_set(err, JD_EINVAL, p,
                              "traceparent must be a W3C traceparent such as "
                              "\"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"");
            goto fail;
        }
        d->traceparent = tp->valuestring;
    }
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(root, "args");
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(root, "method");
    struct vctx v = {.d = d, .limits = &l, .registry = registry, .batch = batch};
    if (handler) {
        d->shape = JD_JOBDEF_TASK;
        ptr_join(p, sizeof p, base, "method");
        if (method) {
            rc = jd_error_set(err, JD_EINVAL, p, "\"method\" belongs to a \"process\" job");
            goto fail;
        }
        ptr_join(p, sizeof p, base, "handler");
        if (!cJSON_IsString(handler) || !handler->valuestring[0]) {
            rc = jd_error_set(err, JD_EINVAL, p, "handler must be a handler name");
            goto fail;
        }
        char ap[JD_ERROR_PTR_MAX];
        ptr_join(ap, sizeof ap, base, "args");
        if (args && !cJSON_IsObject(args)) {
            rc = jd_error_set(err, JD_EINVAL, ap, "args must be an object");
            goto fail;
        }
        size_t i = add_step(&v);
        d->steps[i] = (struct jd_jobdef_step){.kind = JD_JSTEP_CALL,
                                              .id = "task",
                                              .call = handler->valuestring,
                                              .args = args,
                                              .parent = -1};
        size_t nrefs = 0;
        if ((rc = jd_subst_check(args, ap, NULL, NULL, &nrefs, err)))
            goto fail;
        if ((rc = handler_validate(&v, handler->valuestring, args, nrefs, p, ap, err)))
            goto fail;
    } else if (steps) {
        d->shape = JD_JOBDEF_WORKFLOW;
        ptr_join(p, sizeof p, base, args ? "args" : "method");
        if (args || method) {
            rc = jd_error_set(err, JD_EINVAL, p, "\"%s\" does not belong to a \"steps\" job",
                              args ? "args" : "method");
            goto fail;
        }
        ptr_join(p, sizeof p, base, "steps");
        if (!cJSON_IsArray(steps) || cJSON_GetArraySize(steps) == 0) {
            rc = jd_error_set(err, JD_EINVAL, p, "steps must be a non-empty array");
            goto fail;
        }
        int i = 0;
        for (const cJSON *s = steps->child; s; s = s->next, i++) {
            char sp[JD_ERROR_PTR_MAX];
            ptr_index(sp, sizeof sp, p, i);
            v.done_before = d->nsteps; /* only steps before this one can be referenced */
            if ((rc = parse_step(&v, s, sp, -1, err)))
                goto fail;
        }
    } else {
        d->shape = JD_JOBDEF_PROCESS;
        ptr_join(p, sizeof p, base, "args");
        if (args) {
            rc = jd_error_set(err, JD_EINVAL, p,
                              "\"args\" does not belong to a \"process\" job (use \"input\")");
            goto fail;
        }
        ptr_join(p, sizeof p, base, "process");
        if (!cJSON_IsString(process) || !process->valuestring[0]) {
            rc = jd_error_set(err, JD_EINVAL, p, "process must be a process type name");
            goto fail;
        }
        d->process = process->valuestring;
        ptr_join(p, sizeof p, base, "method");
        if (!method) {
            rc = jd_error_set(err, JD_EINVAL, p, "missing method");
            goto fail;
        }
        if (!cJSON_IsString(method) || !method->valuestring[0]) {
            rc = jd_error_set(err, JD_EINVAL, p, "method must be a non-empty string");
            goto fail;
        }
        d->method = method->valuestring;
        if (registry) {
            const struct jd_process_type *pt = jd_registry_process_type(registry, d->process);
            if (!pt) {
                ptr_join(p, sizeof p, base, "process");
                rc = jd_error_set(err, JD_EINVAL, p, "unknown process type \"%s\"", d->process);
                goto fail;
            }
            bool found = false;
            for (const char *const *m = pt->methods; m && *m && !found; m++)
                found = strcmp(*m, d->method) == 0;
            if (!found) {
                rc = jd_error_set(err, JD_EINVAL, p, "process type \"%s\" has no method \"%s\"",
                                  d->process, d->method);
                goto fail;
            }
            /* The type's own check of the input: make and drop an instance. */
            char msg[256] = "";
            char *in = d->input ? jd_json_print(d->input) : NULL;
            void *inst = pt->create(d->method, in, msg, sizeof msg);
            free(in);
            if (!inst) {
                ptr_join(p, sizeof p, base, "input");
                rc = jd_error_set(err, JD_EINVAL, p, "%s", msg[0] ? msg : "input refused");
                goto fail;
            }
            if (pt->destroy)
                pt->destroy(inst);
        }
    }
    *out = d;
    return 0;
fail:
    jd_jobdef_free(d);
    return rc;
}

int jd_jobdef_from_json(cJSON *root, const char *base, const struct jd_job_limits *limits,
                        const struct jd_registry *registry, struct jd_jobdef **out,
                        struct jd_error *err)
{
    return from_json(root, base, limits, registry, NULL, out, err);
}

int jd_jobdef_parse(const char *text, size_t len, const struct jd_job_limits *limits,
                    const struct jd_registry *registry, struct jd_jobdef **out,
                    struct jd_error *err)
{
    *out = NULL;
    int rc = jd_jobdef_check_text(text, len, limits, err);
    if (rc)
        return rc;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t off = end ? (size_t)(end - text) : 0;
        return jd_error_set(err, JD_EPARSE, "", "malformed JSON near byte %zu", off);
    }
    /* Trailing non-space bytes after the value are malformed too. */
    for (const char *p = end; p && p < text + len; p++)
        if (!isspace((unsigned char)*p) && *p != '\0') {
            cJSON_Delete(root);
            return jd_error_set(err, JD_EPARSE, "",
                                "unexpected data after the JSON value at byte %zu",
                                (size_t)(p - text));
        }
    return jd_jobdef_from_json(root, "", limits, registry, out, err);
}

int jd_jobdef_parse_batch(const char *text, size_t len, const struct jd_job_limits *limits,
                          const struct jd_registry *registry, struct jd_jobdef ***out, size_t *n,
                          struct jd_error *err)
{
    struct jd_job_limits l = jd_jobdef_limits(limits);
    struct jd_jobdef **defs = NULL;
    size_t count = 0;
    cJSON *root = NULL;
    int rc;
    *out = NULL;
    *n = 0;
    size_t cap =
        l.max_definition_bytes * (size_t)(l.max_batch > BATCH_DEFINITIONS ? BATCH_DEFINITIONS : 1);
    struct batch_budget budget = {.cap = cap, .left = cap};
    if (len > cap) {
        rc = jd_error_set(err, JD_ETOOBIG, "", "batch is %zu bytes, the limit is %zu", len, cap);
        goto fail;
    }
    struct jd_job_limits tl = l;
    tl.max_definition_bytes = cap;
    tl.max_depth = l.max_depth + 2; /* {"jobs":[ ... ]} */
    if ((rc = jd_jobdef_check_text(text, len, &tl, err)))
        goto fail;
    root = cJSON_ParseWithLength(text, len);
    if (!root) {
        rc = jd_error_set(err, JD_EPARSE, "", "malformed JSON");
        goto fail;
    }
    cJSON *jobs = cJSON_GetObjectItemCaseSensitive(root, "jobs");
    if (!cJSON_IsObject(root) || !cJSON_IsArray(jobs) || cJSON_GetArraySize(jobs) == 0) {
        rc = jd_error_set(err, JD_EINVAL, "/jobs", "a batch is {\"jobs\": [definition, ...]}");
        goto fail;
    }
    count = (size_t)cJSON_GetArraySize(jobs);
    if (count > l.max_batch) {
        rc = jd_error_set(err, JD_ETOOBIG, "/jobs", "%zu jobs in one batch, the limit is %u", count,
                          l.max_batch);
        goto fail;
    }
    defs = jd_xcalloc(count, sizeof *defs);
    size_t i = 0;
    for (cJSON *c = jobs->child, *next; c; c = next, i++) {
        char base[32];
        snprintf(base, sizeof base, "/jobs/%zu", i);
        next = c->next;
        /* Each definition owns its tree: moved out of the batch, not copied. */
        if ((rc = from_json(cJSON_DetachItemViaPointer(jobs, c), base, &l, registry, &budget,
                            &defs[i], err)))
            goto fail;
    }
    cJSON_Delete(root);
    *out = defs;
    *n = count;
    return 0;
fail:
    for (size_t k = 0; defs && k < count; k++)
        jd_jobdef_free(defs[k]);
    free(defs);
    cJSON_Delete(root);
    return rc;
}

void jd_jobdef_free(struct jd_jobdef *d)
{
    if (!d)
        return;
    if (d->charged_to)
        atomic_fetch_sub_explicit(d->charged_to, d->mem, memory_order_relaxed);
    cJSON_Delete(d->root);
    cJSON_Delete(d->kept);
    free(d->text);
    free(d->input_text);
    for (size_t i = 0; i < d->nsteps; i++)
        free(d->steps[i].args_text);
    free(d->steps);
    free(d);
}

struct jd_retry_policy jd_jobdef_retry_for_tag(const struct jd_jobdef *d, uint32_t tag)
{
    if (tag >= 1 && tag <= d->nsteps && d->steps[tag - 1].has_retry)
        return d->steps[tag - 1].retry;
    if (d->has_retry)
        return d->retry;
    return (struct jd_retry_policy){.max_attempts = 1, .factor = 1.0};
}
