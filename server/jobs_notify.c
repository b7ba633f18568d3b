/*
 * Completion webhooks: a job with "notify": {"url": ..., "on": [...]} gets
 * one POST when it ends in one of those states, after that end is durable.
 *
 * The POST is an ordinary call of the http handler (so --http-allow,
 * --http-timeout, the connect rules and the output cap apply as to any job's
 * http step), retried by the registry with backoff: 5 attempts, 1 s then
 * doubling, at most 30 s apart; a 4xx answer is final, a 5xx or a
 * connection error is tried again. Every attempt and the outcome are
 * appended to the job's history (a dispatch event {"command":"notify",...}
 * per attempt, then a complete event with "notify": true), which replay
 * ignores (no "run"). Deliveries in flight are not durable: a restart
 * before the last attempt ends drops the rest (the history shows how far
 * it got).
 *
 * Body: {"event": "job.<state>", "job": <the job as GET /v1/jobs/{id}>}.
 * Headers: Content-Type: application/json; Jackdaw-Event: job.<state>;
 * Jackdaw-Job-Id: <id>; with --webhook-secret, Jackdaw-Signature:
 * t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>, so a
 * receiver checks the body and the time it was signed (and can refuse
 * replays of old ones).
 *
 * Threading: jobs_notify_start from the commit callback, without mu; the
 * registry's callbacks on its threads; history records go to the store
 * (which only enqueues).
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sha256.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOTIFY_ATTEMPTS 5
#define NOTIFY_BACKOFF_MS 1000
#define NOTIFY_MAX_BACKOFF_MS 30000
#define NOTIFY_TIMEOUT_MS 10000 /* per attempt: a receiver should answer at once */

struct notify {
    struct jd_jobs *j;
    int64_t id;
    char *url;
};

/* A history record of its own (the job is no longer in the table). */
struct nrec {
    struct jd_write w;
    char *data;
};

static void nrec_done(void *arg, struct jd_write *w, int rc)
{
    (void)w;
    (void)rc; /* a job deleted meanwhile: nothing to record on */
    struct nrec *r = arg;
    free(r->data);
    free(r);
}

static void record(struct jd_jobs *j, int64_t id, enum jd_event_kind kind, cJSON *data)
{
    struct nrec *r = jd_xcalloc(1, sizeof *r);
    r->data = cJSON_PrintUnformatted(data);
    cJSON_Delete(data);
    r->w = (struct jd_write){.op = JD_W_JOB_CHANGE,
                             .job_id = id,
                             .kind = kind,
                             .data = r->data,
                             .done = nrec_done,
                             .arg = r};
    if (jd_store_submit(j->store, &r->w) != 0)
        nrec_done(r, &r->w, JD_ESHUTDOWN);
}

static void on_attempt(void *arg, uint32_t attempt)
{
    struct notify *n = arg;
    pthread_mutex_lock(&n->j->mu);
    n->j->st.webhook_attempts++;
    pthread_mutex_unlock(&n->j->mu);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "command", "notify");
    cJSON_AddNumberToObject(d, "attempt", attempt);
    cJSON_AddStringToObject(d, "url", n->url);
    record(n->j, n->id, JD_EVK_DISPATCH, d);
}

