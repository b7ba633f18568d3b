/*
 * The HTTP server against an in-memory fake of the job layer (every
 * function of server/jobs.h is defined here, so the real one is not linked):
 * statuses and problem+json, auth, body limits (Content-Length and chunked),
 * content types, suspend/resume around commits that finish before or after
 * the handler suspends, long-poll woken by a change or by its deadline, the
 * parked-connection cap, SSE streaming with Last-Event-ID resume, and drain
 * answering parked waiters. Driven with libcurl over loopback.
 *
 * Threads: the fake fires done/watch callbacks from its own threads, as the
 * storage writer would.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "api/http.h"
#include "common/clock.h"
#include "common/log.h"
#include "scheduler/sched.h"
#include "server/jobs.h"
#include "server/tasks.h"
#include "server/tasks.h"
#include "server/schedules.h"
#include "server/stats.h"
#include "storage/store.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* ---------------- the fake job layer ---------------- */

#define FJOBS 64
#define FWATCH 64

struct fwatch {
    bool active, firing;
    int64_t id, since;
    bool terminal_only;
    void (*fn)(void *, int, int64_t);
    void (*fn_json)(void *, int, int64_t, const char *); /* or this (never given a JSON) */
    void *arg;
    uint64_t wid;
};

static void fw_call(const struct fwatch *w, int rc, int64_t v)
{
    if (w->fn_json)
        w->fn_json(w->arg, rc, v, NULL);
    else
        w->fn(w->arg, rc, v);
}

struct jd_jobs {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t state[FJOBS]; /* enum jd_job_state, -1 = none */
    int64_t version[FJOBS];
    int n;
    struct fwatch w[FWATCH];
    uint64_t next_wid;
    bool sync_done; /* fire done callbacks inline, before submit returns */
    bool shutdown;
    atomic_int pending; /* async callbacks not yet fired */
};

static struct jd_jobs fake;
static const char *state_names[] = {"queued",    "running", "waiting",
                                    "succeeded", "failed",  "cancelled"};

struct later {
    jd_submit_done_fn sdone;
    jd_action_done_fn adone;
    void *arg;
    int64_t id;
    int rc;
};

static void fire_done(struct later *l)
{
    char json[128];
    snprintf(json, sizeof json, "{\"id\":\"%" PRId64 "\",\"state\":\"queued\",\"version\":1}",
             l->id);
    if (l->sdone) {
        struct jd_submit_result res = {0};
        res.rc = l->rc;
        res.job_id = l->id;
        res.json = json;
        l->sdone(l->arg, &res);
    } else {
        l->adone(l->arg, l->rc, json);
    }
}

static void *later_main(void *arg)
{
    usleep(30000); /* the commit takes a while: the handler has suspended */
    fire_done(arg);
    free(arg);
    atomic_fetch_sub(&fake.pending, 1);
    return NULL;
}

static void schedule_done(struct later l)
{
    if (fake.sync_done) {
        fire_done(&l);
        return;
    }
    struct later *p = malloc(sizeof *p);
    *p = l;
    atomic_fetch_add(&fake.pending, 1);
    pthread_t t;
    pthread_create(&t, NULL, later_main, p);
    pthread_detach(t);
}

static int64_t new_job(void)
{
    pthread_mutex_lock(&fake.mu);
    int64_t id = ++fake.n;
    fake.state[id] = JD_JOB_QUEUED;
    fake.version[id] = 1;
    pthread_mutex_unlock(&fake.mu);
    return id;
}

/* Move job id to state (bumping its version) and fire matching watches. */
static void fake_advance(int64_t id, enum jd_job_state st)
{
    struct fwatch fire[FWATCH];
    int nf = 0;
    pthread_mutex_lock(&fake.mu);
    fake.state[id] = st;
    int64_t v = ++fake.version[id];
    for (int i = 0; i < FWATCH; i++) {
        struct fwatch *w = &fake.w[i];
        if (w->active && w->id == id && v > w->since &&
            (!w->terminal_only || jd_job_state_terminal(st))) {
            w->active = false;
            w->firing = true;
            fire[nf++] = *w;
        }
    }
    pthread_mutex_unlock(&fake.mu);
    for (int i = 0; i < nf; i++)
        fw_call(&fire[i], 0, v);
    pthread_mutex_lock(&fake.mu);
    for (int i = 0; i < FWATCH; i++)
        for (int k = 0; k < nf; k++)
            if (fake.w[i].wid == fire[k].wid)
                fake.w[i].firing = false;
    pthread_cond_broadcast(&fake.cv);
    pthread_mutex_unlock(&fake.mu);
}

int jd_jobs_parse_id(const char *s, int64_t *id)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v <= 0)
        return JD_ENOENT;
    *id = v;
    return 0;
}

static bool exists(int64_t id)
{
    return id > 0 && id <= fake.n;
}

int jd_jobs_submit(struct jd_jobs *j, const char *body, size_t len, const char *key,
                   jd_submit_done_fn done, void *arg, struct jd_error *err)
{
    if (len == 0 || body[0] != '{')
        return jd_error_set(err, JD_EPARSE, NULL, "malformed JSON at byte 0");
    if (strstr(body, "\"bad\"") != NULL)
        return jd_error_set(err, JD_EINVAL, "/handler", "unknown handler \"bad\"");
    if (j->shutdown)
        return jd_error_set(err, JD_ESHUTDOWN, NULL, "draining");
    struct later l = {.sdone = done, .arg = arg, .id = new_job()};
    schedule_done(l);
    return 0;
}

int jd_jobs_submit_batch(struct jd_jobs *j, const char *body, size_t len, jd_submit_done_fn done,
                         void *arg, struct jd_error *err)
{
    return jd_jobs_submit(j, body, len, NULL, done, arg, err);
}

int jd_jobs_submit_batch_traced(struct jd_jobs *j, const char *body, size_t len,
                                const char *traceparent, jd_submit_done_fn done, void *arg,
                                struct jd_error *err)
{
    return jd_jobs_submit(j, body, len, NULL, done, arg, err);
}

