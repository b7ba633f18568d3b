/*
 * The task and workflow processes and the plugin process-type adapter (see
 * workflow.h for the semantics). A workflow keeps, per flattened step, whether
 * it has not started, is running or is done; `pos` is the top-level step in
 * progress. Everything a step needs (outputs of earlier steps, buffered
 * messages) lives in the instance, and the only inputs are the definition and
 * the events, so the same events give the same yields: that is what replay
 * relies on.
 *
 * Threading: as process.h; no shared state.
 */
#include "server/workflow.h"

#include "common/alloc.h"
#include "common/error.h"
#include "server/jobdef.h"

#include <cJSON.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum sstate { S_NEW = 0, S_RUNNING = 1, S_DONE = 2 };

struct wf {
    bool task;
    int64_t job_id;
    char job_id_s[24];
    const struct jd_jobdef *def; /* owned_def, or borrowed (jd_workflow_new_def) */
    struct jd_jobdef *owned_def; /* parsed by init from its input; freed by close */
    enum sstate *st;
    size_t pos;             /* top-level step in progress */
    cJSON *outputs;         /* id -> output, as raw JSON text (keep_output) */
    size_t outputs_bytes;   /* the call steps' output text together */
    _Atomic size_t *charge; /* the def's memory counter (jd_jobdef_charge), or NULL */
    size_t charged;         /* text of outputs and messages charged to it */
    cJSON *messages;        /* buffered {"topic","data"} in arrival order, data raw */
    cJSON *task_output;     /* task: the call's result */
};

void *jd_workflow_new(int64_t job_id)
{
    struct wf *w = jd_xcalloc(1, sizeof *w);
    w->job_id = job_id;
    snprintf(w->job_id_s, sizeof w->job_id_s, "%" PRId64, job_id);
    return w;
}

void *jd_workflow_new_def(int64_t job_id, const struct jd_jobdef *def)
{
    struct wf *w = jd_workflow_new(job_id);
    w->def = def;
    return w;
}

static int wf_init_common(struct wf *w, const char *method, const char *input, struct jd_error *err)
{
    if (!method || strcmp(method, "run") != 0)
        return jd_error_set(err, JD_EINVAL, "/method", "unknown method \"%s\" (use \"run\")",
                            method ? method : "");
    if (!w->def) {
        /* No definition handed over: parse the input (the definition text). */
        if (!input)
            return jd_error_set(err, JD_EINVAL, "", "missing job definition");
        struct jd_job_limits lim = {.max_definition_bytes = SIZE_MAX / 2,
                                    .max_depth = 1u << 20,
                                    .max_steps = 1u << 20,
                                    .max_string = SIZE_MAX / 2};
        int rc = jd_jobdef_parse(input, strlen(input), &lim, NULL, &w->owned_def, err);
        if (rc)
            return rc;
        jd_jobdef_slim(w->owned_def); /* as the job layer's: no tree kept that no step reads */
        w->def = w->owned_def;
    }
    if ((w->def->shape == JD_JOBDEF_TASK) != w->task)
        return jd_error_set(err, JD_EINVAL, "", "definition shape does not match process type");
    w->charge = w->def->charged_to;
    w->st = jd_xcalloc(w->def->nsteps ? w->def->nsteps : 1, sizeof *w->st);
    w->outputs = cJSON_CreateObject();
    w->messages = cJSON_CreateArray();
    return 0;
}

static int task_init(void *self, const char *method, const char *input, struct jd_error *err)
{
    struct wf *w = self;
    w->task = true;
    return wf_init_common(w, method, input, err);
}

static int wf_init(void *self, const char *method, const char *input, struct jd_error *err)
{
    struct wf *w = self;
    w->task = false;
    return wf_init_common(w, method, input, err);
}

static void wf_close(void *self)
{
    struct wf *w = self;
    if (!w)
        return;
    if (w->charge)
        atomic_fetch_sub_explicit(w->charge, w->charged, memory_order_relaxed);
    jd_jobdef_free(w->owned_def);
    free(w->st);
    cJSON_Delete(w->outputs);
    cJSON_Delete(w->messages);
    cJSON_Delete(w->task_output);
    free(w);
}

static void fail_json(struct jd_step_out *out, cJSON *e)
{
    jd_step_fail_take(out, jd_json_print(e));
    cJSON_Delete(e);
}

static void fail_simple(struct jd_step_out *out, const char *kind, const char *step,
                        const char *msg)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "kind", kind);
    cJSON_AddStringToObject(e, "message", msg);
    if (step)
        cJSON_AddStringToObject(e, "step", step);
    fail_json(out, e);
}

