/*
 * The CLI's HTTP client: one libcurl easy handle per call against the public
 * API (docs/architecture.md, "The CLI": cli/ uses libcurl, cJSON and common/ only, never
 * server/). Response bodies are capped at JD_CLI_BODY_MAX so a hostile or
 * broken server cannot grow the client's memory without bound. Single
 * threaded per struct jd_cli_resp; jd_cli_global_init once before threads.
 */
#ifndef JD_CLI_CLIENT_H
#define JD_CLI_CLIENT_H

#include <stddef.h>

/* Four times the server's default request body limit: a job with a large
 * output still fits, a server streaming garbage does not take all memory. */
#define JD_CLI_BODY_MAX (16u * 1024 * 1024)

struct jd_cli_conn {
    const char *url;   /* borrowed, "http://127.0.0.1:8080" */
    const char *token; /* borrowed, may be NULL */
};

struct jd_cli_resp {
    long status; /* HTTP status, 0 when no answer came */
    char *body;  /* NUL-terminated, caller frees with free() */
    size_t len;
    int truncated;      /* the body went past JD_CLI_BODY_MAX */
    char err[256];      /* curl's error text when status is 0 */
    long retry_after_s; /* the answer's Retry-After in seconds, 0 when none */
};

/* Make one request. body may be NULL (no body). timeout_s 0 = none.
 * Returns 0 when an HTTP answer came, -1 when it could not connect or the
 * transfer broke (resp->err says why). Free resp->body either way. */
int jd_cli_request(const struct jd_cli_conn *c, const char *method, const char *path,
                   const char *body, long timeout_s, struct jd_cli_resp *resp);

/* Percent-encode s for a path segment or query value; caller frees with free(). */
char *jd_cli_escape(const char *s);

/*
 * An SSE stream: on_event is called once per complete event with its id
 * (or "" when none), its event name and its data (borrowed for the call).
 * Returns 0 when the server closed the stream, -1 on a broken connection;
 * *status is the HTTP status (0 when none). last_id (in/out, at least 64
 * bytes) carries Last-Event-ID across reconnects.
 */
typedef void (*jd_cli_sse_fn)(void *ud, const char *id, const char *event, const char *data);
int jd_cli_sse(const struct jd_cli_conn *c, const char *path, char *last_id, jd_cli_sse_fn fn,
               void *ud, long *status, struct jd_cli_resp *err_resp);

#endif
