/*
 * ${...} substitution in job arguments: ${input.path}, ${steps.<id>.output.path}
 * and ${job.id}. Paths are dot-separated object keys or array indexes. "$${"
 * writes a literal "${". Substitution is a pure function of its inputs (the
 * recorded step outputs), so a replay computes the same arguments.
 *
 * Two bounds keep a small definition from asking for a huge result: every
 * byte substitution produces is counted as it is produced, and the work
 * stops at the first string that passes the string limit or the first
 * place where the result (as compact JSON) passes the byte limit. Values are
 * measured before they are copied or spliced, and measuring stops at the
 * room left, so the time and memory spent are linear in the limits, however
 * often a definition refers to a large value.
 *
 * Lookups are linear in the reference, not in the size of what it walks:
 * a container with more than INDEX_MIN members is indexed (a hash table
 * from (container, key or position) to member) the first time a path
 * enters it, so n references into a container of m members cost O(n + m).
 *
 * A step output may be kept as raw JSON text (a cJSON_Raw item: the
 * workflow keeps outputs as text, not trees); it is parsed when a reference
 * first enters it and the tree is dropped when substitution ends.
 *
 * Threading: no shared state; safe from any thread.
 */
#include "common/alloc.h"
#include "server/jobdef.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_MAX 512     /* a reference's body (between ${ and }): paths are short */
#define SEG_MAX 256     /* one path segment (an object key or an array index) */
#define INDEX_MIN 16    /* containers up to this size are scanned, larger ones indexed */
#define INDEX_DIGITS 19 /* an array index of more digits is past any array (and size_t) */

void jd_ptr_append(char *buf, size_t cap, const char *token)
{
    size_t n = strlen(buf);
    if (n + 1 < cap)
        buf[n++] = '/';
    for (const char *p = token; *p && n + 2 < cap; p++) {
        if (*p == '~') {
            buf[n++] = '~';
            buf[n++] = '0';
        } else if (*p == '/') {
            buf[n++] = '~';
            buf[n++] = '1';
        } else {
            buf[n++] = *p;
        }
    }
    buf[n < cap ? n : cap - 1] = '\0';
}

void jd_ptr_frame_format(const struct jd_ptr_frame *f, const char *base, char *buf, size_t cap)
{
    if (!f) {
        snprintf(buf, cap, "%s", base ? base : "");
        return;
    }
    jd_ptr_frame_format(f->up, base, buf, cap);
    if (f->key) {
        jd_ptr_append(buf, cap, f->key);
    } else {
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", f->index);
        jd_ptr_append(buf, cap, idx);
    }
}

/* ---- the lookup index ---- */

/* One member of an indexed container, or (key NULL, pos SIZE_MAX) the mark
 * that its container has been indexed. Arrays are keyed by position. */
struct slot {
    const cJSON *parent;
    const char *key;
    size_t pos;
    const cJSON *child;
};

struct index {
    struct slot *slots; /* open addressing, linear probing; parent NULL = empty */
    size_t cap, used;   /* cap is 0 or a power of two; used <= cap / 2 */
};

static uint64_t slot_hash(const cJSON *parent, const char *key, size_t pos)
{
    uint64_t h = 1469598103934665603ULL ^ ((uint64_t)(uintptr_t)parent * 0x9E3779B97F4A7C15ULL);
    if (key) {
        for (const unsigned char *p = (const unsigned char *)key; *p; p++)
            h = (h ^ *p) * 1099511628211ULL;
    } else {
        h = (h ^ (uint64_t)pos) * 1099511628211ULL;
        h ^= h >> 29;
        h *= 0xBF58476D1CE4E5B9ULL;
    }
    return h ^ (h >> 32);
}

static bool slot_is(const struct slot *s, const cJSON *parent, const char *key, size_t pos)
{
    if (s->parent != parent)
        return false;
    if (!key || !s->key)
        return !key && !s->key && s->pos == pos;
    return strcmp(s->key, key) == 0;
}

static struct slot *index_find(const struct index *ix, const cJSON *parent, const char *key,
                               size_t pos)
{
    if (!ix->cap)
        return NULL;
    for (size_t i = slot_hash(parent, key, pos) & (ix->cap - 1);; i = (i + 1) & (ix->cap - 1)) {
        struct slot *s = &ix->slots[i];
        if (!s->parent)
            return NULL;
        if (slot_is(s, parent, key, pos))
            return s;
    }
}

/* Insert unless present (an object's first member of a name wins, as with
 * cJSON_GetObjectItemCaseSensitive). */