static void yield_timer(struct jd_step_out *out, uint32_t tag, const char *cmd, int64_t ms)
{
    char args[48];
    snprintf(args, sizeof args, "{\"ms\":%" PRId64 "}", ms);
    jd_step_yield(out, tag, cmd, args, 0);
}

/* Start step i (not a group). Returns false after setting FAIL. */
static bool start_leaf(struct wf *w, size_t i, struct jd_step_out *out)
{
    const struct jd_jobdef_step *s = &w->def->steps[i];
    uint32_t tag = (uint32_t)(i + 1);
    w->st[i] = S_RUNNING;
    switch (s->kind) {
    case JD_JSTEP_CALL: {
        if (s->args_text) { /* nothing to substitute (jd_jobdef_slim) */
            jd_step_yield(out, tag, s->call, s->args_text, s->timeout_ms);
            return true;
        }
        struct jd_subst_ctx sc = {
            .input = w->def->input, .steps = w->outputs, .job_id = w->job_id_s};
        struct jd_error e;
        jd_error_clear(&e);
        cJSON *args = jd_subst(s->args, &sc, &e);
        if (!args) {
            /* A reference that does not resolve, or args that would pass the
             * substitution bounds (jd_subst_ctx): the message names the
             * limit, "at" the place in the step's args. */
            char msg[JD_ERROR_MSG_MAX + 64];
            snprintf(msg, sizeof msg, "step \"%s\": %s", s->id, e.message);
            cJSON *err = cJSON_CreateObject();
            cJSON_AddStringToObject(err, "kind", "substitution");
            cJSON_AddStringToObject(err, "message", msg);
            cJSON_AddStringToObject(err, "step", s->id);
            cJSON_AddStringToObject(err, "at", e.pointer);
            fail_json(out, err);
            return false;
        }
        char *text = jd_json_print(args);
        cJSON_Delete(args);
        jd_step_yield(out, tag, s->call, text, s->timeout_ms);
        free(text);
        return true;
    }
    case JD_JSTEP_SLEEP:
        yield_timer(out, tag, JD_CMD_SLEEP, s->sleep_ms);
        return true;
    case JD_JSTEP_WAIT:
        if (s->timeout_ms > 0)
            yield_timer(out, tag, JD_CMD_TIMER, s->timeout_ms);
        return true;
    case JD_JSTEP_PARALLEL:
        break;
    }
    return true;
}

/* A running wait step takes the first buffered message with its topic. */
static void try_wait(struct wf *w, size_t i)
{
    const struct jd_jobdef_step *s = &w->def->steps[i];
    if (s->kind != JD_JSTEP_WAIT || w->st[i] != S_RUNNING)
        return;
    int k = 0;
    for (cJSON *m = w->messages->child; m; m = m->next, k++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(m, "topic");
        if (cJSON_IsString(t) && strcmp(t->valuestring, s->topic) == 0) {
            cJSON *msg = cJSON_DetachItemFromArray(w->messages, k);
            cJSON *data = cJSON_DetachItemFromObjectCaseSensitive(msg, "data");
            cJSON_AddItemToObject(w->outputs, s->id, data ? data : cJSON_CreateNull());
            cJSON_Delete(msg);
            w->st[i] = S_DONE;
            return;
        }
    }
}

/* Offer the buffered messages to the running wait steps of the top-level
 * step in progress, in step order (the same order the loop in wf_step
 * uses). Called as each message event arrives, so that a wait step takes a
 * message that came before its timer's completion even when both arrive in
 * one batch: the outcome depends on the order of events only, never on how
 * the scheduler batched them, and replay (which delivers the recorded
 * events in their recorded order, but batched differently) decides the same. */
static void offer_messages(struct wf *w)
{
    if (w->pos >= w->def->nsteps)
        return;
    size_t i = w->pos;
    const struct jd_jobdef_step *s = &w->def->steps[i];
    if (s->kind != JD_JSTEP_PARALLEL) {
        try_wait(w, i);
        return;
    }
    for (size_t c = i + 1; c <= i + s->nchildren; c++)
        try_wait(w, c);
}

/* A raw JSON item holding text (takes it), charged to the job's memory
 * counter until the process closes. */
static cJSON *raw_take(struct wf *w, char *text)
{
    size_t n = strlen(text);
    cJSON *raw = cJSON_CreateRaw(text);
    free(text);
    if (!raw) {
        fprintf(stderr, "jackdaw: out of memory (workflow text)\n");
        abort();
    }
    w->charged += n;
    if (w->charge)
        atomic_fetch_add_explicit(w->charge, n, memory_order_relaxed);
    return raw;
}

