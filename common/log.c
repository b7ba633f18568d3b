/*
 * JSON-lines logger. Builds each line in a stack buffer and writes it with a
 * single write(2) so concurrent lines never interleave.
 */
#include "common/log.h"
#include "common/clock.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define LOG_LINE_MAX 4096 /* longer lines are truncated, still valid JSON */

static _Atomic int min_level = JD_LOG_INFO;
static const char *names[] = {"debug", "info", "warn", "error", "off"};

void jd_log_set_level(enum jd_log_level level)
{
    atomic_store_explicit(&min_level, (int)level, memory_order_relaxed);
}

enum jd_log_level jd_log_get_level(void)
{
    return (enum jd_log_level)atomic_load_explicit(&min_level, memory_order_relaxed);
}

int jd_log_level_parse(const char *s)
{
    for (int i = 0; i <= JD_LOG_OFF; i++)
        if (s && !strcmp(s, names[i]))
            return i;
    return -1;
}

struct line {
    char buf[LOG_LINE_MAX];
    size_t len;
};

static void put(struct line *l, const char *s, size_t n)
{
    if (l->len + n > sizeof l->buf - 3)
        n = sizeof l->buf - 3 - l->len;
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void put_str(struct line *l, const char *s)
{
    put(l, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            put(l, esc, 2);
        } else if (*p < 0x20) {
            int n = snprintf(esc, sizeof esc, "\\u%04x", *p);
            put(l, esc, (size_t)n);
        } else {
            put(l, (const char *)p, 1);
        }
    }
    put(l, "\"", 1);
}

static void put_field(struct line *l, const char *k, const char *v)
{
    put(l, ",", 1);
    put_str(l, k);
    put(l, ":", 1);
    put_str(l, v ? v : "");
}

static void emit(enum jd_log_level level, const char *msg, va_list *fields)
{
    struct line l = {.len = 0};
    char ts[40];
    jd_time_format(jd_wall_ms(), ts, sizeof ts);
    put(&l, "{\"time\":", 8);
    put_str(&l, ts);
    put_field(&l, "level", names[level]);
    put_field(&l, "msg", msg);
    if (fields) {
        const char *k;
        while ((k = va_arg(*fields, const char *)) != NULL) {
            const char *v = va_arg(*fields, const char *);
            put_field(&l, k, v);
        }
    }
    l.buf[l.len++] = '}';
    l.buf[l.len++] = '\n';
    ssize_t rc = write(STDERR_FILENO, l.buf, l.len);
    (void)rc;
}

void jd_log(enum jd_log_level level, const char *msg, ...)
{
    if ((int)level < atomic_load_explicit(&min_level, memory_order_relaxed) || level >= JD_LOG_OFF)
        return;
    va_list ap;
    va_start(ap, msg);
    emit(level, msg, &ap);
    va_end(ap);
}

void jd_logf(enum jd_log_level level, const char *fmt, ...)
{
    if ((int)level < atomic_load_explicit(&min_level, memory_order_relaxed) || level >= JD_LOG_OFF)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(level, msg, NULL);
}
