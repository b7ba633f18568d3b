/*
 * Remote tasks across cluster nodes: relays, forwarded claims and
 * announcements (see api/forward.h for what and why).
 *
 * Invariants: every queued relay holds a reference on its request, which
 * is suspended (armed) until this module wakes it exactly once; every
 * queued claim's done runs exactly once (with NULL when refused late or
 * stopped). A node's URL is cached for FWD_URL_TTL_MS; a call that gets no
 * answer re-reads it uncached, so a dead owner is told from a slow one.
 *
 * Threading: http_forward_relay on an MHD thread (queues and suspends); the
 * hooks on any thread (queue only, never block); FWD_THREADS threads run
 * the items: libcurl, the store's node table, and, when a task's owner is
 * gone, the job layer's own answer for the id. f->mu guards the queue, the
 * URL cache and `stop`; it is never held across a call out.
 */
#include "api/forward.h"
#include "api/http_impl.h"

#include "api/problem.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "storage/store.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FWD_THREADS 4       /* calls that may block up to FWD_TIMEOUT_MS each */
#define FWD_QUEUE_MAX 256   /* items waiting for a thread; more are refused at once */
#define FWD_TIMEOUT_MS 3000 /* one call to another node, connect included */
#define FWD_CONNECT_MS 1000
#define FWD_ANSWER_MAX ((size_t)16 << 20) /* a claim of 100 tasks with large args */
#define FWD_URL_TTL_MS 5000               /* a node's URL changes only with its incarnation */
#define FWD_URL_CACHE 64                  /* nodes remembered; the oldest entry goes */
#define FWD_DOWN_MS 1000 /* after no answer, a node is not called again this long */

enum fkind { F_RELAY, F_BATCH, F_WORKERS, F_CLAIM, F_ANNOUNCE };

struct fitem {
    enum fkind kind;
    int64_t node;
    struct jd_req *r;  /* relay, batch: referenced, suspended */
    int which;         /* relay: 0 complete, 1 fail, 2 heartbeat */
    int64_t within_ms; /* workers: the route's ?within= */
    char *body;        /* claim: the body (owned); announce: the payload (owned) */
    void (*done)(void *cbarg, const char *json);
    void *cbarg;
    struct fitem *next;
};

struct urlc {
    int64_t node;
    int64_t at_ms;
    char *url;
};

/* A node that did not answer: calls to it fail at once until until_ms, so
 * a stalled node holds no thread for long (it would hold all of them). */
struct downc {
    int64_t node, until_ms;
};

struct jd_forward {
    struct jd_store *store;
    char *auth; /* "Authorization: Bearer T" or NULL */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct fitem *head, *tail;
    unsigned queued;
    bool stop;
    pthread_t threads[FWD_THREADS];
    unsigned nthreads;
    struct urlc cache[FWD_URL_CACHE];
    struct downc down[FWD_URL_CACHE];
    _Atomic int64_t warned_ms; /* the last warn_unreachable */
    _Atomic uint64_t relays, relay_failures, relays_gone, claims, claim_failures, claimed,
        announces, refused;
};

/* ---- the node table, cached ---- */

