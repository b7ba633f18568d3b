/*
 * See client.h. Every body that comes back is read into a buffer that stops
 * growing at JD_CLI_BODY_MAX; the transfer is aborted past it. SSE lines are
 * capped the same way, so one endless line cannot exhaust memory either.
 */
#include "cli/client.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

struct buf {
    char *p;
    size_t len, cap;
    int truncated;
};

static int buf_add(struct buf *b, const char *d, size_t n)
{
    if (b->len + n > JD_CLI_BODY_MAX) {
        b->truncated = 1;
        return -1;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        b->p = jd_xrealloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

static size_t on_body(char *d, size_t sz, size_t nm, void *ud)
{
    return buf_add(ud, d, sz * nm) == 0 ? sz * nm : 0;
}

static CURL *easy_new(const struct jd_cli_conn *c, const char *path, struct curl_slist **hdrs,
                      char *errbuf)
{
    CURL *h = curl_easy_init();
    if (!h) {
        fprintf(stderr, "jackdaw: out of memory\n");
        abort();
    }
    char *url = jd_xasprintf("%s%s", c->url, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    free(url);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "jackdaw-cli");
    if (c->token && *c->token) {
        char *a = jd_xasprintf("Authorization: Bearer %s", c->token);
        *hdrs = curl_slist_append(*hdrs, a);
        free(a);
    }
    return h;
}

int jd_cli_request(const struct jd_cli_conn *c, const char *method, const char *path,
                   const char *body, long timeout_s, struct jd_cli_resp *resp)
{
    struct curl_slist *hdrs = NULL;
    struct buf b = {0};
    memset(resp, 0, sizeof *resp);
    CURL *h = easy_new(c, path, &hdrs, resp->err);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    } else if (strcmp(method, "POST") == 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    if (timeout_s > 0)
        curl_easy_setopt(h, CURLOPT_TIMEOUT, timeout_s);
    CURLcode rc = curl_easy_perform(h);
    int ret = 0;
    if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && b.truncated)) {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp->status);
        curl_off_t ra = 0;
        if (curl_easy_getinfo(h, CURLINFO_RETRY_AFTER, &ra) == CURLE_OK && ra > 0)
            resp->retry_after_s = ra > 3600 ? 3600 : (long)ra;
        if (b.truncated)
            snprintf(resp->err, sizeof resp->err, "response larger than %u bytes", JD_CLI_BODY_MAX);
    } else {
        if (!resp->err[0])
            snprintf(resp->err, sizeof resp->err, "%s", curl_easy_strerror(rc));
        resp->status = 0;
        ret = -1;
    }
    resp->body = b.p ? b.p : jd_xstrdup("");
    resp->len = b.len;
    resp->truncated = b.truncated;
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    return ret;
}

char *jd_cli_escape(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(s);
    char *out = jd_xmalloc(n * 3 + 1), *o = out;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            *p == '-' || *p == '_' || *p == '.' || *p == '~') {
            *o++ = (char)*p;
        } else {
            *o++ = '%';
            *o++ = hex[*p >> 4];
            *o++ = hex[*p & 15];
        }
    }
    *o = '\0';
    return out;
}

/* SSE parsing state: the current line and the event being built. */
struct sse {
    struct buf line, data;
    char id[64], event[64];
    char *last_id;
    jd_cli_sse_fn fn;
    void *ud;
    long status;
    struct buf errbody;
    CURL *h;
};

static void sse_line(struct sse *s, char *l)
{
    if (!*l) { /* blank line: dispatch */
        if (s->data.len || s->event[0]) {
            if (s->data.len && s->data.p[s->data.len - 1] == '\n')
                s->data.p[--s->data.len] = '\0';
            if (s->id[0])
                snprintf(s->last_id, 64, "%s", s->id);
            s->fn(s->ud, s->id, s->event[0] ? s->event : "message", s->data.p ? s->data.p : "");
        }
        s->data.len = 0;
        if (s->data.p)
            s->data.p[0] = '\0';
        s->id[0] = s->event[0] = '\0';
        return;
    }
    if (*l == ':')
        return; /* comment: a heartbeat */
    char *v = strchr(l, ':');
    if (v) {
        *v++ = '\0';
        if (*v == ' ')
            v++;
    } else {
        v = l + strlen(l);
    }
    if (strcmp(l, "data") == 0) {
        if (buf_add(&s->data, v, strlen(v)) == 0)
            buf_add(&s->data, "\n", 1);
    } else if (strcmp(l, "id") == 0) {
        snprintf(s->id, sizeof s->id, "%s", v);
    } else if (strcmp(l, "event") == 0) {
        snprintf(s->event, sizeof s->event, "%s", v);
    }
}

static size_t on_sse(char *d, size_t sz, size_t nm, void *ud)
{
    struct sse *s = ud;
    size_t n = sz * nm;
    if (!s->status)
        curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->status != 200)
        return buf_add(&s->errbody, d, n) == 0 ? n : 0;
    for (size_t i = 0; i < n; i++) {
        if (d[i] == '\n') {
            if (s->line.len && s->line.p[s->line.len - 1] == '\r')
                s->line.len--;
            if (s->line.p)
                s->line.p[s->line.len] = '\0';
            sse_line(s, s->line.p ? s->line.p : (char[]){0});
            s->line.len = 0;
        } else if (buf_add(&s->line, d + i, 1) != 0) {
            return 0; /* a line past the cap: give up on this stream */
        }
    }
    return n;
}

int jd_cli_sse(const struct jd_cli_conn *c, const char *path, char *last_id, jd_cli_sse_fn fn,
               void *ud, long *status, struct jd_cli_resp *err_resp)
{
    struct curl_slist *hdrs = NULL;
    struct sse s = {.last_id = last_id, .fn = fn, .ud = ud};
    memset(err_resp, 0, sizeof *err_resp);
    CURL *h = easy_new(c, path, &hdrs, err_resp->err);
    s.h = h;
    hdrs = curl_slist_append(hdrs, "Accept: text/event-stream");
    if (last_id[0]) {
        char *l = jd_xasprintf("Last-Event-ID: %s", last_id);
        hdrs = curl_slist_append(hdrs, l);
        free(l);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_sse);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    /* A stream that sends nothing (not even the heartbeat) for a minute is dead. */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
    CURLcode rc = curl_easy_perform(h);
    if (!s.status)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &s.status);
    *status = s.status;
    err_resp->status = s.status;
    err_resp->body = s.errbody.p ? s.errbody.p : jd_xstrdup("");
    err_resp->len = s.errbody.len;
    free(s.line.p);
    free(s.data.p);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK && !err_resp->err[0])
        snprintf(err_resp->err, sizeof err_resp->err, "%s", curl_easy_strerror(rc));
    return rc == CURLE_OK ? 0 : -1;
}