static void on_done(void *arg, const struct jd_call_result *res)
{
    struct notify *n = arg;
    pthread_mutex_lock(&n->j->mu);
    if (res->ok)
        n->j->st.webhooks_delivered++;
    else
        n->j->st.webhooks_failed++;
    pthread_mutex_unlock(&n->j->mu);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddBoolToObject(d, "notify", true);
    cJSON_AddNumberToObject(d, "attempt", res->attempt);
    if (res->ok) {
        /* the status only: a receiver's body is not the job's business */
        cJSON *r = cJSON_Parse(res->result_json ? res->result_json : "null");
        const cJSON *st = r ? cJSON_GetObjectItemCaseSensitive(r, "status") : NULL;
        cJSON *o = cJSON_AddObjectToObject(d, "result");
        cJSON_AddNumberToObject(o, "status", cJSON_IsNumber(st) ? st->valuedouble : 0);
        cJSON_Delete(r);
    } else {
        cJSON *e = cJSON_Parse(res->error_json ? res->error_json : "null");
        if (e) {
            cJSON_DeleteItemFromObjectCaseSensitive(e, "details"); /* the receiver's answer */
            cJSON_AddItemToObject(d, "error", e);
        } else {
            cJSON_AddStringToObject(d, "error", res->error_kind ? res->error_kind : "failed");
        }
        char id[24];
        snprintf(id, sizeof id, "%" PRId64, n->id);
        jd_log(JD_LOG_WARN, "job webhook failed", "job_id", id, "url", n->url, "kind",
               res->error_kind ? res->error_kind : "", NULL);
    }
    record(n->j, n->id, JD_EVK_COMPLETE, d);
    free(n->url);
    free(n);
}

void jobs_notify_start(struct jd_jobs *j, int64_t id, enum jd_job_state state, const char *url)
{
    char *job = NULL;
    if (jd_jobs_get_json(j, id, &job, NULL, NULL) != 0)
        return; /* deleted already */
    char event[32];
    snprintf(event, sizeof event, "job.%s", jd_job_state_name(state));
    char *body = jd_xasprintf("{\"event\":\"%s\",\"job\":%s}", event, job);
    free(job);

    cJSON *args = cJSON_CreateObject();
    cJSON_AddStringToObject(args, "method", "POST");
    cJSON_AddStringToObject(args, "url", url);
    cJSON *h = cJSON_AddObjectToObject(args, "headers");
    cJSON_AddStringToObject(h, "Content-Type", "application/json");
    cJSON_AddStringToObject(h, "Jackdaw-Event", event);
    char idt[24];
    snprintf(idt, sizeof idt, "%" PRId64, id);
    cJSON_AddStringToObject(h, "Jackdaw-Job-Id", idt);
    if (j->webhook_secret) {
        char t[24];
        snprintf(t, sizeof t, "%" PRId64, jd_wall_ms() / 1000);
        char *signed_text = jd_xasprintf("%s.%s", t, body);
        uint8_t mac[JD_SHA256_LEN];
        jd_hmac_sha256(j->webhook_secret, strlen(j->webhook_secret), signed_text,
                       strlen(signed_text), mac);
        free(signed_text);
        char hex[2 * JD_SHA256_LEN + 1];
        jd_hex(mac, JD_SHA256_LEN, hex);
        char sig[128];
        snprintf(sig, sizeof sig, "t=%s,v1=%s", t, hex);
        cJSON_AddStringToObject(h, "Jackdaw-Signature", sig);
    }
    cJSON_AddStringToObject(args, "body", body);
    cJSON_AddNumberToObject(args, "timeout_ms", NOTIFY_TIMEOUT_MS);
    free(body);
    char *args_text = cJSON_PrintUnformatted(args);
    cJSON_Delete(args);

    struct notify *n = jd_xcalloc(1, sizeof *n);
    n->j = j;
    n->id = id;
    n->url = jd_xstrdup(url);
    char key[48];
    snprintf(key, sizeof key, "notify:%" PRId64, id);
    struct jd_call_request req = {
        .command = "http",
        .args_json = args_text,
        .idempotency_key = key,
        .first_attempt = 1,
        .timeout_ms = NOTIFY_TIMEOUT_MS,
        .retry = {.max_attempts = NOTIFY_ATTEMPTS,
                  .backoff_ms = NOTIFY_BACKOFF_MS,
                  .factor = 2,
                  .max_backoff_ms = NOTIFY_MAX_BACKOFF_MS},
        .on_attempt = on_attempt,
        .done = on_done,
        .arg = n,
    };
    struct jd_call_handle *handle = NULL;
    if (jd_registry_call(j->reg, &req, &handle) != 0) {
        free(n->url);
        free(n);
    } else {
        jd_registry_call_release(handle);
    }
    free(args_text);
}