static void index_put(struct index *ix, const cJSON *parent, const char *key, size_t pos,
                      const cJSON *child)
{
    if (ix->used + 1 > ix->cap / 2) {
        struct index bigger = {.cap = ix->cap ? ix->cap * 2 : 64};
        bigger.slots = jd_xcalloc(bigger.cap, sizeof *bigger.slots);
        for (size_t i = 0; i < ix->cap; i++)
            if (ix->slots[i].parent)
                index_put(&bigger, ix->slots[i].parent, ix->slots[i].key, ix->slots[i].pos,
                          ix->slots[i].child);
        free(ix->slots);
        *ix = bigger;
    }
    size_t i = slot_hash(parent, key, pos) & (ix->cap - 1);
    while (ix->slots[i].parent) {
        if (slot_is(&ix->slots[i], parent, key, pos))
            return;
        i = (i + 1) & (ix->cap - 1);
    }
    ix->slots[i] = (struct slot){.parent = parent, .key = key, .pos = pos, .child = child};
    ix->used++;
}

/* The member of container c named key (object) or at pos (array; key NULL). */
static const cJSON *member(struct index *ix, const cJSON *c, const char *key, size_t pos)
{
    if (index_find(ix, c, NULL, SIZE_MAX)) {
        const struct slot *s = index_find(ix, c, key, pos);
        return s ? s->child : NULL;
    }
    size_t i = 0;
    const cJSON *m = c->child;
    for (; m && i < INDEX_MIN; m = m->next, i++)
        if (key ? strcmp(m->string, key) == 0 : i == pos)
            return m;
    if (!m)
        return NULL; /* small: the scan was the whole container */
    i = 0;
    for (m = c->child; m; m = m->next, i++)
        index_put(ix, c, cJSON_IsObject(c) ? m->string : NULL, i, m);
    index_put(ix, c, NULL, SIZE_MAX, c);
    const struct slot *s = index_find(ix, c, key, pos);
    return s ? s->child : NULL;
}

/* An array index: decimal digits only, no sign, at most INDEX_DIGITS of
 * them (so the value fits size_t without wrapping). false: not an index. */
static bool parse_index(const char *seg, size_t *out)
{
    size_t n = strlen(seg), v = 0;
    if (n == 0 || n > INDEX_DIGITS)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (seg[i] < '0' || seg[i] > '9')
            return false;
        v = v * 10 + (size_t)(seg[i] - '0');
    }
    *out = v;
    return true;
}

/* Walk a dot path ("a.b.0") from v; NULL if a segment does not resolve. */
static const cJSON *walk(struct index *ix, const cJSON *v, const char *path)
{
    char seg[SEG_MAX];
    while (v && *path) {
        size_t n = strcspn(path, ".");
        if (n == 0 || n >= sizeof seg)
            return NULL;
        memcpy(seg, path, n);
        seg[n] = '\0';
        path += n;
        if (*path == '.')
            path++;
        size_t pos;
        if (cJSON_IsObject(v))
            v = member(ix, v, seg, 0);
        else if (cJSON_IsArray(v) && parse_index(seg, &pos))
            v = member(ix, v, NULL, pos);
        else
            return NULL;
    }
    return v;
}

enum ref_kind { REF_BAD, REF_INPUT, REF_STEP, REF_JOB_ID };

/* Classify a reference body (between ${ and }). For REF_INPUT *path is the
 * path after "input" (may be ""); for REF_STEP, id is copied into idbuf and
 * *path is the path after "output". */
static enum ref_kind classify(const char *body, const char **path, char *idbuf, size_t idcap)
{
    if (strcmp(body, "job.id") == 0)
        return REF_JOB_ID;
    if (strcmp(body, "input") == 0) {
        *path = "";
        return REF_INPUT;
    }
    if (strncmp(body, "input.", 6) == 0 && body[6]) {
        *path = body + 6;
        return REF_INPUT;
    }
    if (strncmp(body, "steps.", 6) == 0) {
        const char *id = body + 6;
        const char *dot = strchr(id, '.');
        if (!dot || dot == id || (size_t)(dot - id) >= idcap)
            return REF_BAD;
        memcpy(idbuf, id, (size_t)(dot - id));
        idbuf[dot - id] = '\0';
        const char *rest = dot + 1;
        if (strcmp(rest, "output") == 0) {
            *path = "";
            return REF_STEP;
        }
        if (strncmp(rest, "output.", 7) == 0 && rest[7]) {
            *path = rest + 7;
            return REF_STEP;
        }
    }
    return REF_BAD;
}

/* ---- one substitution ---- */

