/*
 * The code table: one row per JD_E* code with its text and HTTP status.
 */
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct code_row {
    int code;
    const char *text;
    int http;
};

static const struct code_row rows[] = {
    {JD_OK, "ok", 200},
    {JD_EINVAL, "invalid input", 422},
    {JD_ENOMEM, "out of memory", 503},
    {JD_ENOENT, "not found", 404},
    {JD_EEXIST, "already exists", 409},
    {JD_ECONFLICT, "conflict", 409},
    {JD_EFULL, "too many requests", 429},
    {JD_ESHUTDOWN, "shutting down", 503},
    {JD_EIO, "storage or I/O failure", 500},
    {JD_ESTALE, "stale or duplicate completion", 409},
    {JD_ETIMEOUT, "timed out", 504},
    {JD_ECANCELLED, "cancelled", 409},
    {JD_EPARSE, "malformed input", 400},
    {JD_EBUSY, "busy", 503},
    {JD_ECORRUPT, "corrupt or foreign file", 500},
    {JD_EPERM, "not allowed", 403},
    {JD_ETOOBIG, "too large", 413},
    {JD_EINTERNAL, "internal error", 500},
};

static const struct code_row *find(int code)
{
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (rows[i].code == code)
            return &rows[i];
    return NULL;
}

const char *jd_strerror(int code)
{
    const struct code_row *r = find(code);
    return r ? r->text : "unknown error";
}

int jd_error_http_status(int code)
{
    const struct code_row *r = find(code);
    return r ? r->http : 500;
}

int jd_error_set(struct jd_error *err, int code, const char *pointer, const char *fmt, ...)
{
    if (!err)
        return code;
    err->code = code;
    snprintf(err->pointer, sizeof err->pointer, "%s", pointer ? pointer : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return code;
}

void jd_error_clear(struct jd_error *err)
{
    if (!err)
        return;
    err->code = 0;
    err->message[0] = '\0';
    err->pointer[0] = '\0';
}
