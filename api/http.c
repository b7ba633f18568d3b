/*
 * The HTTP server over libmicrohttpd (MHD): starting and stopping the
 * daemon, the connection lifecycle (a struct jd_req from the first access
 * handler call to the completion notifier), accumulating the request body,
 * authentication, request ids and logging, responses, and dispatching a
 * routed request to its handler (routes_*.c). Parking, long-poll and SSE
 * are in park.c.
 *
 * Threads: MHD's pool threads call the access handler, the SSE content
 * reader and the completion notifier; the job layer's done and watch
 * callbacks arrive on its threads (the storage writer, workers); one timer
 * thread of this module expires long-polls and paces SSE heartbeats; the
 * owner thread calls start/attach/drain/stop.
 *
 * A request is a struct jd_req, reference counted: MHD holds one reference from
 * the first handler call to the completion notifier, a pending job-layer
 * callback (done or watch) holds one, the parked list holds one, and an SSE
 * response holds one. The last unref frees it, so no callback can outlive
 * its request whichever order things happen in.
 *
 * Suspending: a handler that must wait sets `armed` and calls
 * MHD_suspend_connection while holding req->mu; a waker takes req->mu, marks
 * the request `fired` and resumes only if it was suspended. A callback that
 * fires before the handler suspends (even on the same thread) is therefore
 * seen by the handler, which then answers at once instead of suspending.
 * Lock order: req->mu before h->park_mu; the timer thread never takes a
 * req->mu while holding park_mu.
 */
#include "api/http_impl.h"

#include "api/problem.h"
#include "api/router.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DISCARD_LIMIT                                                                              \
    ((size_t)64 << 20) /* bytes of a rejected chunked body read before closing                     \
                        */

/* Requests (about 1.4 KiB) are made on an MHD thread and often dropped on
 * the completion thread: from an object cache (alloc.h). */
static struct jd_objcache *req_cache(void)
{
    return jd_objcache(JD_OC_HTTP_REQ, sizeof(struct jd_req));
}

void http_req_ref(struct jd_req *r)
{
    /* relaxed: taking a reference needs no ordering, only the drop does */
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
}

void http_req_unref(struct jd_req *r)
{
    /* acq_rel: the last dropper must see every other holder's writes */
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_destroy(&r->mu);
    free(r->path);
    free(r->body);
    free(r->cb_json);
    free(r->ans_json);
    free(r->sse_buf);
    jd_jobs_events_sub_free(r->evsub);
    jd_objcache_free(req_cache(), r);
}

struct jd_jobs *http_jobs_of(struct jd_http *h)
{
    /* acquire: pairs with the release in jd_http_attach */
    return atomic_load_explicit(&h->jobs, memory_order_acquire);
}

struct jd_schedules *http_schedules_of(struct jd_http *h)
{
    /* acquire: pairs with the release in jd_http_attach_schedules */
    return atomic_load_explicit(&h->schedules, memory_order_acquire);
}

enum MHD_Result http_respond(struct jd_req *r, int status, const char *ctype, char *body,
                             size_t len, const char *h1, const char *v1, const char *h2,
                             const char *v2)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(body);
        return MHD_NO;
    }
    if (ctype != NULL)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(resp, "X-Request-Id", r->rid);
    if (h1 != NULL && v1 != NULL)
        MHD_add_response_header(resp, h1, v1);
    if (h2 != NULL && v2 != NULL)
        MHD_add_response_header(resp, h2, v2);
    if (r->replayed)
        MHD_add_response_header(resp, "Idempotent-Replayed", "true");
    r->status = status;
    r->phase = PH_DONE;
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

char *http_answer_dup(const char *json)
{
    size_t n = strlen(json);
    char *b = jd_xmalloc(n + 2);
    memcpy(b, json, n + 1);
    return b;
}

