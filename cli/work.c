/*
 * jackdaw work: a generic worker for the task routes of issue 13. It claims
 * tasks of one command (long-poll), runs PROGRAM once per task with the
 * task's args as JSON on stdin, and reports its stdout as the result (JSON
 * when it parses, else the text as a JSON string) or its non-zero exit as a
 * failure (75, EX_TEMPFAIL, is retryable; other codes are not; the tail of
 * stderr goes into the message). A task's "traceparent" (W3C trace context
 * of its job) is the program's TRACEPARENT variable.
 *
 * Concurrency: a small pool of threads, one per slot (--concurrency). Each
 * slot is a plain loop (claim one, spawn, poll the child's pipes with the
 * heartbeat as the poll timeout, report), which keeps a task's whole state in
 * one stack frame; N is small (a worker runs programs, not thousands of
 * coroutines), so a thread per slot costs nothing that a curl-multi event
 * loop would save, and it is far easier to read. Children are started with
 * posix_spawnp (safe from threads, no fork of a multi-threaded heap).
 *
 * Signals: SIGTERM/SIGINT are blocked in every thread; the main thread takes
 * them with sigwait and sets `stopping` (release: the slots read it with
 * acquire). A slot stops claiming, finishes its running task, and returns;
 * a claim is a long-poll of at most JD_WORK_CLAIM_WAIT_MS, which bounds how
 * long a drain waits for an idle slot.
 *
 * Retries: a heartbeat, complete or fail that gets no answer (a restarting
 * server) or a 5xx (in a cluster, 503 with Retry-After: the node that owns
 * the task did not answer) is tried again after the server's Retry-After, or
 * else a jittered pause from 250 ms doubling to 8 s (both capped at 8 s),
 * until the task's lease would have run out: then the task is coming back
 * as attempt + 1 anyway, so the slot logs it and moves on. A 4xx (409: the
 * task is no longer ours) is final. The lease's end is measured on this
 * host's monotonic clock from when the claim answered (then from each
 * heartbeat that was answered): no parse of lease_expires_at, and no trust
 * in the two hosts' wall clocks agreeing.
 */
#include "cli/work.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"

extern char **environ;

#define JD_WORK_CLAIM_WAIT_MS 5000 /* long-poll per claim; also the drain bound for idle slots */
#define JD_WORK_STDERR_TAIL 2048   /* enough for a traceback's last lines */
#define JD_WORK_KILL_GRACE_MS 5000 /* SIGTERM, then SIGKILL after this */
#define JD_WORK_RETRY_MIN_MS 250   /* first pause after a failed report */
#define JD_WORK_RETRY_MAX_MS 8000  /* longest pause, Retry-After included */

static atomic_int stopping;

struct work_cfg {
    const struct jd_cli_conn *conn;
    const char *command;
    int64_t lease_ms;
    char **prog;
    char worker[128];
};

static int64_t now_ms(void)
{
    return (int64_t)(jd_now_ns() / 1000000);
}

/* POST a JSON object; returns the HTTP status (0: no answer). Frees body. */
static long post(const struct work_cfg *w, const char *path, cJSON *body, long timeout_s,
                 struct jd_cli_resp *r)
{
    char *b = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    jd_cli_request(w->conn, "POST", path, b, timeout_s, r);
    free(b);
    return r->status;
}

/* Worth another try: no answer at all, or a 5xx (503: not now). */
static int retryable(long st)
{
    return st == 0 || st >= 500;
}

/* The pause before the next try: the answer's Retry-After when it has one,
 * else *backoff jittered to between half and all of it (so a fleet does not
 * come back in step), which then doubles; capped at JD_WORK_RETRY_MAX_MS. */
static int64_t retry_pause(const struct jd_cli_resp *r, int64_t *backoff)
{
    int64_t p;
    if (r->status && r->retry_after_s > 0) {
        p = (int64_t)r->retry_after_s * 1000;
    } else {
        p = *backoff / 2 + (int64_t)(jd_now_ns() % (uint64_t)(*backoff / 2 + 1));
        *backoff = *backoff * 2 < JD_WORK_RETRY_MAX_MS ? *backoff * 2 : JD_WORK_RETRY_MAX_MS;
    }
    return p < JD_WORK_RETRY_MAX_MS ? p : JD_WORK_RETRY_MAX_MS;
}

