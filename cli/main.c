/*
 * jackdaw: the command-line client. It speaks only the public HTTP API
 * (docs/architecture.md, "The CLI"). Each subcommand makes one or a few requests and
 * prints either a table for people or, with --json, the server's JSON.
 *
 * Exit codes (also in --help and README.md):
 *   0 ok; 1 the server said no (4xx, problem detail on stderr); 2 usage;
 *   3 cannot connect, 5xx or an unreadable answer; 4 (--wait) the job ended
 *   failed or cancelled; 5 (--wait) the wait ended before the job did.
 * Single threaded.
 */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/client.h"
#include "cli/schedules.h"
#include "cli/table.h"
#include "cli/work.h"
#include "common/alloc.h"
#include "common/clock.h"

static const char usage_main[] =
    "usage: jackdaw [--url URL] [--token TOKEN] [--json] COMMAND [ARGS]\n"
    "\n"
    "Commands:\n"
    "  submit FILE|- [--wait [DUR]]   submit a job (JSON); prints its id\n"
    "  get ID [--wait DUR]            show a job\n"
    "  events ID [--follow]           a job's history; --follow streams it live\n"
    "  cancel ID | retry ID           cancel a job / retry a failed one\n"
    "  ls [--state S] [--queue Q] [--limit N] [--cursor C]   list jobs, newest first\n"
    "  queues                         job counts per queue and state\n"
    "  pause QUEUE | resume QUEUE     stop / restart dispatch from a queue\n"
    "  message ID TOPIC JSON          send a message to a running or waiting job\n"
    "  handlers                       loaded plugins and their commands\n"
    "  schedules ls|get|put|pause|resume|trigger|rm|events   recurring jobs\n"
    "  work --command NAME -- PROGRAM ARGS...   run PROGRAM for each task of NAME\n"
    "  COMMAND --help                 help for one command\n"
    "\n"
    "Environment: JACKDAW_URL (default http://127.0.0.1:8080), JACKDAW_TOKEN\n"
    "(sent as a Bearer token). --url and --token override them.\n"
    "--json prints the server's JSON unchanged (one document) for scripts.\n"
    "\n"
    "Exit codes: 0 ok; 1 the server refused (4xx; the problem detail is on\n"
    "stderr); 2 usage; 3 cannot connect, 5xx or an unreadable answer;\n"
    "4 (--wait) the job ended failed or cancelled; 5 (--wait) the wait ended\n"
    "before the job did.\n";

/* A job for people: one "key<TAB>value" line per field present. */
static void print_job(const cJSON *job)
{
    static const char *const keys[] = {"id",         "state",       "handler",      "queue",
                                       "priority",   "attempts",    "max_attempts", "created_at",
                                       "started_at", "finished_at", "run_at"};
    struct jd_cli_table t;
    jd_cli_table_init(&t, 2);
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        char v[128];
        jd_cli_num_or_str(job, keys[i], v, sizeof v);
        if (!v[0] && strcmp(keys[i], "handler") == 0) /* a single-handler job */
            jd_cli_num_or_str(cJSON_GetObjectItem(job, "definition"), "handler", v, sizeof v);
        if (v[0])
            jd_cli_table_row(&t, (const char *[]){keys[i], v});
    }
    jd_cli_table_json_rows(&t, job, (const char *[]){"output", "error"}, 2);
    jd_cli_table_print(&t, stdout);
    jd_cli_table_free(&t);
}

static int job_exit(const cJSON *job)
{
    const char *st = jd_cli_str(job, "state");
    if (!st)
        return JD_EX_SERVER;
    if (strcmp(st, "succeeded") == 0)
        return JD_EX_OK;
    if (strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0)
        return JD_EX_JOB_FAILED;
    return JD_EX_WAIT_ENDED;
}

/* Print a job answer (raw with --json); the exit code: ex, which is the
 * job's (job_exit) when waiting, else OK unless the server failed. */
static int show_job(const cJSON *job, const char *raw, int ex, int waiting)
{
    if (jd_cli_json)
        fputs(raw, stdout), fputs(raw[0] && raw[strlen(raw) - 1] == '\n' ? "" : "\n", stdout);
    else
        print_job(job);
    return !waiting && ex != JD_EX_SERVER ? JD_EX_OK : ex;
}

/* Wait for job id up to wait_ms (0: no wait) and print it. The server caps
 * one ?wait= (60 s by default), so longer waits loop. */
