/*
 * http: make an HTTP request with libcurl.
 *
 *   {"method": "POST", "url": "http://127.0.0.1:9000/x",
 *    "headers": {"X-Token": "t"}, "body": {"any": "json"} | "text",
 *    "timeout_ms": 5000}
 * ->{"status": 200, "headers": {"content-type": "application/json",
 *                               "set-cookie": ["a=1", "b=2"], ...},
 *    "body": <JSON if the response is application/json, else a string>,
 *    "truncated": false}
 *
 * A 5xx answer fails with kind "http_status", retryable; a 4xx one with
 * kind "http_status", not retryable (both carry the response as details).
 * Response headers: one key per field name, lower-cased, in order of first
 * appearance. A repeated field is joined with ", " in the order received
 * (RFC 9110 5.3), except set-cookie, which is always an array of strings,
 * even for one cookie (its values hold commas, so they cannot be joined:
 * the special case RFC 9110 5.3 names; RFC 6265 3 says not to fold it).
 * Only the final response's fields are kept (not those of a 100 Continue
 * before it); at most HTTP_MAX_HEADERS_BYTES of header lines are kept, the
 * rest dropped. Values are JSON strings: invalid UTF-8 bytes become U+FFFD,
 * as in bodies.
 *
 * Connection errors and curl's own timeout fail with kind "http_error",
 * retryable. Redirects are not followed (a 3xx is returned as is). The
 * method defaults to GET, or POST when there is a body. A JSON (non-string)
 * body is sent with Content-Type: application/json, a string body with no
 * Content-Type, unless the headers say otherwise. Response bodies over
 * config "output_cap" bytes (default 64 KiB) are cut and "truncated" is true
 * (a cut JSON body is returned as a string). Config "http_allow"
 * (comma-separated HOST, HOST:PORT, V6, [V6] or [V6]:PORT) limits where
 * requests go, checked on the URL at submit and on the address at connect
 * (on_open_socket states the rule); unset or empty: any host but link-local
 * ones. Only http and https. Framing fields (Host, Content-Length, ...) are
 * the handler's, not the job's. Every request has a deadline: "timeout_ms",
 * else config "http_timeout_ms" (default 60 s), plus connect and stall
 * limits.
 *
 * Threading: one event-loop thread owns a curl multi handle and every easy
 * handle in it (no thread per request). handle() builds the easy handle on
 * the caller's thread, queues it and wakes the loop (curl_multi_wakeup);
 * cancel() queues a cancel the same way. The queue is guarded by a mutex;
 * everything else belongs to the loop thread. The loop starts on first use
 * and lives as long as the process (the ABI has no unload hook).
 */
#include "plugins/builtin.h"

#include <curl/curl.h>
#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <strings.h>
#include <sys/socket.h>

#define HTTP_DEFAULT_CAP (64 * 1024)        /* as exec: bounded, storable results */
#define HTTP_MAX_HEADERS_BYTES (64 * 1024)  /* response headers kept, beyond that dropped */
#define HTTP_DEFAULT_TIMEOUT_MS (60 * 1000) /* --http-timeout's default, as common clients */
#define HTTP_CONNECT_TIMEOUT_MS (10 * 1000) /* a TCP + TLS handshake that takes longer is lost */
#define HTTP_LOW_SPEED_BYTES 1L             /* below 1 byte/s ...                        */
#define HTTP_LOW_SPEED_SECS 30L             /* ... for 30 s, a transfer has stalled: give up */
#define HTTP_REFUSED 2 /* http_validate: well-formed, but the configuration refuses it */

static const struct jd_host *host;

/* One response header line: the name lower-cased, the value with its
 * surrounding whitespace cut, both as offsets into req.hraw. */
struct hfield {
    size_t name, nlen;
    size_t val, vlen;
    size_t next; /* next field of the same name (index), or SIZE_MAX */
    int first;   /* the first field of its name: where its key is written */
};

struct req {
    struct jd_call *call;
    CURL *easy;
    struct curl_slist *headers;
    char *body; /* request body, owned */
    struct jd_pjson_buf resp_body;
    struct jd_pjson_buf hraw; /* the current response's names and values, back to back */
    struct hfield *fields;    /* in order received; offsets into hraw */
    size_t nfields, capfields;
    size_t headers_bytes; /* raw header-line bytes seen in the current response */
    int headers_full;     /* HTTP_MAX_HEADERS_BYTES reached: drop the rest */
    int last_kept;        /* the previous line was kept: an obs-fold may extend it */
    size_t cap;
    int truncated;
    int cancelled;
    int name_allowed;  /* the URL's host matched a name entry of the allow-list */
    char refused[200]; /* the socket callback refused an address: why */
    char errbuf[CURL_ERROR_SIZE];
    struct req *next; /* queue or active list */
};

