/*
 * Remote tasks, part 4 of 5 (see jobs_tasks.c): reads. One command, the
 * list of plugin and remote commands, the workers seen, per-command
 * statistics for the metrics route, and a task's stored state (its row, or
 * its claim in its job's history).
 *
 * Threads: any (HTTP threads, the metrics route). Each read takes tmu for
 * the copy only and renders what it copied; tasks_render_cmd is also called
 * by jd_jobs_command_put under tmu. jd_task_stored_state reads the store
 * only.
 */
#include "server/jobs_impl.h"
#include "server/jobs_tasks_impl.h"
#include "server/tasks.h"

#include "common/alloc.h"
#include "common/clock.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define HISTORY_PAGE 1000 /* events read at once while looking for a task's claim */

/* Whether event e is the dispatch that claimed task id (its data names it). */
static bool claimed_by(const struct jd_job_event *e, const char *id)
{
    if (e->kind != JD_EVK_DISPATCH || !e->data || !strstr(e->data, id))
        return false; /* cheap test first: most dispatches name another task */
    cJSON *d = cJSON_Parse(e->data);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(d, "task");
    bool mine = cJSON_IsString(t) && strcmp(t->valuestring, id) == 0;
    cJSON_Delete(d);
    return mine;
}

/* Events of job after `after` (at most limit in all, or to the end with
 * limit 0), searched for the claim of base: *found and its step's *tag
 * once seen; *done once a completion of that step follows with no later
 * dispatch of the step between. */
static int scan_claim(struct jd_store *s, int64_t job, int64_t after, unsigned limit,
                      const char *base, bool *found, uint32_t *tag, bool *done)
{
    bool over = false;
    unsigned seen = 0;
    for (;;) {
        struct jd_job_event *ev = NULL;
        size_t n = 0;
        unsigned want = limit && limit - seen < HISTORY_PAGE ? limit - seen : HISTORY_PAGE;
        int rc = jd_store_events(s, job, after, want, &ev, &n);
        if (rc)
            return rc;
        for (size_t i = 0; i < n && !over; i++) {
            if (!*found) {
                *found = claimed_by(&ev[i], base);
                *tag = ev[i].tag;
            } else if (ev[i].tag == *tag && ev[i].kind == JD_EVK_COMPLETE) {
                *done = over = true;
            } else if (ev[i].tag == *tag && ev[i].kind == JD_EVK_DISPATCH) {
                over = true; /* a later attempt: this one did not end in a completion */
            }
        }
        seen += (unsigned)n;
        after = n ? ev[n - 1].seq : after;
        jd_job_events_free(ev, n);
        if (n < want || over || (limit && seen >= limit))
            return 0;
    }
}

int jd_task_stored_state(struct jd_store *s, const char *id, int *state, int64_t *job_id)
{
    int rc = jd_store_task_state(s, id, state, job_id);
    char base[JD_TASK_ID_MAX + 1];
    int64_t seq = rc == JD_ENOENT ? jd_task_id_claim(id, base) : -1;
    if (rc != JD_ENOENT || seq < 0)
        return rc;
    /* No row: a claim that nothing wrote since. Its dispatch event names
     * it (base); a completion of its step after it, with no later dispatch
     * of the step between, ended it. An id with a seq names that event:
     * one read refuses a forged one. */
    int64_t job = jd_task_id_job(id);
    bool found = false, done = false;
    uint32_t tag = 0;
    if (seq > 0) {
        struct jd_job_event *ev = NULL;
        size_t n = 0;
        rc = jd_store_events(s, job, seq - 1, 1, &ev, &n);
        found = rc == 0 && n == 1 && ev[0].seq == seq && claimed_by(&ev[0], base);
        tag = n ? ev[0].tag : 0;
        jd_job_events_free(ev, n);
        if (found) /* then what became of it */
            rc = scan_claim(s, job, seq, 0, base, &found, &tag, &done);
    } else {
        /* An id from before ids carried the seq: its claim is among the
         * job's latest events, unless the job went on long after. */
        struct jd_job row = {0};
        rc = jd_store_job_get(s, job, &row);
        int64_t last = row.version;
        jd_job_clear(&row);
        if (rc == 0)
            rc = scan_claim(s, job, last > JD_TASK_NOSEQ_WINDOW ? last - JD_TASK_NOSEQ_WINDOW : 0,
                            JD_TASK_NOSEQ_WINDOW, base, &found, &tag, &done);
    }
    if (rc)
        return rc;
    if (!found)
        return JD_ENOENT;
    *state = done ? JD_TASK_COMPLETED : JD_TASK_CLAIMED;
    *job_id = job;
    return 0;
}

/* Under tmu: render one command. */
void tasks_render_cmd(struct jd_sbuf *b, const struct rcmd *c, int64_t now)
{
    char t1[32], t2[32];
    jd_render_time(c->created_ms, t1);
    jd_render_time(c->updated_ms, t2);
    jd_sb_puts(b, "{\"name\":");
    jd_sb_string(b, c->name);
    jd_sb_puts(b, ",\"kind\":\"remote\",\"timeout_ms\":");
    jd_sb_number(b, c->timeout_ms);
    jd_sb_puts(b, ",\"max_in_flight\":");
    if (c->max_in_flight > 0)
        jd_sb_number(b, c->max_in_flight);
    else
        jd_sb_puts(b, "null");
    jd_sb_puts(b, ",\"description\":");
    if (c->description)
        jd_sb_string(b, c->description);
    else
        jd_sb_puts(b, "null");
    jd_sb_puts(b, ",\"waiting\":");
    jd_sb_number(b, (int64_t)c->waiting);
    jd_sb_puts(b, ",\"in_flight\":");
    jd_sb_number(b, (int64_t)c->in_flight);
    jd_sb_puts(b, ",\"oldest_waiting_ms\":");
    if (c->whead)
        jd_sb_number(b, now - c->whead->created_ms > 0 ? now - c->whead->created_ms : 0);
    else
        jd_sb_puts(b, "null");
    jd_sb_puts(b, ",\"created_at\":\"");
    jd_sb_puts(b, t1);
    jd_sb_puts(b, "\",\"updated_at\":\"");
    jd_sb_puts(b, t2);
    jd_sb_puts(b, "\"}");
}

