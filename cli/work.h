/*
 * jackdaw work, the generic worker (see work.c). Called from main's thread
 * after curl_global_init; starts its own threads and joins them.
 */
#ifndef JD_CLI_WORK_H
#define JD_CLI_WORK_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "cli/client.h"

#define jd_work_usage                                                                              \
    "usage: jackdaw work --command NAME [--concurrency N] [--lease DUR] -- PROGRAM ARGS...\n"      \
    "Claim tasks of command NAME and run PROGRAM once per task: the task's args as\n"              \
    "JSON on stdin, its stdout (JSON, or text as a JSON string) the result. A\n"                   \
    "non-zero exit fails the task (75, EX_TEMPFAIL, retryable; others not) with the\n"             \
    "tail of stderr. PROGRAM's environment adds JACKDAW_IDEMPOTENCY_KEY (the same\n"               \
    "for every attempt: dedupe effects on it), JACKDAW_ATTEMPT and JACKDAW_JOB_ID.\n"              \
    "Heartbeats every third of the lease (default 60s); a cancelled\n"                             \
    "job's program gets SIGTERM (SIGKILL 5 s later). SIGTERM/SIGINT drain: stop\n"                 \
    "claiming, finish running tasks, exit 0 (idle slots stop within 5 s).\n"                       \
    "--concurrency N (1..256, default 1) runs up to N programs at once. A task\n"                  \
    "whose job has a W3C traceparent gives it to PROGRAM as TRACEPARENT.\n"

/* Run the worker; returns the exit code. conn is borrowed. */
int jd_work_main(const struct jd_cli_conn *conn, int argc, char **argv);

/* A program's stdout as a result: JSON when it parses, else the text as a
 * JSON string (one trailing newline dropped). Caller frees with cJSON_Delete. */
cJSON *jd_work_result(const char *out, size_t len);

#endif