static pthread_once_t loop_once = PTHREAD_ONCE_INIT;
static int loop_ok;
static CURLM *multi;
static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static struct req *q_new;         /* handed to the loop */
static struct jd_call **q_cancel; /* cancel requests */
static size_t q_ncancel, q_capcancel;
static struct req *active; /* loop thread only */

/* ---- argument checks ---- */

/* An address in one form for comparing: IPv4 (also when it came as an
 * IPv4-mapped IPv6 address) or IPv6. */
struct addr {
    int family; /* AF_INET or AF_INET6; 0: not an address literal */
    unsigned char b[16];
};

static void addr_normalise(struct addr *a)
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (a->family == AF_INET6 && memcmp(a->b, mapped, 12) == 0) {
        memmove(a->b, a->b + 12, 4);
        a->family = AF_INET;
    }
}

/* Parse an address literal of n bytes (no brackets). */
static int addr_parse(const char *s, size_t n, struct addr *a)
{
    char buf[INET6_ADDRSTRLEN + 1];
    memset(a, 0, sizeof *a);
    if (n == 0 || n >= sizeof buf)
        return 0;
    memcpy(buf, s, n);
    buf[n] = '\0';
    if (inet_pton(AF_INET, buf, a->b) == 1)
        a->family = AF_INET;
    else if (inet_pton(AF_INET6, buf, a->b) == 1)
        a->family = AF_INET6;
    else
        return 0;
    addr_normalise(a);
    return 1;
}

static int addr_equal(const struct addr *x, const struct addr *y)
{
    return x->family && x->family == y->family &&
           memcmp(x->b, y->b, x->family == AF_INET ? 4 : 16) == 0;
}

/* Link-local addresses, where cloud metadata services answer (169.254.0.0/16
 * with 169.254.169.254; fe80::/10), and AWS's IPv6 metadata address
 * fd00:ec2::254, also written as NAT64 (64:ff9b::/96) of an IPv4 one. A
 * job reaches them only through an allow-list entry naming that address. */
static int addr_link_local(const struct addr *a)
{
    static const unsigned char aws6[16] = {0xfd, 0x00, 0x0e, 0xc2, 0, 0, 0,    0,
                                           0,    0,    0,    0,    0, 0, 0x02, 0x54};
    static const unsigned char nat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
    if (a->family == AF_INET)
        return a->b[0] == 169 && a->b[1] == 254;
    if (a->family != AF_INET6)
        return 0;
    if (memcmp(a->b, nat64, 12) == 0)
        return a->b[12] == 169 && a->b[13] == 254;
    return (a->b[0] == 0xfe && (a->b[1] & 0xc0) == 0x80) || memcmp(a->b, aws6, 16) == 0;
}

/* One allow-list entry: HOST, HOST:PORT, V6, [V6] or [V6]:PORT. */
struct entry {
    const char *host; /* not NUL-terminated */
    size_t hlen;
    long port;       /* -1: any port */
    struct addr lit; /* family 0 when host is a name */
};

static int entry_parse(const char *p, size_t n, struct entry *e)
{
    const char *colon = NULL, *portp = NULL;
    size_t ncolons = 0;
    memset(e, 0, sizeof *e);
    e->port = -1;
    for (size_t i = 0; i < n; i++)
        if (p[i] == ':')
            ncolons++, colon = p + i;
    if (n && p[0] == '[') {
        const char *close = memchr(p, ']', n);
        if (!close)
            return 0;
        e->host = p + 1;
        e->hlen = (size_t)(close - p - 1);
        if (close + 1 < p + n) {
            if (close[1] != ':')
                return 0;
            portp = close + 2;
        }
    } else if (ncolons == 1) {
        e->host = p;
        e->hlen = (size_t)(colon - p);
        portp = colon + 1;
    } else {
        e->host = p; /* a name, an IPv4 address or a bare IPv6 address */
        e->hlen = n;
    }
    if (portp) {
        char *end;
        size_t plen = (size_t)(p + n - portp);
        char buf[8];
        if (plen == 0 || plen > 5)
            return 0;
        memcpy(buf, portp, plen);
        buf[plen] = '\0';
        e->port = strtol(buf, &end, 10);
        if (*end || e->port < 1 || e->port > 65535)
            return 0;
    }
    addr_parse(e->host, e->hlen, &e->lit);
    return e->hlen > 0;
}