int jd_jobs_validate(struct jd_jobs *j, const char *body, size_t len, struct jd_error *err)
{
    return 0;
}

int jd_jobs_get_json(struct jd_jobs *j, int64_t id, char **json, int64_t *version, bool *terminal)
{
    pthread_mutex_lock(&fake.mu);
    if (!exists(id)) {
        pthread_mutex_unlock(&fake.mu);
        return JD_ENOENT;
    }
    enum jd_job_state st = (enum jd_job_state)fake.state[id];
    *version = fake.version[id];
    *terminal = jd_job_state_terminal(st);
    char buf[128];
    snprintf(buf, sizeof buf, "{\"id\":\"%" PRId64 "\",\"state\":\"%s\",\"version\":%" PRId64 "}",
             id, state_names[st], *version);
    pthread_mutex_unlock(&fake.mu);
    *json = strdup(buf);
    return 0;
}

int jd_jobs_list_json(struct jd_jobs *j, const struct jd_jobs_list_query *q, char **json,
                      struct jd_error *err)
{
    *json = strdup("{\"jobs\":[],\"next_cursor\":null}");
    return 0;
}

int jd_jobs_submit_traced(struct jd_jobs *j, const char *body, size_t len, const char *key,
                          const char *traceparent, jd_submit_done_fn done, void *arg,
                          struct jd_error *err)
{
    return jd_jobs_submit(j, body, len, key, done, arg, err);
}

bool jd_traceparent_valid(const char *s)
{
    return s != NULL;
}

int jd_jobs_delete(struct jd_jobs *j, int64_t id, jd_action_done_fn done, void *arg)
{
    return exists(id) ? JD_ECONFLICT : JD_ENOENT;
}

int jd_jobs_bulk_start(struct jd_jobs *j, enum jd_bulk_kind kind, const char *body, size_t len,
                       char **json, bool *started, struct jd_error *err)
{
    *started = false;
    *json = strdup("{\"id\":\"1\",\"matched\":0}");
    return 0;
}

int jd_jobs_operation_json(struct jd_jobs *j, const char *id, char **json)
{
    return JD_ENOENT;
}

/* GET /v1/events: a stream with no events, never woken */
struct jd_events_sub {
    int unused;
};

int jd_jobs_events_sub(const struct jd_events_query *q, struct jd_events_sub **out,
                       struct jd_error *err)
{
    *out = calloc(1, sizeof **out);
    return 0;
}

void jd_jobs_events_sub_free(struct jd_events_sub *s)
{
    free(s);
}

int jd_jobs_events_read(struct jd_jobs *j, const struct jd_events_sub *s, int64_t after,
                        unsigned limit, void (*fn)(void *arg, int64_t id, const char *event_json),
                        void *arg, int64_t *next)
{
    *next = after;
    return 0;
}

int jd_jobs_events_tail(struct jd_jobs *j, int64_t *id)
{
    *id = 0;
    return 0;
}

uint64_t jd_jobs_commits(struct jd_jobs *j)
{
    return 0;
}

int jd_jobs_watch_any(struct jd_jobs *j, uint64_t since_commits,
                      void (*fn)(void *arg, int rc, int64_t version), void *arg, uint64_t *watch_id)
{
    *watch_id = 0;
    return JD_ESHUTDOWN;
}

int jd_jobs_events_json(struct jd_jobs *j, int64_t id, int64_t after_seq, unsigned limit,
                        char **json)
{
    if (!exists(id))
        return JD_ENOENT;
    *json = strdup("{\"events\":[]}");
    return 0;
}

int jd_jobs_events_each(struct jd_jobs *j, int64_t id, int64_t after_seq, unsigned limit,
                        bool (*fn)(void *, int64_t, const char *, const char *), void *arg)
{
    pthread_mutex_lock(&fake.mu);
    if (!exists(id)) {
        pthread_mutex_unlock(&fake.mu);
        return JD_ENOENT;
    }
    int64_t v = fake.version[id];
    pthread_mutex_unlock(&fake.mu);
    int n = 0;
    bool more = true;
    for (int64_t s = after_seq + 1; s <= v && more && (unsigned)n < limit; s++, n++) {
        char ev[64];
        snprintf(ev, sizeof ev, "{\"seq\":%" PRId64 "}", s);
        more = fn(arg, s, "state", ev);
    }
    return n;
}

/* Remote commands and tasks (server/tasks.h): not under test here. */
int jd_jobs_command_put(struct jd_jobs *j, const char *name, const char *body, size_t len,
                        bool *created, jd_action_done_fn done, void *arg, struct jd_error *err)
{
    return JD_EINTERNAL;
}
int jd_jobs_command_delete(struct jd_jobs *j, const char *name, jd_action_done_fn done, void *arg,
                           struct jd_error *err)
{
    return JD_EINTERNAL;
}
int jd_jobs_command_get_json(struct jd_jobs *j, const char *name, char **json)
{
    return JD_ENOENT;
}
int jd_jobs_commands_json(struct jd_jobs *j, char **json)
{
    *json = strdup("{\"commands\":[]}");
    return 0;
}
int jd_jobs_task_claim(struct jd_jobs *j, const char *body, size_t len, jd_action_done_fn done,
                       void *arg, struct jd_error *err)
{
    return JD_EINTERNAL;
}
int jd_jobs_task_claim_here(struct jd_jobs *j, const char *body, size_t len, jd_action_done_fn done,
                            void *arg, struct jd_error *err)
{
    return JD_EINTERNAL;
}
int jd_jobs_task_batch_check(struct jd_jobs *j, const char *body, size_t len, struct jd_error *err)
{
    return 0;
}
bool jd_task_id_parse(const char *id, int64_t *node)
{
    *node = 0;
    return false;
}
int jd_task_stored_state(struct jd_store *s, const char *id, int *state, int64_t *job_id)
{
    return JD_ENOENT;
}
int jd_jobs_task_complete(struct jd_jobs *j, const char *id, const char *body, size_t len,
                          jd_action_done_fn done, void *arg, const char **reason,
                          struct jd_error *err)
{
    return JD_EINTERNAL;
}
int jd_jobs_task_fail(struct jd_jobs *j, const char *id, const char *body, size_t len,
                      jd_action_done_fn done, void *arg, const char **reason, struct jd_error *err)
{
    return JD_EINTERNAL;
}
int jd_jobs_task_heartbeat(struct jd_jobs *j, const char *id, const char *body, size_t len,
                           jd_action_done_fn done, void *arg, const char **reason,
                           struct jd_error *err)
{
    return JD_EINTERNAL;
}
int jd_jobs_task_end_batch(struct jd_jobs *j, const char *body, size_t len, jd_action_done_fn done,
                           void *arg, struct jd_error *err)
{
    return JD_EINTERNAL;
}
int jd_jobs_workers_json(struct jd_jobs *j, int64_t within_ms, char **json)
{
    *json = strdup("{\"workers\":[]}");
    return 0;
}
int jd_jobs_task_stats(struct jd_jobs *j, struct jd_task_stats **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    return 0;
}
void jd_task_stats_free(struct jd_task_stats *v, size_t n)
{
}
int jd_jobs_handlers_json(struct jd_jobs *j, char **json)
{
    *json = strdup("{\"plugins\":[]}");
    return 0;
}