/* node's URL (caller frees): 0, JD_ENOENT (no live row), JD_EIO. */
static int node_url(struct jd_forward *f, int64_t node, bool fresh, char **url)
{
    int64_t now = jd_wall_ms();
    *url = NULL;
    pthread_mutex_lock(&f->mu);
    for (unsigned i = 0; i < FWD_URL_CACHE && !fresh; i++)
        if (f->cache[i].node == node && f->cache[i].url && now - f->cache[i].at_ms < FWD_URL_TTL_MS)
            *url = jd_xstrdup(f->cache[i].url);
    pthread_mutex_unlock(&f->mu);
    if (*url)
        return 0;
    int rc = jd_store_node_url(f->store, node, url);
    pthread_mutex_lock(&f->mu);
    unsigned slot = 0;
    for (unsigned i = 0; i < FWD_URL_CACHE; i++) {
        if (f->cache[i].node == node) {
            slot = i;
            break;
        }
        if (f->cache[i].at_ms < f->cache[slot].at_ms)
            slot = i;
    }
    free(f->cache[slot].url);
    f->cache[slot].url = NULL;
    f->cache[slot].node = 0;
    f->cache[slot].at_ms = 0;
    if (rc == 0) {
        f->cache[slot].node = node;
        f->cache[slot].at_ms = now;
        f->cache[slot].url = jd_xstrdup(*url);
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

/* Whether node is in its quiet time after a call it did not answer. */
static bool node_down(struct jd_forward *f, int64_t node)
{
    int64_t now = jd_wall_ms();
    bool down = false;
    pthread_mutex_lock(&f->mu);
    for (unsigned i = 0; i < FWD_URL_CACHE && !down; i++)
        down = f->down[i].node == node && f->down[i].until_ms > now;
    pthread_mutex_unlock(&f->mu);
    return down;
}

/* node answered (ok) or did not. */
static void node_answered(struct jd_forward *f, int64_t node, bool ok)
{
    int64_t now = jd_wall_ms();
    pthread_mutex_lock(&f->mu);
    unsigned slot = FWD_URL_CACHE;
    for (unsigned i = 0; i < FWD_URL_CACHE && slot == FWD_URL_CACHE; i++)
        if (f->down[i].node == node)
            slot = i;
    if (ok && slot < FWD_URL_CACHE)
        f->down[slot].node = f->down[slot].until_ms = 0;
    if (!ok) {
        if (slot == FWD_URL_CACHE) { /* a free or lapsed entry, else the one ending first */
            slot = 0;
            for (unsigned i = 1; i < FWD_URL_CACHE; i++)
                if (f->down[i].until_ms < f->down[slot].until_ms)
                    slot = i;
        }
        f->down[slot].node = node;
        f->down[slot].until_ms = now + FWD_DOWN_MS;
    }
    pthread_mutex_unlock(&f->mu);
}

/* ---- one call ---- */

struct answer {
    char *p;
    size_t len;
    bool over;
};

static size_t on_data(char *ptr, size_t size, size_t n, void *arg)
{
    struct answer *a = arg;
    size_t k = size * n;
    if (a->len + k > FWD_ANSWER_MAX) {
        a->over = true;
        return 0; /* ends the transfer */
    }
    a->p = jd_xrealloc(a->p, a->len + k + 1);
    memcpy(a->p + a->len, ptr, k);
    a->len += k;
    a->p[a->len] = '\0';
    return k;
}

/* An operator's clue when another node cannot be reached (a wrong
 * --advertise-url, a firewall): logged at most every FWD_WARN_EVERY_MS. */
#define FWD_WARN_EVERY_MS 10000
static void warn_unreachable(struct jd_forward *f, const char *url, const char *why)
{
    int64_t now = jd_wall_ms();
    int64_t last = atomic_load_explicit(&f->warned_ms, memory_order_relaxed);
    if (now - last < FWD_WARN_EVERY_MS ||
        !atomic_compare_exchange_strong_explicit(&f->warned_ms, &last, now, memory_order_relaxed,
                                                 memory_order_relaxed))
        return;
    jd_log(JD_LOG_WARN, "cluster: another node did not answer a task request", "url", url, "error",
           why, NULL);
}

/* POST body (NULL: GET) to node's base + path on curl handle c; the HTTP status (the
 * answer in *out, caller frees; NUL-terminated) or 0 when no answer came
 * (or the node is in its quiet time: node_down). */
static long post(struct jd_forward *f, CURL *c, int64_t node, const char *base, const char *path,
                 const char *body, size_t len, char **out, size_t *outlen)
{
    struct answer a = {0};
    *out = NULL;
    *outlen = 0;
    if (node_down(f, node))
        return 0;
    char *url = jd_xasprintf("%s%s", base, path);
    char me[64];
    snprintf(me, sizeof me, "Jackdaw-Forwarded: %" PRId64, jd_store_node_id(f->store));
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    hd = curl_slist_append(hd, me);
    hd = curl_slist_append(hd, "Expect:");
    if (f->auth)
        hd = curl_slist_append(hd, f->auth);
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    } else {
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)FWD_TIMEOUT_MS);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)FWD_CONNECT_MS);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &a);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    long status = 0;
    CURLcode cc = curl_easy_perform(c);
    if (cc == CURLE_OK && !a.over)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hd);
    if (status <= 0)
        warn_unreachable(f, url, a.over ? "the answer is too large" : curl_easy_strerror(cc));
    node_answered(f, node, status > 0 || a.over);
    free(url);
    if (status <= 0) {
        free(a.p);
        *out = NULL;
        *outlen = 0;
        return 0;
    }
    *out = a.p ? a.p : jd_xstrdup("");
    *outlen = a.len;
    return status;
}

