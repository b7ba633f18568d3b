/*
 * Internals of the job layer shared by server/jobs.c (lifecycle, replay,
 * watches) and server/render.c (JSON output). Not a public contract: only
 * files of the job layer include it.
 *
 * Threading: everything below is guarded by jd_jobs.mu unless a field says
 * otherwise. Calls into the registry (which may complete a call on the calling
 * thread) and jd_sched_kill (which may finish a process on the calling
 * thread) are made without holding mu; other scheduler and store calls only
 * enqueue and are made with or without it.
 */
#ifndef JD_SERVER_JOBS_IMPL_H
#define JD_SERVER_JOBS_IMPL_H

#include "plugins/registry.h"
#include "scheduler/sched.h"
#include "server/jobdef.h"
#include "server/jobs.h"
#include "storage/store.h"

#include <cJSON.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* Render one stored job as a cJSON object (caller deletes). */
cJSON *jd_render_job(const struct jd_job *row);
/* The text of cJSON_PrintUnformatted(jd_render_job(row)), built directly
 * (caller frees with free). */
char *jd_render_job_json(const struct jd_job *row);
/* A growing text buffer for rendering JSON without a cJSON tree; p is
 * NUL-terminated once anything was put (caller frees p). Each function
 * writes what cJSON_PrintUnformatted would for the same value. */
struct jd_sbuf {
    char *p;
    size_t n, cap;
};
void jd_sb_put(struct jd_sbuf *b, const char *s, size_t n); /* raw bytes */
void jd_sb_puts(struct jd_sbuf *b, const char *s);          /* raw text */
void jd_sb_string(struct jd_sbuf *b, const char *s);        /* a JSON string */
void jd_sb_number(struct jd_sbuf *b, int64_t v);            /* v as a cJSON number */
/* JSON text embedded as cJSON would reprint it; NULL or unparsable text
 * puts `otherwise` (raw) instead. */
void jd_sb_json(struct jd_sbuf *b, const char *text, const char *otherwise);

/* jd_time_format(wall_ms, buf, 32) without gmtime_r and snprintf. */
void jd_render_time(int64_t wall_ms, char buf[32]);

/* Render one history event (caller deletes). */
cJSON *jd_render_event(const struct jd_job_event *ev);
/* Render the plugins of a frozen registry: {"plugins":[...]} (caller deletes). */
cJSON *jd_render_handlers(const struct jd_registry *r);
/* Render queue counts: {"queues":[...]} (caller deletes). */
cJSON *jd_render_queues(const struct jd_queue_counts *rows, size_t n);

#endif