int jd_jobs_queues_json(struct jd_jobs *j, char **json)
{
    *json = strdup("{\"queues\":[]}");
    return 0;
}

static int action(int64_t id, jd_action_done_fn done, void *arg, bool need_live)
{
    pthread_mutex_lock(&fake.mu);
    bool ok = exists(id);
    bool term = ok && jd_job_state_terminal((enum jd_job_state)fake.state[id]);
    pthread_mutex_unlock(&fake.mu);
    if (!ok)
        return JD_ENOENT;
    if (need_live == term)
        return JD_ECONFLICT;
    struct later l = {.adone = done, .arg = arg, .id = id};
    schedule_done(l);
    return 0;
}

int jd_jobs_cancel(struct jd_jobs *j, int64_t id, jd_action_done_fn done, void *arg)
{
    return action(id, done, arg, true);
}

int jd_jobs_message(struct jd_jobs *j, int64_t id, const char *body, size_t len,
                    jd_action_done_fn done, void *arg, struct jd_error *err)
{
    return action(id, done, arg, true);
}

int jd_jobs_retry(struct jd_jobs *j, int64_t id, jd_action_done_fn done, void *arg)
{
    return action(id, done, arg, false);
}

int jd_jobs_queue_json(struct jd_jobs *j, const char *queue, char **json)
{
    (void)j;
    (void)queue;
    *json = strdup("{}");
    return 0;
}

int jd_jobs_queue_configure(struct jd_jobs *j, const char *queue, const char *body, size_t len,
                            jd_action_done_fn done, void *arg, struct jd_error *err)
{
    (void)j;
    (void)queue;
    (void)body;
    (void)len;
    (void)err;
    struct later l = {.adone = done, .arg = arg};
    schedule_done(l);
    return 0;
}

int jd_jobs_limits(struct jd_jobs *j, struct jd_jobs_queue_limit **queues, size_t *nq,
                   struct jd_jobs_command_limit **commands, size_t *nc)
{
    (void)j;
    *queues = NULL;
    *commands = NULL;
    *nq = *nc = 0;
    return 0;
}

int jd_jobs_queue_pause(struct jd_jobs *j, const char *queue, bool paused, jd_action_done_fn done,
                        void *arg)
{
    struct later l = {.adone = done, .arg = arg};
    schedule_done(l);
    return 0;
}

static int fake_watch(int64_t id, int64_t since, bool terminal_only, struct fwatch fw,
                      uint64_t *watch_id)
{
    pthread_mutex_lock(&fake.mu);
    if (!exists(id)) {
        pthread_mutex_unlock(&fake.mu);
        return JD_ENOENT;
    }
    int64_t v = fake.version[id];
    bool now =
        fake.shutdown ||
        (v > since && (!terminal_only || jd_job_state_terminal((enum jd_job_state)fake.state[id])));
    if (!now) {
        for (int i = 0; i < FWATCH; i++) {
            struct fwatch *w = &fake.w[i];
            if (!w->active && !w->firing) {
                fw.active = true;
                fw.firing = false;
                fw.id = id;
                fw.since = since;
                fw.terminal_only = terminal_only;
                fw.wid = ++fake.next_wid;
                *w = fw;
                if (watch_id)
                    *watch_id = w->wid;
                pthread_mutex_unlock(&fake.mu);
                return 0;
            }
        }
        pthread_mutex_unlock(&fake.mu);
        return JD_EFULL;
    }
    bool sd = fake.shutdown;
    if (watch_id)
        *watch_id = ++fake.next_wid;
    pthread_mutex_unlock(&fake.mu);
    fw_call(&fw, sd ? JD_ESHUTDOWN : 0, v); /* at once, on this thread */
    return 0;
}

int jd_jobs_watch(struct jd_jobs *j, int64_t id, int64_t since, bool terminal_only,
                  void (*fn)(void *, int, int64_t), void *arg, uint64_t *watch_id)
{
    return fake_watch(id, since, terminal_only, (struct fwatch){.fn = fn, .arg = arg}, watch_id);
}

int jd_jobs_watch_json(struct jd_jobs *j, int64_t id, int64_t since, bool terminal_only,
                       void (*fn)(void *, int, int64_t, const char *), void *arg,
                       uint64_t *watch_id)
{
    return fake_watch(id, since, terminal_only, (struct fwatch){.fn_json = fn, .arg = arg},
                      watch_id);
}

bool jd_jobs_unwatch(struct jd_jobs *j, uint64_t watch_id)
{
    bool never_ran = false;
    pthread_mutex_lock(&fake.mu);
    for (int i = 0; i < FWATCH; i++) {
        struct fwatch *w = &fake.w[i];
        if (w->wid != watch_id)
            continue;
        while (w->firing)
            pthread_cond_wait(&fake.cv, &fake.mu);
        if (w->active) {
            w->active = false;
            never_ran = true;
        }
    }
    pthread_mutex_unlock(&fake.mu);
    return never_ran;
}

