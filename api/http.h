/*
 * The HTTP server: libmicrohttpd with an internal thread pool in poll mode
 * (not epoll: see http.c) and suspend/resume, serving every route of
 * api/routes.h (docs/architecture.md, "HTTP routes") over the job layer (server/jobs.h).
 *
 * No MHD callback blocks on the database: submits, cancels, messages,
 * retries and queue changes suspend their connection until the job layer's
 * done callback (after the commit) resumes it; long-polls and SSE streams
 * park on jd_jobs_watch with a deadline kept by one timer thread of this
 * module.
 *
 * Lifecycle (one owner thread, normally main): start -> attach (ready) ->
 * drain (readiness 503, stop accepting, answer parked waiters) -> the job
 * layer drains (its done callbacks answer suspended requests) -> stop.
 */
#ifndef JD_API_HTTP_H
#define JD_API_HTTP_H

#include "common/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct jd_http;
struct jd_jobs;
struct jd_schedules;
struct jd_store;

struct jd_http_config {
    const char *host;         /* borrowed; an IPv4/IPv6 literal or a name */
    uint16_t port;            /* 0: pick a free port (see jd_http_port) */
    unsigned threads;         /* MHD thread pool size; 0: 2 */
    unsigned max_connections; /* 0: 1000 */
    unsigned conn_timeout_s;  /* idle connection timeout; 0: 30 */
    unsigned max_parked;      /* long-polls + SSE streams at once; 0: 512 */
    size_t max_body;          /* request body cap; 0: 4 MiB */
    const char *token;        /* borrowed (copied); NULL or "": /v1 is open */
    const char
        *worker_token;      /* borrowed (copied); with token: opens only the JD_RF_WORKER routes */
    int64_t max_wait_ms;    /* cap on ?wait=; 0: 60 s */
    int64_t heartbeat_ms;   /* SSE heartbeat interval; 0: 15 s */
    struct jd_store *store; /* borrowed, for /metrics; may be NULL */
    bool ui_off;            /* true: no dashboard (/ui/ and / answer 404) */
};

/* Bind and start serving. Until jd_http_attach, /livez answers and
 * everything under /v1 and /readyz is 503. *out freed with jd_http_stop. */
int jd_http_start(const struct jd_http_config *cfg, struct jd_http **out, struct jd_error *err);

/* The bound port (the real one when cfg->port was 0). */
uint16_t jd_http_port(const struct jd_http *h);

/* Hand over the job layer (borrowed; it must outlive jd_http_stop) and
 * become ready. */
void jd_http_attach(struct jd_http *h, struct jd_jobs *jobs);
/* For jd_jobs_set_claim_alive: whether the client of a parked claim (the
 * request handed to jd_jobs_task_claim) is still connected. Never blocks. */
bool jd_http_claim_alive(void *req);
/* A cluster node: forward task requests for other nodes' tasks through f
 * (borrowed, outliving jd_http_stop; api/forward.h), before jd_http_attach. */
struct jd_forward;
void jd_http_attach_forward(struct jd_http *h, struct jd_forward *f);
/* Hand over the schedules (borrowed, outliving jd_http_stop), before
 * jd_http_attach; /v1/schedules answers 503 without them. */
void jd_http_attach_schedules(struct jd_http *h, struct jd_schedules *s);

/* Begin shutdown: /readyz and new submissions answer 503, the listening
 * socket stops accepting, every parked long-poll is answered with the job's
 * current state and every SSE stream ends. Idempotent. */
void jd_http_drain(struct jd_http *h);

/* Wait up to timeout_ms for requests still in flight (e.g. waiting for a
 * commit), stop the daemon and free everything. Call after the job layer
 * drained, so no done callback is still pending. */
void jd_http_stop(struct jd_http *h, int64_t timeout_ms);

/* The OpenAPI document served at /v1/openapi.yaml (api/openapi.c). */
extern const char jd_openapi_yaml[];

#endif
