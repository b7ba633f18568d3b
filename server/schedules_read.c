/*
 * Reading schedules as JSON for the API (one, a page, a schedule's
 * history) from the store, with the next five fire times computed from
 * the stored definition, and the engine's statistics for /metrics.
 *
 * Threading: any thread; reads go to the store's read connections;
 * jd_schedules_stats takes S->mu only to read the count.
 */
#include "server/schedules_impl.h"

#include "common/clock.h"
#include "server/jobs_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_id(cJSON *o, const char *name, int64_t id)
{
    if (id <= 0) {
        cJSON_AddNullToObject(o, name);
        return;
    }
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRId64, id);
    cJSON_AddStringToObject(o, name, buf);
}

char *schedules_render(struct jd_schedules *S, const struct jd_schedule_row *row)
{
    cJSON *def = cJSON_Parse(row->definition);
    if (!def)
        def = cJSON_CreateObject();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", row->id);
    for (cJSON *c = def->child; c; c = c->next)
        cJSON_AddItemToObject(o, c->string, cJSON_Duplicate(c, 1));
    const char *state = row->retired ? "retired" : row->paused ? "paused" : "active";
    cJSON_AddBoolToObject(o, "paused", row->paused);
    cJSON_AddStringToObject(o, "state", state);
    cJSON *times = cJSON_AddArrayToObject(o, "next_fire_times");
    struct spec sp;
    struct jd_error err;
    if (!row->paused && !row->retired && row->next_fire_ms &&
        schedules_spec_parse(S, row->id, def, false, &sp, &err) == 0) {
        int64_t t = row->next_fire_ms;
        for (int i = 0; i < 5 && t; i++) {
            char buf[40];
            jd_time_format(t, buf, sizeof buf);
            cJSON_AddItemToArray(times, cJSON_CreateString(buf));
            t = schedules_spec_next(&sp, row->anchor_ms, t);
        }
        schedules_spec_clear(&sp);
    }
    if (row->last_fire_ms) {
        cJSON *lf = cJSON_AddObjectToObject(o, "last_fire");
        jd_render_add_time(lf, "time", row->last_fire_ms);
        add_id(lf, "job_id", row->last_job_id);
        cJSON_AddStringToObject(lf, "outcome", row->last_outcome ? row->last_outcome : "fired");
    } else {
        cJSON_AddNullToObject(o, "last_fire");
    }
    cJSON *counts = cJSON_AddObjectToObject(o, "counts");
    cJSON_AddNumberToObject(counts, "fires", (double)row->fires);
    cJSON_AddNumberToObject(counts, "skips", (double)row->skips);
    jd_render_add_time(o, "created_at", row->created_ms);
    jd_render_add_time(o, "updated_at", row->updated_ms);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    cJSON_Delete(def);
    return text;
}

int jd_schedules_get_json(struct jd_schedules *S, const char *id, char **json)
{
    *json = NULL;
    if (jd_schedules_check_id(id, NULL) != 0)
        return JD_ENOENT;
    struct jd_schedule_row row;
    int rc = jd_store_schedule_get(S->store, id, &row);
    if (rc)
        return rc;
    *json = schedules_render(S, &row);
    jd_schedule_row_clear(&row);
    return 0;
}

int jd_schedules_list_json(struct jd_schedules *S, const char *cursor, unsigned limit, char **json,
                           struct jd_error *err)
{
    *json = NULL;
    if (limit == 0)
        limit = 50;
    if (limit > 1000)
        return jd_error_set(err, JD_EINVAL, NULL, "limit is 1 to 1000");
    if (cursor && jd_schedules_check_id(cursor, NULL) != 0)
        return jd_error_set(err, JD_EINVAL, NULL, "cursor is not one this server gave out");
    struct jd_schedule_row *rows;
    size_t n;
    char *next;
    int rc = jd_store_schedule_list(S->store, cursor, limit, &rows, &n, &next);
    if (rc)
        return jd_error_set(err, rc, NULL, "reading schedules failed: %s", jd_strerror(rc));
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "schedules");
    for (size_t i = 0; i < n; i++) {
        char *one = schedules_render(S, &rows[i]);
        cJSON_AddItemToArray(arr, cJSON_Parse(one));
        free(one);
    }
    if (next)
        cJSON_AddStringToObject(o, "next_cursor", next);
    else
        cJSON_AddNullToObject(o, "next_cursor");
    *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    free(next);
    jd_schedule_rows_free(rows, n);
    return 0;
}

int jd_schedules_events_json(struct jd_schedules *S, const char *id, int64_t after_seq,
                             unsigned limit, char **json)
{
    *json = NULL;
    if (jd_schedules_check_id(id, NULL) != 0)
        return JD_ENOENT;
    struct jd_schedule_row row;
    int rc = jd_store_schedule_get(S->store, id, &row);
    if (rc)
        return rc;
    jd_schedule_row_clear(&row);
    struct jd_schedule_event *ev;
    size_t n;
    rc = jd_store_schedule_events(S->store, id, after_seq < 0 ? 0 : after_seq, limit ? limit : 1000,
                                  &ev, &n);
    if (rc)
        return rc;
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "events");
    for (size_t i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "seq", (double)ev[i].seq);
        jd_render_add_time(e, "time", ev[i].time_ms);
        cJSON_AddStringToObject(e, "kind", ev[i].kind ? ev[i].kind : "");
        jd_render_add_time(e, "fire_time", ev[i].fire_ms);
        add_id(e, "job_id", ev[i].job_id);
        cJSON *d = ev[i].data ? cJSON_Parse(ev[i].data) : NULL;
        cJSON_AddItemToObject(e, "data", d ? d : cJSON_CreateNull());
        cJSON_AddItemToArray(arr, e);
    }
    *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    jd_schedule_events_free(ev, n);
    return 0;
}

void jd_schedules_stats(struct jd_schedules *S, struct jd_schedules_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&S->mu);
    out->schedules = S->count;
    pthread_mutex_unlock(&S->mu);
    out->fires = atomic_load_explicit(&S->st_fires, memory_order_relaxed);
    out->skips = atomic_load_explicit(&S->st_skips, memory_order_relaxed);
    out->caught_up = atomic_load_explicit(&S->st_caught_up, memory_order_relaxed);
    out->retired = atomic_load_explicit(&S->st_retired, memory_order_relaxed);
    out->lag_ms_sum = atomic_load_explicit(&S->st_lag_sum, memory_order_relaxed);
    for (int i = 0; i < JD_SCHED_LAG_BUCKETS; i++)
        out->lag_hist[i] = atomic_load_explicit(&S->st_lag[i], memory_order_relaxed);
}