struct subst {
    const struct jd_subst_ctx *ctx;
    struct jd_error *err;
    size_t max_string, max_bytes;
    size_t used; /* bytes of the result so far, as compact JSON */
    struct index ix;
    char *scratch; /* measure(): where a value is printed to find its size */
    size_t scratch_cap;
    struct parsed *parsed; /* raw step outputs parsed so far */
};

/* A raw step output and its tree, for as long as one substitution runs. */
struct parsed {
    const cJSON *raw;
    cJSON *tree; /* NULL if the text does not parse */
    struct parsed *next;
};

/* v, or for a raw item the tree of its text (parsed once per substitution). */
static const cJSON *cooked(struct subst *st, const cJSON *v)
{
    if (!cJSON_IsRaw(v))
        return v;
    for (struct parsed *p = st->parsed; p; p = p->next)
        if (p->raw == v)
            return p->tree;
    struct parsed *p = jd_xcalloc(1, sizeof *p);
    p->raw = v;
    p->tree = cJSON_Parse(v->valuestring);
    p->next = st->parsed;
    st->parsed = p;
    return p->tree;
}

struct sbuf {
    char *p;
    size_t n, cap;
};

static void sb_add(struct sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = jd_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* Bytes of s as a JSON string, quotes and escapes included (as cJSON
 * prints it: two bytes for " \ \b \f \n \r \t, six for other controls). */
static size_t json_string_size(const char *s)
{
    size_t n = 2;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\' || *p == '\b' || *p == '\f' || *p == '\n' || *p == '\r' ||
            *p == '\t')
            n += 2;
        else if (*p < 32)
            n += 6;
        else
            n += 1;
    }
    return n;
}

/* Print v compactly into st->scratch if it takes at most `room` bytes:
 * true with *len set, false if it is larger. The printer stops as soon as
 * the buffer is full, so this costs O(min(size of v, room)). */
static bool measure(struct subst *st, const cJSON *v, size_t room, size_t *len)
{
    if (room > INT_MAX - 16)
        room = INT_MAX - 16;
    /* cJSON may ask for up to 5 bytes more than it writes; with 6 spare a
     * value of `room` bytes always fits, and a failure means a larger one. */
    size_t need = room + 6;
    if (st->scratch_cap < need) {
        free(st->scratch);
        st->scratch_cap = need;
        st->scratch = jd_xmalloc(need);
    }
    if (!cJSON_PrintPreallocated((cJSON *)v, st->scratch, (int)need, 0))
        return false;
    *len = strlen(st->scratch);
    return *len <= room;
}

static void fail_string_limit(struct subst *st, const struct jd_ptr_frame *at)
{
    char p[JD_ERROR_PTR_MAX];
    jd_ptr_frame_format(at, "", p, sizeof p);
    jd_error_set(st->err, JD_ETOOBIG, p,
                 "substitution makes a string longer than the %zu-byte string limit",
                 st->max_string);
}

/* Count n more bytes of result; false (err set) past the byte limit. */
static bool spend(struct subst *st, size_t n, const struct jd_ptr_frame *at)
{
    if (n <= st->max_bytes - st->used) {
        st->used += n;
        return true;
    }
    char p[JD_ERROR_PTR_MAX];
    jd_ptr_frame_format(at, "", p, sizeof p);
    jd_error_set(st->err, JD_ETOOBIG, p,
                 "substitution makes the args larger than the %zu-byte limit for a definition",
                 st->max_bytes);
    return false;
}

/* Resolve one reference; *owned receives a value to delete (job id). */
static const cJSON *resolve(struct subst *st, const char *body, cJSON **owned, bool *unresolved_ok)
{
    const struct jd_subst_ctx *ctx = st->ctx;
    const char *path = NULL;
    char id[128];
    *owned = NULL;
    *unresolved_ok = false;
    switch (classify(body, &path, id, sizeof id)) {
    case REF_JOB_ID:
        if (!ctx->job_id) {
            *unresolved_ok = true;
            return NULL;
        }
        *owned = cJSON_CreateString(ctx->job_id);
        return *owned;
    case REF_INPUT:
        return ctx->input ? walk(&st->ix, ctx->input, path) : NULL;
    case REF_STEP: {
        const cJSON *out = cJSON_IsObject(ctx->steps) ? member(&st->ix, ctx->steps, id, 0) : NULL;
        if (!out) {
            *unresolved_ok = ctx->keep_unresolved;
            return NULL;
        }
        return walk(&st->ix, cooked(st, out), path);
    }
    case REF_BAD:
        break;
    }
    return NULL;
}