static int get_job(const char *id, int64_t wait_ms, int waiting)
{
    char *eid = jd_cli_escape(id);
    int64_t deadline = ((int64_t)(jd_now_ns() / 1000000)) + wait_ms;
    cJSON *job = NULL;
    char *raw = NULL;
    int ex;
    for (;;) {
        int64_t left = deadline - ((int64_t)(jd_now_ns() / 1000000));
        char *path = waiting && left > 0 ? jd_xasprintf("/v1/jobs/%s?wait=%" PRId64 "ms", eid, left)
                                         : jd_xasprintf("/v1/jobs/%s", eid);
        cJSON_Delete(job);
        free(raw);
        job = NULL;
        raw = NULL;
        ex = jd_cli_call("GET", path, NULL, waiting ? (long)(left / 1000) + 30 : 30, &job, &raw);
        free(path);
        if (ex != JD_EX_OK)
            break;
        ex = job_exit(job);
        if (!waiting || ex != JD_EX_WAIT_ENDED || ((int64_t)(jd_now_ns() / 1000000)) >= deadline)
            break;
    }
    if (job)
        ex = show_job(job, raw, ex, waiting);
    cJSON_Delete(job);
    free(raw);
    free(eid);
    return ex;
}

static const char usage_submit[] =
    "usage: jackdaw submit FILE|- [--wait [DUR]] [--traceparent TP]\n"
    "Submit the job in FILE (or stdin for -), e.g. {\"handler\":\"echo\",\"args\":{}}.\n"
    "Prints the new job's id (--json: the job). --wait (default 1h) waits for it\n"
    "to end and prints it; exit 4 when it failed or was cancelled, 5 when the\n"
    "wait ended first. --traceparent TP stores the W3C trace context TP on the\n"
    "job (over the file's own), e.g. --traceparent \"$TRACEPARENT\" inside a\n"
    "program that `jackdaw work` runs.\n";

/* body with its "traceparent" member set to tp (the server checks it: 422
 * at /traceparent when malformed). A body that is not a JSON object is
 * returned as it is, for the server to refuse. Takes and returns a
 * malloc'd string. */
static char *with_traceparent(char *body, const char *tp)
{
    cJSON *o = cJSON_Parse(body);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return body;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(o, "traceparent");
    cJSON_AddStringToObject(o, "traceparent", tp);
    char *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!out)
        return body;
    free(body);
    return out;
}

static int cmd_submit(int argc, char **argv)
{
    const char *file = NULL, *traceparent = NULL;
    int waiting = 0;
    int64_t wait_ms = 3600 * 1000;
    for (int i = 1; i < argc; i++) {
        if (jd_cli_is_help(argv[i]))
            return jd_cli_usage(usage_submit, 1);
        if (strcmp(argv[i], "--wait") == 0) {
            waiting = 1;
            if (i + 1 < argc && argv[i + 1][0] >= '0' && argv[i + 1][0] <= '9')
                if (jd_cli_parse_dur(argv[++i], &wait_ms) != 0)
                    return JD_EX_USAGE;
        } else if (strcmp(argv[i], "--traceparent") == 0 && i + 1 < argc) {
            traceparent = argv[++i];
        } else if (!file) {
            file = argv[i];
        } else {
            return jd_cli_usage(usage_submit, 0);
        }
    }
    if (!file)
        return jd_cli_usage(usage_submit, 0);
    char *body = jd_cli_read_file(file);
    if (!body)
        return JD_EX_USAGE;
    if (traceparent)
        body = with_traceparent(body, traceparent);
    cJSON *job = NULL;
    char *raw = NULL;
    /* --wait: the submit itself waits (POST ?wait=, capped by the
     * server's --max-wait); a long-poll goes on for what is left. */
    int64_t deadline = (int64_t)(jd_now_ns() / 1000000) + wait_ms;
    char *path = waiting ? jd_xasprintf("/v1/jobs?wait=%" PRId64 "ms", wait_ms) : NULL;
    int ex = jd_cli_call("POST", path ? path : "/v1/jobs", body,
                         waiting ? (long)(wait_ms / 1000) + 60 : 60, &job, &raw);
    free(path);
    free(body);
    if (ex == JD_EX_OK) {
        char id[64];
        jd_cli_num_or_str(job, "id", id, sizeof id);
        int64_t left = deadline - (int64_t)(jd_now_ns() / 1000000);
        if (!id[0]) {
            fprintf(stderr, "jackdaw: the server's answer has no job id\n");
            ex = JD_EX_SERVER;
        } else if (waiting && job_exit(job) == JD_EX_WAIT_ENDED && left > 0) {
            ex = get_job(id, left, 1);
        } else if (waiting) {
            ex = show_job(job, raw, job_exit(job), 1);
        } else if (jd_cli_json) {
            jd_cli_print_json(job);
        } else {
            puts(id);
        }
    }
    cJSON_Delete(job);
    free(raw);
    return ex;
}

