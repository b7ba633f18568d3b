/*
 * A schedule's definition: the id rules, parsing and validating the JSON a
 * PUT takes (the job through the job layer's own validation, errors with a
 * pointer into the body), the next fire time after a given time, and the
 * fixed jitter of a fire.
 *
 * Threading: pure functions over their arguments, except that
 * schedules_spec_parse asks the job layer to validate the job (any thread).
 */
#include "server/schedules_impl.h"

#include "common/clock.h"
#include "server/jobdef.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const schedules_overlap_names[] = {"skip", "allow", "cancel_previous", NULL};
const char *const schedules_catchup_names[] = {"none", "latest", "all", NULL};

void schedules_spec_clear(struct spec *sp)
{
    free(sp->def_text);
    free(sp->job_text);
    memset(sp, 0, sizeof *sp);
}

int jd_schedules_check_id(const char *id, struct jd_error *err)
{
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n > JD_SCHEDULE_ID_MAX)
        return jd_error_set(err, JD_EINVAL, NULL, "a schedule id is 1 to %d characters",
                            JD_SCHEDULE_ID_MAX);
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return jd_error_set(err, JD_EINVAL, NULL,
                                "a schedule id may use letters, digits, '-', '_' and '.'");
    }
    if (strcmp(id, ".") == 0 || strcmp(id, "..") == 0)
        return jd_error_set(err, JD_EINVAL, NULL, "\"%s\" is not a schedule id", id);
    return 0;
}

/* The first fire strictly after `after` (0: none, e.g. past end_at). */
int64_t schedules_spec_next(const struct spec *sp, int64_t anchor_ms, int64_t after)
{
    if (sp->start_at && after < sp->start_at - 1)
        after = sp->start_at - 1;
    int64_t t;
    if (sp->is_cron)
        t = jd_cron_next(&sp->cron, sp->tz, after);
    else
        t = jd_every_next(sp->start_at ? sp->start_at : anchor_ms, sp->every_ms, after);
    if (t <= 0 || (sp->end_at && t > sp->end_at))
        return 0;
    return t;
}

/* A delay in [0, jitter_ms] fixed by the schedule and the fire time, so a
 * re-armed timer (restart, resume) keeps the same moment. */