static int active_watches(void)
{
    int n = 0;
    pthread_mutex_lock(&fake.mu);
    for (int i = 0; i < FWATCH; i++)
        n += fake.w[i].active;
    pthread_mutex_unlock(&fake.mu);
    return n;
}

void jd_jobs_stats(struct jd_jobs *j, struct jd_jobs_stats *out)
{
    memset(out, 0, sizeof *out);
    out->submitted = (uint64_t)fake.n;
}
struct jd_sched *jd_jobs_sched(struct jd_jobs *j)
{
    return NULL;
}
static struct jd_stats *fake_series; /* the real series module, fed by the tests */
struct jd_stats *jd_jobs_series(struct jd_jobs *j)
{
    return fake_series;
}
void jd_sched_stats(struct jd_sched *s, struct jd_sched_stats *out)
{
    memset(out, 0, sizeof *out);
}
void jd_jobs_call_stats(struct jd_jobs *j, struct jd_jobs_call_stats *out)
{
    memset(out, 0, sizeof *out);
}
uint64_t jd_jobs_cluster_requests_applied(struct jd_jobs *j)
{
    (void)j;
    return 0;
}

bool jd_jobs_cluster_watching(struct jd_jobs *j)
{
    (void)j;
    return false;
}
int jd_jobs_create(const struct jd_jobs_config *cfg, struct jd_jobs **out, struct jd_error *err)
{
    return JD_EINTERNAL;
}
int jd_jobs_drain(struct jd_jobs *j, int64_t grace_ms)
{
    return 0;
}
void jd_jobs_destroy(struct jd_jobs *j)
{
}

/* The schedule engine is not attached here (its routes answer 503); these
 * stand in for it at link time so the fake job layer stays the only one. */
int jd_schedules_check_id(const char *id, struct jd_error *err)
{
    return 0;
}
int jd_schedules_put(struct jd_schedules *s, const char *id, const char *body, size_t len,
                     jd_schedule_done_fn done, void *arg, struct jd_error *err)
{
    return JD_EINTERNAL;
}
int jd_schedules_delete(struct jd_schedules *s, const char *id, jd_schedule_done_fn done, void *arg)
{
    return JD_EINTERNAL;
}
int jd_schedules_pause(struct jd_schedules *s, const char *id, bool paused,
                       jd_schedule_done_fn done, void *arg)
{
    return JD_EINTERNAL;
}
int jd_schedules_trigger(struct jd_schedules *s, const char *id, jd_schedule_done_fn done,
                         void *arg, struct jd_error *err)
{
    return JD_EINTERNAL;
}
int jd_schedules_get_json(struct jd_schedules *s, const char *id, char **json)
{
    return JD_EINTERNAL;
}
int jd_schedules_list_json(struct jd_schedules *s, const char *cursor, unsigned limit, char **json,
                           struct jd_error *err)
{
    return JD_EINTERNAL;
}
int jd_schedules_events_json(struct jd_schedules *s, const char *id, int64_t after_seq,
                             unsigned limit, char **json)
{
    return JD_EINTERNAL;
}
void jd_schedules_stats(struct jd_schedules *s, struct jd_schedules_stats *out)
{
    memset(out, 0, sizeof *out);
}

/* ---------------- the client ---------------- */

struct resp {
    long status;
    char *body;
    size_t len;
    char *headers;
    size_t hlen;
};

struct sink {
    char *p;
    size_t n;
};

static size_t sink_write(char *p, size_t size, size_t n, void *ud)
{
    struct sink *s = ud;
    s->p = realloc(s->p, s->n + size * n + 1);
    memcpy(s->p + s->n, p, size * n);
    s->n += size * n;
    s->p[s->n] = '\0';
    return size * n;
}

static uint16_t port;

/* method path [body] [extra headers...NULL] */
static struct resp call(const char *method, const char *path, const char *body, ...)
{
    struct resp r = {0};
    struct sink b = {0}, h = {0};
    CURL *c = curl_easy_init();
    char url[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
    struct curl_slist *hdrs = NULL;
    va_list ap;
    va_start(ap, body);
    for (const char *x; (x = va_arg(ap, const char *)) != NULL;)
        hdrs = curl_slist_append(hdrs, x);
    va_end(ap);
    if (body != NULL) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, sink_write);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &h);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    else
        r.status = -(long)rc;
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(c);
    r.body = b.p ? b.p : strdup("");
    r.len = b.n;
    r.headers = h.p ? h.p : strdup("");
    r.hlen = h.n;
    return r;
}

static void resp_free(struct resp *r)
{
    free(r->body);
    free(r->headers);
}

static bool has_header(const struct resp *r, const char *line)
{
    return strcasestr(r->headers, line) != NULL;
}

static void expect_problem(struct resp *r, long status)
{
    if (r->status != status)
        fail_msg("status %ld, want %ld; body %s", r->status, status, r->body);
    assert_true(has_header(r, "Content-Type: application/problem+json"));
    assert_true(r->len > 0 && r->body[r->len - 1] == '\n');
    cJSON *o = cJSON_Parse(r->body);
    assert_non_null(o);
    assert_int_equal(cJSON_GetObjectItem(o, "status")->valueint, status);
    assert_non_null(cJSON_GetObjectItem(o, "title"));
    assert_non_null(cJSON_GetObjectItem(o, "type"));
    cJSON_Delete(o);
}

/* ---------------- fixtures ---------------- */

static struct jd_http *srv;

static struct jd_http *start(const char *token, unsigned max_parked, size_t max_body)
{
    struct jd_http_config cfg = {
        .host = "127.0.0.1",
        .port = 0,
        .threads = 2,
        .max_parked = max_parked,
        .max_body = max_body,
        .token = token,
        .heartbeat_ms = 200,
        .max_wait_ms = 10000,
    };
    struct jd_http *h = NULL;
    struct jd_error err = {0};
    if (jd_http_start(&cfg, &h, &err) != 0)
        fail_msg("start: %s", err.message);
    port = jd_http_port(h);
    assert_true(port != 0);
    return h;
}