/* 1 if some entry of the list is this address literal (any port). */
static int addr_listed(const char *list, const struct addr *a)
{
    size_t n;
    struct entry e;
    for (const char *cur = list, *p; (p = jd_builtin_list_next(&cur, &n));)
        if (n && entry_parse(p, n, &e) && addr_equal(&e.lit, a))
            return 1;
    return 0;
}

/* Check a URL against the scheme rule, the link-local rule and the
 * allow-list: 0, or 1 (malformed) / HTTP_REFUSED with a reason in err.
 * *name_allowed (may be NULL) says whether a name entry let it through,
 * which the socket callback needs to know (see on_open_socket). */
static int url_allowed(const char *url, char *err, size_t errlen, int *name_allowed)
{
    const char *list = host->config("http_allow");
    CURLU *u;
    char *h = NULL, *scheme = NULL, *port = NULL;
    size_t n, hlen;
    const char *hp;
    struct addr lit;
    long pnum;
    int rc = 1;
    if (name_allowed)
        *name_allowed = 0;
    u = curl_url();
    if (!u || curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &h, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK) {
        snprintf(err, errlen, "url is not a valid absolute URL");
        goto out;
    }
    if (strcasecmp(scheme, "http") != 0 && strcasecmp(scheme, "https") != 0) {
        snprintf(err, errlen, "url scheme must be http or https");
        goto out;
    }
    rc = HTTP_REFUSED;
    hp = h;
    hlen = strlen(h);
    if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']')
        hp++, hlen -= 2;
    pnum = strtol(port, NULL, 10);
    if (addr_parse(hp, hlen, &lit) && addr_link_local(&lit) && !(list && addr_listed(list, &lit))) {
        snprintf(err, errlen,
                 "host \"%.100s\" is link-local (cloud metadata lives there): allowed only when "
                 "--http-allow lists that address",
                 h);
        goto out;
    }
    if (!list || !*list) {
        rc = 0;
        goto out;
    }
    for (const char *cur = list, *p; (p = jd_builtin_list_next(&cur, &n));) {
        struct entry e;
        if (!n || !entry_parse(p, n, &e) || (e.port >= 0 && e.port != pnum))
            continue;
        if (e.lit.family ? addr_equal(&e.lit, &lit)
                         : e.hlen == hlen && strncasecmp(e.host, hp, hlen) == 0) {
            if (name_allowed && !e.lit.family)
                *name_allowed = 1;
            rc = 0;
            goto out;
        }
    }
    snprintf(err, errlen, "host \"%.100s\" port %ld is not in the http allow-list", h, pnum);
out:
    curl_free(h);
    curl_free(scheme);
    curl_free(port);
    curl_url_cleanup(u);
    return rc;
}

/* Request fields that frame the message or steer the connection: curl
 * writes them from the request itself, and a job that set them could
 * smuggle a second request to the server or split the one it makes. */
static const char *const framing_headers[] = {
    "host", "content-length", "transfer-encoding", "connection",       "upgrade",
    "te",   "trailer",        "keep-alive",        "proxy-connection", "expect",
};

/* RFC 9110 tchar: what a field name may be made of. */
static int is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Check args: 0; 1 (malformed) or HTTP_REFUSED (the configuration or the
 * framing rule refuses it), with a message and a JSON pointer. */