char *http_answer_body(struct jd_req *r, const char *json, size_t *len)
{
    size_t n = strlen(json);
    char *b;
    if (json == r->ans_json && r->ans_room) {
        b = r->ans_json; /* n + 2 bytes: http_answer_dup made it */
        r->ans_json = NULL;
    } else {
        b = jd_xmalloc(n + 2);
        memcpy(b, json, n);
    }
    if (n == 0 || b[n - 1] != '\n')
        b[n++] = '\n';
    b[n] = '\0';
    *len = n;
    return b;
}

/* A JSON body from the job layer (not newline-terminated): with "\n". */
enum MHD_Result http_respond_json(struct jd_req *r, int status, const char *json, const char *h1,
                                  const char *v1)
{
    size_t len;
    char *b = http_answer_body(r, json, &len);
    return http_respond(r, status, "application/json", b, len, h1, v1, NULL, NULL);
}

enum MHD_Result http_respond_problem(struct jd_req *r, int status, const char *detail,
                                     const char *pointer)
{
    char *b = jd_problem_json(status, detail, pointer, r->path, r->rid);
    const char *hk = NULL, *hv = NULL;
    if (status == 429 || status == 503) {
        hk = MHD_HTTP_HEADER_RETRY_AFTER;
        hv = "1";
    } else if (status == 405) {
        hk = MHD_HTTP_HEADER_ALLOW;
        hv = jd_router_allow_text(r->m.allow);
    } else if (status == 401) {
        hk = MHD_HTTP_HEADER_WWW_AUTHENTICATE;
        hv = "Bearer realm=\"jackdaw\"";
    }
    if (status == 413)
        atomic_fetch_add_explicit(&r->h->metrics.body_rejected, 1,
                                  memory_order_relaxed); /* relaxed: a counter */
    return http_respond(r, status, "application/problem+json", b, strlen(b), hk, hv, NULL, NULL);
}

enum MHD_Result http_respond_error(struct jd_req *r, int rc, const struct jd_error *err)
{
    int status = jd_error_http_status(rc);
    const char *detail = (err && err->message[0]) ? err->message : jd_strerror(rc);
    char d[64];
    if (rc == JD_ENOENT && !(err && err->message[0]) && r->job_label[0]) {
        snprintf(d, sizeof d, "no job with id %s", r->job_label);
        detail = d;
    }
    return http_respond_problem(r, status, detail, err ? err->pointer : NULL);
}

/* A PUT's answer after its commit: 201 + Location <collection>/<param>
 * when it created the thing (cb_existing carries "created"), else 200. */
enum MHD_Result http_respond_put(struct jd_req *r, const char *json, const char *collection)
{
    pthread_mutex_lock(&r->mu);
    bool created = r->cb_existing;
    pthread_mutex_unlock(&r->mu);
    if (!created)
        return http_respond_json(r, 200, json ? json : "{}", NULL, NULL);
    char *loc = jd_xasprintf("%s/%s", collection, r->m.param);
    enum MHD_Result ret =
        http_respond_json(r, 201, json ? json : "{}", MHD_HTTP_HEADER_LOCATION, loc);
    free(loc);
    return ret;
}

/* The answer of a read: 200 with json (takes ownership), or rc's problem. */
enum MHD_Result http_respond_json_rc(struct jd_req *r, int rc, char *json)
{
    if (rc != 0)
        return http_respond_error(r, rc, NULL);
    enum MHD_Result ret = http_respond_json(r, 200, json, NULL, NULL);
    free(json);
    return ret;
}

/* 404 for a job id that is not even a number. */
enum MHD_Result http_respond_bad_job_id(struct jd_req *r)
{
    char d[160];
    snprintf(d, sizeof d, "no job with id \"%.100s\" (job ids are decimal numbers)", r->m.param);
    return http_respond_problem(r, 404, d, NULL);
}