static const char usage_get[] = "usage: jackdaw get ID [--wait DUR]\n"
                                "Show a job. --wait DUR returns as soon as it has ended or\n"
                                "after DUR; then exit 4 when it failed or was cancelled, 5\n"
                                "when it had not ended.\n";

static int cmd_get(int argc, char **argv)
{
    const char *id = NULL;
    int waiting = 0;
    int64_t wait_ms = 0;
    for (int i = 1; i < argc; i++) {
        if (jd_cli_is_help(argv[i]))
            return jd_cli_usage(usage_get, 1);
        if (strcmp(argv[i], "--wait") == 0 && i + 1 < argc) {
            waiting = 1;
            if (jd_cli_parse_dur(argv[++i], &wait_ms) != 0)
                return JD_EX_USAGE;
        } else if (!id && argv[i][0] != '-') {
            id = argv[i];
        } else {
            return jd_cli_usage(usage_get, 0);
        }
    }
    if (!id)
        return jd_cli_usage(usage_get, 0);
    return get_job(id, wait_ms, waiting);
}

static const char usage_events[] =
    "usage: jackdaw events ID [--follow]\n"
    "Print a job's events (seq, time, kind, data). --follow streams them live\n"
    "until the job ends, reconnecting with Last-Event-ID when the connection\n"
    "drops. With --json, one JSON event per line.\n";

static void print_event_row(const cJSON *e)
{
    char seq[32], kind[64], time[64];
    jd_cli_num_or_str(e, "seq", seq, sizeof seq);
    jd_cli_num_or_str(e, "kind", kind, sizeof kind);
    jd_cli_num_or_str(e, "time", time, sizeof time);
    const cJSON *d = cJSON_GetObjectItem(e, "data");
    char *ds = d ? cJSON_PrintUnformatted(d) : NULL;
    printf("%s\t%s\t%s\t%s\n", seq, time, kind, ds ? ds : "-");
    free(ds);
}

struct follow {
    int ended;
};

static void on_event(void *ud, const char *id, const char *event, const char *data)
{
    struct follow *f = ud;
    if (strcmp(event, "end") == 0) {
        f->ended = 1;
        return;
    }
    if (jd_cli_json) {
        puts(data);
    } else {
        cJSON *e = cJSON_Parse(data);
        if (cJSON_IsObject(e))
            print_event_row(e);
        else
            printf("%s\t-\t%s\t%s\n", id, event, data);
        cJSON_Delete(e);
    }
    fflush(stdout);
}

static int cmd_events(int argc, char **argv)
{
    const char *id = NULL;
    int follow = 0;
    for (int i = 1; i < argc; i++) {
        if (jd_cli_is_help(argv[i]))
            return jd_cli_usage(usage_events, 1);
        if (strcmp(argv[i], "--follow") == 0 || strcmp(argv[i], "-f") == 0)
            follow = 1;
        else if (!id && argv[i][0] != '-')
            id = argv[i];
        else
            return jd_cli_usage(usage_events, 0);
    }
    if (!id)
        return jd_cli_usage(usage_events, 0);
    char *eid = jd_cli_escape(id);
    char *path = jd_xasprintf("/v1/jobs/%s/events", eid);
    free(eid);
    int ex;
    if (!follow) {
        cJSON *j = NULL;
        char *raw = NULL;
        ex = jd_cli_call("GET", path, NULL, 60, &j, &raw);
        if (ex == JD_EX_OK) {
            if (jd_cli_json) {
                fputs(raw, stdout);
                if (!raw[0] || raw[strlen(raw) - 1] != '\n')
                    putchar('\n');
            } else {
                const cJSON *arr = cJSON_IsArray(j) ? j : cJSON_GetObjectItem(j, "events");
                const cJSON *e;
                cJSON_ArrayForEach(e, arr) print_event_row(e);
            }
        }
        cJSON_Delete(j);
        free(raw);
        free(path);
        return ex;
    }
    char last[64] = "";
    struct follow f = {0};
    int failures = 0;
    for (;;) {
        long status = 0;
        struct jd_cli_resp r;
        int rc = jd_cli_sse(&jd_cli, path, last, on_event, &f, &status, &r);
        if (f.ended) {
            ex = JD_EX_OK;
        } else if (status && status != 200) {
            ex = jd_cli_report(&r, 0);
        } else if (rc == 0 || ++failures < 5) {
            /* The stream closed or broke before its end event: reconnect,
             * resuming after the last event seen. */
            free(r.body);
            if (rc != 0)
                sleep(1);
            continue;
        } else {
            ex = jd_cli_report(&r, -1);
        }
        free(r.body);
        break;
    }
    free(path);
    return ex;
}