static int http_check(const char *args_json, char *err, size_t errlen, char *ptr, size_t ptrlen,
                      int *name_allowed)
{
    struct jd_pjson *a = jd_builtin_parse_args(args_json, err, errlen);
    struct jd_pjson *v;
    int64_t t;
    int rc = 1;
    if (!a)
        return 1;
    v = jd_pjson_get(a, "url");
    if (!jd_pjson_str(v)) {
        snprintf(err, errlen, "url must be a string");
        snprintf(ptr, ptrlen, "/url");
        goto out;
    }
    if ((rc = url_allowed(v->string, err, errlen, name_allowed)) != 0) {
        snprintf(ptr, ptrlen, "/url");
        goto out;
    }
    rc = 1;
    if ((v = jd_pjson_get(a, "method"))) {
        const char *m = jd_pjson_str(v);
        size_t i = 0;
        for (; m && m[i]; i++)
            if (!(m[i] >= 'A' && m[i] <= 'Z'))
                break;
        if (!m || !*m || m[i] || i > 16) {
            snprintf(err, errlen, "method must be an upper-case word such as GET or POST");
            snprintf(ptr, ptrlen, "/method");
            goto out;
        }
    }
    if ((v = jd_pjson_get(a, "headers"))) {
        if (!jd_pjson_is(v, JD_PJSON_OBJECT)) {
            snprintf(err, errlen, "headers must be an object of strings");
            snprintf(ptr, ptrlen, "/headers");
            goto out;
        }
        for (size_t i = 0; i < v->len; i++) {
            const char *k = v->keys[i];
            const char *val = jd_pjson_str(v->items[i]);
            size_t j = 0;
            while (k[j] && is_tchar((unsigned char)k[j]))
                j++;
            if (!*k || k[j] || !val || strlen(val) != v->items[i]->len || strpbrk(val, "\r\n")) {
                snprintf(err, errlen, "header names are tokens, values strings without newlines");
                jd_builtin_ptr_token(ptr, ptrlen, "/headers", k);
                goto out;
            }
            for (j = 0; j < sizeof framing_headers / sizeof *framing_headers; j++) {
                if (strcasecmp(k, framing_headers[j]) == 0) {
                    snprintf(err, errlen,
                             "header \"%.60s\" frames the request: the http handler sets it "
                             "itself, a job may not",
                             k);
                    jd_builtin_ptr_token(ptr, ptrlen, "/headers", k);
                    rc = HTTP_REFUSED;
                    goto out;
                }
            }
        }
    }
    if ((v = jd_pjson_get(a, "timeout_ms")) && (!jd_pjson_int(v, &t) || t < 0)) {
        snprintf(err, errlen, "timeout_ms must be a non-negative integer");
        snprintf(ptr, ptrlen, "/timeout_ms");
        goto out;
    }
    rc = 0;
out:
    jd_pjson_free(a);
    return rc;
}

static int http_validate(const char *args_json, char *err, size_t errlen, char *ptr, size_t ptrlen)
{
    return http_check(args_json, err, errlen, ptr, ptrlen, NULL) != 0;
}

/* ---- curl callbacks (loop thread) ---- */

static size_t on_body(char *data, size_t size, size_t n, void *ud)
{
    struct req *r = ud;
    size_t len = size * n;
    size_t keep = r->resp_body.len < r->cap ? r->cap - r->resp_body.len : 0;
    if (len > keep)
        r->truncated = 1;
    else
        keep = len;
    if (keep)
        jd_pjson_buf_raw(&r->resp_body, data, keep);
    return len; /* keep reading (and discarding) so the connection ends cleanly */
}

static int is_ows(char c)
{
    return c == ' ' || c == '\t';
}

/* Keep one header line of the current response. Lines are stored, not
 * written as JSON yet, because repeated names are merged at the end
 * (headers_json). Lines past HTTP_MAX_HEADERS_BYTES, and everything after
 * them, are dropped, so what is kept is always a prefix of the response's
 * fields. A line whose name is not a token (RFC 9110 5.1) is dropped: such a
 * response is invalid. A line that starts with whitespace continues the
 * previous value (obs-fold, which RFC 9112 5.2 says to replace with SP). */
static size_t on_header(char *data, size_t size, size_t n, void *ud)
{
    struct req *r = ud;
    size_t len = size * n, klen, vstart, vend;
    char *colon;
    if (len >= 5 && memcmp(data, "HTTP/", 5) == 0) {
        /* A new response (the final one after a 100 Continue or 103 Early
         * Hints): only the final response's fields are returned. */
        r->hraw.len = 0;
        r->nfields = 0;
        r->headers_bytes = 0;
        r->headers_full = 0;
        r->last_kept = 0;
        return len;
    }
    vend = len;
    while (vend > 0 && (data[vend - 1] == '\r' || data[vend - 1] == '\n' || is_ows(data[vend - 1])))
        vend--;
    if (vend == 0 || r->headers_full)
        return len; /* the blank line ending the head, or past the cap */
    if (r->headers_bytes + len > HTTP_MAX_HEADERS_BYTES) {
        r->headers_full = 1;
        return len;
    }
    r->headers_bytes += len;
    if (is_ows(data[0])) {
        struct hfield *last;
        if (!r->last_kept)
            return len; /* continues a line that was dropped, or none */
        last = &r->fields[r->nfields - 1];
        /* The last value is the last thing in hraw, so it can grow in place. */
        vstart = 1;
        while (vstart < vend && is_ows(data[vstart]))
            vstart++;
        if (last->vlen) {
            jd_pjson_buf_raw(&r->hraw, " ", 1);
            last->vlen++;
        }
        jd_pjson_buf_raw(&r->hraw, data + vstart, vend - vstart);
        last->vlen += vend - vstart;
        return len;
    }
    r->last_kept = 0;
    colon = memchr(data, ':', vend);
    if (!colon || colon == data)
        return len;
    klen = (size_t)(colon - data);
    for (size_t i = 0; i < klen; i++)
        if (!is_tchar((unsigned char)data[i]))
            return len;
    r->last_kept = 1;
    vstart = klen + 1;
    while (vstart < vend && is_ows(data[vstart]))
        vstart++;
    if (r->nfields == r->capfields) {
        r->capfields = r->capfields ? r->capfields * 2 : 16;
        r->fields = jd_pjson_xrealloc(r->fields, r->capfields * sizeof *r->fields);
    }
    struct hfield *f = &r->fields[r->nfields++];
    f->name = r->hraw.len;
    f->nlen = klen;
    f->vlen = vend - vstart;
    f->next = SIZE_MAX;
    f->first = 1;
    jd_pjson_buf_raw(&r->hraw, data, klen);
    for (size_t i = 0; i < klen; i++) {
        char *c = &r->hraw.p[f->name + i];
        if (*c >= 'A' && *c <= 'Z')
            *c = (char)(*c + ('a' - 'A'));
    }
    f->val = r->hraw.len;
    jd_pjson_buf_raw(&r->hraw, data + vstart, vend - vstart);
    return len;
}