static void wait_pending(void)
{
    for (int i = 0; i < 500 && atomic_load(&fake.pending) > 0; i++)
        usleep(10000);
}

static int setup_with(size_t max_body)
{
    memset(fake.state, 0, sizeof fake.state);
    fake.n = 0;
    fake.sync_done = false;
    fake.shutdown = false;
    srv = start(NULL, 8, max_body);
    jd_http_attach(srv, &fake);
    return 0;
}

static int setup(void **state)
{
    return setup_with(1024);
}

static int setup_big(void **state)
{
    return setup_with((size_t)1 << 20);
}

static int teardown(void **state)
{
    wait_pending();
    jd_http_stop(srv, 2000);
    srv = NULL;
    assert_int_equal(active_watches(), 0);
    return 0;
}

/* ---------------- tests ---------------- */

static void test_ready_only_after_attach(void **state)
{
    struct jd_http *h = start(NULL, 8, 1024);
    struct resp r = call("GET", "/livez", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"status\":\"ok\"}\n");
    resp_free(&r);
    r = call("GET", "/readyz", NULL, NULL);
    expect_problem(&r, 503);
    assert_true(has_header(&r, "Retry-After: "));
    resp_free(&r);
    r = call("GET", "/v1/jobs/1", NULL, NULL);
    expect_problem(&r, 503);
    resp_free(&r);
    jd_http_attach(h, &fake);
    r = call("GET", "/readyz", NULL, NULL);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    jd_http_drain(h);
    jd_http_stop(h, 1000);
}

static void test_routing_errors(void **state)
{
    struct resp r = call("GET", "/nope", NULL, "X-Request-Id: abc-123", NULL);
    expect_problem(&r, 404);
    assert_true(has_header(&r, "X-Request-Id: abc-123"));
    assert_non_null(strstr(r.body, "\"request_id\":\"abc-123\""));
    resp_free(&r);
    r = call("DELETE", "/v1/jobs/1/events", NULL, NULL);
    expect_problem(&r, 405);
    assert_true(has_header(&r, "Allow: GET, HEAD"));
    resp_free(&r);
    r = call("GET", "/v1/jobs/abc", NULL, NULL);
    expect_problem(&r, 404);
    resp_free(&r);
    r = call("GET", "/v1/jobs/999", NULL, NULL);
    expect_problem(&r, 404);
    resp_free(&r);
    /* a generated request id when none (or a hostile one) is given */
    r = call("GET", "/livez", NULL, "X-Request-Id: <script>", NULL);
    assert_true(has_header(&r, "X-Request-Id: "));
    assert_null(strstr(r.headers, "<script>"));
    resp_free(&r);
}

static void check_submit(void)
{
    struct resp r =
        call("POST", "/v1/jobs", "{\"handler\":\"echo\"}", "Content-Type: application/json", NULL);
    if (r.status != 201)
        fail_msg("submit: %ld %s", r.status, r.body);
    assert_true(has_header(&r, "Location: /v1/jobs/"));
    assert_true(r.body[r.len - 1] == '\n');
    assert_non_null(strstr(r.body, "\"state\":\"queued\""));
    resp_free(&r);
}

static void test_submit_suspends_until_commit(void **state)
{
    fake.sync_done = false; /* done fires 30 ms later on another thread */
    check_submit();
    fake.sync_done = true; /* done fires before submit returns */
    check_submit();
}

static void test_submit_errors(void **state)
{
    struct resp r =
        call("POST", "/v1/jobs", "{\"handler\":\"bad\"}", "Content-Type: application/json", NULL);
    expect_problem(&r, 422);
    assert_non_null(strstr(r.body, "\"pointer\":\"/handler\""));
    resp_free(&r);
    r = call("POST", "/v1/jobs", "[1,", "Content-Type: application/json", NULL);
    expect_problem(&r, 400);
    resp_free(&r);
    r = call("POST", "/v1/jobs", "handler=echo", "Content-Type: application/x-www-form-urlencoded",
             NULL);
    expect_problem(&r, 415);
    resp_free(&r);
    /* over --max-body (1024 here), announced by Content-Length */
    char big[4096];
    memset(big, ' ', sizeof big - 1);
    big[0] = '{';
    big[sizeof big - 2] = '}';
    big[sizeof big - 1] = '\0';
    r = call("POST", "/v1/jobs", big, "Content-Type: application/json", NULL);
    expect_problem(&r, 413);
    resp_free(&r);
    /* ... and chunked, with no Content-Length */
    r = call("POST", "/v1/jobs", big, "Content-Type: application/json",
             "Transfer-Encoding: chunked", NULL);
    expect_problem(&r, 413);
    resp_free(&r);
    /* the server is still fine */
    check_submit();
}

/* Bodies of 64 KiB and more are started on the slow lane's thread: the
 * answer is the same whether the commit fires before or after the lane
 * returns, and a refusal keeps its status and pointer. */
static void test_large_bodies_take_the_slow_lane(void **state)
{
    size_t n = 200 * 1024;
    char *big = malloc(n + 64);
    int k = snprintf(big, n + 64, "{\"handler\":\"echo\",\"args\":{\"v\":\"");
    memset(big + k, 'x', n);
    strcpy(big + k + n, "\"}}");
    for (int sync = 0; sync < 2; sync++) {
        fake.sync_done = sync;
        struct resp r = call("POST", "/v1/jobs", big, "Content-Type: application/json", NULL);
        if (r.status != 201)
            fail_msg("large submit (sync %d): %ld %s", sync, r.status, r.body);
        assert_true(has_header(&r, "Location: /v1/jobs/"));
        resp_free(&r);
        r = call("POST", "/v1/jobs/batch", big, "Content-Type: application/json", NULL);
        assert_int_equal(r.status, 201);
        resp_free(&r);
    }
    memcpy(big + 12, "bad\"", 4); /* {"handler":"bad" ... */
    struct resp r = call("POST", "/v1/jobs", big, "Content-Type: application/json", NULL);
    expect_problem(&r, 422);
    assert_non_null(strstr(r.body, "\"pointer\":\"/handler\""));
    resp_free(&r);
    free(big);
    check_submit(); /* small bodies as before */
}

