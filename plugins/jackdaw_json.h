/*
 * jackdaw_json.h — an optional, header-only JSON reader and writer for
 * plugin authors.
 *
 * JSON crosses the plugin ABI as text (jackdaw_plugin.h), so a plugin may
 * use any JSON library it likes. This header exists so a plugin needs none:
 * the built-in plugins use it, and so can yours (copy it next to
 * jackdaw_plugin.h; it depends only on libc).
 *
 * Reading: jd_pjson_parse() builds a tree of struct jd_pjson nodes (caller
 * frees with jd_pjson_free). Strings are NUL-terminated copies (a "\u0000"
 * escape is kept in the length but ends the C string early). Numbers are
 * doubles. Nesting is limited to JD_PJSON_MAX_DEPTH.
 *
 * Writing: struct jd_pjson_buf is a growable string; jd_pjson_buf_str()
 * appends a quoted, escaped string, jd_pjson_buf_value() re-serialises a
 * node. Out of memory aborts (plugins get small inputs, and a half-built
 * JSON text would be worse).
 *
 * Threading: no shared state; nodes and buffers belong to one thread at a
 * time. Everything is `static inline` so an unused function costs nothing.
 */
#ifndef JACKDAW_JSON_H
#define JACKDAW_JSON_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JD_PJSON_MAX_DEPTH 64 /* deeper input is refused: recursion stays bounded */

enum jd_pjson_type {
    JD_PJSON_NULL,
    JD_PJSON_FALSE,
    JD_PJSON_TRUE,
    JD_PJSON_NUMBER,
    JD_PJSON_STRING,
    JD_PJSON_ARRAY,
    JD_PJSON_OBJECT,
};

struct jd_pjson {
    enum jd_pjson_type type;
    double number;           /* NUMBER */
    char *string;            /* STRING: NUL-terminated copy */
    size_t len;              /* STRING: bytes; ARRAY/OBJECT: number of items */
    char **keys;             /* OBJECT: keys[i] names items[i] */
    struct jd_pjson **items; /* ARRAY/OBJECT: children */
};

static inline void *jd_pjson_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fputs("jackdaw_json: out of memory\n", stderr);
        abort();
    }
    return q;
}

static inline void jd_pjson_free(struct jd_pjson *v)
{
    if (!v)
        return;
    if (v->type == JD_PJSON_ARRAY || v->type == JD_PJSON_OBJECT) {
        for (size_t i = 0; i < v->len; i++) {
            jd_pjson_free(v->items[i]);
            if (v->keys)
                free(v->keys[i]);
        }
    }
    free(v->items);
    free(v->keys);
    free(v->string);
    free(v);
}

/* ---- parser ---- */

struct jd_pjson_parser {
    const char *p;
    const char *start;
    char *err;
    size_t errlen;
    int failed;
};

static inline void jd_pjson_perr(struct jd_pjson_parser *ps, const char *what)
{
    if (!ps->failed && ps->err && ps->errlen)
        snprintf(ps->err, ps->errlen, "%s at offset %zu", what, (size_t)(ps->p - ps->start));
    ps->failed = 1;
}

static inline void jd_pjson_ws(struct jd_pjson_parser *ps)
{
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')
        ps->p++;
}