/* A field's name and index, sorted to group repeated names. */
struct hkey {
    const char *name;
    size_t nlen, i;
};

/* Order by name, then by arrival. */
static int hkey_cmp(const void *a, const void *b)
{
    const struct hkey *x = a, *y = b;
    int c = memcmp(x->name, y->name, x->nlen < y->nlen ? x->nlen : y->nlen);
    if (c == 0 && x->nlen != y->nlen)
        c = x->nlen < y->nlen ? -1 : 1;
    if (c == 0)
        c = x->i < y->i ? -1 : 1;
    return c;
}

/* Append the kept fields as a JSON object: one key per name (lower case),
 * in order of each name's first appearance. Repeated fields are joined with
 * ", " in order received (RFC 9110 5.3), except set-cookie, whose values
 * hold commas (the special case 5.3 names): it is always an array.
 * Grouping goes through a sort, so a response with thousands of fields
 * stays O(n log n). */
static void headers_json(struct req *r, struct jd_pjson_buf *out)
{
    struct hkey *k = NULL;
    int any = 0;
    if (r->nfields) {
        k = jd_pjson_xrealloc(NULL, r->nfields * sizeof *k);
        for (size_t i = 0; i < r->nfields; i++)
            k[i] = (struct hkey){r->hraw.p + r->fields[i].name, r->fields[i].nlen, i};
        qsort(k, r->nfields, sizeof *k, hkey_cmp);
        for (size_t j = 1; j < r->nfields; j++) {
            if (k[j].nlen == k[j - 1].nlen && memcmp(k[j].name, k[j - 1].name, k[j].nlen) == 0) {
                r->fields[k[j - 1].i].next = k[j].i;
                r->fields[k[j].i].first = 0;
            }
        }
    }
    jd_pjson_buf_cat(out, "{");
    for (size_t i = 0; i < r->nfields; i++) {
        const struct hfield *f = &r->fields[i];
        int cookie = f->nlen == 10 && memcmp(r->hraw.p + f->name, "set-cookie", 10) == 0;
        if (!f->first)
            continue;
        if (any++)
            jd_pjson_buf_cat(out, ",");
        jd_pjson_buf_strn(out, r->hraw.p + f->name, f->nlen);
        jd_pjson_buf_cat(out, cookie ? ":[" : ":");
        if (cookie) {
            for (size_t j = i; j != SIZE_MAX; j = r->fields[j].next) {
                if (j != i)
                    jd_pjson_buf_cat(out, ",");
                jd_pjson_buf_strn(out, r->hraw.p + r->fields[j].val, r->fields[j].vlen);
            }
            jd_pjson_buf_cat(out, "]");
        } else {
            /* Join the raw bytes first, so escaping sees one string. */
            struct jd_pjson_buf v = {0};
            for (size_t j = i; j != SIZE_MAX; j = r->fields[j].next) {
                if (j != i)
                    jd_pjson_buf_raw(&v, ", ", 2);
                jd_pjson_buf_raw(&v, r->hraw.p + r->fields[j].val, r->fields[j].vlen);
            }
            jd_pjson_buf_strn(out, v.p ? v.p : "", v.len);
            jd_pjson_buf_free(&v);
        }
    }
    jd_pjson_buf_cat(out, "}");
    free(k);
}