/* ---- relays ---- */

/* Answer r (on its MHD thread, once woken) as the relay left it. */
static enum MHD_Result answer_relay(struct jd_req *r, const char *json)
{
    if (r->relay_status > 0) {
        size_t n = json ? strlen(json) : 0;
        char *b = jd_xmalloc(n + 1);
        memcpy(b, json ? json : "", n + 1);
        const char *ct = r->relay_status >= 400 ? "application/problem+json" : "application/json";
        return http_respond(r, r->relay_status, ct, b, n,
                            r->relay_status == 503 ? "Retry-After" : NULL, "1", NULL, NULL);
    }
    if (r->relay_rc == JD_ECONFLICT && r->relay_reason) {
        char *b =
            jd_problem_json_reason(409, r->relay_reason, r->cb_err.message, NULL, r->path, r->rid);
        return http_respond(r, 409, "application/problem+json", b, strlen(b), NULL, NULL, NULL,
                            NULL);
    }
    return http_respond_error(r, r->relay_rc, &r->cb_err);
}

/* Hand r its answer: the owner's (status > 0, body owned) or a refusal
 * made here (rc, reason, err). */
static void relay_deliver(struct jd_req *r, long status, char *body, int rc, const char *reason,
                          const struct jd_error *err)
{
    pthread_mutex_lock(&r->mu);
    r->cb_rc = 0;
    free(r->cb_json);
    r->cb_json = body;
    r->cb_json_room = false; /* not http_answer_dup's: answers copy it */
    r->relay_status = (int)status;
    r->relay_rc = rc;
    r->relay_reason = reason;
    if (err)
        r->cb_err = *err;
    pthread_mutex_unlock(&r->mu);
    http_wake(r, WAKE_CHANGED);
}

/* 503 (with Retry-After): the owner may answer later. */
static void relay_unavailable(struct jd_req *r, const char *why)
{
    relay_deliver(r, 503, jd_problem_json(503, why, NULL, r->path, r->rid), 0, NULL, NULL);
}

static void no_done(void *arg, int rc, const char *json)
{
    (void)arg, (void)rc, (void)json;
}

/* The owner of r's task has no live row (or did not answer, and the task's
 * end is stored): the store's record of the task answers, through the job
 * layer's own refusal (it never held this id). */
static void relay_gone(struct jd_forward *f, struct jd_req *r, int which)
{
    atomic_fetch_add_explicit(&f->relays_gone, 1, memory_order_relaxed);
    struct jd_jobs *j = http_jobs_of(r->h);
    struct jd_error err = {0};
    const char *reason = NULL;
    const char *b = r->body ? r->body : "";
    /* The job layer never holds an id that names another node, so it
     * refuses (no_done is never called). */
    int rc = which == 0
                 ? jd_jobs_task_complete(j, r->m.param, b, r->len, no_done, NULL, &reason, &err)
             : which == 1
                 ? jd_jobs_task_fail(j, r->m.param, b, r->len, no_done, NULL, &reason, &err)
                 : jd_jobs_task_heartbeat(j, r->m.param, b, r->len, no_done, NULL, &reason, &err);
    if (rc == 0) { /* not reached */
        relay_unavailable(r, "the task's node is gone");
        return;
    }
    relay_deliver(r, 0, NULL, rc, reason, &err);
}