static void make_request_id(struct jd_http *h, struct jd_req *r)
{
    const char *given = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Request-Id");
    if (given != NULL) {
        size_t n = strlen(given);
        bool ok = n > 0 && n <= REQ_ID_MAX;
        for (size_t i = 0; ok && i < n; i++) {
            char c = given[i];
            ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 c == '-' || c == '_' || c == '.' || c == ':';
        }
        if (ok) {
            memcpy(r->rid, given, n + 1);
            return;
        }
    }
    /* relaxed: only uniqueness matters */
    uint64_t n = atomic_fetch_add_explicit(&h->rid_counter, 1, memory_order_relaxed);
    /* "%016" PRIx64 "%08" PRIx64 of the seed and the counter's low half,
     * without snprintf (one per request) */
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++)
        r->rid[i] = hex[(h->rid_seed >> (60 - 4 * i)) & 15];
    for (int i = 0; i < 8; i++)
        r->rid[16 + i] = hex[(n >> (28 - 4 * i)) & 15];
    r->rid[24] = '\0';
}

static void log_request(struct jd_req *r, bool terminated)
{
    enum jd_log_level lvl = r->status >= 500 ? JD_LOG_WARN : JD_LOG_INFO;
    if (lvl < jd_log_get_level())
        return; /* filtered out: skip the formatting */
    char status[16], dur[32];
    snprintf(status, sizeof status, "%d", r->status);
    double ms = (double)(jd_now_ns() - r->start_ns) / 1e6;
    snprintf(dur, sizeof dur, "%.3f", ms);
    const char *msg = terminated ? "request aborted" : "request";
    if (r->job_label[0] != '\0')
        jd_log(lvl, msg, "request_id", r->rid, "method", r->method, "path", r->path ? r->path : "",
               "status", status, "duration_ms", dur, "job_id", r->job_label, NULL);
    else
        jd_log(lvl, msg, "request_id", r->rid, "method", r->method, "path", r->path ? r->path : "",
               "status", status, "duration_ms", dur, NULL);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct jd_http *h = cls;
    struct jd_req *r = *con_cls;
    if (r == NULL)
        return;
    *con_cls = NULL;
    bool aborted = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK;
    log_request(r, aborted);
    uint64_t us = (jd_now_ns() - r->start_ns) / 1000;
    jd_http_metrics_observe(&h->metrics, r->m.route, r->status, us);
    /* However the request ended (answered, timed out, or the client hung up
     * while it was parked or streaming), its slot and watch go back now. */
    http_park_release(r);
    /* release: jd_http_stop's acquire load then sees this request's frees */
    atomic_fetch_sub_explicit(&h->inflight, 1, memory_order_release);
    http_req_unref(r);
}

/* Per connection (MHD's socket context): set when a request was answered
 * before its body was read, so the close lingers (linger.c). */
struct conn_ctx {
    atomic_bool linger; /* relaxed: set and read on the connection's thread */
};

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct jd_http *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        struct conn_ctx *c = jd_xcalloc(1, sizeof *c);
        atomic_init(&c->linger, false);
        *socket_context = c;
        return;
    }
    struct conn_ctx *c = *socket_context;
    *socket_context = NULL;
    if (c == NULL)
        return;
    bool linger = atomic_load_explicit(&c->linger, memory_order_relaxed);
    free(c);
    if (!linger)
        return;
    /* MHD closes its descriptor right after this; a duplicate keeps the
     * socket open (no reset) while linger.c drains it. */
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci != NULL ? fcntl(ci->connect_fd, F_DUPFD_CLOEXEC, 3) : -1;
    if (fd >= 0)
        http_linger_add(h->linger, fd);
}

/* The request was answered before its body was read: the client may still
 * be sending it, so its connection's close lingers. */