int64_t schedules_jitter_for(const struct sched *sc, int64_t fire_ms)
{
    if (sc->sp.jitter_ms <= 0)
        return 0;
    uint64_t h = 1469598103934665603ull ^ (uint64_t)fire_ms;
    for (const unsigned char *p = (const unsigned char *)sc->id; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    h ^= h >> 29;
    return (int64_t)(h % (uint64_t)(sc->sp.jitter_ms + 1));
}

/* ----------------------------------------------------------- parsing */

static int enum_of(const cJSON *v, const char *const *names, const char *ptr, int *out,
                   struct jd_error *err)
{
    if (cJSON_IsString(v))
        for (int i = 0; names[i]; i++)
            if (strcmp(v->valuestring, names[i]) == 0) {
                *out = i;
                return 0;
            }
    char list[96] = "";
    for (int i = 0; names[i]; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", i ? ", " : "",
                 names[i]);
    return jd_error_set(err, JD_EINVAL, ptr, "must be one of %s", list);
}

static int time_of(const cJSON *v, const char *ptr, int64_t *out, struct jd_error *err)
{
    if (!cJSON_IsString(v) || jd_time_parse(v->valuestring, out) != 0)
        return jd_error_set(err, JD_EINVAL, ptr,
                            "must be an RFC 3339 time such as \"2026-01-01T00:00:00Z\"");
    return 0;
}

/* Move err's pointer under prefix ("/handler" -> "/job/handler"). */
void schedules_pointer_under(struct jd_error *err, const char *prefix)
{
    size_t p = strlen(prefix), n = strnlen(err->pointer, sizeof err->pointer);
    if (p + n >= sizeof err->pointer)
        n = sizeof err->pointer - p - 1;
    memmove(err->pointer + p, err->pointer, n);
    memcpy(err->pointer, prefix, p);
    err->pointer[p + n] = '\0';
}

/* The job with the schedule's labels merged in: its own labels, then the
 * schedule's, then {"schedule": id}. Takes nothing; returns a new tree. */
static cJSON *merged_job(const cJSON *job, const cJSON *labels, const char *id)
{
    cJSON *out = cJSON_Duplicate(job, 1);
    cJSON *l = cJSON_GetObjectItemCaseSensitive(out, "labels");
    if (!l) {
        l = cJSON_CreateObject();
        cJSON_AddItemToObject(out, "labels", l);
    }
    if (cJSON_IsObject(l)) {
        for (const cJSON *c = labels ? labels->child : NULL; c; c = c->next) {
            cJSON_DeleteItemFromObjectCaseSensitive(l, c->string);
            cJSON_AddItemToObject(l, c->string, cJSON_Duplicate(c, 1));
        }
        cJSON_DeleteItemFromObjectCaseSensitive(l, "schedule");
        cJSON_AddStringToObject(l, "schedule", id);
    }
    return out;
}

/*
 * Parse a definition (borrowed root). validate_job: check the job with the
 * job layer now (PUT); off when loading what was stored (a fire checks it
 * again and records what is wrong). root is normalised in place (defaults
 * filled, "paused" removed) before def_text is printed.
 */
int schedules_spec_parse(struct jd_schedules *S, const char *id, cJSON *root, bool validate_job,
                         struct spec *sp, struct jd_error *err)
{
    static const char *const known[] = {"cron",    "every",     "timezone", "job",
                                        "overlap", "catchup",   "start_at", "end_at",
                                        "paused",  "jitter_ms", "labels",   NULL};
    memset(sp, 0, sizeof *sp);
    if (!cJSON_IsObject(root))
        return jd_error_set(err, JD_EINVAL, "", "a schedule is a JSON object");
    char ptr[JD_ERROR_PTR_MAX];
    for (const cJSON *c = root->child; c; c = c->next) {
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++)
            ok = strcmp(c->string, known[i]) == 0;
        if (!ok) {
            ptr[0] = '\0';
            jd_ptr_append(ptr, sizeof ptr, c->string);
            return jd_error_set(err, JD_EINVAL, ptr, "unknown field \"%.64s\"", c->string);
        }
    }
    const cJSON *cron = cJSON_GetObjectItemCaseSensitive(root, "cron");
    const cJSON *every = cJSON_GetObjectItemCaseSensitive(root, "every");
    const cJSON *v;
    int rc;
    if (!cron && !every)
        return jd_error_set(err, JD_EINVAL, "",
                            "a schedule needs \"cron\" (e.g. \"0 3 * * *\") or \"every\" "
                            "(e.g. \"30s\")");
    if (cron && every)
        return jd_error_set(err, JD_EINVAL, "/every", "give \"cron\" or \"every\", not both");
    if (cron) {
        if (!cJSON_IsString(cron))
            return jd_error_set(err, JD_EINVAL, "/cron", "must be a string");
        sp->is_cron = true;
        if ((rc = jd_cron_parse(cron->valuestring, &sp->cron, err)) != 0) {
            snprintf(err->pointer, sizeof err->pointer, "/cron");
            return rc;
        }
        v = cJSON_GetObjectItemCaseSensitive(root, "timezone");
        if (v && !cJSON_IsString(v))
            return jd_error_set(err, JD_EINVAL, "/timezone", "must be a string");
        if ((rc = jd_tz_get(v ? v->valuestring : "UTC", &sp->tz, err)) != 0) {
            snprintf(err->pointer, sizeof err->pointer, "/timezone");
            return rc;
        }
        if (!v)
            cJSON_AddStringToObject(root, "timezone", "UTC");
    } else {
        if (!cJSON_IsString(every))
            return jd_error_set(err, JD_EINVAL, "/every", "must be a string such as \"30s\"");
        if ((rc = jd_every_parse(every->valuestring, &sp->every_ms, err)) != 0) {
            snprintf(err->pointer, sizeof err->pointer, "/every");
            return rc;
        }
        if (cJSON_GetObjectItemCaseSensitive(root, "timezone"))
            return jd_error_set(err, JD_EINVAL, "/timezone",
                                "a time zone applies to \"cron\" schedules only");
    }
    int e = 0;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "overlap")) &&
        (rc = enum_of(v, schedules_overlap_names, "/overlap", &e, err)) != 0)
        return rc;
    sp->overlap = (enum overlap)e;
    e = CU_LATEST;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "catchup")) &&
        (rc = enum_of(v, schedules_catchup_names, "/catchup", &e, err)) != 0)
        return rc;
    sp->catchup = (enum catchup)e;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "start_at")) &&
        (rc = time_of(v, "/start_at", &sp->start_at, err)) != 0)
        return rc;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "end_at")) &&
        (rc = time_of(v, "/end_at", &sp->end_at, err)) != 0)
        return rc;
    if (sp->start_at && sp->end_at && sp->end_at <= sp->start_at)
        return jd_error_set(err, JD_EINVAL, "/end_at", "must be after start_at");
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "paused"))) {
        if (!cJSON_IsBool(v))
            return jd_error_set(err, JD_EINVAL, "/paused", "must be true or false");
        sp->paused = cJSON_IsTrue(v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "jitter_ms"))) {
        double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
        if (d < 0 || d > MAX_JITTER_MS || d != (double)(int64_t)d)
            return jd_error_set(err, JD_EINVAL, "/jitter_ms",
                                "must be a whole number of milliseconds from 0 to %d",
                                MAX_JITTER_MS);
        sp->jitter_ms = (int64_t)d;
        if (!sp->is_cron && sp->jitter_ms >= sp->every_ms)
            return jd_error_set(err, JD_EINVAL, "/jitter_ms",
                                "must be shorter than the interval (%" PRId64 " ms)", sp->every_ms);
    }
    const cJSON *labels = cJSON_GetObjectItemCaseSensitive(root, "labels");
    if (labels) {
        if (!cJSON_IsObject(labels))
            return jd_error_set(err, JD_EINVAL, "/labels", "must be an object of strings");
        int n = 0;
        for (const cJSON *c = labels->child; c; c = c->next, n++) {
            snprintf(ptr, sizeof ptr, "/labels");
            jd_ptr_append(ptr, sizeof ptr, c->string);
            if (!cJSON_IsString(c))
                return jd_error_set(err, JD_EINVAL, ptr, "a label value must be a string");
            if (strcmp(c->string, "schedule") == 0)
                return jd_error_set(err, JD_EINVAL, ptr,
                                    "the \"schedule\" label is set by Jackdaw to the schedule id");
            if (n >= MAX_LABELS)
                return jd_error_set(err, JD_EINVAL, ptr, "more than %d labels", MAX_LABELS);
        }
    }
    const cJSON *job = cJSON_GetObjectItemCaseSensitive(root, "job");
    if (!job)
        return jd_error_set(err, JD_EINVAL, "/job", "a schedule needs a job definition");
    if (!cJSON_IsObject(job))
        return jd_error_set(err, JD_EINVAL, "/job", "must be a job definition (an object)");
    if (cJSON_GetObjectItemCaseSensitive(job, "run_at"))
        return jd_error_set(err, JD_EINVAL, "/job/run_at",
                            "a scheduled job runs at its fire time (use delay_ms to run later)");
    if (cJSON_GetObjectItemCaseSensitive(job, "unique"))
        return jd_error_set(err, JD_EINVAL, "/job/unique",
                            "a scheduled job cannot be unique (use \"overlap\" instead)");
    cJSON *mj = merged_job(job, labels, id);
    sp->job_text = cJSON_PrintUnformatted(mj);
    cJSON_Delete(mj);
    if (validate_job &&
        (rc = jd_jobs_validate(S->jobs, sp->job_text, strlen(sp->job_text), err)) != 0) {
        schedules_pointer_under(err, "/job");
        if (rc == JD_EPARSE || rc == JD_ETOOBIG)
            rc = err->code = JD_EINVAL;
        schedules_spec_clear(sp);
        return rc;
    }
    if (!cJSON_GetObjectItemCaseSensitive(root, "overlap"))
        cJSON_AddStringToObject(root, "overlap", schedules_overlap_names[sp->overlap]);
    if (!cJSON_GetObjectItemCaseSensitive(root, "catchup"))
        cJSON_AddStringToObject(root, "catchup", schedules_catchup_names[sp->catchup]);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "paused"); /* state, kept in the row */
    sp->def_text = cJSON_PrintUnformatted(root);
    return 0;
}