static void run_relay(struct jd_forward *f, CURL *c, struct fitem *it)
{
    struct jd_req *r = it->r;
    char *url = NULL;
    int rc = node_url(f, it->node, false, &url);
    if (rc == JD_ENOENT) {
        relay_gone(f, r, it->which);
        return;
    }
    if (rc) {
        relay_unavailable(r, "the database did not answer; retry");
        return;
    }
    atomic_fetch_add_explicit(&f->relays, 1, memory_order_relaxed);
    char *ans = NULL;
    size_t alen = 0;
    /* The path from its checked parts (the id parsed: digits, a dot, hex),
     * never the client's raw text. */
    static const char *const verbs[] = {"complete", "fail", "heartbeat"};
    char *path = jd_xasprintf("/v1/tasks/%s/%s", r->m.param, verbs[it->which]);
    long st = post(f, c, it->node, url, path, r->body ? r->body : "", r->len, &ans, &alen);
    free(path);
    free(url);
    if (st > 0) {
        relay_deliver(r, st, ans, 0, NULL, NULL);
        return;
    }
    atomic_fetch_add_explicit(&f->relay_failures, 1, memory_order_relaxed);
    rc = node_url(f, it->node, true, &url); /* dead, or only slow? */
    free(url);
    int st_ = 0;
    int64_t job = 0;
    /* Alive (or not yet known dead): only a task it may still hold waits
     * for it; one whose end is stored (or that it never handed out) is
     * answered from the store, as final as the owner's own answer. */
    if (rc == JD_ENOENT || jd_task_stored_state(f->store, r->m.param, &st_, &job) != 0 ||
        st_ != JD_TASK_CLAIMED)
        relay_gone(f, r, it->which);
    else
        relay_unavailable(r, "the node that holds this task did not answer; retry");
}

/* ---- a batch of ends split among nodes ---- */

struct sync_done {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool fired;
    int rc;
    char *json;
};

static void sync_cb(void *arg, int rc, const char *json)
{
    struct sync_done *d = arg;
    pthread_mutex_lock(&d->mu);
    d->rc = rc;
    d->json = json ? jd_xstrdup(json) : NULL;
    d->fired = true;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

/* {"tasks":[items[idx[0..n)]]} (caller frees). */
static char *sub_batch(cJSON *items, const int *idx, int n)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *ts = cJSON_AddArrayToObject(o, "tasks");
    for (int k = 0; k < n; k++)
        cJSON_AddItemToArray(ts, cJSON_Duplicate(cJSON_GetArrayItem(items, idx[k]), true));
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return body;
}

/* End items[idx[0..n)] here (the job layer's batch; this thread waits for
 * its commit): each one's result object into res (owned), or status. */
static void batch_here(struct jd_jobs *j, cJSON *items, const int *idx, int n, cJSON **res)
{
    char *body = sub_batch(items, idx, n);
    struct sync_done d = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct jd_error err = {0};
    int rc = jd_jobs_task_end_batch(j, body, strlen(body), sync_cb, &d, &err);
    if (rc == 0) {
        pthread_mutex_lock(&d.mu);
        while (!d.fired)
            pthread_cond_wait(&d.cv, &d.mu);
        pthread_mutex_unlock(&d.mu);
        rc = d.rc;
    }
    free(body);
    cJSON *ans = rc == 0 ? cJSON_Parse(d.json) : NULL;
    cJSON *rs = cJSON_GetObjectItemCaseSensitive(ans, "results");
    for (int k = 0; k < n; k++) {
        cJSON *one = cJSON_GetArrayItem(rs, k);
        res[idx[k]] = one ? cJSON_Duplicate(one, true) : NULL;
    }
    cJSON_Delete(ans);
    free(d.json);
    pthread_mutex_destroy(&d.mu);
    pthread_cond_destroy(&d.cv);
}

/* Send items[idx[0..n)] to node's batch route: true with each one's
 * result in res when it answered 200; false when it has no live row
 * (*gone) or did not answer. */
