/*
 * JSON rendering of jobs, history events, handlers and queues for the HTTP
 * layer (shapes documented in jobs.h). Ids and times are strings; JSON text
 * stored in the database is embedded as JSON, not as strings.
 *
 * Threading: pure functions; safe from any thread.
 */
#include "server/jobs_impl.h"

#include "common/clock.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_time(cJSON *o, const char *name, int64_t ms)
{
    if (ms <= 0) {
        cJSON_AddNullToObject(o, name);
        return;
    }
    char buf[40];
    jd_time_format(ms, buf, sizeof buf);
    cJSON_AddStringToObject(o, name, buf);
}

/* Embed JSON text (NULL or unparsable: null). */
static void add_json(cJSON *o, const char *name, const char *text)
{
    cJSON *v = text ? cJSON_Parse(text) : NULL;
    cJSON_AddItemToObject(o, name, v ? v : cJSON_CreateNull());
}

cJSON *jd_render_job(const struct jd_job *row)
{
    cJSON *o = cJSON_CreateObject();
    char id[24];
    snprintf(id, sizeof id, "%" PRId64, row->id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "state", jd_job_state_name(row->state));
    cJSON_AddStringToObject(o, "queue", row->queue ? row->queue : "default");
    cJSON_AddNumberToObject(o, "priority", (double)row->priority);
    cJSON_AddNumberToObject(o, "version", (double)row->version);
    cJSON_AddNumberToObject(o, "attempts", (double)row->attempts);
    add_json(o, "output", row->output);
    add_json(o, "error", row->error);
    cJSON *def = row->definition ? cJSON_Parse(row->definition) : NULL;
    const cJSON *labels = def ? cJSON_GetObjectItemCaseSensitive(def, "labels") : NULL;
    cJSON_AddItemToObject(o, "labels", labels ? cJSON_Duplicate(labels, 1) : cJSON_CreateObject());
    add_time(o, "created_at", row->created_ms);
    add_time(o, "updated_at", row->updated_ms);
    add_time(o, "started_at", row->started_ms);
    add_time(o, "finished_at", row->finished_ms);
    add_time(o, "run_at", row->run_at_ms);
    cJSON_AddItemToObject(o, "definition", def ? def : cJSON_CreateNull());
    return o;
}

cJSON *jd_render_event(const struct jd_job_event *ev)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "seq", (double)ev->seq);
    add_time(o, "time", ev->time_ms);
    cJSON_AddStringToObject(o, "kind", jd_event_kind_name(ev->kind));
    cJSON_AddNumberToObject(o, "tag", ev->tag);
    add_json(o, "data", ev->data);
    return o;
}

cJSON *jd_render_handlers(const struct jd_registry *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "plugins");
    const struct jd_plugin *p;
    for (size_t i = 0; (p = jd_registry_plugin(r, i)) != NULL; i++) {
        cJSON *po = cJSON_CreateObject();
        cJSON_AddStringToObject(po, "name", p->name ? p->name : "");
        cJSON_AddStringToObject(po, "version", p->version ? p->version : "");
        cJSON *cmds = cJSON_AddArrayToObject(po, "commands");
        for (size_t c = 0; c < p->ncommands; c++) {
            cJSON *co = cJSON_CreateObject();
            cJSON_AddStringToObject(co, "name", p->commands[c].name);
            cJSON_AddBoolToObject(co, "blocking", !!(p->commands[c].flags & JD_CMD_BLOCKING));
            cJSON_AddItemToArray(cmds, co);
        }
        cJSON *pts = cJSON_AddArrayToObject(po, "process_types");
        for (size_t t = 0; t < p->nprocess_types; t++) {
            cJSON *to = cJSON_CreateObject();
            cJSON_AddStringToObject(to, "name", p->process_types[t].name);
            cJSON *ms = cJSON_AddArrayToObject(to, "methods");
            for (const char *const *m = p->process_types[t].methods; m && *m; m++)
                cJSON_AddItemToArray(ms, cJSON_CreateString(*m));
            cJSON_AddItemToArray(pts, to);
        }
        cJSON_AddItemToArray(arr, po);
    }
    return o;
}

cJSON *jd_render_queues(const struct jd_queue_counts *rows, size_t n)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "queues");
    for (size_t i = 0; i < n; i++) {
        cJSON *q = cJSON_CreateObject();
        cJSON_AddStringToObject(q, "name", rows[i].queue);
        cJSON_AddBoolToObject(q, "paused", rows[i].paused);
        cJSON *c = cJSON_AddObjectToObject(q, "counts");
        for (int s = 0; s < JD_JOB_NSTATES; s++)
            cJSON_AddNumberToObject(c, jd_job_state_name((enum jd_job_state)s),
                                    (double)rows[i].counts[s]);
        cJSON_AddItemToArray(arr, q);
    }
    return o;
}
