/*
 * loadgen: the end-to-end load generator of `make bench-e2e`. It drives a
 * job queue with no-op jobs over keep-alive connections and measures jobs
 * completed per second and submit->complete latency.
 *
 *   --target jackdaw     each connection submits {"handler":"echo",...} with
 *                        POST /v1/jobs, then long-polls GET /v1/jobs/{id}?wait=30s
 *                        until the job is terminal; the job is complete when
 *                        that answer says "succeeded". With --submit-wait the
 *                        submit itself waits (POST /v1/jobs?wait=30s): one
 *                        request a job, long-polling only if the wait ended.
 *   --target beanstalkd  producer connections `put` jobs whose body holds the
 *                        submit time; worker connections `reserve` and `delete`
 *                        them (the no-op work); a job is complete when its
 *                        DELETED arrives.
 *   --target jackdaw-remote  the same shape over Jackdaw's task routes:
 *                        producers POST {"handler": <remote command>, "args":
 *                        {"t": submit time}}; workers claim up to --batch
 *                        tasks (POST /v1/tasks/claim, long-poll) and end them
 *                        all with one POST /v1/tasks/complete; a job is
 *                        complete when that answer (sent after the commit)
 *                        arrives. The command must be registered first (PUT
 *                        /v1/commands/{name}; --handler names it).
 *                        Besides submit->complete, each task's
 *                        claim-to-complete as its worker saw it (the claim's
 *                        answer to the complete's answer) is reported as
 *                        claim_p50_ms / claim_p99_ms.
 *
 * --addr may be given up to MAX_ADDRS times (the nodes of a cluster): the
 * connections are spread over the addresses round-robin, each keeping its
 * own for the whole run.
 *
 * Closed loop (default): at most --conns jobs are in flight at once.
 * Open loop (--rate R): a job is due every 1/R s; latency counts from the due
 * time, so a stalled server cannot hide its queueing (no coordinated omission).
 *
 * Invariants: every connection is owned by one thread's epoll loop; threads
 * share nothing but the job-number counter and the start flag (atomics,
 * relaxed: they only hand out numbers) until they are joined and their
 * latency arrays merged. Output: one JSON line on stdout, a human line on
 * stderr.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 4096
#define OUT_CAP 16384     /* one request: a batch complete of MAX_BATCH tasks fits */
#define MAX_BATCH 64      /* tasks per claim for jackdaw-remote */
#define TASK_ID_MAX 96    /* "<node>.<job>-<seq>-<32 hex>": at most 92 (server/tasks.h) */
#define IN_START 8192     /* response buffer; grows for long job documents */
#define IN_MAX (4u << 20) /* a response bigger than this is an error */
#define WAIT_PARAM "30s"  /* long-poll length; re-polled if it expires */
#define MAX_ADDRS 8       /* --addr given several times: a cluster's nodes */

enum target { T_JACKDAW, T_BEANSTALKD, T_REMOTE };
enum role { R_HTTP, R_PRODUCER, R_WORKER };
enum cstate { C_IDLE, C_POST, C_GET, C_PUT, C_RESERVE, C_DELETE, C_RPOST, C_CLAIM, C_COMPLETE };

struct opts {
    enum target target;
    const char *host;
    int port;
    long jobs;
    int conns;
    int threads;
    int workers; /* beanstalkd worker connections */
    double rate; /* jobs/s, 0: closed loop */
    double timeout_s;
    const char *label;
    const char *handler;
    const char *timeline; /* file for the latency histogram over time, or NULL */
    int batch;            /* jackdaw-remote: tasks per claim */
    bool submit_wait;     /* jackdaw: POST /v1/jobs?wait= (one request a job) */
};

struct conn {
    int fd;
    int addr; /* index in addrs[] */
    enum role role;
    enum cstate state;
    char out[OUT_CAP];
    size_t out_len, out_off;
    char *in;
    size_t in_len, in_cap;
    int64_t t_start; /* job's submit (or due) time, ns */
    char job_id[32];
    struct thread *th;
    /* jackdaw-remote workers: the tasks claimed, being completed */
    char (*tids)[TASK_ID_MAX];
    int64_t *tts;
    int ntasks;
    int64_t t_claimed; /* when the claim's answer arrived, ns */
};

struct thread {
    pthread_t tid;
    int index;
    int epfd;
    struct conn *conns;
    int nconns;
    /* closed loop: jobs in flight; open loop: the next due time */
    long inflight;
    long max_inflight;
    int64_t next_due;
    double rate;
    size_t pending_due; /* open loop: due jobs with no free connection yet */
    int64_t *pending_t;
    size_t pending_cap, pending_head;
    /* results */
    uint32_t *lat_us;
    uint32_t *done_ms; /* --timeline: each latency's completion time, ms from start */
    size_t nlat, cap_lat;
    uint32_t *claim_us; /* jackdaw-remote: each task's claim-to-complete, us */
    size_t nclaim, cap_claim;
    long completed, failed, errors, submitted;
    bool out_of_jobs;
};