static bool batch_there(struct jd_forward *f, CURL *c, int64_t node, cJSON *items, const int *idx,
                        int n, cJSON **res, bool *gone)
{
    char *url = NULL;
    *gone = false;
    int rc = node_url(f, node, false, &url);
    if (rc) {
        *gone = rc == JD_ENOENT;
        return false;
    }
    char *body = sub_batch(items, idx, n);
    atomic_fetch_add_explicit(&f->relays, 1, memory_order_relaxed);
    char *ans = NULL;
    size_t alen = 0;
    long st = post(f, c, node, url, "/v1/tasks/complete", body, strlen(body), &ans, &alen);
    free(body);
    free(url);
    if (st != 200) {
        free(ans);
        atomic_fetch_add_explicit(&f->relay_failures, 1, memory_order_relaxed);
        if (st == 0) {
            char *u2 = NULL;
            *gone = node_url(f, node, true, &u2) == JD_ENOENT;
            free(u2);
        }
        return false;
    }
    cJSON *a = cJSON_Parse(ans);
    free(ans);
    cJSON *rs = cJSON_GetObjectItemCaseSensitive(a, "results");
    for (int k = 0; k < n; k++) {
        cJSON *one = cJSON_GetArrayItem(rs, k);
        res[idx[k]] = one ? cJSON_Duplicate(one, true) : NULL;
    }
    cJSON_Delete(a);
    return true;
}

/* POST /v1/tasks/complete whose items name other nodes: each node ends
 * its own (one request each, in turn); items of nodes without a live row
 * are answered here from the stored state, with this node's own. The
 * answer is one result per item, in order, as a single node gives it. */
static void run_batch(struct jd_forward *f, CURL *c, struct fitem *it)
{
    struct jd_req *r = it->r;
    struct jd_jobs *j = http_jobs_of(r->h);
    cJSON *o = cJSON_ParseWithLength(r->body ? r->body : "", r->len);
    cJSON *items = cJSON_GetObjectItemCaseSensitive(o, "tasks");
    int n = cJSON_GetArraySize(items);
    int64_t me = jd_store_node_id(f->store);
    int64_t *node = jd_xcalloc((size_t)n + 1, sizeof *node);
    int *idx = jd_xcalloc((size_t)n + 1, sizeof *idx);
    int *here = jd_xcalloc((size_t)n + 1, sizeof *here);
    bool *done = jd_xcalloc((size_t)n + 1, sizeof *done);
    cJSON **res = jd_xcalloc((size_t)n + 1, sizeof *res);
    int nhere = 0, i = 0;
    cJSON *x;
    cJSON_ArrayForEach(x, items)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(x, "id");
        if (!cJSON_IsString(id) || !jd_task_id_parse(id->valuestring, &node[i]) || node[i] == me)
            node[i] = 0;
        i++;
    }
    for (i = 0; i < n; i++) {
        if (done[i])
            continue;
        if (node[i] == 0) {
            here[nhere++] = i;
            done[i] = true;
            continue;
        }
        int m = 0;
        for (int k = i; k < n; k++)
            if (!done[k] && node[k] == node[i]) {
                idx[m++] = k;
                done[k] = true;
            }
        bool gone = false;
        if (!batch_there(f, c, node[i], items, idx, m, res, &gone)) {
            for (int k = 0; k < m; k++) {
                if (gone)
                    here[nhere++] = idx[k]; /* the stored state answers */
                else
                    res[idx[k]] = NULL; /* 503 below */
            }
            if (gone)
                atomic_fetch_add_explicit(&f->relays_gone, 1, memory_order_relaxed);
        }
    }
    if (nhere > 0) {
        /* in item order, as a single node ends them */
        for (int a = 1; a < nhere; a++)
            for (int b = a; b > 0 && here[b - 1] > here[b]; b--) {
                int t = here[b];
                here[b] = here[b - 1];
                here[b - 1] = t;
            }
        batch_here(j, items, here, nhere, res);
    }
    cJSON *out = cJSON_CreateObject();
    cJSON *rs = cJSON_AddArrayToObject(out, "results");
    i = 0;
    cJSON_ArrayForEach(x, items)
    {
        if (res[i]) {
            cJSON_AddItemToArray(rs, res[i]);
        } else {
            cJSON *one = cJSON_CreateObject();
            cJSON_AddItemToObject(one, "id",
                                  cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(x, "id"), true));
            cJSON_AddNumberToObject(one, "status", 503);
            cJSON_AddItemToArray(rs, one);
        }
        i++;
    }
    char *body = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    cJSON_Delete(o);
    free(node);
    free(idx);
    free(here);
    free(done);
    free(res);
    relay_deliver(r, 200, body, 0, NULL, NULL);
}