static int simple_post(int argc, char **argv, const char *fmt, const char *usage_text)
{
    if (argc != 2 || argv[1][0] == '-')
        return jd_cli_usage(usage_text, argc > 1 && jd_cli_is_help(argv[1]));
    char *e = jd_cli_escape(argv[1]);
    char *path = jd_xasprintf(fmt, e);
    free(e);
    cJSON *j = NULL;
    char *raw = NULL;
    struct jd_cli_resp r;
    int rc = jd_cli_request(&jd_cli, "POST", path, NULL, 60, &r);
    int ex = jd_cli_report(&r, rc);
    if (ex == JD_EX_OK && r.len) {
        j = cJSON_Parse(r.body);
        if (jd_cli_json && j)
            jd_cli_print_json(j);
        else if (j && cJSON_GetObjectItem(j, "state"))
            print_job(j);
    }
    cJSON_Delete(j);
    free(raw);
    free(r.body);
    free(path);
    return ex;
}

static const char usage_cancel[] = "usage: jackdaw cancel ID\nCancel a job; prints it.\n";
static const char usage_retry[] =
    "usage: jackdaw retry ID\nRun a failed or cancelled job again; prints it.\n";
static const char usage_pause[] =
    "usage: jackdaw pause QUEUE\nStop dispatching jobs from QUEUE (submits still queue).\n";
static const char usage_resume[] = "usage: jackdaw resume QUEUE\nDispatch from QUEUE again.\n";

static void job_row(const cJSON *e, char (*buf)[JD_CLI_CELL], const char **cells)
{
    jd_cli_num_or_str(e, "id", buf[0], sizeof buf[0]);
    const char *h = jd_cli_str(cJSON_GetObjectItem(e, "definition"), "handler");
    cells[0] = buf[0];
    cells[1] = jd_cli_str(e, "state");
    cells[2] = jd_cli_str(e, "queue");
    cells[3] = h ? h : "workflow";
    cells[4] = jd_cli_str(e, "created_at");
}

static const char usage_ls[] =
    "usage: jackdaw ls [--state S] [--queue Q] [--limit N] [--cursor C]\n"
    "List jobs newest first: ID STATE QUEUE HANDLER CREATED. When there are more,\n"
    "the last line (on stderr) gives the --cursor for the next page.\n";

static int cmd_ls(int argc, char **argv)
{
    static const char *const opts[] = {"--state", "--queue", "--limit", "--cursor"};
    const char *vals[4] = {0};
    for (int i = 1; i < argc; i++) {
        if (jd_cli_is_help(argv[i]))
            return jd_cli_usage(usage_ls, 1);
        size_t k = 0;
        while (k < 4 && strcmp(argv[i], opts[k]) != 0)
            k++;
        if (k == 4 || i + 1 >= argc)
            return jd_cli_usage(usage_ls, 0);
        vals[k] = argv[++i];
    }
    char *q = jd_xstrdup("/v1/jobs");
    char sep = '?';
    for (size_t k = 0; k < 4; k++) {
        if (!vals[k])
            continue;
        char *e = jd_cli_escape(vals[k]);
        char *n = jd_xasprintf("%s%c%s=%s", q, sep, opts[k] + 2, e);
        free(e);
        free(q);
        q = n;
        sep = '&';
    }
    int ex = jd_cli_list(q, "jobs", 5,
                         (const char *[]){"ID", "STATE", "QUEUE", "HANDLER", "CREATED"}, job_row);
    free(q);
    return ex;
}

static const char usage_queues[] =
    "usage: jackdaw queues\nJob counts per queue and state, and whether it is paused.\n";