/* curl is about to connect to addr: check the address itself, not the name
 * it came from, and make the socket close-on-exec (exec's children must
 * not inherit it).
 *
 * The rule: a link-local address (see addr_link_local) is refused unless
 * the allow-list names that address. With an allow-list, the address must
 * be an address entry's (same port if the entry has one), or the URL's host
 * must have matched a name entry: a name entry allows whatever that name
 * resolves to when curl looks it up for this request (one lookup, checked
 * here at connect time, so there is no window between the check and the
 * use). An operator who does not trust a name's DNS lists addresses. */
static curl_socket_t on_open_socket(void *ud, curlsocktype purpose, struct curl_sockaddr *sa)
{
    struct req *r = ud;
    const char *list = host->config("http_allow");
    struct addr a = {0};
    long port = -1;
    int ok;
    (void)purpose;
    if (sa->family == AF_INET && sa->addrlen >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)&sa->addr;
        a.family = AF_INET;
        memcpy(a.b, &in->sin_addr, 4);
        port = ntohs(in->sin_port);
    } else if (sa->family == AF_INET6 && sa->addrlen >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)&sa->addr;
        a.family = AF_INET6;
        memcpy(a.b, &in6->sin6_addr, 16);
        port = ntohs(in6->sin6_port);
        addr_normalise(&a);
    }
    ok = a.family != 0;
    if (ok && addr_link_local(&a) && !(list && addr_listed(list, &a)))
        ok = 0;
    else if (ok && list && *list && !r->name_allowed) {
        size_t n;
        struct entry e;
        ok = 0;
        for (const char *cur = list, *p; !ok && (p = jd_builtin_list_next(&cur, &n));)
            ok = n && entry_parse(p, n, &e) && addr_equal(&e.lit, &a) &&
                 (e.port < 0 || e.port == port);
    }
    if (!ok) {
        char text[INET6_ADDRSTRLEN] = "?";
        if (a.family)
            inet_ntop(a.family, a.b, text, sizeof text);
        snprintf(r->refused, sizeof r->refused,
                 "connecting to %s port %ld is not allowed (link-local, or not in the http "
                 "allow-list)",
                 text, port);
        return CURL_SOCKET_BAD;
    }
    return socket(sa->family, sa->socktype | SOCK_CLOEXEC, sa->protocol);
}

static void req_free(struct req *r)
{
    if (r->easy)
        curl_easy_cleanup(r->easy);
    curl_slist_free_all(r->headers);
    free(r->body);
    jd_pjson_buf_free(&r->resp_body);
    jd_pjson_buf_free(&r->hraw);
    free(r->fields);
    free(r);
}

/* The transfer ended: build the result and finish the call. */
static void req_finish(struct req *r, CURLcode code)
{
    long status = 0;
    char *ctype = NULL;
    struct jd_pjson_buf out = {0};
    struct jd_pjson *json = NULL;
    if (r->cancelled) {
        host->complete(r->call, NULL); /* release; the host already finished it */
        return;
    }
    if (code != CURLE_OK && r->refused[0]) {
        host->fail(r->call, "not_allowed", r->refused, 0, NULL);
        return;
    }
    if (code != CURLE_OK) {
        char msg[CURL_ERROR_SIZE + 64];
        snprintf(msg, sizeof msg, "%s", r->errbuf[0] ? r->errbuf : curl_easy_strerror(code));
        host->fail(r->call, "http_error", msg, 1, NULL);
        return;
    }
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(r->easy, CURLINFO_CONTENT_TYPE, &ctype);
    jd_pjson_buf_printf(&out, "{\"status\":%ld,\"headers\":", status);
    headers_json(r, &out);
    jd_pjson_buf_cat(&out, ",\"body\":");
    if (ctype && strncasecmp(ctype, "application/json", 16) == 0 && !r->truncated)
        json = jd_pjson_parse(jd_pjson_buf_text(&r->resp_body), NULL, 0);
    if (json)
        jd_pjson_buf_value(&out, json);
    else
        jd_pjson_buf_strn(&out, r->resp_body.p ? r->resp_body.p : "", r->resp_body.len);
    jd_pjson_buf_printf(&out, ",\"truncated\":%s}", r->truncated ? "true" : "false");
    jd_pjson_free(json);
    if (status >= 400) {
        char msg[64];
        snprintf(msg, sizeof msg, "HTTP status %ld", status);
        host->fail(r->call, "http_status", msg, status >= 500, out.p);
    } else {
        host->complete(r->call, out.p);
    }
    jd_pjson_buf_free(&out);
}