static void linger_if_body_pending(struct jd_req *r)
{
    const char *cl = http_header(r, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *te = http_header(r, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if ((cl == NULL || strcmp(cl, "0") == 0) && te == NULL)
        return;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct conn_ctx *c = ci != NULL ? ci->socket_context : NULL;
    if (c != NULL)
        atomic_store_explicit(&c->linger, true, memory_order_relaxed);
}

const char *http_query(struct jd_req *r, const char *key)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

bool http_query_limit(struct jd_req *r, unsigned dflt, unsigned max, unsigned *out,
                      enum MHD_Result *ret)
{
    const char *lim = http_query(r, "limit");
    int64_t v = dflt;
    if (lim != NULL && (http_parse_i64(lim, &v) != 0 || v < 1 || v > (int64_t)max)) {
        char m[64];
        snprintf(m, sizeof m, "limit must be an integer from 1 to %u", max);
        *ret = http_respond_problem(r, 400, m, NULL);
        return false;
    }
    *out = (unsigned)v;
    return true;
}

const char *http_header(struct jd_req *r, const char *key)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, key);
}

int http_parse_i64(const char *s, int64_t *out)
{
    if (s == NULL || *s == '\0' || strlen(s) > 18)
        return JD_EINVAL;
    int64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return JD_EINVAL;
        v = v * 10 + (*p - '0');
    }
    *out = v;
    return 0;
}

/* Each route's handler, by route id, from the route table (api/routes.h). */
static jd_route_fn *const handlers[JD_ROUTE_COUNT] = {
#define JD_ROUTE_HANDLER(id, method, pattern, handler, flags) [id] = handler,
    JD_ROUTES(JD_ROUTE_HANDLER)
#undef JD_ROUTE_HANDLER
};

/* The body is complete: check what the route's flags ask for, then hand
 * the request to its handler. */
static enum MHD_Result dispatch(struct jd_req *r)
{
    struct jd_http *h = r->h;
    unsigned flags = r->m.flags;
    if ((flags & JD_RF_JOBS) && http_jobs_of(h) == NULL)
        return http_respond_problem(r, 503, "starting: recovering jobs", NULL);
    /* seq_cst: a request arriving after drain began must not start work */
    if ((flags & JD_RF_WRITE) && atomic_load(&h->draining))
        return http_respond_problem(r, 503, "the server is shutting down", NULL);
    if (flags & JD_RF_JSON) {
        if (r->len == 0)
            return http_respond_problem(r, 400, "the request needs a JSON body", NULL);
        if (!jd_utf8_valid(r->body, r->len))
            return http_respond_problem(r, 400, "the body is not valid UTF-8", NULL);
    }
    return handlers[r->m.route](r);
}

/* First call for a request: route, authenticate, check the headers. Returns
 * MHD_YES with r->phase PH_DONE when it already answered. */
static enum MHD_Result first_call(struct jd_req *r)
{
    struct jd_http *h = r->h;
    if (r->match_rc == JD_ENOENT) {
        char d[200];
        snprintf(d, sizeof d, "no route for %.16s %.120s (the routes are in /v1/openapi.yaml)",
                 r->method, r->path ? r->path : "");
        return http_respond_problem(r, 404, d, NULL);
    }
    if (r->match_rc == JD_ECONFLICT)
        return http_respond_problem(r, 405, "method not allowed on this route", NULL);
    if (h->token != NULL && (r->m.flags & JD_RF_V1)) {
        const char *auth = http_header(r, MHD_HTTP_HEADER_AUTHORIZATION);
        /* Both compared, each in constant time, whatever the route. */
        int main_ok = jd_auth_bearer_ok(auth, h->token);
        int worker_ok = h->worker_token != NULL && jd_auth_bearer_ok(auth, h->worker_token);
        if (!main_ok && worker_ok && !(r->m.flags & JD_RF_WORKER))
            return http_respond_problem(
                r, 403, "the worker token opens only /v1/tasks/* and PUT /v1/commands/*", NULL);
        if (!main_ok && !worker_ok)
            return http_respond_problem(r, 401, "missing or wrong bearer token", NULL);
    }
    const char *cl = http_header(r, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl != NULL) {
        int64_t n;
        if (http_parse_i64(cl, &n) != 0 || (uint64_t)n > h->max_body) {
            char d[96];
            snprintf(d, sizeof d, "request body over the limit of %zu bytes", h->max_body);
            return http_respond_problem(r, 413, d, NULL);
        }
    }
    if ((r->m.flags & JD_RF_JSON) &&
        !jd_content_type_is_json(http_header(r, MHD_HTTP_HEADER_CONTENT_TYPE))) {
        char d[200];
        const char *ct = http_header(r, MHD_HTTP_HEADER_CONTENT_TYPE);
        snprintf(d, sizeof d,
                 "the body must be JSON: send it with -H 'Content-Type: application/json' "
                 "(got %.80s)",
                 ct ? ct : "no Content-Type");
        return http_respond_problem(r, 415, d, NULL);
    }
    r->phase = PH_BODY;
    return MHD_YES;
}