static void test_actions(void **state)
{
    int64_t id = new_job();
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "/cancel", id);
    struct resp r = call("POST", path, NULL, NULL);
    assert_int_equal(r.status, 202);
    resp_free(&r);
    fake_advance(id, JD_JOB_CANCELLED);
    r = call("POST", path, NULL, NULL);
    expect_problem(&r, 409);
    resp_free(&r);
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "/retry", id);
    r = call("POST", path, NULL, NULL);
    assert_int_equal(r.status, 202);
    resp_free(&r);
    r = call("POST", "/v1/jobs/424242/cancel", NULL, NULL);
    expect_problem(&r, 404);
    resp_free(&r);
    r = call("POST", "/v1/queues/mail/pause", NULL, NULL);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    r = call("GET", "/v1/jobs?limit=0", NULL, NULL);
    expect_problem(&r, 400);
    resp_free(&r);
    r = call("GET", "/v1/jobs?state=bogus", NULL, NULL);
    expect_problem(&r, 400);
    resp_free(&r);
    r = call("GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "jackdaw_http_requests_total{route=\"/v1/jobs/{id}/cancel\""));
    resp_free(&r);
    r = call("GET", "/v1/openapi.yaml", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, jd_openapi_yaml);
    resp_free(&r);
}

static void test_auth(void **state)
{
    jd_http_stop(srv, 1000);
    srv = start("s3cret", 8, 1024);
    jd_http_attach(srv, &fake);
    int64_t id = new_job();
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64, id);
    struct resp r = call("GET", path, NULL, NULL);
    expect_problem(&r, 401);
    assert_true(has_header(&r, "WWW-Authenticate: Bearer"));
    resp_free(&r);
    r = call("GET", path, NULL, "Authorization: Bearer wrong", NULL);
    expect_problem(&r, 401);
    resp_free(&r);
    r = call("GET", path, NULL, "Authorization: Bearer s3cret", NULL);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    r = call("GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    r = call("GET", "/livez", NULL, NULL);
    assert_int_equal(r.status, 200);
    resp_free(&r);
}

/* The dashboard's files and /v1/stats: public files with ETag, CSP and
 * 304; redirects to /ui/; the series under the token; --ui off. */
static void test_dashboard(void **state)
{
    jd_http_stop(srv, 1000);
    srv = start("s3cret", 8, 1024);
    jd_http_attach(srv, &fake);
    struct resp r = call("GET", "/ui/", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_true(has_header(&r, "Content-Type: text/html; charset=utf-8"));
    assert_true(has_header(&r, "Content-Security-Policy: default-src 'none'; script-src 'self';"));
    assert_non_null(strstr(r.body, "<!doctype html>"));
    const char *e = strstr(r.headers, "ETag: ");
    assert_non_null(e);
    char inm[96];
    snprintf(inm, sizeof inm, "If-None-Match: %.*s", (int)strcspn(e + 6, "\r\n"), e + 6);
    resp_free(&r);
    r = call("GET", "/ui/", NULL, inm, NULL);
    assert_int_equal(r.status, 304);
    assert_int_equal(r.len, 0);
    resp_free(&r);
    r = call("GET", "/ui/app.js", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_true(has_header(&r, "Content-Type: text/javascript"));
    resp_free(&r);
    r = call("GET", "/", NULL, NULL);
    assert_int_equal(r.status, 302);
    assert_true(has_header(&r, "Location: /ui/"));
    resp_free(&r);
    r = call("GET", "/ui", NULL, NULL);
    assert_int_equal(r.status, 302);
    resp_free(&r);
    r = call("GET", "/ui/missing.js", NULL, NULL);
    expect_problem(&r, 404);
    resp_free(&r);

    jd_stats_job_end(fake_series, "mail", JD_JOB_FAILED, jd_wall_ms());
    r = call("GET", "/v1/stats", NULL, NULL);
    expect_problem(&r, 401);
    resp_free(&r);
    r = call("GET", "/v1/stats?seconds=5", NULL, "Authorization: Bearer s3cret", NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"seconds\":5,"));
    assert_non_null(strstr(r.body, "\"name\":\"mail\""));
    assert_non_null(strstr(r.body, "\"totals\":{\"succeeded\":0,\"failed\":1,\"cancelled\":0}"));
    assert_non_null(strstr(r.body, "\"oldest_queued\":[]")); /* no store here */
    resp_free(&r);
    const char *bad[] = {"0", "901", "-1", "abc", "", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[64];
        snprintf(path, sizeof path, "/v1/stats?seconds=%s", bad[i]);
        r = call("GET", path, NULL, "Authorization: Bearer s3cret", NULL);
        expect_problem(&r, 400);
        resp_free(&r);
    }
    jd_http_stop(srv, 1000);

    struct jd_http_config cfg = {.host = "127.0.0.1", .ui_off = true};
    struct jd_error err = {0};
    if (jd_http_start(&cfg, &srv, &err) != 0)
        fail_msg("start: %s", err.message);
    port = jd_http_port(srv);
    jd_http_attach(srv, &fake);
    r = call("GET", "/ui/", NULL, NULL);
    expect_problem(&r, 404);
    resp_free(&r);
    r = call("GET", "/", NULL, NULL);
    expect_problem(&r, 404);
    resp_free(&r);
}

struct advance_arg {
    int64_t id;
    int delay_ms;
    enum jd_job_state states[4];
};

static void *advance_main(void *arg)
{
    struct advance_arg *a = arg;
    for (int i = 0; i < 4 && a->states[i] != JD_JOB_QUEUED; i++) {
        usleep((useconds_t)a->delay_ms * 1000);
        fake_advance(a->id, a->states[i]);
    }
    return NULL;
}

static void test_long_poll_woken_by_completion(void **state)
{
    int64_t id = new_job();
    struct advance_arg a = {id, 150, {JD_JOB_RUNNING, JD_JOB_SUCCEEDED}};
    pthread_t t;
    pthread_create(&t, NULL, advance_main, &a);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "?wait=8s", id);
    uint64_t t0 = jd_now_ns();
    struct resp r = call("GET", path, NULL, NULL);
    double secs = (double)(jd_now_ns() - t0) / 1e9;
    pthread_join(t, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"state\":\"succeeded\"")); /* running did not end it */
    assert_true(secs >= 0.25 && secs < 4.0);
    resp_free(&r);
}