static inline int jd_pjson_hex4(const char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* Parses a string literal at ps->p (which points at '"'); returns a malloc'd
 * copy and its length, or NULL on error. */
static inline char *jd_pjson_pstring(struct jd_pjson_parser *ps, size_t *lenp)
{
    size_t cap = 16, n = 0;
    char *s = (char *)jd_pjson_xrealloc(NULL, cap);
    ps->p++; /* opening quote */
    for (;;) {
        unsigned char c = (unsigned char)*ps->p;
        char enc[4];
        size_t k = 0;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c == 0 || c < 0x20) {
            jd_pjson_perr(ps, c ? "control character in string" : "unterminated string");
            free(s);
            return NULL;
        }
        if (c != '\\') {
            enc[k++] = (char)c;
            ps->p++;
        } else {
            char e = ps->p[1];
            ps->p += 2;
            switch (e) {
            case '"':
                enc[k++] = '"';
                break;
            case '\\':
                enc[k++] = '\\';
                break;
            case '/':
                enc[k++] = '/';
                break;
            case 'b':
                enc[k++] = '\b';
                break;
            case 'f':
                enc[k++] = '\f';
                break;
            case 'n':
                enc[k++] = '\n';
                break;
            case 'r':
                enc[k++] = '\r';
                break;
            case 't':
                enc[k++] = '\t';
                break;
            case 'u': {
                unsigned cp, lo;
                if (jd_pjson_hex4(ps->p, &cp) != 0) {
                    jd_pjson_perr(ps, "bad \\u escape");
                    free(s);
                    return NULL;
                }
                ps->p += 4;
                if (cp >= 0xD800 && cp <= 0xDBFF && ps->p[0] == '\\' && ps->p[1] == 'u' &&
                    jd_pjson_hex4(ps->p + 2, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    ps->p += 6;
                } else if (cp >= 0xD800 && cp <= 0xDFFF) {
                    cp = 0xFFFD; /* lone surrogate: replacement character */
                }
                if (cp < 0x80) {
                    enc[k++] = (char)cp;
                } else if (cp < 0x800) {
                    enc[k++] = (char)(0xC0 | (cp >> 6));
                    enc[k++] = (char)(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                    enc[k++] = (char)(0xE0 | (cp >> 12));
                    enc[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    enc[k++] = (char)(0x80 | (cp & 0x3F));
                } else {
                    enc[k++] = (char)(0xF0 | (cp >> 18));
                    enc[k++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                    enc[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    enc[k++] = (char)(0x80 | (cp & 0x3F));
                }
                break;
            }
            default:
                ps->p -= 1;
                jd_pjson_perr(ps, "bad escape");
                free(s);
                return NULL;
            }
        }
        if (n + k + 1 > cap) {
            cap = cap * 2 + k;
            s = (char *)jd_pjson_xrealloc(s, cap);
        }
        memcpy(s + n, enc, k);
        n += k;
    }
    s[n] = '\0';
    *lenp = n;
    return s;
}

static inline struct jd_pjson *jd_pjson_pvalue(struct jd_pjson_parser *ps, int depth);

static inline struct jd_pjson *jd_pjson_node(enum jd_pjson_type t)
{
    struct jd_pjson *v = (struct jd_pjson *)jd_pjson_xrealloc(NULL, sizeof *v);
    memset(v, 0, sizeof *v);
    v->type = t;
    return v;
}

static inline void jd_pjson_push(struct jd_pjson *v, char *key, struct jd_pjson *item, size_t *cap)
{
    if (v->len == *cap) {
        *cap = *cap ? *cap * 2 : 4;
        v->items = (struct jd_pjson **)jd_pjson_xrealloc(v->items, *cap * sizeof *v->items);
        if (v->type == JD_PJSON_OBJECT)
            v->keys = (char **)jd_pjson_xrealloc(v->keys, *cap * sizeof *v->keys);
    }
    if (v->type == JD_PJSON_OBJECT)
        v->keys[v->len] = key;
    v->items[v->len++] = item;
}

static inline struct jd_pjson *jd_pjson_pcontainer(struct jd_pjson_parser *ps, int depth, int obj)
{
    struct jd_pjson *v = jd_pjson_node(obj ? JD_PJSON_OBJECT : JD_PJSON_ARRAY);
    size_t cap = 0;
    char close = obj ? '}' : ']';
    ps->p++;
    jd_pjson_ws(ps);
    if (*ps->p == close) {
        ps->p++;
        return v;
    }
    for (;;) {
        char *key = NULL;
        size_t klen;
        struct jd_pjson *item;
        jd_pjson_ws(ps);
        if (obj) {
            if (*ps->p != '"') {
                jd_pjson_perr(ps, "expected a string key");
                goto fail;
            }
            key = jd_pjson_pstring(ps, &klen);
            if (!key)
                goto fail;
            jd_pjson_ws(ps);
            if (*ps->p != ':') {
                free(key);
                jd_pjson_perr(ps, "expected ':'");
                goto fail;
            }
            ps->p++;
        }
        item = jd_pjson_pvalue(ps, depth + 1);
        if (!item) {
            free(key);
            goto fail;
        }
        jd_pjson_push(v, key, item, &cap);
        jd_pjson_ws(ps);
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p == close) {
            ps->p++;
            return v;
        }
        jd_pjson_perr(ps, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        goto fail;
    }
fail:
    jd_pjson_free(v);
    return NULL;
}

static inline struct jd_pjson *jd_pjson_pvalue(struct jd_pjson_parser *ps, int depth)
{
    struct jd_pjson *v;
    if (depth > JD_PJSON_MAX_DEPTH) {
        jd_pjson_perr(ps, "nested too deeply");
        return NULL;
    }
    jd_pjson_ws(ps);
    switch (*ps->p) {
    case '{':
        return jd_pjson_pcontainer(ps, depth, 1);
    case '[':
        return jd_pjson_pcontainer(ps, depth, 0);
    case '"': {
        size_t len;
        char *s = jd_pjson_pstring(ps, &len);
        if (!s)
            return NULL;
        v = jd_pjson_node(JD_PJSON_STRING);
        v->string = s;
        v->len = len;
        return v;
    }
    case 't':
        if (strncmp(ps->p, "true", 4) == 0) {
            ps->p += 4;
            return jd_pjson_node(JD_PJSON_TRUE);
        }
        break;
    case 'f':
        if (strncmp(ps->p, "false", 5) == 0) {
            ps->p += 5;
            return jd_pjson_node(JD_PJSON_FALSE);
        }
        break;
    case 'n':
        if (strncmp(ps->p, "null", 4) == 0) {
            ps->p += 4;
            return jd_pjson_node(JD_PJSON_NULL);
        }
        break;
    default: {
        const char *q = ps->p;
        char *end;
        double d;
        if (*q == '-')
            q++;
        if (*q < '0' || *q > '9')
            break;
        d = strtod(ps->p, &end);
        if (end == ps->p)
            break;
        ps->p = end;
        v = jd_pjson_node(JD_PJSON_NUMBER);
        v->number = d;
        return v;
    }
    }
    jd_pjson_perr(ps, *ps->p ? "unexpected character" : "unexpected end of input");
    return NULL;
}

/* Parse JSON text (NULL or empty parses as null). Returns the tree (caller
 * frees with jd_pjson_free), or NULL with a message in err. */
static inline struct jd_pjson *jd_pjson_parse(const char *text, char *err, size_t errlen)
{
    struct jd_pjson_parser ps = {text ? text : "null", text ? text : "null", err, errlen, 0};
    struct jd_pjson *v;
    if (text && !*text)
        ps.p = ps.start = "null";
    v = jd_pjson_pvalue(&ps, 0);
    if (!v)
        return NULL;
    jd_pjson_ws(&ps);
    if (*ps.p) {
        jd_pjson_perr(&ps, "trailing characters");
        jd_pjson_free(v);
        return NULL;
    }
    return v;
}

/* ---- access (all tolerate a NULL node) ---- */

/* Member `key` of an object, or NULL. Borrowed from v. */
static inline struct jd_pjson *jd_pjson_get(const struct jd_pjson *v, const char *key)
{
    if (!v || v->type != JD_PJSON_OBJECT)
        return NULL;
    for (size_t i = v->len; i-- > 0;) /* the last duplicate wins, as in most parsers */
        if (strcmp(v->keys[i], key) == 0)
            return v->items[i];
    return NULL;
}

static inline int jd_pjson_is(const struct jd_pjson *v, enum jd_pjson_type t)
{
    return v && v->type == t;
}

/* The string, or NULL if v is not a string. Borrowed from v. */
static inline const char *jd_pjson_str(const struct jd_pjson *v)
{
    return jd_pjson_is(v, JD_PJSON_STRING) ? v->string : NULL;
}

/* 1 and *out if v is a number with an integral value in int64 range. */
static inline int jd_pjson_int(const struct jd_pjson *v, int64_t *out)
{
    if (!jd_pjson_is(v, JD_PJSON_NUMBER) || !(v->number >= -9.2e18 && v->number <= 9.2e18) ||
        v->number != (double)(int64_t)v->number)
        return 0;
    *out = (int64_t)v->number;
    return 1;
}

/* 1 for true, 0 for false, dflt for anything else (including absent). */
static inline int jd_pjson_bool(const struct jd_pjson *v, int dflt)
{
    if (jd_pjson_is(v, JD_PJSON_TRUE))
        return 1;
    if (jd_pjson_is(v, JD_PJSON_FALSE))
        return 0;
    return dflt;
}

/* ---- writer ---- */

struct jd_pjson_buf {
    char *p; /* NUL-terminated while len > 0 or after any append */
    size_t len;
    size_t cap;
};

static inline void jd_pjson_buf_reserve(struct jd_pjson_buf *b, size_t more)
{
    if (b->len + more + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + more + 1)
            cap *= 2;
        b->p = (char *)jd_pjson_xrealloc(b->p, cap);
        b->cap = cap;
    }
}

static inline void jd_pjson_buf_raw(struct jd_pjson_buf *b, const char *s, size_t n)
{
    jd_pjson_buf_reserve(b, n);
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static inline void jd_pjson_buf_cat(struct jd_pjson_buf *b, const char *s)
{
    jd_pjson_buf_raw(b, s, strlen(s));
}

static inline void jd_pjson_buf_printf(struct jd_pjson_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void jd_pjson_buf_printf(struct jd_pjson_buf *b, const char *fmt, ...)
{
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0)
        return;
    jd_pjson_buf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Append s (n bytes, may hold any bytes) as a JSON string literal. Invalid
 * UTF-8 bytes become U+FFFD so the output is always valid JSON. */
static inline void jd_pjson_buf_strn(struct jd_pjson_buf *b, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    jd_pjson_buf_raw(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        size_t k = 0;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            jd_pjson_buf_raw(b, esc, 2);
            i++;
            continue;
        }
        if (c < 0x20) {
            const char *short_esc = c == '\n'   ? "\\n"
                                    : c == '\r' ? "\\r"
                                    : c == '\t' ? "\\t"
                                                : NULL;
            if (short_esc)
                jd_pjson_buf_cat(b, short_esc);
            else
                jd_pjson_buf_printf(b, "\\u%04x", c);
            i++;
            continue;
        }
        if (c < 0x80)
            k = 1;
        else if (c >= 0xC2 && c <= 0xDF)
            k = 2;
        else if (c >= 0xE0 && c <= 0xEF)
            k = 3;
        else if (c >= 0xF0 && c <= 0xF4)
            k = 4;
        if (k > 1) {
            if (i + k > n) {
                k = 0;
            } else {
                for (size_t j = 1; j < k; j++)
                    if ((u[i + j] & 0xC0) != 0x80)
                        k = 0;
            }
        }
        if (k == 0) {
            jd_pjson_buf_cat(b, "\xEF\xBF\xBD");
            i++;
            continue;
        }
        jd_pjson_buf_raw(b, s + i, k);
        i += k;
    }
    jd_pjson_buf_raw(b, "\"", 1);
}

static inline void jd_pjson_buf_str(struct jd_pjson_buf *b, const char *s)
{
    if (!s)
        jd_pjson_buf_cat(b, "null");
    else
        jd_pjson_buf_strn(b, s, strlen(s));
}

static inline void jd_pjson_buf_number(struct jd_pjson_buf *b, double d)
{
    if (d != d || d - d != 0) /* NaN or infinite: JSON has no spelling for them */
        jd_pjson_buf_cat(b, "null");
    else if (d > -1e15 && d < 1e15 && d == (double)(int64_t)d)
        jd_pjson_buf_printf(b, "%lld", (long long)d);
    else
        jd_pjson_buf_printf(b, "%.17g", d);
}

/* Append v re-serialised (compact). */
static inline void jd_pjson_buf_value(struct jd_pjson_buf *b, const struct jd_pjson *v)
{
    if (!v) {
        jd_pjson_buf_cat(b, "null");
        return;
    }
    switch (v->type) {
    case JD_PJSON_NULL:
        jd_pjson_buf_cat(b, "null");
        break;
    case JD_PJSON_FALSE:
        jd_pjson_buf_cat(b, "false");
        break;
    case JD_PJSON_TRUE:
        jd_pjson_buf_cat(b, "true");
        break;
    case JD_PJSON_NUMBER:
        jd_pjson_buf_number(b, v->number);
        break;
    case JD_PJSON_STRING:
        jd_pjson_buf_strn(b, v->string, v->len);
        break;
    case JD_PJSON_ARRAY:
    case JD_PJSON_OBJECT:
        jd_pjson_buf_raw(b, v->type == JD_PJSON_ARRAY ? "[" : "{", 1);
        for (size_t i = 0; i < v->len; i++) {
            if (i)
                jd_pjson_buf_raw(b, ",", 1);
            if (v->type == JD_PJSON_OBJECT) {
                jd_pjson_buf_str(b, v->keys[i]);
                jd_pjson_buf_raw(b, ":", 1);
            }
            jd_pjson_buf_value(b, v->items[i]);
        }
        jd_pjson_buf_raw(b, v->type == JD_PJSON_ARRAY ? "]" : "}", 1);
        break;
    }
}

/* The buffer's text (never NULL; "" when empty). Borrowed from b. */
static inline const char *jd_pjson_buf_text(struct jd_pjson_buf *b)
{
    if (!b->p)
        jd_pjson_buf_reserve(b, 0), b->p[0] = '\0';
    return b->p;
}

static inline void jd_pjson_buf_free(struct jd_pjson_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

#endif