/* Keep a workflow step's output r (takes ownership) as its compact text, not
 * as a tree (a 1 MB output of 60,000 members is ~7 MB as cJSON, kept until
 * the job ends); substitution parses it when a reference enters it. The
 * outputs together are held to JD_WF_OUTPUTS_MAX: past it the step fails
 * (false, FAIL set), so a chain of steps each splicing the last one's
 * output cannot grow one job without bound. The text is charged to the
 * job's memory counter (--max-job-memory) until the process closes. */
static bool keep_output(struct wf *w, const struct jd_jobdef_step *s, cJSON *r,
                        struct jd_step_out *out)
{
    char *text = jd_json_print(r);
    cJSON_Delete(r);
    if (!text)
        text = jd_xstrdup("null");
    size_t n = strlen(text);
    if (n > JD_WF_OUTPUTS_MAX || w->outputs_bytes > JD_WF_OUTPUTS_MAX - n) {
        free(text);
        char m[256];
        snprintf(m, sizeof m,
                 "step \"%s\": the outputs of the workflow's steps would pass %zu bytes together",
                 s->id, (size_t)JD_WF_OUTPUTS_MAX);
        fail_simple(out, "output_too_large", s->id, m);
        return false;
    }
    w->outputs_bytes += n;
    cJSON_AddItemToObject(w->outputs, s->id, raw_take(w, text));
    return true;
}

/* A message {"topic", "data"} (takes ownership) with its data kept as text,
 * as outputs are: a wait step moves the data into the outputs as it is. */
static cJSON *compact_message(struct wf *w, cJSON *m)
{
    cJSON *data = cJSON_DetachItemFromObjectCaseSensitive(m, "data");
    if (data) {
        char *text = jd_json_print(data);
        cJSON_Delete(data);
        cJSON_AddItemToObject(m, "data", raw_take(w, text ? text : jd_xstrdup("null")));
    }
    return m;
}

/* A completion for tag: false if it failed the process (FAIL set). */
static bool on_complete(struct wf *w, const struct jd_event *ev, struct jd_step_out *out)
{
    if (ev->tag == 0 || ev->tag > w->def->nsteps)
        return true;
    size_t i = ev->tag - 1;
    const struct jd_jobdef_step *s = &w->def->steps[i];
    if (w->st[i] != S_RUNNING)
        return true; /* e.g. the timer of a wait that a message satisfied */
    switch (s->kind) {
    case JD_JSTEP_CALL:
        if (ev->error) {
            cJSON *cause = cJSON_Parse(ev->error);
            if (w->task && cause) {
                fail_json(out, cause);
                return false;
            }
            const cJSON *kind = cJSON_GetObjectItemCaseSensitive(cause, "kind");
            const cJSON *msg = cJSON_GetObjectItemCaseSensitive(cause, "message");
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "kind",
                                    cJSON_IsString(kind) ? kind->valuestring : "step_failed");
            char m[512];
            snprintf(m, sizeof m, "step \"%s\" failed: %s", s->id,
                     cJSON_IsString(msg) ? msg->valuestring : "error");
            cJSON_AddStringToObject(e, "message", m);
            cJSON_AddStringToObject(e, "step", s->id);
            cJSON_AddItemToObject(e, "cause", cause ? cause : cJSON_CreateNull());
            fail_json(out, e);
            return false;
        } else {
            cJSON *r = ev->data ? cJSON_Parse(ev->data) : NULL;
            if (!r)
                r = cJSON_CreateNull();
            if (w->task) {
                cJSON_Delete(w->task_output);
                w->task_output = r;
            } else if (!keep_output(w, s, r, out)) {
                return false;
            }
            w->st[i] = S_DONE;
        }
        return true;
    case JD_JSTEP_SLEEP:
        w->st[i] = S_DONE;
        return true;
    case JD_JSTEP_WAIT: {
        char m[256];
        snprintf(m, sizeof m, "no message on topic \"%s\" within %" PRId64 " ms", s->topic,
                 s->timeout_ms);
        fail_simple(out, "timeout", s->id, m);
        return false;
    }
    case JD_JSTEP_PARALLEL:
        break;
    }
    return true;
}