cJSON *jd_work_result(const char *out, size_t len)
{
    cJSON *j = cJSON_ParseWithLength(out, len);
    if (j)
        return j;
    /* Text: wrapped as a string, one trailing newline dropped. */
    char *t = jd_xstrndup(out, len);
    size_t n = strlen(t);
    if (n && t[n - 1] == '\n')
        t[n - 1] = '\0';
    j = cJSON_CreateString(t);
    free(t);
    return j;
}

struct run {
    char *out;
    size_t out_len, out_cap;
    int out_over;
    char tail[JD_WORK_STDERR_TAIL];
    size_t tail_len;
    int status;        /* waitpid status */
    int abandoned;     /* the server said the task is no longer ours */
    int64_t lease_end; /* now_ms() by which the lease runs out, if not renewed */
};

static void tail_add(struct run *r, const char *d, size_t n)
{
    if (n >= sizeof r->tail) {
        memcpy(r->tail, d + n - sizeof r->tail + 1, sizeof r->tail - 1);
        r->tail_len = sizeof r->tail - 1;
        return;
    }
    if (r->tail_len + n >= sizeof r->tail) {
        size_t drop = r->tail_len + n - (sizeof r->tail - 1);
        memmove(r->tail, r->tail + drop, r->tail_len - drop);
        r->tail_len -= drop;
    }
    memcpy(r->tail + r->tail_len, d, n);
    r->tail_len += n;
}

static void out_add(struct run *r, const char *d, size_t n)
{
    if (r->out_over || r->out_len + n > JD_CLI_BODY_MAX) {
        r->out_over = 1; /* keep draining the pipe, keep nothing */
        return;
    }
    if (r->out_len + n + 1 > r->out_cap) {
        r->out_cap = (r->out_len + n + 1) * 2;
        r->out = jd_xrealloc(r->out, r->out_cap);
    }
    memcpy(r->out + r->out_len, d, n);
    r->out_len += n;
}

/* The program's environment: the task's key, attempt and job first (getenv
 * takes the first match, so ours win over inherited ones), the task's W3C
 * trace context as TRACEPARENT when it has one, then ours without any
 * inherited TRACEPARENT (the program's parent span is its job's, never one
 * this worker inherited). Returns a NULL-ended array of strings; free with
 * env_free. */
static char **task_env(const cJSON *t)
{
    size_t n = 0, k = 3;
    while (environ[n])
        n++;
    char **env = jd_xcalloc(n + 5, sizeof *env);
    const char *key = cJSON_GetStringValue(cJSON_GetObjectItem(t, "idempotency_key"));
    const char *job = cJSON_GetStringValue(cJSON_GetObjectItem(t, "job_id"));
    const char *tp = cJSON_GetStringValue(cJSON_GetObjectItem(t, "traceparent"));
    const cJSON *att = cJSON_GetObjectItem(t, "attempt");
    env[0] = jd_xasprintf("JACKDAW_IDEMPOTENCY_KEY=%s", key ? key : "");
    env[1] = jd_xasprintf("JACKDAW_ATTEMPT=%d", cJSON_IsNumber(att) ? att->valueint : 0);
    env[2] = jd_xasprintf("JACKDAW_JOB_ID=%s", job ? job : "");
    if (tp)
        env[k++] = jd_xasprintf("TRACEPARENT=%s", tp);
    for (size_t i = 0; i < n; i++) /* borrowed; env_free keeps them */
        if (strncmp(environ[i], "TRACEPARENT=", 12) != 0)
            env[k++] = environ[i];
    return env;
}

static void env_free(char **env)
{
    for (int k = 0; k < 3; k++)
        free(env[k]);
    if (env[3] && strncmp(env[3], "TRACEPARENT=", 12) == 0) /* ours: inherited ones were left out */
        free(env[3]);
    free(env);
}

