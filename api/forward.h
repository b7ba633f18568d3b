/*
 * Remote tasks across cluster nodes, the HTTP half (issue 16; README
 * "Running a cluster"). A task's state machine lives on the node that made
 * it (its id names that node: jd_task_id_parse); a worker may talk to any
 * node. This module is the node-to-node side:
 *
 *   relays     a heartbeat, complete or fail for another node's task is
 *              sent to that node's advertised URL and its answer (status
 *              and body) handed back verbatim; when the owner has no live
 *              node row any more the task's state in the database answers
 *              (409 lease_lost, completed, cancelled; 404), and a live owner
 *              that does not answer gets 503;
 *   claims     the job layer's forwarded claims (jd_task_remote.claim): a
 *              non-waiting claim on a node that announced waiting tasks;
 *   announces  the job layer's announcements (jd_task_remote.announce),
 *              sent as a NOTIFY through the store.
 *
 * Bounds: FWD_THREADS threads do the blocking work (libcurl, the node
 * table) off the HTTP event threads; at most FWD_QUEUE_MAX items wait
 * (more: a relay answers 503 at once, a claim is "no tasks from there", an
 * announcement is dropped: the next one comes within a second); each call
 * to another node is bounded by FWD_TIMEOUT_MS and its answer by
 * FWD_ANSWER_MAX bytes; a node that did not answer is not called again for
 * FWD_DOWN_MS (its requests fail at once), so a stalled node cannot hold
 * every thread. Requests another node forwarded carry the header
 * Jackdaw-Forwarded and are never forwarded again (one hop).
 *
 * Lifecycle (main): start after the store opened -> jd_http_attach_forward
 * and jd_jobs_set_task_remote -> ... -> jd_forward_stop after the job
 * layer drained (queued relays answer 503, queued claims get no tasks,
 * later ones are refused) -> jd_forward_free after the job layer is gone.
 */
#ifndef JD_API_FORWARD_H
#define JD_API_FORWARD_H

#include "server/tasks.h"

#include <stdint.h>

struct jd_forward;
struct jd_store;

struct jd_forward_config {
    struct jd_store *store; /* borrowed: node URLs and announcements */
    const char *token;      /* borrowed (copied): sent as "Authorization: Bearer"; NULL: none */
};

/* 0, or JD_EIO (a thread could not start). Free with jd_forward_free. */
int jd_forward_start(const struct jd_forward_config *cfg, struct jd_forward **out);
/* Stop the threads (idempotent): what is queued is answered as refused. */
void jd_forward_stop(struct jd_forward *f);
void jd_forward_free(struct jd_forward *f);
/* The job layer's hooks (jd_jobs_set_task_remote) served by f. */
void jd_forward_task_remote(struct jd_forward *f, struct jd_task_remote *out);

/* For /metrics: this node's forwarding since it started. */
struct jd_forward_stats {
    uint64_t relays, relay_failures; /* relays sent; of those, no answer from the owner */
    uint64_t relays_gone;            /* answered here from the store (owner gone or silent) */
    uint64_t claims, claim_failures; /* forwarded claims sent; of those, no answer */
    uint64_t claimed;                /* tasks those claims brought back */
    uint64_t announces, refused;     /* announcements sent; items refused (queue full, stopped) */
};
void jd_forward_stats(struct jd_forward *f, struct jd_forward_stats *out);

#endif