/* ---- GET /v1/workers across the nodes ---- */

#define FWD_LIST_NODES 16 /* nodes asked for their workers */
#define FWD_LIST_MAX 1024 /* workers listed at most, as each node tracks */

/* Fold one node's {"workers":[...]} into all: the same name on two nodes
 * is one worker (in flight summed, commands joined, the latest sighting). */
static void workers_merge(cJSON *all, const char *json)
{
    cJSON *o = json ? cJSON_Parse(json) : NULL;
    cJSON *w;
    cJSON_ArrayForEach(w, cJSON_GetObjectItemCaseSensitive(o, "workers"))
    {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(w, "name");
        if (!cJSON_IsString(name))
            continue;
        cJSON *m = NULL, *x;
        cJSON_ArrayForEach(x, all)
        {
            if (strcmp(cJSON_GetObjectItemCaseSensitive(x, "name")->valuestring,
                       name->valuestring) == 0) {
                m = x;
                break;
            }
        }
        if (!m) {
            if (cJSON_GetArraySize(all) < FWD_LIST_MAX)
                cJSON_AddItemToArray(all, cJSON_Duplicate(w, true));
            continue;
        }
        const cJSON *inf = cJSON_GetObjectItemCaseSensitive(w, "in_flight");
        cJSON *minf = cJSON_GetObjectItemCaseSensitive(m, "in_flight");
        if (cJSON_IsNumber(inf) && cJSON_IsNumber(minf))
            cJSON_SetNumberValue(minf, minf->valuedouble + inf->valuedouble);
        const cJSON *seen = cJSON_GetObjectItemCaseSensitive(w, "last_seen_at");
        const cJSON *mseen = cJSON_GetObjectItemCaseSensitive(m, "last_seen_at");
        if (cJSON_IsString(seen) && cJSON_IsString(mseen) &&
            strcmp(seen->valuestring, mseen->valuestring) > 0) /* one format: text order */
            cJSON_ReplaceItemInObjectCaseSensitive(m, "last_seen_at",
                                                   cJSON_CreateString(seen->valuestring));
        cJSON *mc = cJSON_GetObjectItemCaseSensitive(m, "commands");
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(w, "commands"))
        {
            bool have = false;
            const cJSON *y;
            cJSON_ArrayForEach(y, mc) have |= cJSON_IsString(y) && cJSON_IsString(c) &&
                                              strcmp(y->valuestring, c->valuestring) == 0;
            if (!have && cJSON_IsString(c) && cJSON_GetArraySize(mc) < JD_TASK_MAX_CLAIM_COMMANDS)
                cJSON_AddItemToArray(mc, cJSON_CreateString(c->valuestring));
        }
    }
    cJSON_Delete(o);
}

/* This node's workers and every other live node's (one GET each, in
 * turn); a node that does not answer is left out. */
static void run_workers(struct jd_forward *f, CURL *c, struct fitem *it)
{
    struct jd_req *r = it->r;
    cJSON *out = cJSON_CreateObject();
    cJSON *all = cJSON_AddArrayToObject(out, "workers");
    char *mine = NULL;
    if (jd_jobs_workers_json(http_jobs_of(r->h), it->within_ms, &mine) == 0)
        workers_merge(all, mine);
    free(mine);
    int64_t *ids = NULL, me = jd_store_node_id(f->store);
    char **urls = NULL;
    size_t n = 0;
    char path[64];
    snprintf(path, sizeof path, "/v1/workers?within=%" PRId64 "ms", it->within_ms);
    if (jd_store_nodes_live(f->store, FWD_LIST_NODES, &ids, &urls, &n) == 0)
        for (size_t i = 0; i < n; i++) {
            if (ids[i] == me)
                continue;
            char *ans = NULL;
            size_t alen = 0;
            if (post(f, c, ids[i], urls[i], path, NULL, 0, &ans, &alen) == 200)
                workers_merge(all, ans);
            free(ans);
        }
    jd_store_nodes_free(ids, urls, n);
    char *body = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    relay_deliver(r, 200, body, 0, NULL, NULL);
}

/* ---- the queue and its threads ---- */

static void item_free(struct fitem *it)
{
    free(it->body);
    free(it);
}