/* Run the program for one task, heartbeating; fills r. Returns 0, or -1 when
 * the program could not be started (r->tail says why). */
static int run_task(const struct work_cfg *w, const char *tid, const char *args, char **env,
                    struct run *r)
{
    int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    int ret = -1;
    pid_t pid = -1;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC))
        goto fail;
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
    int e = posix_spawnp(&pid, w->prog[0], &fa, &at, w->prog, env);
    if (e != 0) {
        r->tail_len =
            (size_t)snprintf(r->tail, sizeof r->tail, "cannot run %s: %s", w->prog[0], strerror(e));
        pid = -1;
        goto fail;
    }
    close(in[0]), close(out[1]), close(err[1]);
    in[0] = out[1] = err[1] = -1;
    fcntl(in[1], F_SETFL, O_NONBLOCK);
    size_t args_len = strlen(args), args_off = 0;
    int64_t every = w->lease_ms / 3 > 0 ? w->lease_ms / 3 : 1;
    int64_t next_hb = now_ms() + every, kill_at = 0;
    int64_t hb_backoff = JD_WORK_RETRY_MIN_MS;
    int hb_failing = 0; /* 1: the last heartbeat got no answer or a 5xx; 2: and the lease ran out */
    char *hb_path = jd_xasprintf("/v1/tasks/%s/heartbeat", tid);
    while (out[0] >= 0 || err[0] >= 0) {
        struct pollfd p[3] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}, {in[1], POLLOUT, 0}};
        int64_t wait = next_hb - now_ms();
        if (kill_at && kill_at - now_ms() < wait)
            wait = kill_at - now_ms();
        poll(p, 3, wait > 0 ? (int)wait : 0);
        char buf[65536];
        for (int k = 0; k < 2; k++) {
            if (p[k].fd < 0 || !(p[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t n = read(p[k].fd, buf, sizeof buf);
            if (n > 0) {
                k == 0 ? out_add(r, buf, (size_t)n) : tail_add(r, buf, (size_t)n);
            } else if (n == 0 || errno != EINTR) {
                close(p[k].fd);
                *(k == 0 ? &out[0] : &err[0]) = -1;
            }
        }
        if (in[1] >= 0 && (p[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t n = write(in[1], args + args_off, args_len - args_off);
            if (n > 0)
                args_off += (size_t)n;
            if (n < 0 && errno != EAGAIN && errno != EINTR)
                args_off = args_len; /* the program closed stdin: fine */
            if (args_off == args_len) {
                close(in[1]);
                in[1] = -1;
            }
        }
        if (kill_at && now_ms() >= kill_at) {
            kill(-pid, SIGKILL);
            kill_at = 0;
        }
        if (now_ms() >= next_hb) {
            int64_t sent = now_ms();
            next_hb = sent + every;
            cJSON *b = cJSON_CreateObject();
            cJSON_AddNumberToObject(b, "lease_ms", (double)w->lease_ms);
            struct jd_cli_resp hr;
            long st = post(w, hb_path, b, every / 1000 + 5, &hr);
            if (st >= 200 && st < 300) {
                r->lease_end = sent + w->lease_ms; /* the server renewed it after we sent */
                hb_backoff = JD_WORK_RETRY_MIN_MS;
                hb_failing = 0;
            } else if (retryable(st) && hb_failing < 2 && now_ms() < r->lease_end) {
                if (!hb_failing)
                    fprintf(stderr, "jackdaw work: task %s: heartbeat answered %ld %s; retrying\n",
                            tid, st, st ? hr.body : hr.err);
                hb_failing = 1;
                int64_t retry_at = now_ms() + retry_pause(&hr, &hb_backoff);
                if (retry_at > r->lease_end)
                    retry_at = r->lease_end;
                if (retry_at < next_hb)
                    next_hb = retry_at;
            } else if (retryable(st) && hb_failing < 2) {
                fprintf(stderr,
                        "jackdaw work: task %s: no heartbeat answered before its lease ran out "
                        "(last: %ld); it may come back as the next attempt\n",
                        tid, st);
                hb_failing = 2; /* back to one try per third of the lease */
            }
            if (st == 409 && !r->abandoned) {
                /* Cancelled, lease lost or already done: the task is no
                 * longer ours; stop the program and report nothing. */
                fprintf(stderr, "jackdaw work: task %s: %s; stopping its program\n", tid,
                        strstr(hr.body, "cancelled") ? "job cancelled" : "no longer ours");
                r->abandoned = 1;
                kill(-pid, SIGTERM);
                kill_at = now_ms() + JD_WORK_KILL_GRACE_MS;
            }
            free(hr.body);
        }
    }
    free(hb_path);
    while (waitpid(pid, &r->status, 0) < 0 && errno == EINTR)
        ;
    ret = 0;
fail:
    for (int k = 0; k < 2; k++) {
        if (in[k] >= 0)
            close(in[k]);
        if (out[k] >= 0)
            close(out[k]);
        if (err[k] >= 0)
            close(err[k]);
    }
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    return ret;
}

static void report_task(const struct work_cfg *w, const char *tid, struct run *r, int started)
{
    cJSON *b = cJSON_CreateObject();
    char *path;
    int ok = started && WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0 && !r->out_over;
    if (ok) {
        cJSON_AddItemToObject(b, "result", jd_work_result(r->out ? r->out : "", r->out_len));
        path = jd_xasprintf("/v1/tasks/%s/complete", tid);
    } else {
        char msg[JD_WORK_STDERR_TAIL + 128];
        int retry = started && WIFEXITED(r->status) && WEXITSTATUS(r->status) == 75;
        const char *kind = !started ? "spawn" : r->out_over ? "output_too_large" : "exit";
        if (!started)
            snprintf(msg, sizeof msg, "%.*s", (int)r->tail_len, r->tail);
        else if (r->out_over)
            snprintf(msg, sizeof msg, "output larger than %u bytes", JD_CLI_BODY_MAX);
        else if (WIFEXITED(r->status))
            snprintf(msg, sizeof msg, "exit %d: %.*s", WEXITSTATUS(r->status), (int)r->tail_len,
                     r->tail);
        else
            snprintf(msg, sizeof msg, "killed by signal %d: %.*s", WTERMSIG(r->status),
                     (int)r->tail_len, r->tail);
        cJSON *e = cJSON_AddObjectToObject(b, "error");
        cJSON_AddStringToObject(e, "message", msg);
        cJSON_AddStringToObject(e, "kind", kind);
        cJSON_AddBoolToObject(e, "retryable", retry);
        path = jd_xasprintf("/v1/tasks/%s/fail", tid);
    }
    /* Tried at least once; again after a retryable answer while the lease
     * lasts (the last try is at its end). */
    char *body = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    int64_t backoff = JD_WORK_RETRY_MIN_MS;
    for (int tries = 1;; tries++) {
        struct jd_cli_resp resp;
        int64_t left = r->lease_end - now_ms();
        long timeout_s = left / 1000 + 5 < 60 ? left / 1000 + 5 : 60;
        jd_cli_request(w->conn, "POST", path, body, timeout_s > 5 ? timeout_s : 5, &resp);
        long st = resp.status;
        if (st >= 200 && st < 300) {
            if (tries > 1)
                fprintf(stderr, "jackdaw work: task %s: reported on try %d\n", tid, tries);
            free(resp.body);
            break;
        }
        int again = retryable(st) && now_ms() < r->lease_end;
        fprintf(stderr, "jackdaw work: task %s: reporting it answered %ld %s%s\n", tid, st,
                st ? resp.body : resp.err,
                again           ? " (retrying)"
                : retryable(st) ? " (giving up: its lease has run out; it may come back as the "
                                  "next attempt)"
                                : "");
        int64_t p = again ? retry_pause(&resp, &backoff) : 0;
        free(resp.body);
        if (!again)
            break;
        left = r->lease_end - now_ms();
        p = p < left ? p : left;
        if (p > 0)
            usleep((useconds_t)(p * 1000));
    }
    free(body);
    free(path);
}

static void *slot_main(void *arg)
{
    const struct work_cfg *w = arg;
    char *claim_path = "/v1/tasks/claim";
    while (!atomic_load_explicit(&stopping, memory_order_acquire)) {
        cJSON *b = cJSON_CreateObject();
        cJSON *cmds = cJSON_AddArrayToObject(b, "commands");
        cJSON_AddItemToArray(cmds, cJSON_CreateString(w->command));
        cJSON_AddStringToObject(b, "worker", w->worker);
        cJSON_AddNumberToObject(b, "max", 1);
        cJSON_AddNumberToObject(b, "wait_ms", JD_WORK_CLAIM_WAIT_MS);
        cJSON_AddNumberToObject(b, "lease_ms", (double)w->lease_ms);
        struct jd_cli_resp r;
        int64_t t0 = now_ms();
        long st = post(w, claim_path, b, JD_WORK_CLAIM_WAIT_MS / 1000 + 30, &r);
        int64_t t_ans = now_ms(); /* the lease began before this */
        cJSON *j = st == 200 ? cJSON_Parse(r.body) : NULL;
        if (st != 200) {
            fprintf(stderr, "jackdaw work: claim answered %ld %s\n", st, st ? r.body : r.err);
            free(r.body);
            sleep(1); /* the server is away or refusing: do not spin */
            continue;
        }
        free(r.body);
        /* An empty answer well before the long-poll ended (a server that
         * does not wait): pause, so the slot does not spin on it. */
        if (cJSON_GetArraySize(cJSON_GetObjectItem(j, "tasks")) == 0 && now_ms() - t0 < 1000)
            usleep(500 * 1000);
        const cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(j, "tasks"))
        {
            const char *tid = cJSON_GetStringValue(cJSON_GetObjectItem(t, "id"));
            if (!tid)
                continue;
            char *etid = jd_cli_escape(tid);
            const cJSON *a = cJSON_GetObjectItem(t, "args");
            char *args = a ? cJSON_PrintUnformatted(a) : jd_xstrdup("null");
            struct run run = {.lease_end = t_ans + w->lease_ms};
            char **env = task_env(t);
            int started = run_task(w, etid, args, env, &run) == 0;
            env_free(env);
            if (!run.abandoned)
                report_task(w, etid, &run, started);
            free(run.out);
            free(args);
            free(etid);
        }
        cJSON_Delete(j);
    }
    return NULL;
}

int jd_work_main(const struct jd_cli_conn *conn, int argc, char **argv)
{
    struct work_cfg w = {.conn = conn, .lease_ms = 60000};
    int conc = 1, i;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(jd_work_usage, stdout);
            return 0;
        }
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        if (i + 1 >= argc)
            goto usage;
        if (strcmp(argv[i], "--command") == 0) {
            w.command = argv[++i];
        } else if (strcmp(argv[i], "--concurrency") == 0) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 256)
                goto usage;
            conc = (int)n;
        } else if (strcmp(argv[i], "--lease") == 0) {
            if (jd_duration_parse(argv[++i], &w.lease_ms) != 0 || w.lease_ms < 1000)
                goto usage;
        } else {
            goto usage;
        }
    }
    if (!w.command || i >= argc)
        goto usage;
    w.prog = argv + i;
    char host[64] = "host";
    gethostname(host, sizeof host - 1);
    snprintf(w.worker, sizeof w.worker, "%s/%d", host, (int)getpid());

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_t *th = jd_xcalloc((size_t)conc, sizeof *th);
    for (int k = 0; k < conc; k++)
        pthread_create(&th[k], NULL, slot_main, &w);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "jackdaw work: %s: draining (finishing running tasks)\n", strsignal(sig));
    /* release: slots that see the flag stop claiming */
    atomic_store_explicit(&stopping, 1, memory_order_release);
    for (int k = 0; k < conc; k++)
        pthread_join(th[k], NULL);
    free(th);
    return 0;
usage:
    fputs(jd_work_usage, stderr);
    return 2;
}
