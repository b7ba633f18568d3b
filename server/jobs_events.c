/*
 * The global stream of job transitions (GET /v1/events): filters parsed
 * once per stream, events read from the store in commit order and rendered
 * one line of JSON each. Change notification is jd_jobs_watch_any
 * (jobs_watch.c).
 *
 * Threading: any thread; a jd_events_sub is owned by one stream and used by
 * one thread at a time.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct jd_events_sub {
    struct jd_event_find f;
    char *queue;
    char lab[JD_JOBS_LABEL_FILTERS][JOBS_LABEL_BUF];
};

void jd_jobs_events_sub_free(struct jd_events_sub *s)
{
    if (!s)
        return;
    free(s->queue);
    free(s);
}

int jd_jobs_events_sub(const struct jd_events_query *q, struct jd_events_sub **out,
                       struct jd_error *err)
{
    jd_error_clear(err);
    *out = NULL;
    struct jd_events_sub *s = jd_xcalloc(1, sizeof *s);
    if (q->state && q->state[0]) {
        const char *p = q->state;
        while (*p) {
            size_t n = strcspn(p, ",");
            char name[16] = "";
            int st = -1;
            if (n < sizeof name) {
                memcpy(name, p, n);
                name[n] = '\0';
                st = jd_job_state_parse(name);
            }
            if (st < 0) {
                jd_jobs_events_sub_free(s);
                return jd_error_set(err, JD_EINVAL, "/state",
                                    "state is a comma-separated list of queued, running, "
                                    "waiting, succeeded, failed, cancelled");
            }
            s->f.state_mask |= 1u << st;
            p += n;
            if (*p == ',')
                p++;
        }
    }
    /* labels: the same rules as GET /v1/jobs */
    struct jd_jobs_list_query lq = {.n_labels = q->n_labels};
    for (size_t i = 0; i < q->n_labels && i < JD_JOBS_LABEL_FILTERS; i++)
        lq.labels[i] = q->labels[i];
    struct jd_job_find jf;
    int rc = jobs_filter_parse(&lq, &jf, s->lab, err);
    if (rc) {
        jd_jobs_events_sub_free(s);
        return rc;
    }
    s->f.n_labels = jf.n_labels;
    for (size_t i = 0; i < jf.n_labels; i++) {
        s->f.label_key[i] = jf.label_key[i];
        s->f.label_value[i] = jf.label_value[i];
    }
    if (q->queue) {
        if (strlen(q->queue) > 256) {
            jd_jobs_events_sub_free(s);
            return jd_error_set(err, JD_EINVAL, "/queue", "no queue has a name that long");
        }
        s->queue = jd_xstrdup(q->queue);
        s->f.queue = s->queue;
    }
    *out = s;
    return 0;
}

int jd_jobs_events_read(struct jd_jobs *j, const struct jd_events_sub *s, int64_t after,
                        unsigned limit, void (*fn)(void *arg, int64_t id, const char *event_json),
                        void *arg, int64_t *next)
{
    struct jd_event_find f = s->f;
    f.after_id = after;
    f.limit = limit < 1 ? 1 : limit > 1000 ? 1000 : limit;
    struct jd_stream_event *ev = NULL;
    size_t n = 0;
    int rc = jd_store_event_stream(j->store, &f, &ev, &n, next);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        struct jd_sbuf b = {0};
        char t[32];
        jd_sb_puts(&b, "{\"id\":\"");
        snprintf(t, sizeof t, "%" PRId64, ev[i].id);
        jd_sb_puts(&b, t);
        jd_sb_puts(&b, "\",\"job_id\":\"");
        snprintf(t, sizeof t, "%" PRId64, ev[i].job_id);
        jd_sb_puts(&b, t);
        jd_sb_puts(&b, "\",\"seq\":");
        jd_sb_number(&b, ev[i].seq);
        jd_sb_puts(&b, ",\"time\":\"");
        jd_render_time(ev[i].time_ms, t);
        jd_sb_puts(&b, t);
        jd_sb_puts(&b, "\",\"queue\":");
        jd_sb_string(&b, ev[i].queue);
        jd_sb_puts(&b, ",\"state\":");
        jd_sb_string(&b, jd_job_state_name(ev[i].state));
        if (ev[i].traceparent) {
            jd_sb_puts(&b, ",\"traceparent\":");
            jd_sb_string(&b, ev[i].traceparent);
        }
        jd_sb_puts(&b, ",\"data\":");
        jd_sb_json(&b, ev[i].data, "null");
        jd_sb_puts(&b, "}");
        fn(arg, ev[i].id, b.p);
        free(b.p);
    }
    jd_stream_events_free(ev, n);
    return (int)n;
}

int jd_jobs_events_tail(struct jd_jobs *j, int64_t *id)
{
    return jd_store_event_last_id(j->store, id);
}