/* An item refused (queue full, stopping): answered as "nothing from there". */
static void item_refuse(struct jd_forward *f, struct fitem *it)
{
    atomic_fetch_add_explicit(&f->refused, 1, memory_order_relaxed);
    if (it->kind == F_RELAY || it->kind == F_BATCH || it->kind == F_WORKERS) {
        relay_unavailable(it->r, "this node is busy or stopping; retry");
        http_req_unref(it->r);
    } else if (it->kind == F_CLAIM) {
        it->done(it->cbarg, NULL);
    }
    item_free(it);
}

/* Queue it, or refuse it (false: the caller still owns it). */
static bool enqueue(struct jd_forward *f, struct fitem *it)
{
    pthread_mutex_lock(&f->mu);
    bool ok = !f->stop && f->queued < FWD_QUEUE_MAX;
    if (ok) {
        it->next = NULL;
        if (f->tail)
            f->tail->next = it;
        else
            f->head = it;
        f->tail = it;
        f->queued++;
        pthread_cond_signal(&f->cv);
    }
    pthread_mutex_unlock(&f->mu);
    return ok;
}

static void run_claim(struct jd_forward *f, CURL *c, struct fitem *it)
{
    char *url = NULL;
    char *ans = NULL;
    size_t alen = 0;
    long st = 0;
    if (node_url(f, it->node, false, &url) == 0) {
        atomic_fetch_add_explicit(&f->claims, 1, memory_order_relaxed);
        st = post(f, c, it->node, url, "/v1/tasks/claim", it->body, strlen(it->body), &ans, &alen);
        if (st != 200)
            atomic_fetch_add_explicit(&f->claim_failures, 1, memory_order_relaxed);
    }
    free(url);
    if (st == 200) {
        cJSON *o = cJSON_Parse(ans);
        int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, "tasks"));
        atomic_fetch_add_explicit(&f->claimed, (uint64_t)(n > 0 ? n : 0), memory_order_relaxed);
        cJSON_Delete(o);
    }
    it->done(it->cbarg, st == 200 ? ans : NULL);
    free(ans);
}

static void *fwd_main(void *arg)
{
    struct jd_forward *f = arg;
    CURL *c = curl_easy_init(); /* one per thread: keeps connections to the other nodes */
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (!f->head && !f->stop)
            pthread_cond_wait(&f->cv, &f->mu);
        if (f->stop)
            break; /* jd_forward_stop refuses what is left */
        struct fitem *it = f->head;
        f->head = it->next;
        if (!f->head)
            f->tail = NULL;
        f->queued--;
        pthread_mutex_unlock(&f->mu);
        if (!c) {
            item_refuse(f, it);
        } else if (it->kind == F_RELAY) {
            run_relay(f, c, it);
            http_req_unref(it->r);
            item_free(it);
        } else if (it->kind == F_BATCH || it->kind == F_WORKERS) {
            if (it->kind == F_BATCH)
                run_batch(f, c, it);
            else
                run_workers(f, c, it);
            http_req_unref(it->r);
            item_free(it);
        } else if (it->kind == F_CLAIM) {
            run_claim(f, c, it);
            item_free(it);
        } else {
            if (jd_store_tasks_announce(f->store, it->body) == 0)
                atomic_fetch_add_explicit(&f->announces, 1, memory_order_relaxed);
            item_free(it);
        }
        pthread_mutex_lock(&f->mu);
    }
    pthread_mutex_unlock(&f->mu);
    if (c)
        curl_easy_cleanup(c);
    return NULL;
}

/* ---- the entry points ---- */

enum MHD_Result http_forward_relay(struct jd_req *r, int64_t node, int which)
{
    struct jd_forward *f = r->h->fwd;
    if (!f)
        return http_respond_problem(r, 503, "this node does not forward task requests", NULL);
    struct fitem *it = jd_xcalloc(1, sizeof *it);
    it->kind = which == -2 ? F_WORKERS : which < 0 ? F_BATCH : F_RELAY;
    it->within_ms = node; /* workers: the route's ?within= */
    it->node = node;
    it->which = which;
    it->r = r;
    http_arm(r);
    http_req_ref(r); /* the item's */
    r->answer = answer_relay;
    r->phase = PH_ASYNC;
    /* Suspend before queueing: a thread may answer at once. */
    pthread_mutex_lock(&r->mu);
    r->suspended = true;
    MHD_suspend_connection(r->conn);
    pthread_mutex_unlock(&r->mu);
    if (!enqueue(f, it))
        item_refuse(f, it);
    return MHD_YES;
}

