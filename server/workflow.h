/*
 * The built-in process types, as jd_process_ops state machines:
 *
 *   task      one call: {"handler": .., "args": ..}; its result is the job output.
 *   workflow  {"steps": [..]}: sequential steps, parallel groups (all
 *             yields at once, wait for all, the first failure fails the
 *             group), sleep_ms (a durable timer yield), wait for a message
 *             topic with an optional timeout, ${..} substitution in args.
 *
 * plus the adapter that runs a plugin's process type (jackdaw_plugin.h)
 * through the same interface.
 *
 * Both built-ins are spawned with method "run" and the job definition's JSON
 * text as input. Each step yields with tag = its flattened index + 1
 * (jobdef.h), so the tags depend only on the definition: a replay yields the
 * same tags in the same order whatever the timing of messages. Messages are
 * {"topic": .., "data": ..}; they are buffered in arrival order and a wait
 * step takes the first one with its topic. A wait step with a timeout always
 * yields its timer (even when a message is already buffered) so that the tag
 * sequence does not depend on when messages arrived. A running wait step
 * takes a message as soon as it arrives, so a wait ends by whichever of its
 * message and its timer's completion comes first in the event order, however
 * the events were batched into steps: the same events in the same order give
 * the same decisions, which is what replay (jobs.c) relies on.
 *
 * Output of a workflow: {"<step id>": output, ...} for every call step (its
 * result) and wait step (the message's data). Errors are JSON objects
 * {"kind": .., "message": .., ...}: kinds "cancelled", "timeout" (wait
 * timeout), "substitution", "output_too_large" (the call steps' outputs
 * together passed JD_WF_OUTPUTS_MAX), or the failed call's kind with "step"
 * naming the step and "cause" holding the call's error. Step outputs are
 * kept as text while the workflow runs, parsed only when a reference reads
 * them.
 *
 * Threading: as process.h: one instance is never used by two threads at once.
 */
#ifndef JD_SERVER_WORKFLOW_H
#define JD_SERVER_WORKFLOW_H

#include "plugins/jackdaw_plugin.h"
#include "scheduler/process.h"

#include <stdint.h>

/* What a workflow's call-step outputs may hold together, as compact JSON
 * text: sixteen definitions' worth (one output can be as large as a whole
 * definition by substitution), so one job's memory is bounded whatever its
 * steps splice. */
#define JD_WF_OUTPUTS_MAX ((size_t)16 << 20)

extern const struct jd_process_ops jd_task_ops;
extern const struct jd_process_ops jd_workflow_ops;
extern const struct jd_process_ops jd_plugin_process_ops;

/* A task/workflow instance for job_id (for ${job.id}); hand it to
 * jd_sched_spawn (takes ownership) or call ops->close to free it. */
void *jd_workflow_new(int64_t job_id);

struct jd_jobdef;

/* Like jd_workflow_new, but init uses def (borrowed: it must stay valid until
 * the process finishes; close does not touch it) instead of parsing its
 * input, which may then be NULL. Saves a parse of the definition per start. */
void *jd_workflow_new_def(int64_t job_id, const struct jd_jobdef *def);

/* An adapter instance for a plugin process type (borrowed; lives as long as
 * the registry). Freed by jd_plugin_process_ops.close. */
void *jd_plugin_process_new(const struct jd_process_type *pt);

#endif