/* The string s (at `at`) with its references substituted. */
static cJSON *subst_string(struct subst *st, const char *s, const struct jd_ptr_frame *at)
{
    char p[JD_ERROR_PTR_MAX];
    /* Exactly one reference: keep the value's type. */
    size_t len = strlen(s);
    if (len > 3 && s[0] == '$' && s[1] == '{' && s[len - 1] == '}' &&
        !memchr(s + 2, '}', len - 3) && !strstr(s + 2, "${") && len - 3 < REF_MAX) {
        char body[REF_MAX];
        memcpy(body, s + 2, len - 3);
        body[len - 3] = '\0';
        cJSON *owned;
        bool keep;
        const cJSON *v = resolve(st, body, &owned, &keep);
        if (!v && !keep) {
            jd_ptr_frame_format(at, "", p, sizeof p);
            jd_error_set(st->err, JD_EINVAL, p, "reference \"%s\" does not resolve", s);
            return NULL;
        }
        if (!v) {
            v = owned = cJSON_CreateString(s);
        } else if (cJSON_IsString(v) &&
                   strnlen(v->valuestring, st->max_string + 1) > st->max_string) {
            cJSON_Delete(owned);
            fail_string_limit(st, at);
            return NULL;
        }
        size_t size;
        if (!measure(st, v, st->max_bytes - st->used, &size))
            size = SIZE_MAX; /* larger than the room left: spend() fails */
        if (!spend(st, size, at)) {
            cJSON_Delete(owned);
            return NULL;
        }
        return owned ? owned : cJSON_Duplicate(v, 1);
    }
    struct sbuf b = {0};
    sb_add(&b, "", 0);
    const char *q = s;
    while (*q) {
        const char *piece = q; /* copy text up to the next "${" or "$${" as is */
        size_t n = 0;
        const char *ref = NULL;
        if (q[0] == '$' && q[1] == '$' && q[2] == '{') {
            piece = "${";
            n = 2;
            q += 3;
        } else if (q[0] == '$' && q[1] == '{') {
            ref = q;
        } else {
            const char *next = strstr(q + 1, "${");
            if (next && next[-1] == '$' && next - 1 > q)
                next--; /* stop before a "$${" too */
            n = next ? (size_t)(next - q) : strlen(q);
            q += n;
        }
        if (ref) {
            const char *end = strchr(ref + 2, '}');
            if (!end || (size_t)(end - ref - 2) >= REF_MAX) {
                jd_ptr_frame_format(at, "", p, sizeof p);
                jd_error_set(st->err, JD_EINVAL, p, "unterminated reference in \"%.64s\"", s);
                goto fail;
            }
            char body[REF_MAX];
            memcpy(body, ref + 2, (size_t)(end - ref - 2));
            body[end - ref - 2] = '\0';
            cJSON *owned;
            bool keep;
            const cJSON *v = resolve(st, body, &owned, &keep);
            q = end + 1;
            size_t room = st->max_string - b.n;
            if (!v && !keep) {
                jd_ptr_frame_format(at, "", p, sizeof p);
                jd_error_set(st->err, JD_EINVAL, p, "reference \"${%s}\" does not resolve", body);
                goto fail;
            }
            if (!v) {
                piece = ref;
                n = (size_t)(end - ref + 1);
            } else if (cJSON_IsString(v)) {
                piece = v->valuestring;
                n = strnlen(piece, room + 1);
            } else if (measure(st, v, room, &n)) {
                piece = st->scratch;
            } else {
                n = room + 1;
            }
            if (n > room) {
                cJSON_Delete(owned);
                fail_string_limit(st, at);
                goto fail;
            }
            sb_add(&b, piece, n);
            cJSON_Delete(owned);
            continue;
        }
        if (n > st->max_string - b.n) {
            fail_string_limit(st, at);
            goto fail;
        }
        sb_add(&b, piece, n);
    }
    if (!spend(st, json_string_size(b.p), at))
        goto fail;
    cJSON *r = cJSON_CreateString(b.p);
    free(b.p);
    return r;
fail:
    free(b.p);
    return NULL;
}

