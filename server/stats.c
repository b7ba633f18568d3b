/*
 * The throughput series (see stats.h): per queue, a ring of JD_STATS_WINDOW
 * one-second buckets indexed by (second % window); a bucket carries the
 * second it counts, so a stale one (from a lap ago) reads as zero and is
 * reset when written again. Queue slots are allocated on a queue's first
 * ended job and live until destroy.
 */
#include "server/stats.h"

#include "common/alloc.h"
#include "common/clock.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_SUCCEEDED, K_FAILED, K_CANCELLED, K_N };
static const char *const kind_name[K_N] = {"succeeded", "failed", "cancelled"};

struct bucket {
    int64_t sec; /* the second counted here; a different one means zero */
    uint32_t n[K_N];
};

struct squeue {
    char *name;
    struct bucket ring[JD_STATS_WINDOW];
};

struct jd_stats {
    pthread_mutex_t mu; /* guards everything below */
    struct squeue *q[JD_STATS_MAX_QUEUES];
    size_t nq;
    struct squeue *other; /* ends of queues past the cap, or NULL */
};

struct jd_stats *jd_stats_create(void)
{
    struct jd_stats *s = jd_xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

void jd_stats_destroy(struct jd_stats *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i <= s->nq; i++) {
        struct squeue *q = i < s->nq ? s->q[i] : s->other;
        if (q != NULL) {
            free(q->name);
            free(q);
        }
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static struct squeue *squeue_new(const char *name)
{
    struct squeue *q = jd_xcalloc(1, sizeof *q);
    q->name = jd_xstrdup(name);
    for (size_t i = 0; i < JD_STATS_WINDOW; i++)
        q->ring[i].sec = -1;
    return q;
}

/* Under mu: the slot of name, made on first use. */
static struct squeue *slot_locked(struct jd_stats *s, const char *name)
{
    /* Queue names are checked at submit; anything else (the JSON is
     * written without escaping) counts as other. */
    size_t len = strlen(name);
    bool plain = len > 0 && len <= 64 &&
                 strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                              "0123456789._-") == len;
    if (plain) {
        for (size_t i = 0; i < s->nq; i++)
            if (strcmp(s->q[i]->name, name) == 0)
                return s->q[i];
        if (s->nq < JD_STATS_MAX_QUEUES)
            return s->q[s->nq++] = squeue_new(name);
    }
    if (s->other == NULL)
        s->other = squeue_new(JD_STATS_OTHER);
    return s->other;
}

void jd_stats_job_end(struct jd_stats *s, const char *queue, enum jd_job_state state,
                      int64_t now_ms)
{
    int k = state == JD_JOB_SUCCEEDED   ? K_SUCCEEDED
            : state == JD_JOB_FAILED    ? K_FAILED
            : state == JD_JOB_CANCELLED ? K_CANCELLED
                                        : -1;
    if (k < 0 || now_ms < 0)
        return;
    int64_t sec = now_ms / 1000;
    pthread_mutex_lock(&s->mu);
    struct bucket *b = &slot_locked(s, queue ? queue : "default")->ring[sec % JD_STATS_WINDOW];
    if (b->sec != sec) {
        memset(b, 0, sizeof *b);
        b->sec = sec;
    }
    b->n[k]++;
    pthread_mutex_unlock(&s->mu);
}

char *jd_stats_json(struct jd_stats *s, int seconds, int64_t now_ms)
{
    if (seconds < 1)
        seconds = 1;
    if (seconds > JD_STATS_WINDOW)
        seconds = JD_STATS_WINDOW;
    int64_t end = now_ms / 1000, first = end - seconds + 1;
    char when[40];
    jd_time_format(end * 1000, when, sizeof when);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL)
        jd_xmalloc((size_t)-1); /* out of memory: abort as every small allocation does */
    fprintf(f, "{\"bucket_seconds\":1,\"seconds\":%d,\"end\":\"%s\",\"queues\":[", seconds, when);
    /* Copy the counts out under the lock and format them after it: the
     * lock is taken where jobs end, under the job layer's mutex, so it is
     * held for a copy, never for the printing. Names outlive the copy
     * (slots are freed only by destroy). */
    pthread_mutex_lock(&s->mu);
    struct squeue *order[JD_STATS_MAX_QUEUES + 1];
    size_t n = s->nq;
    memcpy(order, s->q, n * sizeof order[0]);
    if (s->other != NULL)
        order[n++] = s->other;
    size_t per = (size_t)K_N * (size_t)seconds;
    uint32_t *counts = jd_xcalloc(n ? n * per : 1, sizeof *counts);
    for (size_t i = 0; i < n; i++)
        for (int64_t t = first; t <= end; t++) {
            const struct bucket *b =
                &order[i]->ring[((t % JD_STATS_WINDOW) + JD_STATS_WINDOW) % JD_STATS_WINDOW];
            if (b->sec == t)
                for (int k = 0; k < K_N; k++)
                    counts[i * per + (size_t)k * (size_t)seconds + (size_t)(t - first)] = b->n[k];
        }
    pthread_mutex_unlock(&s->mu);
    /* sort an index, not order[], so each queue keeps its row of counts */
    size_t idx[JD_STATS_MAX_QUEUES + 1];
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    for (size_t i = 1; i < n; i++) /* insertion sort by name: n <= 65 */
        for (size_t j = i; j > 0 && strcmp(order[idx[j - 1]]->name, order[idx[j]]->name) > 0; j--) {
            size_t tmp = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = tmp;
        }
    for (size_t r = 0; r < n; r++) {
        size_t i = idx[r];
        uint64_t total[K_N] = {0};
        /* Names are [A-Za-z0-9._-] or "(other)" (see slot_locked): no escaping. */
        fprintf(f, "%s{\"name\":\"%s\"", r ? "," : "", order[i]->name);
        for (int k = 0; k < K_N; k++) {
            const uint32_t *row = counts + i * per + (size_t)k * (size_t)seconds;
            fprintf(f, ",\"%s\":[", kind_name[k]);
            for (int t = 0; t < seconds; t++) {
                total[k] += row[t];
                fprintf(f, t == 0 ? "%u" : ",%u", row[t]);
            }
            fputc(']', f);
        }
        fprintf(f, ",\"totals\":{\"succeeded\":%llu,\"failed\":%llu,\"cancelled\":%llu}}",
                (unsigned long long)total[K_SUCCEEDED], (unsigned long long)total[K_FAILED],
                (unsigned long long)total[K_CANCELLED]);
    }
    free(counts);
    fputs("]}", f);
    fclose(f);
    return text;
}