#define JD_HTTP_CONN_MEMORY 16384 /* bytes of libmicrohttpd pool per connection */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct jd_http *h = cls;
    struct jd_req *r = *con_cls;
    if (r == NULL) {
        r = jd_objcache_calloc(req_cache());
        r->h = h;
        r->conn = conn;
        atomic_init(&r->refs, 1); /* MHD's, dropped in on_completed */
        /* relaxed: only uniqueness matters */
        r->serial = atomic_fetch_add_explicit(&h->serial_counter, 1, memory_order_relaxed) + 1;
        pthread_mutex_init(&r->mu, NULL);
        r->start_ns = jd_now_ns();
        size_t ml = strnlen(method, sizeof r->method - 1); /* truncated as before */
        memcpy(r->method, method, ml);
        r->method[ml] = '\0';
        r->path = jd_xstrdup(url);
        make_request_id(h, r);
        r->match_rc = jd_router_match(method, url, &r->m);
        *con_cls = r;
        /* relaxed: only the decrement publishes anything (see on_completed) */
        atomic_fetch_add_explicit(&h->inflight, 1, memory_order_relaxed);
        enum MHD_Result ret = first_call(r);
        if (r->phase == PH_DONE)
            linger_if_body_pending(r);
        return ret;
    }
    switch (r->phase) {
    case PH_BODY:
        if (*upload_data_size > 0) {
            size_t n = *upload_data_size;
            *upload_data_size = 0;
            if (r->too_big || r->len + n > h->max_body) {
                /* libmicrohttpd 0.9.75 cannot queue a response mid-upload,
                 * so an oversized chunked body is read and dropped, and the
                 * 413 goes out at its end; a body that keeps coming past
                 * the discard limit gets its connection closed instead. */
                r->too_big = true;
                r->discarded += n;
                if (r->discarded > DISCARD_LIMIT) {
                    r->status = 413;
                    return MHD_NO;
                }
                return MHD_YES;
            }
            if (r->len + n + 1 > r->cap) {
                r->cap = (r->len + n + 1) * 2;
                if (r->cap > h->max_body + 1)
                    r->cap = h->max_body + 1;
                r->body = jd_xrealloc(r->body, r->cap);
            }
            memcpy(r->body + r->len, upload_data, n);
            r->len += n;
            r->body[r->len] = '\0';
            return MHD_YES;
        }
        if (r->too_big) {
            char d[96];
            snprintf(d, sizeof d, "request body over the limit of %zu bytes", h->max_body);
            return http_respond_problem(r, 413, d, NULL);
        }
        return dispatch(r);
    case PH_ASYNC:
        return http_finish_async(r);
    case PH_PARKED:
        return http_finish_parked(r);
    case PH_NEW:
    case PH_DONE:
        /* Late body bytes after an early answer: swallow them. */
        *upload_data_size = 0;
        return MHD_YES;
    }
    return MHD_NO;
}