static void *loop_main(void *arg)
{
    (void)arg;
    for (;;) {
        struct req *incoming, *r;
        struct jd_call **cancels;
        size_t ncancel;
        int running, nmsg;
        CURLMsg *m;

        pthread_mutex_lock(&q_mu);
        incoming = q_new;
        q_new = NULL;
        cancels = q_cancel;
        ncancel = q_ncancel;
        q_cancel = NULL;
        q_ncancel = q_capcancel = 0;
        pthread_mutex_unlock(&q_mu);

        while (incoming) {
            r = incoming;
            incoming = r->next;
            r->next = active;
            active = r;
            curl_multi_add_handle(multi, r->easy);
        }
        for (size_t i = 0; i < ncancel; i++) {
            for (struct req **pp = &active; *pp; pp = &(*pp)->next) {
                if ((*pp)->call == cancels[i]) {
                    r = *pp;
                    *pp = r->next;
                    curl_multi_remove_handle(multi, r->easy);
                    r->cancelled = 1;
                    req_finish(r, CURLE_ABORTED_BY_CALLBACK);
                    req_free(r);
                    break;
                }
            }
        }
        free(cancels);

        curl_multi_perform(multi, &running);
        while ((m = curl_multi_info_read(multi, &nmsg))) {
            if (m->msg != CURLMSG_DONE)
                continue;
            for (struct req **pp = &active; *pp; pp = &(*pp)->next) {
                if ((*pp)->easy == m->easy_handle) {
                    CURLcode code = m->data.result;
                    r = *pp;
                    *pp = r->next;
                    curl_multi_remove_handle(multi, r->easy);
                    req_finish(r, code);
                    req_free(r);
                    break;
                }
            }
        }
        curl_multi_poll(multi, NULL, 0, 1000, NULL);
    }
    return NULL;
}

static void loop_start(void)
{
    pthread_t t;
    pthread_attr_t at;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return;
    multi = curl_multi_init();
    if (!multi)
        return;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    loop_ok = pthread_create(&t, &at, loop_main, NULL) == 0;
    pthread_attr_destroy(&at);
    if (!loop_ok)
        host->log(JD_PLOG_ERROR, "http", "cannot start the event-loop thread");
}

/* ---- handler ---- */

static void http_cancel(struct jd_call *call);