static void test_long_poll_since_and_timeout(void **state)
{
    int64_t id = new_job();
    char path[96];
    /* times out with the job unchanged */
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "?wait=300ms", id);
    uint64_t t0 = jd_now_ns();
    struct resp r = call("GET", path, NULL, NULL);
    double secs = (double)(jd_now_ns() - t0) / 1e9;
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"state\":\"queued\""));
    assert_true(secs >= 0.28 && secs < 3.0);
    resp_free(&r);
    /* since=<version>: any change ends it */
    struct advance_arg a = {id, 100, {JD_JOB_RUNNING}};
    pthread_t t;
    pthread_create(&t, NULL, advance_main, &a);
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "?wait=8s&since=1", id);
    r = call("GET", path, NULL, NULL);
    pthread_join(t, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"state\":\"running\""));
    resp_free(&r);
    /* already past the version: at once */
    r = call("GET", path, NULL, NULL);
    assert_non_null(strstr(r.body, "\"version\":2"));
    resp_free(&r);
    r = call("GET", "/v1/jobs/1?wait=soon", NULL, NULL);
    expect_problem(&r, 400);
    resp_free(&r);
}

struct bg_call {
    char path[96];
    struct resp r;
    const char *hdr;
};

static void *bg_main(void *arg)
{
    struct bg_call *b = arg;
    b->r = call("GET", b->path, NULL, b->hdr, NULL);
    return NULL;
}

static void test_parked_cap_and_drain(void **state)
{
    jd_http_stop(srv, 1000);
    srv = start(NULL, 1, 1024);
    jd_http_attach(srv, &fake);
    int64_t id = new_job();
    struct bg_call b = {0};
    snprintf(b.path, sizeof b.path, "/v1/jobs/%" PRId64 "?wait=9s", id);
    pthread_t t;
    pthread_create(&t, NULL, bg_main, &b);
    usleep(200000); /* parked by now */
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "?wait=9s", id);
    struct resp r = call("GET", path, NULL, NULL);
    expect_problem(&r, 429);
    assert_true(has_header(&r, "Retry-After: "));
    resp_free(&r);
    /* drain answers the parked waiter at once with the current state */
    uint64_t t0 = jd_now_ns();
    jd_http_drain(srv);
    pthread_join(t, NULL);
    assert_true((double)(jd_now_ns() - t0) / 1e9 < 3.0);
    assert_int_equal(b.r.status, 200);
    assert_non_null(strstr(b.r.body, "\"state\":\"queued\""));
    resp_free(&b.r);
}

/* Open a raw connection and send a GET for path (with an extra header or
 * NULL); returns the socket. */
static int raw_get(const char *path, const char *hdr)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\n%s%s\r\n", path,
                     hdr ? hdr : "", hdr ? "\r\n" : "");
    assert_int_equal(write(fd, req, (size_t)n), n);
    return fd;
}

/* Clients that hang up while parked (close, reset or half-close; in a
 * long-poll or an SSE stream) give back their --max-parked slot and their
 * watch at once, long before their wait or heartbeat would end. */
static void test_vanished_clients_give_back_slots(void **state)
{
    jd_http_stop(srv, 1000);
    srv = start(NULL, 3, 1024);
    jd_http_attach(srv, &fake);
    int64_t id = new_job();
    char lp[96], ev[96];
    snprintf(lp, sizeof lp, "/v1/jobs/%" PRId64 "?wait=9s", id);
    snprintf(ev, sizeof ev, "/v1/jobs/%" PRId64 "/events", id);
    for (int round = 0; round < 3; round++) {
        int fd[3];
        for (int i = 0; i < 3; i++)
            fd[i] = i == 2 ? raw_get(ev, "Accept: text/event-stream") : raw_get(lp, NULL);
        usleep(200000); /* parked by now */
        struct resp r = call("GET", lp, NULL, NULL);
        expect_problem(&r, 429);
        resp_free(&r);
        for (int i = 0; i < 3; i++) {
            if (round == 1) { /* reset instead of FIN */
                struct linger l = {1, 0};
                setsockopt(fd[i], SOL_SOCKET, SO_LINGER, &l, sizeof l);
            }
            if (round == 2)
                shutdown(fd[i], SHUT_WR);
            else
                close(fd[i]);
        }
        /* within 2 s (the wait is 9 s, the heartbeat far away), a long-poll
         * gets its slot again */
        long status = 0;
        snprintf(lp, sizeof lp, "/v1/jobs/%" PRId64 "?wait=10ms", id);
        for (int k = 0; k < 40 && status != 200; k++) {
            r = call("GET", lp, NULL, NULL);
            status = r.status;
            resp_free(&r);
            if (status != 200)
                usleep(50000);
        }
        assert_int_equal(status, 200);
        snprintf(lp, sizeof lp, "/v1/jobs/%" PRId64 "?wait=9s", id);
        if (round == 2)
            for (int i = 0; i < 3; i++)
                close(fd[i]);
    }
}