static int resolve_addr(const char *host, uint16_t port, struct sockaddr_storage *ss,
                        socklen_t *len)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    if (getaddrinfo(host, ps, &hints, &res) != 0 || res == NULL)
        return JD_EINVAL;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static void mhd_panic(void *cls, const char *file, unsigned int line, const char *reason)
{
    char where[256];
    snprintf(where, sizeof where, "%s:%u", file ? file : "?", line);
    jd_log(JD_LOG_ERROR, "libmicrohttpd panic", "where", where, "reason", reason ? reason : "",
           NULL);
    abort();
}

/* Stop the helper threads (park timer, slow lane, linger) and free the server. */
static void free_server(struct jd_http *h)
{
    http_timer_stop(h);
    http_offload_stop(h->offload);
    http_linger_stop(h->linger);
    pthread_mutex_destroy(&h->park_mu);
    free(h->token);
    free(h->worker_token);
    free(h);
}

int jd_http_start(const struct jd_http_config *cfg, struct jd_http **out, struct jd_error *err)
{
    struct jd_http *h = jd_xcalloc(1, sizeof *h);
    struct sockaddr_storage ss;
    socklen_t slen = 0;
    int rc;
    h->quiesced_fd = MHD_INVALID_SOCKET;
    h->token = (cfg->token && cfg->token[0]) ? jd_xstrdup(cfg->token) : NULL;
    h->worker_token = (h->token && cfg->worker_token && cfg->worker_token[0])
                          ? jd_xstrdup(cfg->worker_token)
                          : NULL;
    h->max_body = cfg->max_body ? cfg->max_body : (size_t)4 << 20;
    h->max_parked = cfg->max_parked ? cfg->max_parked : 512;
    h->max_wait_ms = cfg->max_wait_ms ? cfg->max_wait_ms : 60000;
    h->heartbeat_ms = cfg->heartbeat_ms ? cfg->heartbeat_ms : 15000;
    h->store = cfg->store;
    h->ui_off = cfg->ui_off;
    atomic_init(&h->jobs, NULL);
    atomic_init(&h->draining, false);
    atomic_init(&h->inflight, 0);
    atomic_init(&h->parked_count, 0);
    atomic_init(&h->rid_counter, 1);
    if (getrandom(&h->rid_seed, sizeof h->rid_seed, 0) != sizeof h->rid_seed)
        h->rid_seed = (uint64_t)jd_wall_ms() ^ ((uint64_t)getpid() << 32);
    atomic_init(&h->serial_counter, 0);
    pthread_mutex_init(&h->park_mu, NULL);
    h->park_ep = h->park_evfd = -1;

    if (resolve_addr(cfg->host ? cfg->host : "127.0.0.1", cfg->port, &ss, &slen) != 0) {
        rc = jd_error_set(err, JD_EINVAL, NULL, "cannot resolve listen host \"%s\"",
                          cfg->host ? cfg->host : "");
        goto fail;
    }
    if (http_timer_init(h) != 0) {
        rc = jd_error_set(err, JD_EIO, NULL, "cannot create the HTTP timer's epoll set: %s",
                          strerror(errno));
        goto fail;
    }
    if (http_offload_start(&h->offload) != 0) {
        rc = jd_error_set(err, JD_EIO, NULL, "cannot start the HTTP slow-lane thread");
        goto fail;
    }
    if (http_linger_start(&h->linger) != 0) {
        rc = jd_error_set(err, JD_EIO, NULL, "cannot start the HTTP linger thread");
        goto fail;
    }
    if (pthread_create(&h->timer, NULL, http_timer_main, h) != 0) {
        rc = jd_error_set(err, JD_EIO, NULL, "cannot start the HTTP timer thread");
        goto fail;
    }
    pthread_setname_np(h->timer, "jd-park-timer");
    h->timer_started = true;
    MHD_set_panic_func(mhd_panic, NULL);
    /* poll, not epoll: libmicrohttpd 0.9.75's epoll loop takes events in
     * batches of 128 and, when a batch comes back full, waits for the next
     * one with the idle timeout (the connection timeout, 30 s) instead of
     * not at all, sleeping on the 128 requests it was just told about. An
     * event-loop thread with >= 128 connections all ready at once (the e2e
     * bench at 256 connections, about one run in ten with the completion
     * thread) then answers nothing until the timeout closes them. poll()
     * has no such batch; test_http's burst test covers it. */
    /* Each connection's memory pool (request line, headers, the response's
     * headers) is zeroed at every request on a keep-alive connection: at
     * libmicrohttpd's default of 32 KiB that memset was ~2.5 % of the
     * server's CPU. 16 KiB still takes ~15 KB of request headers (nginx's
     * default is 8 KB per line); more is a 431. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->daemon = MHD_start_daemon(
        flags, cfg->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(cfg->threads ? cfg->threads : 2),
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)JD_HTTP_CONN_MEMORY,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->max_connections ? cfg->max_connections : 1000),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(cfg->conn_timeout_s ? cfg->conn_timeout_s : 30),
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        h, MHD_OPTION_END);
    if (h->daemon == NULL) {
        rc = jd_error_set(err, JD_EIO, NULL, "cannot listen on %s:%u (%s)",
                          cfg->host ? cfg->host : "127.0.0.1", cfg->port,
                          errno ? strerror(errno) : "libmicrohttpd failed to start");
        goto fail;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : cfg->port;
    *out = h;
    return 0;
fail:
    free_server(h);
    return rc;
}

uint16_t jd_http_port(const struct jd_http *h)
{
    return h->port;
}

void jd_http_attach_schedules(struct jd_http *h, struct jd_schedules *s)
{
    /* release: handlers that see the pointer see the loaded schedules */
    atomic_store_explicit(&h->schedules, s, memory_order_release);
}