static int hook_claim(void *arg, int64_t node, const char *body,
                      void (*done)(void *cbarg, const char *json), void *cbarg)
{
    struct jd_forward *f = arg;
    struct fitem *it = jd_xcalloc(1, sizeof *it);
    it->kind = F_CLAIM;
    it->node = node;
    it->body = jd_xstrdup(body);
    it->done = done;
    it->cbarg = cbarg;
    if (enqueue(f, it))
        return 0;
    atomic_fetch_add_explicit(&f->refused, 1, memory_order_relaxed);
    item_free(it);
    return JD_EFULL;
}

static void hook_announce(void *arg, const char *payload)
{
    struct jd_forward *f = arg;
    struct fitem *it = jd_xcalloc(1, sizeof *it);
    it->kind = F_ANNOUNCE;
    it->body = jd_xstrdup(payload);
    if (!enqueue(f, it)) {
        atomic_fetch_add_explicit(&f->refused, 1, memory_order_relaxed);
        item_free(it);
    }
}

void jd_forward_task_remote(struct jd_forward *f, struct jd_task_remote *out)
{
    out->claim = hook_claim;
    out->announce = hook_announce;
    out->arg = f;
}

int jd_forward_start(const struct jd_forward_config *cfg, struct jd_forward **out)
{
    *out = NULL;
    curl_global_init(CURL_GLOBAL_DEFAULT); /* thread-safe since libcurl 7.84 */
    struct jd_forward *f = jd_xcalloc(1, sizeof *f);
    f->store = cfg->store;
    if (cfg->token && cfg->token[0])
        f->auth = jd_xasprintf("Authorization: Bearer %s", cfg->token);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    for (unsigned i = 0; i < FWD_THREADS; i++) {
        if (pthread_create(&f->threads[i], NULL, fwd_main, f) != 0)
            break;
        pthread_setname_np(f->threads[i], "jd-forward");
        f->nthreads++;
    }
    if (f->nthreads == 0) {
        jd_forward_free(f);
        return JD_EIO;
    }
    *out = f;
    return 0;
}

void jd_forward_stop(struct jd_forward *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    bool was = f->stop;
    f->stop = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    if (was)
        return;
    for (unsigned i = 0; i < f->nthreads; i++)
        pthread_join(f->threads[i], NULL);
    f->nthreads = 0;
    pthread_mutex_lock(&f->mu);
    struct fitem *list = f->head;
    f->head = f->tail = NULL;
    f->queued = 0;
    pthread_mutex_unlock(&f->mu);
    while (list) {
        struct fitem *it = list;
        list = it->next;
        item_refuse(f, it);
    }
}

void jd_forward_free(struct jd_forward *f)
{
    if (!f)
        return;
    jd_forward_stop(f);
    for (unsigned i = 0; i < FWD_URL_CACHE; i++)
        free(f->cache[i].url);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f->auth);
    free(f);
}

void jd_forward_stats(struct jd_forward *f, struct jd_forward_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!f)
        return;
    /* relaxed: independent counters read for /metrics */
    out->relays = atomic_load_explicit(&f->relays, memory_order_relaxed);
    out->relay_failures = atomic_load_explicit(&f->relay_failures, memory_order_relaxed);
    out->relays_gone = atomic_load_explicit(&f->relays_gone, memory_order_relaxed);
    out->claims = atomic_load_explicit(&f->claims, memory_order_relaxed);
    out->claim_failures = atomic_load_explicit(&f->claim_failures, memory_order_relaxed);
    out->claimed = atomic_load_explicit(&f->claimed, memory_order_relaxed);
    out->announces = atomic_load_explicit(&f->announces, memory_order_relaxed);
    out->refused = atomic_load_explicit(&f->refused, memory_order_relaxed);
}