static void test_sse_live_and_resume(void **state)
{
    int64_t id = new_job();
    struct advance_arg a = {id, 300, {JD_JOB_RUNNING, JD_JOB_SUCCEEDED}};
    pthread_t t;
    pthread_create(&t, NULL, advance_main, &a);
    struct bg_call b = {0};
    snprintf(b.path, sizeof b.path, "/v1/jobs/%" PRId64 "/events", id);
    b.hdr = "Accept: text/event-stream";
    bg_main(&b);
    pthread_join(t, NULL);
    assert_int_equal(b.r.status, 200);
    assert_true(has_header(&b.r, "Content-Type: text/event-stream"));
    assert_non_null(strstr(b.r.body, "id: 1\nevent: state\ndata: {\"seq\":1}\n\n"));
    assert_non_null(strstr(b.r.body, "id: 2\n"));
    assert_non_null(strstr(b.r.body, "id: 3\n"));
    assert_non_null(strstr(b.r.body, ": heartbeat\n\n")); /* 200 ms heartbeats, 300 ms gaps */
    assert_non_null(strstr(b.r.body, "event: end\n"));
    resp_free(&b.r);
    /* resume after event 2: only 3 and the end */
    struct resp r =
        call("GET", b.path, NULL, "Accept: text/event-stream", "Last-Event-ID: 2", NULL);
    assert_int_equal(r.status, 200);
    assert_null(strstr(r.body, "id: 2\n"));
    assert_non_null(strstr(r.body, "id: 3\n"));
    assert_non_null(strstr(r.body, "event: end\n"));
    resp_free(&r);
}

static void test_sse_ends_on_drain(void **state)
{
    int64_t id = new_job();
    struct bg_call b = {0};
    snprintf(b.path, sizeof b.path, "/v1/jobs/%" PRId64 "/events", id);
    b.hdr = "Accept: text/event-stream";
    pthread_t t;
    pthread_create(&t, NULL, bg_main, &b);
    usleep(300000);
    jd_http_drain(srv);
    pthread_join(t, NULL);
    assert_int_equal(b.r.status, 200);
    assert_non_null(strstr(b.r.body, "id: 1\n"));
    resp_free(&b.r);
    struct resp r = call("GET", "/readyz", NULL, NULL);
    assert_true(r.status < 0); /* no longer accepting connections */
    resp_free(&r);
}

/* ---- a burst of exactly 128 ready keep-alive connections on one thread ---- */

#define BURST 128 /* libmicrohttpd 0.9.75's epoll batch (MAX_EVENTS) */

static int raw_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {.tv_sec = 5}; /* far below the 30 s connection timeout */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void raw_send_get(int fd)
{
    char req[128];
    int n = snprintf(req, sizeof req, "GET /v1/jobs/1 HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n\r\n",
                     (unsigned)port);
    assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
}

/* Read one whole response (headers + Content-Length body); false on a
 * timeout or a close. */
static bool raw_read_response(int fd)
{
    char buf[4096];
    size_t len = 0;
    for (;;) {
        ssize_t r = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (r <= 0)
            return false;
        len += (size_t)r;
        buf[len] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (end == NULL)
            continue;
        const char *cl = strstr(buf, "Content-Length: ");
        size_t body = cl ? strtoul(cl + 16, NULL, 10) : 0;
        if (len >= (size_t)(end + 4 - buf) + body)
            return strncmp(buf, "HTTP/1.1 200", 12) == 0;
    }
}

/* The bench stall: when one event-loop thread found exactly 128 connections
 * ready at once, libmicrohttpd 0.9.75's epoll loop asked the kernel for the
 * rest with the idle timeout (the 30 s connection timeout) instead of 0 and
 * slept on the 128 requests it had just been told about, until the timeout
 * closed them. The server must answer such a burst at once. */
static void test_burst_of_ready_connections_answered(void **state)
{
    (void)state;
    struct jd_http_config cfg = {.host = "127.0.0.1", .threads = 1, .max_connections = 512};
    struct jd_http *h = NULL;
    struct jd_error err = {0};
    if (jd_http_start(&cfg, &h, &err) != 0)
        fail_msg("start: %s", err.message);
    port = jd_http_port(h);
    memset(fake.state, 0, sizeof fake.state);
    fake.n = 0;
    jd_http_attach(h, &fake);
    new_job();

    int blocker = raw_connect();
    int fds[BURST];
    for (int i = 0; i < BURST; i++) { /* every connection accepted and idle */
        fds[i] = raw_connect();
        raw_send_get(fds[i]);
        assert_true(raw_read_response(fds[i]));
    }
    raw_send_get(blocker);
    assert_true(raw_read_response(blocker));

    /* Hold the event-loop thread inside a handler (it needs fake.mu) while
     * all BURST requests arrive, so it next finds them ready together. */
    pthread_mutex_lock(&fake.mu);
    raw_send_get(blocker);
    usleep(50000);
    for (int i = 0; i < BURST; i++)
        raw_send_get(fds[i]);
    usleep(100000);
    pthread_mutex_unlock(&fake.mu);

    uint64_t t0 = jd_now_ns();
    assert_true(raw_read_response(blocker));
    int answered = 0;
    for (int i = 0; i < BURST; i++)
        answered += raw_read_response(fds[i]);
    uint64_t ms = (jd_now_ns() - t0) / 1000000u;
    assert_int_equal(answered, BURST);
    assert_true(ms < 3000);

    for (int i = 0; i < BURST; i++)
        close(fds[i]);
    close(blocker);
    jd_http_stop(h, 2000);
}

int main(void)
{
    jd_log_set_level(JD_LOG_WARN);
    pthread_mutex_init(&fake.mu, NULL);
    pthread_cond_init(&fake.cv, NULL);
    curl_global_init(CURL_GLOBAL_ALL);
    fake_series = jd_stats_create();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_only_after_attach),
        cmocka_unit_test_setup_teardown(test_routing_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_submit_suspends_until_commit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_submit_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_bodies_take_the_slow_lane, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_actions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_auth, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dashboard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_poll_woken_by_completion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_poll_since_and_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parked_cap_and_drain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vanished_clients_give_back_slots, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sse_live_and_resume, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sse_ends_on_drain, setup, teardown),
        cmocka_unit_test(test_burst_of_ready_connections_answered),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    jd_stats_destroy(fake_series);
    curl_global_cleanup();
    return rc;
}