static int cmd_queues(int argc, char **argv)
{
    if (argc != 1)
        return jd_cli_usage(usage_queues, jd_cli_is_help(argv[1]));
    cJSON *j = NULL;
    int ex = jd_cli_call("GET", "/v1/queues", NULL, 60, &j, NULL);
    if (ex == JD_EX_OK && jd_cli_json) {
        jd_cli_print_json(j);
    } else if (ex == JD_EX_OK) {
        static const char *const states[] = {"queued",    "running", "waiting",
                                             "succeeded", "failed",  "cancelled"};
        struct jd_cli_table t;
        jd_cli_table_init(&t, 8);
        jd_cli_table_row(&t, (const char *[]){"QUEUE", "PAUSED", "QUEUED", "RUNNING", "WAITING",
                                              "SUCCEEDED", "FAILED", "CANCELLED"});
        const cJSON *arr = cJSON_IsArray(j) ? j : cJSON_GetObjectItem(j, "queues");
        const cJSON *qu;
        cJSON_ArrayForEach(qu, arr)
        {
            char cells[8][32];
            const char *row[8];
            snprintf(cells[0], 32, "%s", jd_cli_str(qu, "name") ? jd_cli_str(qu, "name") : "");
            snprintf(cells[1], 32, "%s",
                     cJSON_IsTrue(cJSON_GetObjectItem(qu, "paused")) ? "yes" : "no");
            const cJSON *counts = cJSON_GetObjectItem(qu, "counts");
            if (!counts)
                counts = qu;
            for (int s = 0; s < 6; s++) {
                jd_cli_num_or_str(counts, states[s], cells[s + 2], 32);
                if (!cells[s + 2][0])
                    snprintf(cells[s + 2], 32, "0");
            }
            for (int c = 0; c < 8; c++)
                row[c] = cells[c];
            jd_cli_table_row(&t, row);
        }
        jd_cli_table_print(&t, stdout);
        jd_cli_table_free(&t);
    }
    cJSON_Delete(j);
    return ex;
}

static const char usage_message[] =
    "usage: jackdaw message ID TOPIC JSON\n"
    "Send {\"topic\": TOPIC, \"data\": JSON} to a running or waiting job.\n";

static int cmd_message(int argc, char **argv)
{
    if (argc != 4)
        return jd_cli_usage(usage_message, argc > 1 && jd_cli_is_help(argv[1]));
    cJSON *data = cJSON_Parse(argv[3]);
    if (!data) {
        fprintf(stderr, "jackdaw: the message data is not JSON: %s\n", argv[3]);
        return JD_EX_USAGE;
    }
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "topic", argv[2]);
    cJSON_AddItemToObject(body, "data", data);
    char *b = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    char *e = jd_cli_escape(argv[1]);
    char *path = jd_xasprintf("/v1/jobs/%s/messages", e);
    free(e);
    struct jd_cli_resp r;
    int rc = jd_cli_request(&jd_cli, "POST", path, b, 60, &r);
    int ex = jd_cli_report(&r, rc);
    if (ex == JD_EX_OK && jd_cli_json)
        puts(r.len ? r.body : "{}");
    free(r.body);
    free(path);
    free(b);
    return ex;
}

static const char usage_handlers[] = "usage: jackdaw handlers\nThe loaded plugins: PLUGIN VERSION "
                                     "COMMANDS (process types marked).\n";

static int cmd_handlers(int argc, char **argv)
{
    if (argc != 1)
        return jd_cli_usage(usage_handlers, jd_cli_is_help(argv[1]));
    cJSON *j = NULL;
    int ex = jd_cli_call("GET", "/v1/handlers", NULL, 60, &j, NULL);
    if (ex == JD_EX_OK && jd_cli_json) {
        jd_cli_print_json(j);
    } else if (ex == JD_EX_OK) {
        struct jd_cli_table t;
        jd_cli_table_init(&t, 3);
        jd_cli_table_row(&t, (const char *[]){"PLUGIN", "VERSION", "COMMANDS"});
        const cJSON *arr = cJSON_IsArray(j) ? j : cJSON_GetObjectItem(j, "plugins");
        const cJSON *h;
        cJSON_ArrayForEach(h, arr)
        {
            char cmds[1024] = "";
            size_t used = 0;
            const cJSON *c;
            cJSON_ArrayForEach(c, cJSON_GetObjectItem(h, "commands"))
            {
                const char *n = cJSON_IsString(c) ? c->valuestring : jd_cli_str(c, "name");
                if (n && used < sizeof cmds)
                    used += (size_t)snprintf(cmds + used, sizeof cmds - used, "%s%s",
                                             used ? "," : "", n);
            }
            cJSON_ArrayForEach(c, cJSON_GetObjectItem(h, "process_types"))
            {
                const char *n = jd_cli_str(c, "name");
                if (n && used < sizeof cmds)
                    used += (size_t)snprintf(cmds + used, sizeof cmds - used, "%s%s (process)",
                                             used ? "," : "", n);
            }
            jd_cli_table_row(
                &t, (const char *[]){jd_cli_str(h, "name"), jd_cli_str(h, "version"), cmds});
        }
        jd_cli_table_print(&t, stdout);
        jd_cli_table_free(&t);
    }
    cJSON_Delete(j);
    return ex;
}