static struct opts opt = {
    .target = T_JACKDAW,
    .host = "127.0.0.1",
    .port = 8080,
    .jobs = 20000,
    .conns = 64,
    .threads = 1,
    .workers = 0,
    .rate = 0,
    .timeout_s = 300,
    .label = NULL,
    .handler = "echo",
    .batch = 32,
};

static struct {
    char host[64];
    int port;
} addrs[MAX_ADDRS]; /* written before the threads start */
static int naddrs;
static int64_t start_ns;      /* written before the threads start */
static atomic_long next_job;  /* relaxed: only hands out job numbers */
static atomic_long done_jobs; /* relaxed: progress and the end condition */

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The bare-timer control: a thread that asks for a 1 ms sleep over and
 * over and keeps, per 100 ms slice of the run, the longest it overslept.
 * A latency stall that the control shows too is the machine (another
 * process had the CPUs), not the server. */
#define CTL_SLICES 36000 /* one hour of 100 ms slices */
static uint32_t ctl_max_us[CTL_SLICES];
static atomic_bool ctl_stop;

static void *control_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&ctl_stop)) {
        int64_t t = now_ns();
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        int64_t now = now_ns();
        int64_t late = (now - t - 1000000) / 1000, slice = (now - start_ns) / 100000000;
        if (slice >= 0 && slice < CTL_SLICES && late > (int64_t)ctl_max_us[slice])
            ctl_max_us[slice] = (uint32_t)late;
    }
    return NULL;
}

static void die(const char *what)
{
    fprintf(stderr, "loadgen: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* Take the next job number, or -1 when all --jobs have been handed out. */
static long take_job(void)
{
    long j = atomic_fetch_add_explicit(&next_job, 1, memory_order_relaxed);
    return j < opt.jobs ? j : -1;
}

static void record(struct thread *th, int64_t t_start, bool ok)
{
    int64_t d = (now_ns() - t_start) / 1000;
    if (th->nlat == th->cap_lat) {
        th->cap_lat = th->cap_lat ? th->cap_lat * 2 : 4096;
        th->lat_us = realloc(th->lat_us, th->cap_lat * sizeof *th->lat_us);
        th->done_ms = realloc(th->done_ms, th->cap_lat * sizeof *th->done_ms);
        if (!th->lat_us || !th->done_ms)
            die("realloc");
    }
    th->done_ms[th->nlat] = (uint32_t)((now_ns() - start_ns) / 1000000);
    th->lat_us[th->nlat++] = d < 0 ? 0 : (d > UINT32_MAX ? UINT32_MAX : (uint32_t)d);
    if (ok)
        th->completed++;
    else
        th->failed++;
    atomic_fetch_add_explicit(&done_jobs, 1, memory_order_relaxed);
}

/* jackdaw-remote: one task's claim-to-complete as its worker saw it, from
 * the claim's answer arriving to the complete's answer arriving (the
 * complete is answered after its commit). */
static void record_claim(struct thread *th, int64_t t_claimed, int64_t now)
{
    if (th->nclaim == th->cap_claim) {
        th->cap_claim = th->cap_claim ? th->cap_claim * 2 : 4096;
        th->claim_us = realloc(th->claim_us, th->cap_claim * sizeof *th->claim_us);
        if (!th->claim_us)
            die("realloc");
    }
    int64_t d = (now - t_claimed) / 1000;
    th->claim_us[th->nclaim++] = d < 0 ? 0 : (d > UINT32_MAX ? UINT32_MAX : (uint32_t)d);
}

static int connect_to(int a)
{
    const char *h = naddrs ? addrs[a].host : opt.host;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        die("socket");
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)(naddrs ? addrs[a].port : opt.port))};
    if (inet_pton(AF_INET, h, &sa.sin_addr) != 1) {
        fprintf(stderr, "loadgen: bad IPv4 address %s\n", h);
        exit(2);
    }
    for (int tries = 0; connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0; tries++) {
        if (tries > 50)
            die("connect");
        usleep(20000);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

static void conn_watch(struct conn *c, bool want_out)
{
    struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0), .data.ptr = c};
    if (epoll_ctl(c->th->epfd, EPOLL_CTL_MOD, c->fd, &ev) != 0)
        die("epoll_ctl");
}

/* Write what is left of c->out; arm EPOLLOUT only when the socket is full. */
static int conn_flush(struct conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (w < 0) {
            if (errno == EAGAIN) {
                conn_watch(c, true);
                return 0;
            }
            if (errno == EINTR)
                continue;
            return -1;
        }
        c->out_off += (size_t)w;
    }
    return 0;
}

