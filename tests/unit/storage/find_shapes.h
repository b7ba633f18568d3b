/*
 * Every shape of a find and of an event-stream read (storage/find.c), for
 * the tests that check each one's plan: SQLite's (test_store_find.c) and
 * PostgreSQL's (test_pg_read.c). Header-only, like store_test_util.h.
 */
#ifndef JD_TEST_FIND_SHAPES_H
#define JD_TEST_FIND_SHAPES_H

#include "storage/store.h"

#define FIND_SHAPES 1024 /* one per combination of the 10 filter bits below */
#define EVENT_SHAPES 16

/* Shape m: state, queue "q", schedule "s", handler "exec", label
 * team=billing, seven more labels, created after / before, max_id, a
 * cursor, each present when its bit of m is set. */
static inline struct jd_job_find find_shape(unsigned m)
{
    struct jd_job_find f = {.state = -1, .limit = 10};
    if (m & 1)
        f.state = JD_JOB_QUEUED;
    if (m & 2)
        f.queue = "q";
    if (m & 4)
        f.schedule = "s";
    if (m & 8)
        f.handler = "exec";
    if (m & 16) {
        f.label_key[f.n_labels] = "team";
        f.label_value[f.n_labels++] = "billing";
    }
    if (m & 32) {
        for (int i = 0; i < JD_FIND_MAX_LABELS - 1; i++) {
            f.label_key[f.n_labels] = "tier";
            f.label_value[f.n_labels++] = "gold";
        }
    }
    if (m & 64)
        f.created_after_ms = 1000;
    if (m & 128)
        f.created_before_ms = 2000;
    if (m & 256)
        f.max_id = 99;
    if (m & 512) {
        f.after_id = 50;
        f.after_created_ms = 1500;
    }
    return f;
}

/* Event-stream shape m: queue "q", two states, label team=billing, the
 * most labels. */
static inline struct jd_event_find event_shape(unsigned m)
{
    struct jd_event_find f = {.after_id = 5, .limit = 10};
    if (m & 1)
        f.queue = "q";
    if (m & 2)
        f.state_mask = (1u << JD_JOB_SUCCEEDED) | (1u << JD_JOB_FAILED);
    if (m & 4) {
        f.label_key[f.n_labels] = "team";
        f.label_value[f.n_labels++] = "billing";
    }
    if (m & 8)
        while (f.n_labels < JD_FIND_MAX_LABELS) {
            f.label_key[f.n_labels] = "tier";
            f.label_value[f.n_labels++] = "gold";
        }
    return f;
}

#endif