static void http_handle(const struct jd_call_info *info)
{
    struct jd_pjson *a;
    struct jd_pjson *v;
    struct req *r = NULL;
    char err[300] = "", ptr[128];
    const char *method = "GET";
    int64_t timeout_ms = 0;
    int has_ctype = 0, name_allowed = 0, rc;
    struct curl_slist *nl_ctype = NULL;

    pthread_once(&loop_once, loop_start);
    if (!loop_ok) {
        host->fail(info->call, "http_error", "the http plugin could not start", 1, NULL);
        return;
    }
    /* Checked again here, not only at submit: args may come from a
     * substitution (${...}) that validate never saw. */
    if ((rc = http_check(info->args_json, err, sizeof err, ptr, sizeof ptr, &name_allowed)) != 0) {
        host->fail(info->call, rc == HTTP_REFUSED ? "not_allowed" : "invalid_args", err, 0, NULL);
        return;
    }
    a = jd_pjson_parse(info->args_json, NULL, 0);
    r = calloc(1, sizeof *r);
    if (!a || !r || !(r->easy = curl_easy_init())) {
        host->fail(info->call, "http_error", "out of memory", 1, NULL);
        goto fail;
    }
    r->call = info->call;
    r->name_allowed = name_allowed;
    r->cap = jd_builtin_output_cap(host, HTTP_DEFAULT_CAP);
    if ((v = jd_pjson_get(a, "method")))
        method = v->string;
    else if ((v = jd_pjson_get(a, "body")) && !jd_pjson_is(v, JD_PJSON_NULL))
        method = "POST"; /* a body without a method: what curl -d does */
    jd_pjson_int(jd_pjson_get(a, "timeout_ms"), &timeout_ms);
    if ((v = jd_pjson_get(a, "headers"))) {
        for (size_t i = 0; i < v->len; i++) {
            struct jd_pjson_buf h = {0};
            struct curl_slist *nl;
            if (strcasecmp(v->keys[i], "content-type") == 0)
                has_ctype = 1;
            jd_pjson_buf_printf(&h, "%s: %s", v->keys[i], v->items[i]->string);
            nl = curl_slist_append(r->headers, h.p);
            jd_pjson_buf_free(&h);
            if (!nl) {
                host->fail(info->call, "http_error", "out of memory", 1, NULL);
                goto fail;
            }
            r->headers = nl;
        }
    }
    if ((v = jd_pjson_get(a, "body")) && !jd_pjson_is(v, JD_PJSON_NULL)) {
        struct jd_pjson_buf b = {0};
        const char *ctype = NULL;
        if (jd_pjson_is(v, JD_PJSON_STRING)) {
            jd_pjson_buf_raw(&b, v->string, v->len);
            ctype = "Content-Type:"; /* none given: send none rather than curl's form default */
        } else {
            jd_pjson_buf_value(&b, v);
            ctype = "Content-Type: application/json";
        }
        /* jd_pjson_buf aborts on OOM, so b.p is set (b.len may be 0). A failed
         * append must not drop the list built so far (a leak and lost
         * headers), and a NULL body would make curl read the body from
         * stdin. */
        r->body = b.p;
        if (!r->body || (!has_ctype && !(nl_ctype = curl_slist_append(r->headers, ctype)))) {
            host->fail(info->call, "http_error", "out of memory", 1, NULL);
            goto fail;
        }
        if (!has_ctype)
            r->headers = nl_ctype;
        curl_easy_setopt(r->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)b.len);
        curl_easy_setopt(r->easy, CURLOPT_POSTFIELDS, r->body);
    }
    curl_easy_setopt(r->easy, CURLOPT_URL, jd_pjson_str(jd_pjson_get(a, "url")));
    curl_easy_setopt(r->easy, CURLOPT_CUSTOMREQUEST, method);
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(r->easy, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(r->easy, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(r->easy, CURLOPT_HTTPHEADER, r->headers);
    curl_easy_setopt(r->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(r->easy, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(r->easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(r->easy, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(r->easy, CURLOPT_ERRORBUFFER, r->errbuf);
    curl_easy_setopt(r->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(r->easy, CURLOPT_USERAGENT, "jackdaw-http/1");
    curl_easy_setopt(r->easy, CURLOPT_OPENSOCKETFUNCTION, on_open_socket);
    curl_easy_setopt(r->easy, CURLOPT_OPENSOCKETDATA, r);
    /* The args' timeout_ms, else the configured default (--http-timeout);
     * clamped to what curl takes. Connecting and stalling have bounds of
     * their own, so a dead peer is noticed before a long deadline. */
    if (timeout_ms <= 0)
        timeout_ms = jd_builtin_config_ms(host, "http_timeout_ms", HTTP_DEFAULT_TIMEOUT_MS);
    if (timeout_ms > LONG_MAX)
        timeout_ms = LONG_MAX;
    curl_easy_setopt(r->easy, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(
        r->easy, CURLOPT_CONNECTTIMEOUT_MS,
        (long)(timeout_ms < HTTP_CONNECT_TIMEOUT_MS ? timeout_ms : HTTP_CONNECT_TIMEOUT_MS));
    curl_easy_setopt(r->easy, CURLOPT_LOW_SPEED_LIMIT, HTTP_LOW_SPEED_BYTES);
    curl_easy_setopt(r->easy, CURLOPT_LOW_SPEED_TIME, HTTP_LOW_SPEED_SECS);
    jd_pjson_free(a);

    pthread_mutex_lock(&q_mu);
    r->next = q_new;
    q_new = r;
    pthread_mutex_unlock(&q_mu);
    curl_multi_wakeup(multi);
    if (host->is_cancelled(info->call))
        http_cancel(info->call); /* a cancel that came before the request was queued */
    return;
fail:
    if (r)
        req_free(r);
    jd_pjson_free(a);
}

static void http_cancel(struct jd_call *call)
{
    pthread_once(&loop_once, loop_start); /* also orders us after the loop's start */
    if (!loop_ok)
        return;
    pthread_mutex_lock(&q_mu);
    /* A request still queued is finished here; an active one by the loop. */
    for (struct req **pp = &q_new; *pp; pp = &(*pp)->next) {
        if ((*pp)->call == call) {
            struct req *r = *pp;
            *pp = r->next;
            pthread_mutex_unlock(&q_mu);
            host->complete(r->call, NULL);
            req_free(r);
            return;
        }
    }
    if (q_ncancel == q_capcancel) {
        size_t cap = q_capcancel ? q_capcancel * 2 : 8;
        struct jd_call **n = realloc(q_cancel, cap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&q_mu);
            return; /* the transfer runs to its end; the result is dropped */
        }
        q_cancel = n;
        q_capcancel = cap;
    }
    q_cancel[q_ncancel++] = call;
    pthread_mutex_unlock(&q_mu);
    curl_multi_wakeup(multi);
}

static const struct jd_command commands[] = {
    {.name = "http", .validate = http_validate, .handle = http_handle, .cancel = http_cancel},
};

JD_BUILTIN_PLUGIN("http", commands, 1, NULL, 0)