static cJSON *subst_value(struct subst *st, const cJSON *v, const struct jd_ptr_frame *at)
{
    if (cJSON_IsString(v))
        return subst_string(st, v->valuestring, at);
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        bool obj = cJSON_IsObject(v);
        if (!spend(st, 2, at)) /* the brackets */
            return NULL;
        cJSON *r = obj ? cJSON_CreateObject() : cJSON_CreateArray();
        size_t i = 0;
        for (const cJSON *c = v->child; c; c = c->next, i++) {
            struct jd_ptr_frame f = {.up = at, .key = obj ? c->string : NULL, .index = i};
            /* a comma before every member but the first; "key": for objects */
            size_t extra = (i ? 1 : 0) + (obj ? json_string_size(c->string) + 1 : 0);
            cJSON *cc = spend(st, extra, &f) ? subst_value(st, c, &f) : NULL;
            if (!cc) {
                cJSON_Delete(r);
                return NULL;
            }
            if (obj)
                cJSON_AddItemToObject(r, c->string, cc);
            else
                cJSON_AddItemToArray(r, cc);
        }
        return r;
    }
    size_t size;
    if (!measure(st, v, st->max_bytes - st->used, &size))
        size = SIZE_MAX;
    return spend(st, size, at) ? cJSON_Duplicate(v, 1) : NULL;
}

cJSON *jd_subst(const cJSON *v, const struct jd_subst_ctx *ctx, struct jd_error *err)
{
    if (!v)
        return cJSON_CreateObject();
    struct jd_job_limits dl = jd_jobdef_limits(NULL);
    struct subst st = {
        .ctx = ctx,
        .err = err,
        .max_string = ctx->max_string ? ctx->max_string : dl.max_string,
        .max_bytes = ctx->max_bytes ? ctx->max_bytes : dl.max_definition_bytes,
    };
    cJSON *r = subst_value(&st, v, NULL);
    if (r && ctx->bytes)
        *ctx->bytes = st.used;
    free(st.ix.slots);
    free(st.scratch);
    while (st.parsed) {
        struct parsed *p = st.parsed;
        st.parsed = p->next;
        cJSON_Delete(p->tree);
        free(p);
    }
    return r;
}

/* ---- checking references at submit ---- */

/* Fill err with the pointer of `at` under base and the message; returns JD_EINVAL. */
static int check_fail(const struct jd_ptr_frame *at, const char *base, struct jd_error *err,
                      const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int check_fail(const struct jd_ptr_frame *at, const char *base, struct jd_error *err,
                      const char *fmt, ...)
{
    char ptr[JD_ERROR_PTR_MAX], msg[JD_ERROR_MSG_MAX];
    jd_ptr_frame_format(at, base, ptr, sizeof ptr);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return jd_error_set(err, JD_EINVAL, ptr, "%s", msg);
}

static int check_string(const char *s, const struct jd_ptr_frame *at, const char *base,
                        bool (*known)(void *, const char *), void *arg, size_t *nrefs,
                        struct jd_error *err)
{
    const char *p = s;
    while ((p = strstr(p, "${")) != NULL) {
        if (p > s && p[-1] == '$') {
            p += 2;
            continue;
        }
        const char *end = strchr(p + 2, '}');
        if (!end)
            return check_fail(at, base, err, "unterminated reference \"%.64s\"", p);
        char body[REF_MAX];
        size_t n = (size_t)(end - p - 2);
        if (n >= sizeof body)
            return check_fail(at, base, err, "reference too long");
        memcpy(body, p + 2, n);
        body[n] = '\0';
        const char *path;
        char id[128];
        enum ref_kind k = classify(body, &path, id, sizeof id);
        if (k == REF_BAD)
            return check_fail(at, base, err,
                              "unknown reference \"${%s}\" (use ${input.<path>}, "
                              "${steps.<id>.output.<path>} or ${job.id})",
                              body);
        if (k == REF_STEP && !(known && known(arg, id)))
            return check_fail(at, base, err, "reference \"${%s}\" names no earlier step \"%s\"",
                              body, id);
        (*nrefs)++;
        p = end + 1;
    }
    return 0;
}

static int check_value(const cJSON *v, const struct jd_ptr_frame *at, const char *base,
                       bool (*known)(void *, const char *), void *arg, size_t *nrefs,
                       struct jd_error *err)
{
    if (cJSON_IsString(v))
        return check_string(v->valuestring, at, base, known, arg, nrefs, err);
    if (!cJSON_IsArray(v) && !cJSON_IsObject(v))
        return 0;
    size_t i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        struct jd_ptr_frame f = {.up = at, .key = cJSON_IsObject(v) ? c->string : NULL, .index = i};
        int rc = check_value(c, &f, base, known, arg, nrefs, err);
        if (rc)
            return rc;
    }
    return 0;
}

int jd_subst_check(const cJSON *v, const char *ptr, bool (*known)(void *arg, const char *id),
                   void *arg, size_t *nrefs, struct jd_error *err)
{
    size_t n = 0;
    int rc = v ? check_value(v, NULL, ptr, known, arg, &n, err) : 0;
    if (nrefs)
        *nrefs = n;
    return rc;
}
