/*
 * ${...} substitution in job arguments: ${input.path}, ${steps.<id>.output.path}
 * and ${job.id}. Paths are dot-separated object keys or array indexes. "$${"
 * writes a literal "${". Substitution is a pure function of its inputs (the
 * recorded step outputs), so a replay computes the same arguments.
 *
 * Threading: no shared state; safe from any thread.
 */
#include "common/alloc.h"
#include "server/jobdef.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Walk a dot path ("a.b.0") from v; NULL if a segment does not resolve. */
static const cJSON *walk(const cJSON *v, const char *path)
{
    char seg[256];
    while (v && *path) {
        size_t n = strcspn(path, ".");
        if (n == 0 || n >= sizeof seg)
            return NULL;
        memcpy(seg, path, n);
        seg[n] = '\0';
        path += n;
        if (*path == '.')
            path++;
        if (cJSON_IsObject(v)) {
            v = cJSON_GetObjectItemCaseSensitive(v, seg);
        } else if (cJSON_IsArray(v)) {
            char *end;
            long i = strtol(seg, &end, 10);
            if (*end || i < 0 || !isdigit((unsigned char)seg[0]))
                return NULL;
            v = cJSON_GetArrayItem(v, (int)i);
        } else {
            return NULL;
        }
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

/* Resolve one reference; *owned receives a value to delete (job id). */
static const cJSON *resolve(const char *body, const struct jd_subst_ctx *ctx, cJSON **owned,
                            bool *unresolved_ok)
{
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
        return ctx->input ? walk(ctx->input, path) : NULL;
    case REF_STEP: {
        const cJSON *out = ctx->steps ? cJSON_GetObjectItemCaseSensitive(ctx->steps, id) : NULL;
        if (!out) {
            *unresolved_ok = ctx->keep_unresolved;
            return NULL;
        }
        return walk(out, path);
    }
    case REF_BAD:
        break;
    }
    return NULL;
}

static cJSON *subst_string(const char *s, const struct jd_subst_ctx *ctx, struct jd_error *err)
{
    /* Exactly one reference: keep the value's type. */
    size_t len = strlen(s);
    if (len > 3 && s[0] == '$' && s[1] == '{' && s[len - 1] == '}' &&
        !memchr(s + 2, '}', len - 3) && !strstr(s + 2, "${")) {
        char body[512];
        if (len - 3 < sizeof body) {
            memcpy(body, s + 2, len - 3);
            body[len - 3] = '\0';
            cJSON *owned;
            bool keep;
            const cJSON *v = resolve(body, ctx, &owned, &keep);
            if (v) {
                cJSON *r = owned ? owned : cJSON_Duplicate(v, 1);
                return r;
            }
            if (keep)
                return cJSON_CreateString(s);
            jd_error_set(err, JD_EINVAL, NULL, "reference \"%s\" does not resolve", s);
            return NULL;
        }
    }
    struct sbuf b = {0};
    sb_add(&b, "", 0);
    const char *p = s;
    while (*p) {
        if (p[0] == '$' && p[1] == '$' && p[2] == '{') {
            sb_add(&b, "${", 2);
            p += 3;
            continue;
        }
        if (p[0] == '$' && p[1] == '{') {
            const char *end = strchr(p + 2, '}');
            if (!end || (size_t)(end - p - 2) >= 512) {
                jd_error_set(err, JD_EINVAL, NULL, "unterminated reference in \"%.64s\"", s);
                free(b.p);
                return NULL;
            }
            char body[512];
            memcpy(body, p + 2, (size_t)(end - p - 2));
            body[end - p - 2] = '\0';
            cJSON *owned;
            bool keep;
            const cJSON *v = resolve(body, ctx, &owned, &keep);
            if (!v && !keep) {
                jd_error_set(err, JD_EINVAL, NULL, "reference \"${%s}\" does not resolve", body);
                free(b.p);
                return NULL;
            }
            if (!v) {
                sb_add(&b, p, (size_t)(end - p + 1));
            } else if (cJSON_IsString(v)) {
                sb_add(&b, v->valuestring, strlen(v->valuestring));
            } else {
                char *t = cJSON_PrintUnformatted(v);
                sb_add(&b, t, strlen(t));
                free(t);
            }
            cJSON_Delete(owned);
            p = end + 1;
            continue;
        }
        sb_add(&b, p, 1);
        p++;
    }
    cJSON *r = cJSON_CreateString(b.p);
    free(b.p);
    return r;
}

cJSON *jd_subst(const cJSON *v, const struct jd_subst_ctx *ctx, struct jd_error *err)
{
    if (!v)
        return cJSON_CreateObject();
    if (cJSON_IsString(v))
        return subst_string(v->valuestring, ctx, err);
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        cJSON *r = cJSON_IsArray(v) ? cJSON_CreateArray() : cJSON_CreateObject();
        for (const cJSON *c = v->child; c; c = c->next) {
            cJSON *cc = jd_subst(c, ctx, err);
            if (!cc) {
                cJSON_Delete(r);
                return NULL;
            }
            if (cJSON_IsArray(v))
                cJSON_AddItemToArray(r, cc);
            else
                cJSON_AddItemToObject(r, c->string, cc);
        }
        return r;
    }
    return cJSON_Duplicate(v, 1);
}

static int check_string(const char *s, const char *ptr, bool (*known)(void *, const char *),
                        void *arg, struct jd_error *err)
{
    const char *p = s;
    while ((p = strstr(p, "${")) != NULL) {
        if (p > s && p[-1] == '$') {
            p += 2;
            continue;
        }
        const char *end = strchr(p + 2, '}');
        if (!end)
            return jd_error_set(err, JD_EINVAL, ptr, "unterminated reference \"%.64s\"", p);
        char body[512];
        size_t n = (size_t)(end - p - 2);
        if (n >= sizeof body)
            return jd_error_set(err, JD_EINVAL, ptr, "reference too long");
        memcpy(body, p + 2, n);
        body[n] = '\0';
        const char *path;
        char id[128];
        enum ref_kind k = classify(body, &path, id, sizeof id);
        if (k == REF_BAD)
            return jd_error_set(err, JD_EINVAL, ptr,
                                "unknown reference \"${%s}\" (use ${input.<path>}, "
                                "${steps.<id>.output.<path>} or ${job.id})",
                                body);
        if (k == REF_STEP && !(known && known(arg, id)))
            return jd_error_set(err, JD_EINVAL, ptr,
                                "reference \"${%s}\" names no earlier step \"%s\"", body, id);
        p = end + 1;
    }
    return 0;
}

int jd_subst_check(const cJSON *v, const char *ptr, bool (*known)(void *arg, const char *id),
                   void *arg, struct jd_error *err)
{
    if (!v)
        return 0;
    if (cJSON_IsString(v))
        return check_string(v->valuestring, ptr, known, arg, err);
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        int i = 0;
        for (const cJSON *c = v->child; c; c = c->next, i++) {
            char p[JD_ERROR_PTR_MAX];
            snprintf(p, sizeof p, "%s", ptr);
            if (cJSON_IsArray(v)) {
                char idx[24];
                snprintf(idx, sizeof idx, "%d", i);
                jd_ptr_append(p, sizeof p, idx);
            } else {
                jd_ptr_append(p, sizeof p, c->string);
            }
            int rc = jd_subst_check(c, p, known, arg, err);
            if (rc)
                return rc;
        }
    }
    return 0;
}