void jd_http_attach_forward(struct jd_http *h, struct jd_forward *f)
{
    h->fwd = f; /* before attach: its release publishes this too */
}

void jd_http_attach(struct jd_http *h, struct jd_jobs *jobs)
{
    /* release: handlers that see the pointer see the finished job layer */
    atomic_store_explicit(&h->jobs, jobs, memory_order_release);
}

void jd_http_drain(struct jd_http *h)
{
    if (atomic_exchange(&h->draining, true)) /* seq_cst: see route_job_get */
        return;
    if (h->daemon != NULL && h->quiesced_fd == MHD_INVALID_SOCKET) {
        h->quiesced_fd = MHD_quiesce_daemon(h->daemon);
        /* The socket must stay open until MHD_stop_daemon, but clients
         * connecting now should be refused at once, not left in the
         * backlog: shutdown() stops the listening without freeing the fd. */
        if (h->quiesced_fd != MHD_INVALID_SOCKET)
            shutdown(h->quiesced_fd, SHUT_RDWR);
    }
    http_wake_all_parked(h);
}

void jd_http_stop(struct jd_http *h, int64_t timeout_ms)
{
    if (h == NULL)
        return;
    jd_http_drain(h);
    uint64_t deadline = jd_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
    /* acquire: pairs with the release decrement in on_completed */
    while (atomic_load_explicit(&h->inflight, memory_order_acquire) > 0 && jd_now_ns() < deadline) {
        http_wake_all_parked(h); /* an SSE stream may have parked again */
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    http_wake_all_parked(h);
    unsigned left = atomic_load_explicit(&h->inflight, memory_order_acquire);
    if (left > 0) {
        char n[16];
        snprintf(n, sizeof n, "%u", left);
        jd_log(JD_LOG_WARN, "stopping HTTP with requests still in flight", "requests", n, NULL);
    }
    /* The slow lane finishes what it holds while the job layer is still
     * there; its requests are then answered or closed with the daemon. */
    http_offload_stop(h->offload);
    h->offload = NULL;
    if (h->daemon != NULL)
        MHD_stop_daemon(h->daemon);
    if (h->quiesced_fd != MHD_INVALID_SOCKET)
        close(h->quiesced_fd);
    free_server(h);
}
