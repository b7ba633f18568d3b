/*
 * Throughput in memory: how many jobs of each queue ended in each of the
 * last JD_STATS_WINDOW seconds, by final state, for GET /v1/stats and the
 * dashboard's chart. Nothing is stored; a restart starts from zero.
 *
 * Threading: jd_stats_job_end is called by the job layer where a job's end
 * commits (under the job layer's mutex; this module's own mutex is a leaf
 * taken after it) and jd_stats_json by HTTP threads. Both are O(1) in the
 * number of jobs; the hot path is one short lock and a name lookup among
 * at most JD_STATS_MAX_QUEUES names.
 */
#ifndef JD_SERVER_STATS_H
#define JD_SERVER_STATS_H

#include "storage/store.h"

#include <stdint.h>

#define JD_STATS_WINDOW 900 /* 15 minutes of 1 s buckets: 21 KiB per queue tracked */
#define JD_STATS_MAX_QUEUES                                                                        \
    64 /* queues tracked by name; later ones count under "(other)", so                             \
          clients inventing queue names cannot grow memory */
#define JD_STATS_OTHER "(other)"

struct jd_stats;

/* A new, empty series (caller frees with jd_stats_destroy). */
struct jd_stats *jd_stats_create(void);
void jd_stats_destroy(struct jd_stats *s);

/* A job of queue (borrowed) ended in state (succeeded, failed or
 * cancelled; other states are ignored) at wall-clock now_ms. */
void jd_stats_job_end(struct jd_stats *s, const char *queue, enum jd_job_state state,
                      int64_t now_ms);

/* The last `seconds` (1..JD_STATS_WINDOW) seconds ending with the one of
 * now_ms, as JSON (caller frees with free):
 *   {"bucket_seconds":1,"seconds":N,"end":"<ISO time of the last bucket>",
 *    "queues":[{"name":"q","succeeded":[N numbers, oldest first],
 *               "failed":[...],"cancelled":[...],
 *               "totals":{"succeeded":n,"failed":n,"cancelled":n}}, ...]}
 * Queues appear once a job of theirs ended, sorted by name. */
char *jd_stats_json(struct jd_stats *s, int seconds, int64_t now_ms);

#endif