static int cmd_cancel(int argc, char **argv)
{
    return simple_post(argc, argv, "/v1/jobs/%s/cancel", usage_cancel);
}
static int cmd_retry(int argc, char **argv)
{
    return simple_post(argc, argv, "/v1/jobs/%s/retry", usage_retry);
}
static int cmd_pause(int argc, char **argv)
{
    return simple_post(argc, argv, "/v1/queues/%s/pause", usage_pause);
}
static int cmd_resume(int argc, char **argv)
{
    return simple_post(argc, argv, "/v1/queues/%s/resume", usage_resume);
}

static int cmd_work(int argc, char **argv)
{
    return jd_work_main(&jd_cli, argc, argv);
}

static int cmd_schedules(int argc, char **argv)
{
    return jd_schedules_main(argc, argv);
}

static const struct {
    const char *name;
    int (*fn)(int, char **);
} commands[] = {
    {"submit", cmd_submit},       {"get", cmd_get},           {"events", cmd_events},
    {"cancel", cmd_cancel},       {"retry", cmd_retry},       {"ls", cmd_ls},
    {"queues", cmd_queues},       {"pause", cmd_pause},       {"resume", cmd_resume},
    {"message", cmd_message},     {"handlers", cmd_handlers}, {"work", cmd_work},
    {"schedules", cmd_schedules},
};

int main(int argc, char **argv)
{
    jd_cli.url = getenv("JACKDAW_URL");
    if (!jd_cli.url || !*jd_cli.url)
        jd_cli.url = "http://127.0.0.1:8080";
    jd_cli.token = getenv("JACKDAW_TOKEN");
    int i = 1;
    /* Global options come before the command; --json may also follow it. */
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (jd_cli_is_help(argv[i]))
            return jd_cli_usage(usage_main, 1);
        if (strcmp(argv[i], "--json") == 0)
            jd_cli_json = 1;
        else if (strcmp(argv[i], "--url") == 0 && i + 1 < argc)
            jd_cli.url = argv[++i];
        else if (strcmp(argv[i], "--token") == 0 && i + 1 < argc)
            jd_cli.token = argv[++i];
        else
            return jd_cli_usage(usage_main, 0);
    }
    if (i >= argc)
        return jd_cli_usage(usage_main, 0);
    /* Take --json/--url/--token out of the command's own arguments. */
    int n = 0;
    char **args = jd_xcalloc((size_t)(argc - i + 1), sizeof *args);
    for (int k = i; k < argc; k++) {
        if (strcmp(argv[k], "--") == 0) { /* the rest is a program's (work) */
            while (k < argc)
                args[n++] = argv[k++];
            break;
        }
        if (strcmp(argv[k], "--json") == 0) {
            jd_cli_json = 1;
        } else if ((strcmp(argv[k], "--url") == 0 || strcmp(argv[k], "--token") == 0) &&
                   k + 1 < argc) {
            if (argv[k][2] == 'u')
                jd_cli.url = argv[k + 1];
            else
                jd_cli.token = argv[k + 1];
            k++;
        } else {
            args[n++] = argv[k];
        }
    }
    /* No trailing slash, so paths join cleanly. */
    char *url = jd_xstrdup(jd_cli.url);
    size_t ul = strlen(url);
    while (ul > 0 && url[ul - 1] == '/')
        url[--ul] = '\0';
    jd_cli.url = url;
    int ex = -1;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    for (size_t c = 0; c < sizeof commands / sizeof *commands; c++)
        if (strcmp(args[0], commands[c].name) == 0)
            ex = commands[c].fn(n, args);
    if (ex < 0) {
        fprintf(stderr, "jackdaw: unknown command \"%s\"\n", args[0]);
        ex = jd_cli_usage(usage_main, 0);
    }
    curl_global_cleanup();
    free(args);
    free(url);
    return ex;
}