static int conn_send(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int conn_send(struct conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(c->out, sizeof c->out, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof c->out) {
        fprintf(stderr, "loadgen: request too long\n");
        exit(2);
    }
    c->out_len = (size_t)n;
    c->out_off = 0;
    return conn_flush(c);
}

static void conn_open(struct thread *th, struct conn *c)
{
    c->fd = connect_to(c->addr);
    c->in_len = 0;
    c->th = th;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (epoll_ctl(th->epfd, EPOLL_CTL_ADD, c->fd, &ev) != 0)
        die("epoll_ctl add");
}

static void conn_reopen(struct conn *c)
{
    epoll_ctl(c->th->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    conn_open(c->th, c);
}

/* ---- Jackdaw over HTTP/1.1 ---- */

static int http_post(struct conn *c, long job)
{
    char body[256];
    int blen =
        snprintf(body, sizeof body, "{\"handler\":\"%s\",\"args\":{\"n\":%ld}}", opt.handler, job);
    c->state = C_POST;
    return conn_send(c,
                     "POST /v1/jobs%s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                     "Content-Length: %d\r\n\r\n%s",
                     opt.submit_wait ? "?wait=" WAIT_PARAM : "", opt.host, opt.port, blen, body);
}

static int http_get(struct conn *c)
{
    c->state = C_GET;
    return conn_send(c, "GET /v1/jobs/%s?wait=" WAIT_PARAM " HTTP/1.1\r\nHost: %s:%d\r\n\r\n",
                     c->job_id, opt.host, opt.port);
}

/* ---- jackdaw-remote: producers and task workers over HTTP ---- */

static int bs_reserve(struct conn *c);

static int remote_post(struct conn *c)
{
    char body[256];
    int blen = snprintf(body, sizeof body, "{\"handler\":\"%s\",\"args\":{\"t\":%lld}}",
                        opt.handler, (long long)c->t_start);
    c->state = C_RPOST;
    return conn_send(c,
                     "POST /v1/jobs HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                     "Content-Length: %d\r\n\r\n%s",
                     opt.host, opt.port, blen, body);
}

static int remote_claim(struct conn *c)
{
    char body[256];
    int blen = snprintf(body, sizeof body,
                        "{\"commands\":[\"%s\"],\"worker\":\"loadgen\",\"max\":%d,"
                        "\"wait_ms\":1000,\"lease_ms\":60000}",
                        opt.handler, opt.batch);
    c->state = C_CLAIM;
    return conn_send(c,
                     "POST /v1/tasks/claim HTTP/1.1\r\nHost: %s:%d\r\n"
                     "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
                     opt.host, opt.port, blen, body);
}

static int remote_complete(struct conn *c)
{
    char body[OUT_CAP - 256];
    size_t n = (size_t)snprintf(body, sizeof body, "{\"tasks\":[");
    for (int i = 0; i < c->ntasks; i++)
        n += (size_t)snprintf(body + n, sizeof body - n, "%s{\"id\":\"%s\"}", i ? "," : "",
                              c->tids[i]);
    n += (size_t)snprintf(body + n, sizeof body - n, "]}");
    c->state = C_COMPLETE;
    return conn_send(c,
                     "POST /v1/tasks/complete HTTP/1.1\r\nHost: %s:%d\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     opt.host, opt.port, n, body);
}

/* The tasks of a claim answer: each "id" and its args' "t", in order. */
static void remote_parse_tasks(struct conn *c, const char *body, size_t len)
{
    const char *p = body, *e = body + len;
    c->ntasks = 0;
    while (c->ntasks < opt.batch) {
        const char *id = memmem(p, (size_t)(e - p), "{\"id\":\"", 7);
        if (!id)
            break;
        id += 7;
        const char *q = memchr(id, '"', (size_t)(e - id));
        if (!q || q - id >= TASK_ID_MAX)
            break;
        memcpy(c->tids[c->ntasks], id, (size_t)(q - id));
        c->tids[c->ntasks][q - id] = 0;
        const char *t = memmem(q, (size_t)(e - q), "\"t\":", 4);
        c->tts[c->ntasks] = t ? strtoll(t + 4, NULL, 10) : now_ns();
        c->ntasks++;
        p = t ? t : q;
    }
}

static void start_next(struct conn *c);

/* Idle producers of th may go on now that jobs left the system. */
static void wake_producers(struct thread *th)
{
    for (int i = 0; i < th->nconns; i++) {
        struct conn *p = &th->conns[i];
        if (p->role == R_PRODUCER && p->state == C_IDLE) {
            start_next(p);
            if (th->inflight >= th->max_inflight || th->out_of_jobs)
                break;
        }
    }
}

static int remote_on_response(struct conn *c, int status, char *body, size_t blen)
{
    struct thread *th = c->th;
    if (c->state == C_RPOST) {
        if (status != 201 && status != 200) {
            fprintf(stderr, "loadgen: POST -> %d: %.*s\n", status, (int)(blen > 300 ? 300 : blen),
                    body);
            th->errors++;
            th->inflight--;
            record(th, c->t_start, false);
        }
        c->state = C_IDLE;
        start_next(c);
        return 0;
    }
    if (c->state == C_CLAIM) {
        if (status != 200) {
            fprintf(stderr, "loadgen: claim -> %d: %.*s\n", status, (int)(blen > 300 ? 300 : blen),
                    body);
            return -1;
        }
        remote_parse_tasks(c, body, blen);
        c->t_claimed = now_ns();
        return c->ntasks ? remote_complete(c) : remote_claim(c);
    }
    if (c->state == C_COMPLETE) {
        if (status != 200) {
            fprintf(stderr, "loadgen: complete -> %d: %.*s\n", status,
                    (int)(blen > 300 ? 300 : blen), body);
            return -1;
        }
        int64_t now = now_ns();
        for (int i = 0; i < c->ntasks; i++) {
            record_claim(th, c->t_claimed, now);
            record(th, c->tts[i], true);
            th->inflight--;
        }
        c->ntasks = 0;
        if (remote_claim(c) != 0)
            return -1;
        wake_producers(th);
        return 0;
    }
    fprintf(stderr, "loadgen: unexpected response\n");
    return -1;
}

/* A worker connection's first (or next after a reconnect) request. */
static int worker_start(struct conn *c)
{
    return opt.target == T_REMOTE ? remote_claim(c) : bs_reserve(c);
}

/* Find the end of one HTTP response in buf: returns its total length (head +
 * body), 0 if incomplete, -1 if malformed. Sets *status, *body, *body_len
 * (chunked bodies are decoded in place) and *close_after. */
static long http_parse(char *buf, size_t len, int *status, char **body, size_t *body_len,
                       bool *close_after)
{
    char *end = memmem(buf, len, "\r\n\r\n", 4);
    if (!end)
        return 0;
    size_t head_len = (size_t)(end - buf) + 4;
    if (len < 12 || memcmp(buf, "HTTP/1.", 7) != 0)
        return -1;
    *status = atoi(buf + 9);
    *close_after = false;
    long clen = -1;
    bool chunked = false;
    for (char *p = buf; p < end;) {
        char *eol = memmem(p, (size_t)(end - p) + 2, "\r\n", 2);
        if (!eol)
            break;
        size_t l = (size_t)(eol - p);
        if (l > 15 && strncasecmp(p, "content-length:", 15) == 0)
            clen = strtol(p + 15, NULL, 10);
        else if (l > 18 && strncasecmp(p, "transfer-encoding:", 18) == 0 &&
                 memmem(p, l, "chunked", 7))
            chunked = true;
        else if (l > 11 && strncasecmp(p, "connection:", 11) == 0 && memmem(p, l, "close", 5))
            *close_after = true;
        p = eol + 2;
    }
    if (!chunked) {
        if (clen < 0)
            clen = 0;
        if (len < head_len + (size_t)clen)
            return 0;
        *body = buf + head_len;
        *body_len = (size_t)clen;
        return (long)(head_len + (size_t)clen);
    }
    /* Chunked: decode in place once the terminating chunk is there. */
    size_t pos = head_len, out = head_len;
    for (;;) {
        char *eol = memmem(buf + pos, len - pos, "\r\n", 2);
        if (!eol)
            return 0;
        long sz = strtol(buf + pos, NULL, 16);
        size_t data = (size_t)(eol - buf) + 2;
        if (sz == 0) {
            char *fin = memmem(buf + data - 2, len - (data - 2), "\r\n\r\n", 4);
            if (!fin)
                return 0;
            *body = buf + head_len;
            *body_len = out - head_len;
            return (long)((size_t)(fin - buf) + 4);
        }
        if (len < data + (size_t)sz + 2)
            return 0;
        memmove(buf + out, buf + data, (size_t)sz);
        out += (size_t)sz;
        pos = data + (size_t)sz + 2;
        /* The decoded prefix never overtakes the undecoded rest: out <= pos. */
    }
}

/* Extract a string field "key":"value" (first occurrence) into dst. */
static bool json_str(const char *body, size_t len, const char *key, char *dst, size_t cap)
{
    char pat[64];
    int pl = snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = memmem(body, len, pat, (size_t)pl);
    if (!p)
        return false;
    p += pl;
    const char *e = body + len;
    while (p < e && (*p == ' ' || *p == ':'))
        p++;
    if (p >= e || *p != '"')
        return false;
    p++;
    size_t n = 0;
    while (p < e && *p != '"' && n + 1 < cap)
        dst[n++] = *p++;
    dst[n] = 0;
    return p < e && *p == '"';
}

static bool state_terminal(const char *s)
{
    return !strcmp(s, "succeeded") || !strcmp(s, "failed") || !strcmp(s, "cancelled");
}

static void start_next(struct conn *c);

/* One complete HTTP response on c. Returns -1 to drop the connection. */
static int http_on_response(struct conn *c, int status, char *body, size_t blen)
{
    struct thread *th = c->th;
    char state[32] = "";
    if (c->state == C_POST) {
        if (status != 201 && status != 200) {
            fprintf(stderr, "loadgen: POST -> %d: %.*s\n", status, (int)(blen > 300 ? 300 : blen),
                    body);
            th->errors++;
            record(th, c->t_start, false);
            c->state = C_IDLE;
            start_next(c);
            return 0;
        }
        if (!json_str(body, blen, "id", c->job_id, sizeof c->job_id)) {
            fprintf(stderr, "loadgen: 201 without an id\n");
            return -1;
        }
        json_str(body, blen, "state", state, sizeof state);
        if (state_terminal(state)) {
            record(th, c->t_start, !strcmp(state, "succeeded"));
            c->state = C_IDLE;
            start_next(c);
            return 0;
        }
        return http_get(c);
    }
    if (c->state == C_GET) {
        if (status != 200) {
            fprintf(stderr, "loadgen: GET job %s -> %d\n", c->job_id, status);
            th->errors++;
            record(th, c->t_start, false);
            c->state = C_IDLE;
            start_next(c);
            return 0;
        }
        json_str(body, blen, "state", state, sizeof state);
        if (!state_terminal(state))
            return http_get(c); /* the long poll expired: poll again */
        record(th, c->t_start, !strcmp(state, "succeeded"));
        c->state = C_IDLE;
        start_next(c);
        return 0;
    }
    fprintf(stderr, "loadgen: unexpected response\n");
    return -1;
}

/* ---- beanstalkd's text protocol ---- */

static int bs_put(struct conn *c, long job)
{
    char body[64];
    int blen = snprintf(body, sizeof body, "%lld %ld", (long long)c->t_start, job);
    c->state = C_PUT;
    return conn_send(c, "put 1024 0 60 %d\r\n%s\r\n", blen, body);
}

static int bs_reserve(struct conn *c)
{
    c->state = C_RESERVE;
    return conn_send(c, "reserve\r\n");
}

/* One beanstalkd reply (line, plus the job body after RESERVED). Returns its
 * length, 0 if incomplete, -1 on an error reply. */
static long bs_on_data(struct conn *c)
{
    struct thread *th = c->th;
    char *eol = memmem(c->in, c->in_len, "\r\n", 2);
    if (!eol)
        return 0;
    size_t line = (size_t)(eol - c->in) + 2;
    if (c->state == C_PUT) {
        if (strncmp(c->in, "INSERTED ", 9) != 0) {
            fprintf(stderr, "loadgen: put -> %.*s\n", (int)line - 2, c->in);
            return -1;
        }
        c->state = C_IDLE;
        start_next(c);
        return (long)line;
    }
    if (c->state == C_RESERVE) {
        unsigned long long id;
        size_t bytes;
        if (sscanf(c->in, "RESERVED %llu %zu", &id, &bytes) != 2) {
            fprintf(stderr, "loadgen: reserve -> %.*s\n", (int)line - 2, c->in);
            return -1;
        }
        if (c->in_len < line + bytes + 2)
            return 0;
        long long t0 = 0;
        sscanf(c->in + line, "%lld", &t0);
        c->t_start = t0;
        snprintf(c->job_id, sizeof c->job_id, "%llu", id);
        c->state = C_DELETE;
        if (conn_send(c, "delete %s\r\n", c->job_id) != 0)
            return -1;
        return (long)(line + bytes + 2);
    }
    if (c->state == C_DELETE) {
        if (strncmp(c->in, "DELETED", 7) != 0) {
            fprintf(stderr, "loadgen: delete -> %.*s\n", (int)line - 2, c->in);
            return -1;
        }
        record(th, c->t_start, true);
        th->inflight--;
        if (bs_reserve(c) != 0)
            return -1;
        wake_producers(th); /* one may have been held back by the in-flight limit */
        return (long)line;
    }
    fprintf(stderr, "loadgen: unexpected beanstalkd reply %.*s\n", (int)line - 2, c->in);
    return -1;
}

/* ---- scheduling jobs onto idle connections ---- */

/* c is idle: give it the next job if the loop allows one now. */
static void start_next(struct conn *c)
{
    struct thread *th = c->th;
    if (c->role == R_WORKER || th->out_of_jobs)
        return;
    int64_t t0;
    if (th->rate > 0) {
        if (th->pending_head >= th->pending_due)
            return; /* nothing due yet: the timer will come back */
        t0 = th->pending_t[th->pending_head++ % th->pending_cap];
    } else {
        if (c->role == R_PRODUCER && th->inflight >= th->max_inflight)
            return;
        t0 = now_ns();
    }
    long job = take_job();
    if (job < 0) {
        th->out_of_jobs = true;
        return;
    }
    th->submitted++;
    c->t_start = t0;
    int rc;
    if (c->role == R_PRODUCER) {
        th->inflight++;
        rc = opt.target == T_REMOTE ? remote_post(c) : bs_put(c, job);
    } else {
        rc = http_post(c, job);
    }
    if (rc != 0) {
        th->errors++;
        record(th, t0, false);
        conn_reopen(c);
        c->state = C_IDLE;
    }
}

/* Open loop: queue every job due by now, then hand them to idle connections. */
static void open_loop_tick(struct thread *th)
{
    int64_t now = now_ns();
    while (th->next_due <= now && !th->out_of_jobs) {
        if (th->pending_due - th->pending_head >= th->pending_cap) {
            break; /* every slot is due already: the server is far behind */
        }
        th->pending_t[th->pending_due++ % th->pending_cap] = th->next_due;
        th->next_due += (int64_t)(1e9 / th->rate);
    }
    for (int i = 0; i < th->nconns && th->pending_head < th->pending_due; i++)
        if (th->conns[i].state == C_IDLE && th->conns[i].role != R_WORKER)
            start_next(&th->conns[i]);
}

static void on_readable(struct conn *c)
{
    for (;;) {
        if (c->in_cap - c->in_len < 4096) {
            if (c->in_cap >= IN_MAX) {
                fprintf(stderr, "loadgen: response too large\n");
                exit(2);
            }
            c->in_cap *= 2;
            c->in = realloc(c->in, c->in_cap);
            if (!c->in)
                die("realloc");
        }
        ssize_t r = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            break;
        if (r <= 0) {
            /* Peer closed (or reset): fail the job in flight and reconnect. */
            if (c->state != C_IDLE && c->state != C_RESERVE && c->state != C_CLAIM &&
                c->state != C_COMPLETE) {
                c->th->errors++;
                record(c->th, c->t_start, false);
                if (c->role == R_PRODUCER || c->state == C_DELETE)
                    c->th->inflight--;
            }
            conn_reopen(c);
            c->state = C_IDLE;
            if (c->role == R_WORKER)
                worker_start(c);
            else
                start_next(c);
            return;
        }
        c->in_len += (size_t)r;
    }
    for (;;) {
        long used;
        bool close_after = false;
        if (c->role == R_HTTP || opt.target == T_REMOTE) {
            int status = 0;
            char *body = NULL;
            size_t blen = 0;
            used = http_parse(c->in, c->in_len, &status, &body, &blen, &close_after);
            if (used > 0) {
                char saved = body[blen];
                body[blen] = 0;
                int rc = opt.target == T_REMOTE ? remote_on_response(c, status, body, blen)
                                                : http_on_response(c, status, body, blen);
                body[blen] = saved;
                if (rc != 0)
                    used = -1;
            }
        } else {
            used = bs_on_data(c);
        }
        if (used < 0) {
            fprintf(stderr, "loadgen: protocol error, giving up\n");
            exit(2);
        }
        if (used == 0)
            break;
        memmove(c->in, c->in + used, c->in_len - (size_t)used);
        c->in_len -= (size_t)used;
        if (close_after) {
            enum cstate st = c->state;
            conn_reopen(c);
            c->state = st;
            if (st != C_IDLE) {
                c->out_off = 0;
                conn_flush(c);
            }
        }
    }
}

static void *thread_main(void *arg)
{
    struct thread *th = arg;
    th->epfd = epoll_create1(0);
    if (th->epfd < 0)
        die("epoll_create1");
    for (int i = 0; i < th->nconns; i++) {
        conn_open(th, &th->conns[i]);
        th->conns[i].state = C_IDLE;
        th->conns[i].in_cap = IN_START;
        th->conns[i].in = malloc(IN_START);
        th->conns[i].tids = malloc((size_t)opt.batch * sizeof *th->conns[i].tids);
        th->conns[i].tts = malloc((size_t)opt.batch * sizeof *th->conns[i].tts);
        if (!th->conns[i].in || !th->conns[i].tids || !th->conns[i].tts)
            die("malloc");
    }
    th->next_due = now_ns();
    for (int i = 0; i < th->nconns; i++) {
        if (th->conns[i].role == R_WORKER)
            worker_start(&th->conns[i]);
        else if (th->rate <= 0)
            start_next(&th->conns[i]);
    }
    int64_t deadline = now_ns() + (int64_t)(opt.timeout_s * 1e9);
    struct epoll_event evs[256];
    while (atomic_load_explicit(&done_jobs, memory_order_relaxed) < opt.jobs) {
        if (th->rate > 0)
            open_loop_tick(th);
        int timeout_ms = th->rate > 0 ? 1 : 100;
        int n = epoll_wait(th->epfd, evs, 256, timeout_ms);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (evs[i].events & EPOLLOUT) {
                conn_watch(c, false);
                if (conn_flush(c) != 0)
                    die("write");
            }
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                on_readable(c);
        }
        if (now_ns() > deadline) {
            fprintf(stderr, "loadgen: timed out after %.0f s\n", opt.timeout_s);
            break;
        }
    }
    for (int i = 0; i < th->nconns; i++) {
        close(th->conns[i].fd);
        free(th->conns[i].in);
        free(th->conns[i].tids);
        free(th->conns[i].tts);
    }
    close(th->epfd);
    return NULL;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(const uint32_t *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i] / 1000.0;
}

/* --timeline: one line per 100 ms slice of the run in which jobs completed:
 * the slice's start (s), jobs completed in it, and their latency p50, p99
 * and max (ms). A stall shows as a slice with few completions followed by
 * one whose max is as long as the stall. */
static void write_timeline(const struct thread *ths, size_t n)
{
    FILE *f = fopen(opt.timeline, "w");
    if (!f)
        die(opt.timeline);
    uint64_t *v = malloc((n ? n : 1) * sizeof *v); /* slice << 32 | latency us */
    if (!v)
        die("malloc");
    size_t k = 0;
    for (int t = 0; t < opt.threads; t++)
        for (size_t i = 0; i < ths[t].nlat; i++)
            v[k++] = (uint64_t)(ths[t].done_ms[i] / 100) << 32 | ths[t].lat_us[i];
    qsort(v, n, sizeof *v, cmp_u64);
    uint32_t *lat = malloc((n ? n : 1) * sizeof *lat);
    if (!lat)
        die("malloc");
    fprintf(f, "# t_s jobs p50_ms p99_ms max_ms control_max_ms\n");
    for (size_t i = 0; i < n;) {
        size_t j = i, m = 0;
        while (j < n && v[j] >> 32 == v[i] >> 32)
            lat[m++] = (uint32_t)v[j++];
        uint64_t sl = v[i] >> 32;
        fprintf(f, "%.1f %zu %.2f %.2f %.2f %.2f\n", (double)sl / 10, m, pct(lat, m, 0.50),
                pct(lat, m, 0.99), pct(lat, m, 1.0),
                sl < CTL_SLICES ? ctl_max_us[sl] / 1000.0 : 0.0);
        i = j;
    }
    free(lat);
    free(v);
    fclose(f);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: loadgen [--target jackdaw|beanstalkd|jackdaw-remote] [--addr HOST:PORT]...\n"
            "               [--jobs N] [--batch B]\n"
            "               [--conns C] [--threads T] [--workers W] [--rate JOBS_PER_S]\n"
            "               [--timeout SECS] [--label NAME] [--handler NAME]\n"
            "               [--timeline FILE] [--submit-wait]\n"
            "  jackdaw: C connections, each POST a job then long-poll it to the end\n"
            "  (--submit-wait: the POST itself waits, POST /v1/jobs?wait=30s)\n"
            "  beanstalkd: C producer connections (at most C jobs in flight) and W\n"
            "  worker connections (default C) doing reserve + delete\n"
            "  jackdaw-remote: C producers POST jobs of remote command --handler (register\n"
            "  it first); W workers claim up to B tasks and complete them in one request\n"
            "  --addr again (up to 8): connections spread over the addresses round-robin\n"
            "  --timeline: per 100 ms of the run, jobs completed and their latency\n"
            "  p50/p99/max, to find stalls, beside the longest oversleep of a 1 ms\n"
            "  timer in that slice (a control: a stall it shares is the machine's)\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"target", required_argument, 0, 't'},
        {"addr", required_argument, 0, 'a'},
        {"jobs", required_argument, 0, 'n'},
        {"conns", required_argument, 0, 'c'},
        {"threads", required_argument, 0, 'T'},
        {"workers", required_argument, 0, 'w'},
        {"rate", required_argument, 0, 'r'},
        {"timeout", required_argument, 0, 'x'},
        {"label", required_argument, 0, 'l'},
        {"handler", required_argument, 0, 'H'},
        {"timeline", required_argument, 0, 'L'},
        {"batch", required_argument, 0, 'b'},
        {"submit-wait", no_argument, 0, 'W'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    static char host[64];
    int ch;
    while ((ch = getopt_long(argc, argv, "t:a:n:c:T:w:r:x:l:H:L:b:Wh", longopts, NULL)) != -1) {
        switch (ch) {
        case 't':
            if (!strcmp(optarg, "jackdaw"))
                opt.target = T_JACKDAW;
            else if (!strcmp(optarg, "beanstalkd"))
                opt.target = T_BEANSTALKD;
            else if (!strcmp(optarg, "jackdaw-remote"))
                opt.target = T_REMOTE;
            else
                usage();
            break;
        case 'a': {
            const char *colon = strrchr(optarg, ':');
            if (!colon || (size_t)(colon - optarg) >= sizeof host || naddrs == MAX_ADDRS)
                usage();
            memcpy(addrs[naddrs].host, optarg, (size_t)(colon - optarg));
            addrs[naddrs].port = atoi(colon + 1);
            if (addrs[naddrs].port <= 0)
                usage();
            if (naddrs++ == 0) { /* the first names the Host header */
                memcpy(host, addrs[0].host, sizeof host);
                opt.host = host;
                opt.port = addrs[0].port;
            }
            break;
        }
        case 'n':
            opt.jobs = atol(optarg);
            break;
        case 'c':
            opt.conns = atoi(optarg);
            break;
        case 'T':
            opt.threads = atoi(optarg);
            break;
        case 'w':
            opt.workers = atoi(optarg);
            break;
        case 'r':
            opt.rate = atof(optarg);
            break;
        case 'x':
            opt.timeout_s = atof(optarg);
            break;
        case 'l':
            opt.label = optarg;
            break;
        case 'H':
            opt.handler = optarg;
            break;
        case 'W':
            opt.submit_wait = true;
            break;
        case 'L':
            opt.timeline = optarg;
            break;
        case 'b':
            opt.batch = atoi(optarg);
            break;
        default:
            usage();
        }
    }
    if (opt.jobs <= 0 || opt.conns <= 0 || opt.threads <= 0 || opt.port <= 0 || opt.batch < 1 ||
        opt.batch > MAX_BATCH)
        usage();
    if (opt.workers <= 0)
        opt.workers = opt.conns;
    if (opt.threads > opt.conns)
        opt.threads = opt.conns;
    int total_conns = opt.conns + (opt.target != T_JACKDAW ? opt.workers : 0);
    if (total_conns > MAX_CONNS) {
        fprintf(stderr, "loadgen: at most %d connections\n", MAX_CONNS);
        return 2;
    }

    struct thread *ths = calloc((size_t)opt.threads, sizeof *ths);
    if (!ths)
        die("calloc");
    int next_addr = 0;
    for (int t = 0; t < opt.threads; t++) {
        struct thread *th = &ths[t];
        th->index = t;
        int prod = opt.conns / opt.threads + (t < opt.conns % opt.threads);
        int work = opt.target != T_JACKDAW
                       ? opt.workers / opt.threads + (t < opt.workers % opt.threads)
                       : 0;
        th->nconns = prod + work;
        th->max_inflight = prod;
        th->conns = calloc((size_t)th->nconns, sizeof *th->conns);
        if (!th->conns)
            die("calloc");
        for (int i = 0; i < th->nconns; i++) {
            th->conns[i].role = opt.target == T_JACKDAW ? R_HTTP : i < prod ? R_PRODUCER : R_WORKER;
            th->conns[i].addr = naddrs ? next_addr++ % naddrs : 0;
        }
        if (opt.rate > 0) {
            th->rate = opt.rate / opt.threads;
            th->pending_cap = 1u << 20;
            th->pending_t = malloc(th->pending_cap * sizeof *th->pending_t);
            if (!th->pending_t)
                die("malloc");
        }
    }
    int64_t t0 = now_ns();
    start_ns = t0;
    pthread_t ctl;
    if (pthread_create(&ctl, NULL, control_main, NULL) != 0)
        die("pthread_create");
    for (int t = 0; t < opt.threads; t++)
        if (pthread_create(&ths[t].tid, NULL, thread_main, &ths[t]) != 0)
            die("pthread_create");
    for (int t = 0; t < opt.threads; t++)
        pthread_join(ths[t].tid, NULL);
    double secs = (double)(now_ns() - t0) / 1e9;
    atomic_store(&ctl_stop, true);
    pthread_join(ctl, NULL);
    uint32_t ctl_max = 0;
    for (size_t i = 0; i < CTL_SLICES; i++)
        ctl_max = ctl_max_us[i] > ctl_max ? ctl_max_us[i] : ctl_max;

    size_t n = 0;
    long completed = 0, failed = 0, errors = 0;
    for (int t = 0; t < opt.threads; t++) {
        n += ths[t].nlat;
        completed += ths[t].completed;
        failed += ths[t].failed;
        errors += ths[t].errors;
    }
    uint32_t *all = malloc((n ? n : 1) * sizeof *all);
    if (!all)
        die("malloc");
    if (opt.timeline)
        write_timeline(ths, n);
    size_t k = 0, kc = 0, nclaim = 0;
    for (int t = 0; t < opt.threads; t++)
        nclaim += ths[t].nclaim;
    uint32_t *claims = malloc((nclaim ? nclaim : 1) * sizeof *claims);
    if (!claims)
        die("malloc");
    for (int t = 0; t < opt.threads; t++) {
        memcpy(all + k, ths[t].lat_us, ths[t].nlat * sizeof *all);
        k += ths[t].nlat;
        memcpy(claims + kc, ths[t].claim_us, ths[t].nclaim * sizeof *claims);
        kc += ths[t].nclaim;
        free(ths[t].claim_us);
        free(ths[t].lat_us);
        free(ths[t].done_ms);
        free(ths[t].conns);
        free(ths[t].pending_t);
    }
    qsort(all, n, sizeof *all, cmp_u32);
    qsort(claims, nclaim, sizeof *claims, cmp_u32);
    const char *label = opt.label                 ? opt.label
                        : opt.target == T_JACKDAW ? "jackdaw"
                        : opt.target == T_REMOTE  ? "jackdaw-remote"
                                                  : "beanstalkd";
    double jps = secs > 0 ? (double)completed / secs : 0;
    printf("{\"label\":\"%s\",\"jobs\":%ld,\"completed\":%ld,\"failed\":%ld,\"errors\":%ld,"
           "\"conns\":%d,\"rate\":%.0f,\"secs\":%.3f,\"jobs_per_s\":%.0f,\"p50_ms\":%.3f,"
           "\"p90_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f,\"control_max_ms\":%.3f",
           label, opt.jobs, completed, failed, errors, opt.conns, opt.rate, secs, jps,
           pct(all, n, 0.50), pct(all, n, 0.90), pct(all, n, 0.99), pct(all, n, 1.0),
           ctl_max / 1000.0);
    if (opt.target == T_REMOTE) /* the worker's view: claim's answer to complete's answer */
        printf(",\"claim_p50_ms\":%.3f,\"claim_p99_ms\":%.3f,\"claim_max_ms\":%.3f",
               pct(claims, nclaim, 0.50), pct(claims, nclaim, 0.99), pct(claims, nclaim, 1.0));
    printf("}\n");
    fprintf(stderr, "%s: %ld/%ld jobs in %.2f s = %.0f jobs/s; p50 %.2f ms p99 %.2f ms\n", label,
            completed, opt.jobs, secs, jps, pct(all, n, 0.50), pct(all, n, 0.99));
    if (opt.target == T_REMOTE)
        fprintf(stderr, "%s: claim-to-complete p50 %.2f ms p99 %.2f ms (%zu tasks)\n", label,
                pct(claims, nclaim, 0.50), pct(claims, nclaim, 0.99), nclaim);
    free(claims);
    free(all);
    free(ths);
    return completed == opt.jobs ? 0 : 1;
}