int jd_jobs_command_get_json(struct jd_jobs *j, const char *name, char **json)
{
    struct jd_tasks *t = j->tasks;
    *json = NULL;
    pthread_mutex_lock(&t->mu);
    struct rcmd *c = tasks_cmd_find(t, name);
    if (c && c->registered) {
        struct jd_sbuf b = {0};
        tasks_render_cmd(&b, c, jd_wall_ms());
        *json = b.p;
    }
    pthread_mutex_unlock(&t->mu);
    return *json ? 0 : JD_ENOENT;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int jd_jobs_commands_json(struct jd_jobs *j, char **json)
{
    struct jd_tasks *t = j->tasks;
    /* Plugin commands first collected, then each remote one rendered; the
     * list is sorted by name as a whole. */
    size_t n = 0, cap = 0;
    char **items = NULL;
    for (size_t i = 0;; i++) {
        const struct jd_plugin *p = jd_registry_plugin(j->reg, i);
        if (!p)
            break;
        for (size_t k = 0; k < p->ncommands; k++) {
            struct jd_sbuf b = {0};
            jd_sb_puts(&b, "{\"name\":");
            jd_sb_string(&b, p->commands[k].name);
            jd_sb_puts(&b, ",\"kind\":\"plugin\",\"plugin\":");
            jd_sb_string(&b, p->name);
            jd_sb_puts(&b, "}");
            if (n == cap) {
                cap = cap ? cap * 2 : 32;
                items = jd_xrealloc(items, cap * sizeof *items);
            }
            items[n++] = b.p;
        }
    }
    int64_t now = jd_wall_ms();
    pthread_mutex_lock(&t->mu);
    for (struct rcmd *c = t->cmds; c; c = c->next) {
        if (!c->registered)
            continue;
        struct jd_sbuf b = {0};
        tasks_render_cmd(&b, c, now);
        if (n == cap) {
            cap = cap ? cap * 2 : 32;
            items = jd_xrealloc(items, cap * sizeof *items);
        }
        items[n++] = b.p;
    }
    pthread_mutex_unlock(&t->mu);
    /* Each item starts {"name":"<name>", so sorting the text sorts by name. */
    if (n > 1)
        qsort(items, n, sizeof *items, cmp_str);
    struct jd_sbuf out = {0};
    jd_sb_puts(&out, "{\"commands\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            jd_sb_puts(&out, ",");
        jd_sb_puts(&out, items[i]);
        free(items[i]);
    }
    jd_sb_puts(&out, "]}");
    free(items);
    *json = out.p;
    return 0;
}

int jd_jobs_workers_json(struct jd_jobs *j, int64_t within_ms, char **json)
{
    struct jd_tasks *t = j->tasks;
    int64_t since = jd_wall_ms() - within_ms;
    struct jd_sbuf b = {0};
    jd_sb_puts(&b, "{\"workers\":[");
    size_t n = 0;
    pthread_mutex_lock(&t->mu);
    for (struct wkr *w = t->workers; w; w = w->next) {
        if (w->last_seen_ms < since)
            continue;
        char when[32];
        jd_render_time(w->last_seen_ms, when);
        jd_sb_puts(&b, n++ ? ",{\"name\":" : "{\"name\":");
        jd_sb_string(&b, w->name);
        jd_sb_puts(&b, ",\"commands\":[");
        for (size_t i = 0; i < w->ncmds; i++) {
            if (i)
                jd_sb_puts(&b, ",");
            jd_sb_string(&b, w->cmds[i]->name);
        }
        jd_sb_puts(&b, "],\"in_flight\":");
        jd_sb_number(&b, w->in_flight);
        jd_sb_puts(&b, ",\"last_seen_at\":\"");
        jd_sb_puts(&b, when);
        jd_sb_puts(&b, "\"}");
    }
    pthread_mutex_unlock(&t->mu);
    jd_sb_puts(&b, "]}");
    *json = b.p;
    return 0;
}

int jd_jobs_task_stats(struct jd_jobs *j, struct jd_task_stats **out, size_t *n)
{
    struct jd_tasks *t = j->tasks;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&t->mu);
    size_t k = 0;
    for (struct rcmd *c = t->cmds; c; c = c->next)
        k += c->registered;
    struct jd_task_stats *v = jd_xcalloc(k ? k : 1, sizeof *v);
    size_t i = 0;
    for (struct rcmd *c = t->cmds; c; c = c->next) {
        if (!c->registered)
            continue;
        struct jd_task_stats *s_ = &v[i++];
        s_->command = jd_xstrdup(c->name);
        s_->waiting = c->waiting;
        s_->in_flight = c->in_flight;
        s_->claimed = c->claimed_total;
        s_->lease_expiries = c->lease_expiries;
        s_->completed = c->completed;
        s_->failed = c->failed;
        memcpy(s_->latency_hist, c->lat_hist, sizeof s_->latency_hist);
        s_->latency_ms_sum = c->lat_ms_sum;
    }
    pthread_mutex_unlock(&t->mu);
    *out = v;
    *n = k;
    return 0;
}

void jd_task_stats_free(struct jd_task_stats *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i].command);
    free(v);
}