static int wf_step(void *self, struct jd_event *events, size_t n, struct jd_step_out *out)
{
    struct wf *w = self;
    for (size_t k = 0; k < n; k++) {
        struct jd_event *ev = &events[k];
        if (ev->type == JD_EVENT_CANCEL) {
            fail_simple(out, "cancelled", NULL, "the job was cancelled");
            return 0;
        }
        if (ev->type == JD_EVENT_MESSAGE) {
            cJSON *m = ev->data ? cJSON_Parse(ev->data) : NULL;
            if (cJSON_IsObject(m)) {
                cJSON_AddItemToArray(w->messages, compact_message(w, m));
                offer_messages(w);
            } else {
                cJSON_Delete(m);
            }
            continue;
        }
        if (ev->type == JD_EVENT_YIELD_COMPLETE && !on_complete(w, ev, out))
            return 0;
    }
    size_t ns = w->def->nsteps;
    while (w->pos < ns) {
        size_t i = w->pos;
        const struct jd_jobdef_step *s = &w->def->steps[i];
        size_t nch = s->kind == JD_JSTEP_PARALLEL ? s->nchildren : 0;
        if (w->st[i] == S_NEW) {
            w->st[i] = S_RUNNING;
            if (s->kind == JD_JSTEP_PARALLEL) {
                for (size_t c = i + 1; c <= i + nch; c++)
                    if (!start_leaf(w, c, out))
                        return 0;
            } else if (!start_leaf(w, i, out)) {
                return 0;
            }
        }
        bool all = true, only_waits = true;
        if (s->kind == JD_JSTEP_PARALLEL) {
            for (size_t c = i + 1; c <= i + nch; c++) {
                try_wait(w, c);
                if (w->st[c] != S_DONE) {
                    all = false;
                    if (w->def->steps[c].kind != JD_JSTEP_WAIT)
                        only_waits = false;
                }
            }
            if (all)
                w->st[i] = S_DONE;
        } else {
            try_wait(w, i);
            all = w->st[i] == S_DONE;
            only_waits = s->kind == JD_JSTEP_WAIT;
        }
        if (!all) {
            out->status = only_waits ? JD_STEP_IDLE : JD_STEP_WAIT;
            return 0;
        }
        w->pos = i + 1 + nch;
    }
    if (w->task) {
        char *r = w->task_output ? jd_json_print(w->task_output) : jd_xstrdup("null");
        jd_step_done_take(out, r);
    } else {
        jd_step_done_take(out, jd_json_print(w->outputs));
    }
    return 0;
}

const struct jd_process_ops jd_task_ops = {
    .type_name = "task", .init = task_init, .step = wf_step, .close = wf_close};
const struct jd_process_ops jd_workflow_ops = {
    .type_name = "workflow", .init = wf_init, .step = wf_step, .close = wf_close};

/* ---- plugin process types ---- */

struct pproc {
    const struct jd_process_type *pt;
    void *inst;
};

void *jd_plugin_process_new(const struct jd_process_type *pt)
{
    struct pproc *p = jd_xcalloc(1, sizeof *p);
    p->pt = pt;
    return p;
}

static int pp_init(void *self, const char *method, const char *input, struct jd_error *err)
{
    struct pproc *p = self;
    char msg[256] = "";
    p->inst = p->pt->create(method, input, msg, sizeof msg);
    if (!p->inst)
        return jd_error_set(err, JD_EINVAL, "/input", "%s", msg[0] ? msg : "input refused");
    return 0;
}

#define STATUS_UNSET ((enum jd_step_status)0x7f) /* the plugin set no status */

static int pp_step(void *self, struct jd_event *events, size_t n, struct jd_step_out *out)
{
    struct pproc *p = self;
    struct jd_plugin_event stackev[8] = {{0}};
    struct jd_plugin_event *pev = n <= 8 ? stackev : jd_xcalloc(n, sizeof *pev);
    for (size_t i = 0; i < n; i++) {
        pev[i] = (struct jd_plugin_event){
            .type = events[i].type == JD_EVENT_YIELD_COMPLETE ? JD_PEVENT_COMPLETE
                    : events[i].type == JD_EVENT_MESSAGE      ? JD_PEVENT_MESSAGE
                                                              : JD_PEVENT_CANCEL,
            .tag = events[i].tag,
            .data_json = events[i].data,
            .error_json = events[i].error,
        };
    }
    out->status = STATUS_UNSET;
    int rc = p->pt->step(p->inst, pev, n, out);
    if (pev != stackev)
        free(pev);
    if (out->status == STATUS_UNSET) {
        if (out->nyields > 0)
            out->status = JD_STEP_WAIT;
        else
            jd_step_fail(out, "{\"kind\":\"plugin_error\",\"message\":\"process step set no "
                              "status\"}");
    }
    return rc ? JD_EINTERNAL : 0;
}

static void pp_close(void *self)
{
    struct pproc *p = self;
    if (p && p->inst && p->pt->destroy)
        p->pt->destroy(p->inst);
    free(p);
}

const struct jd_process_ops jd_plugin_process_ops = {
    .type_name = "plugin", .init = pp_init, .step = pp_step, .close = pp_close};
