/*
 * Unit tests for the scheduler runtime (scheduler/sched*.c) and the step
 * helpers (scheduler/step.c): every process state transition, events and
 * their generations, kill and cancel, hooks, timers, the blocking pool and
 * shutdown. Test processes are small scripted state machines; the test
 * thread waits for their results with a condition variable (bounded waits,
 * so a lost wake-up fails the test instead of hanging it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "scheduler/sched.h"

#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- what the hooks saw ---- */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int nfinished;
static enum jd_step_status last_status;
static char last_result[256], last_error[256];
static jd_pid last_pid;
static struct jd_token tokens[16];
static int ntokens;
static int nstepped_wait, nstepped_idle;
static int nclosed;

/* The scheduler under test; on_dispatch reads it. Set before any spawn. */
static struct jd_sched *g_sched;

static void reset_seen(void)
{
    pthread_mutex_lock(&mu);
    nfinished = 0;
    ntokens = 0;
    nstepped_wait = nstepped_idle = 0;
    nclosed = 0;
    last_result[0] = last_error[0] = 0;
    pthread_mutex_unlock(&mu);
}

static void on_finished(void *ctx, jd_pid pid, void *user, enum jd_step_status st,
                        const char *result, const char *error)
{
    (void)ctx;
    (void)user;
    pthread_mutex_lock(&mu);
    nfinished++;
    last_status = st;
    last_pid = pid;
    snprintf(last_result, sizeof(last_result), "%s", result ? result : "");
    snprintf(last_error, sizeof(last_error), "%s", error ? error : "");
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void on_dispatch(void *ctx, jd_pid pid, void *user, const struct jd_yield *y,
                        struct jd_token tok)
{
    (void)pid;
    (void)user;
    (void)ctx;
    struct jd_sched *s = g_sched;
    if (y->command && strcmp(y->command, "echo") == 0) {
        /* completes at once, from inside dispatch */
        jd_sched_complete(s, tok, strdup(y->args ? y->args : "null"), NULL);
        return;
    }
    pthread_mutex_lock(&mu);
    if (ntokens < 16)
        tokens[ntokens++] = tok;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void on_stepped(void *ctx, jd_pid pid, void *user, enum jd_step_status st)
{
    (void)ctx;
    (void)pid;
    (void)user;
    pthread_mutex_lock(&mu);
    if (st == JD_STEP_WAIT)
        nstepped_wait++;
    if (st == JD_STEP_IDLE)
        nstepped_idle++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* Wait until *counter >= n (under mu), at most 5 s. */
static bool wait_for(int *counter, int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 5;
    pthread_mutex_lock(&mu);
    while (*counter < n)
        if (pthread_cond_timedwait(&cv, &mu, &ts) != 0)
            break;
    bool ok = *counter >= n;
    pthread_mutex_unlock(&mu);
    return ok;
}

static struct jd_sched *make(unsigned workers, bool dispatcher)
{
    reset_seen();
    struct jd_sched_config cfg = {.workers = workers, .blocking_threads = 2, .blocking_queue = 3};
    cfg.hooks.finished = on_finished;
    cfg.hooks.stepped = on_stepped;
    cfg.hooks.dispatch = dispatcher ? on_dispatch : NULL;
    assert_int_equal(jd_sched_create(&cfg, &g_sched), 0);
    return g_sched;
}

/* ---- a scripted test process ---- */
struct tp {
    int kind;
    int steps;
    sem_t *gate;    /* if set, step 2 waits on it (to be Running during an event) */
    sem_t *in_step; /* posted when step 2 starts */
    char log[512];  /* events seen: "c1:data;m42;x;" */
    int *closed;
    struct jd_sched *s;
};

static void tp_log(struct tp *t, const char *fmt, ...)
{
    size_t l = strlen(t->log);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->log + l, sizeof(t->log) - l, fmt, ap);
    va_end(ap);
}

static void log_events(struct tp *t, struct jd_event *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        switch (ev[i].type) {
        case JD_EVENT_YIELD_COMPLETE:
            tp_log(t, "c%u:%s%s;", ev[i].tag, ev[i].data ? ev[i].data : "",
                   ev[i].error ? ev[i].error : "");
            break;
        case JD_EVENT_MESSAGE:
            tp_log(t, "m%llu%s;", (unsigned long long)ev[i].value, ev[i].data ? ev[i].data : "");
            break;
        case JD_EVENT_CANCEL:
            tp_log(t, "x;");
            break;
        }
    }
}

enum {
    K_DONE,       /* DONE at once with {"ok":1} */
    K_IDLE_MSG,   /* IDLE until a message, then DONE with the log */
    K_WAIT_ECHO,  /* yield echo tag 1, WAIT; DONE with the log */
    K_WAIT_EXT,   /* yield "ext" tag 7, WAIT; then DONE with the log */
    K_RUNNING,    /* step1: yield ext tag 3 + CONTINUE; step2: gated, WAIT; step3: DONE log */
    K_CONTINUE,   /* CONTINUE 5 times, then DONE */
    K_FOREVER,    /* CONTINUE forever */
    K_CANCEL,     /* IDLE; on cancel DONE "cancelled" */
    K_GATED_IDLE, /* step 1 gated (Running), returns IDLE */
    K_WORKER,     /* DONE with the current worker index */
};

static int tp_init(void *self, const char *method, const char *input, struct jd_error *err)
{
    (void)self;
    (void)input;
    if (method && strcmp(method, "bad") == 0)
        return jd_error_set(err, JD_EINVAL, NULL, "unknown method \"%s\"", method);
    return 0;
}

static int tp_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    struct tp *t = self;
    t->steps++;
    log_events(t, ev, n);
    switch (t->kind) {
    case K_DONE:
        jd_step_done(out, "{\"ok\":1}");
        break;
    case K_IDLE_MSG:
        if (n == 0)
            out->status = JD_STEP_IDLE;
        else
            jd_step_done(out, t->log);
        break;
    case K_WAIT_ECHO:
        if (t->steps == 1) {
            jd_step_yield(out, 1, "echo", "\"hi\"", 0);
            out->status = JD_STEP_WAIT;
        } else {
            jd_step_done(out, t->log);
        }
        break;
    case K_WAIT_EXT:
        if (t->steps == 1) {
            jd_step_yield(out, 7, "ext", NULL, 0);
            out->status = JD_STEP_WAIT;
        } else {
            jd_step_done(out, t->log);
        }
        break;
    case K_RUNNING:
        if (t->steps == 1) {
            jd_step_yield(out, 3, "ext", NULL, 0);
            out->status = JD_STEP_CONTINUE;
        } else if (t->steps == 2) {
            sem_post(t->in_step);
            sem_wait(t->gate); /* the completion arrives while we are Running */
            out->status = JD_STEP_WAIT;
        } else {
            jd_step_done(out, t->log);
        }
        break;
    case K_CONTINUE:
        if (t->steps < 6)
            out->status = JD_STEP_CONTINUE;
        else
            jd_step_done(out, "\"five\"");
        break;
    case K_FOREVER:
        out->status = JD_STEP_CONTINUE;
        break;
    case K_CANCEL:
        for (size_t i = 0; i < n; i++)
            if (ev[i].type == JD_EVENT_CANCEL) {
                jd_step_fail(out, "{\"kind\":\"cancelled\"}");
                return 0;
            }
        out->status = JD_STEP_IDLE;
        break;
    case K_GATED_IDLE:
        if (t->steps == 1) {
            sem_post(t->in_step);
            sem_wait(t->gate);
        }
        out->status = JD_STEP_IDLE;
        break;
    case K_WORKER: {
        char buf[32];
        snprintf(buf, sizeof(buf), "%d", jd_sched_current_worker());
        jd_step_done(out, buf);
        break;
    }
    }
    return 0;
}

static void tp_close(void *self)
{
    struct tp *t = self;
    pthread_mutex_lock(&mu);
    nclosed++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    free(t);
}

static const struct jd_process_ops tp_ops = {
    .type_name = "test", .init = tp_init, .step = tp_step, .close = tp_close};

static struct tp *tp_new(int kind)
{
    struct tp *t = calloc(1, sizeof(*t));
    t->kind = kind;
    return t;
}

static jd_pid spawn(struct jd_sched *s, int kind)
{
    jd_pid pid = 0;
    assert_int_equal(jd_sched_spawn(s, &tp_ops, tp_new(kind), NULL, "run", NULL, &pid), 0);
    assert_true(pid != 0);
    return pid;
}

static void test_step_helpers(void **state)
{
    (void)state;
    struct jd_step_out out = {0};
    jd_step_yield(&out, 1, "a", "{}", 5);
    jd_step_yield(&out, 2, "b", NULL, 0);
    for (uint32_t i = 3; i < 20; i++)
        jd_step_yield(&out, i, "c", "[]", 0);
    assert_int_equal(out.nyields, 19);
    assert_string_equal(out.yields[0].command, "a");
    assert_string_equal(out.yields[0].args, "{}");
    assert_int_equal(out.yields[0].timeout_ms, 5);
    assert_null(out.yields[1].args);
    jd_step_done(&out, "1");
    assert_int_equal(out.status, JD_STEP_DONE);
    assert_string_equal(out.result, "1");
    jd_step_fail(&out, "{\"e\":1}");
    assert_int_equal(out.status, JD_STEP_FAIL);
    assert_null(out.result);
    assert_string_equal(out.error, "{\"e\":1}");
    jd_step_done_take(&out, strdup("2"));
    assert_null(out.error);
    jd_step_out_reset(&out);
    assert_int_equal(out.status, JD_STEP_CONTINUE);
    assert_int_equal(out.nyields, 0);
    assert_null(out.result);
    free(out.yields);
}

static void test_spawn_done_and_close(void **state)
{
    (void)state;
    struct jd_sched *s = make(2, false);
    jd_pid pid = spawn(s, K_DONE);
    assert_true(wait_for(&nfinished, 1));
    assert_int_equal(last_status, JD_STEP_DONE);
    assert_string_equal(last_result, "{\"ok\":1}");
    assert_true(last_pid == pid);
    assert_true(wait_for(&nclosed, 1));
    /* the pid is gone now */
    assert_int_equal(jd_sched_send(s, pid, 1, NULL), JD_ENOENT);
    assert_int_equal(jd_sched_kill(s, pid, NULL), JD_ENOENT);
    assert_int_equal(jd_sched_cancel(s, pid), JD_ENOENT);
    assert_int_equal(jd_sched_send(s, 0, 1, NULL), JD_ENOENT);
    assert_int_equal(jd_sched_send(s, (jd_pid)1 << 32 | 0xfffffff, 1, strdup("x")), JD_ENOENT);
    jd_sched_destroy(s);
}

static void test_init_failure(void **state)
{
    (void)state;
    struct jd_sched *s = make(1, false);
    struct tp *t = tp_new(K_DONE);
    jd_pid pid;
    assert_int_equal(jd_sched_spawn(s, &tp_ops, t, NULL, "bad", "{}", &pid), 0);
    assert_true(wait_for(&nfinished, 1));
    assert_int_equal(last_status, JD_STEP_FAIL);
    assert_non_null(strstr(last_error, "init_failed"));
    assert_non_null(strstr(last_error, "unknown method \\\"bad\\\""));
    assert_true(wait_for(&nclosed, 1));
    jd_sched_destroy(s);
}

static void test_message_to_idle(void **state)
{
    (void)state;
    struct jd_sched *s = make(2, false);
    jd_pid pid = spawn(s, K_IDLE_MSG);
    assert_true(wait_for(&nstepped_idle, 1));
    assert_int_equal(jd_sched_send(s, pid, 42, strdup("\"x\"")), 0);
    assert_true(wait_for(&nfinished, 1));
    assert_string_equal(last_result, "m42\"x\";");
    jd_sched_destroy(s);
}

static void test_message_before_first_step(void **state)
{
    (void)state;
    struct jd_sched *s = make(1, false);
    /* a message sent right after spawn is delivered with the first step */
    jd_pid pid = spawn(s, K_IDLE_MSG);
    assert_int_equal(jd_sched_send(s, pid, 7, NULL), 0);
    assert_true(wait_for(&nfinished, 1));
    assert_string_equal(last_result, "m7;");
    jd_sched_destroy(s);
}

static void test_yield_completed_in_dispatch(void **state)
{
    (void)state;
    struct jd_sched *s = make(2, true);
    spawn(s, K_WAIT_ECHO);
    assert_true(wait_for(&nfinished, 1));
    assert_int_equal(last_status, JD_STEP_DONE);
    assert_string_equal(last_result, "c1:\"hi\";");
    assert_int_equal(nstepped_wait, 1);
    jd_sched_destroy(s);
}

static void test_no_dispatcher_fails_yields(void **state)
{
    (void)state;
    struct jd_sched *s = make(1, false);
    spawn(s, K_WAIT_ECHO);
    assert_true(wait_for(&nfinished, 1));
    assert_string_equal(last_result, "c1:{\"kind\":\"no_dispatcher\"};");
    jd_sched_destroy(s);
}

static void test_completion_from_outside_and_duplicate(void **state)
{
    (void)state;
    struct jd_sched *s = make(2, true);
    spawn(s, K_WAIT_EXT);
    assert_true(wait_for(&ntokens, 1));
    struct jd_token tok = tokens[0];
    assert_int_equal(tok.tag, 7);
    struct jd_sched_stats st;
    jd_sched_stats(s, &st);
    assert_int_equal(st.blocked, 1);
    /* a token naming an older generation of the same slot is dropped */
    struct jd_token stale = {.pid = tok.pid - ((jd_pid)1 << 32), .tag = 7};
    assert_int_equal(jd_sched_complete(s, stale, strdup("\"old\""), NULL), JD_ESTALE);
    assert_int_equal(jd_sched_complete(s, tok, strdup("\"r\""), NULL), 0);
    assert_true(wait_for(&nfinished, 1));
    assert_string_equal(last_result, "c7:\"r\";");
    /* the process is gone: a second completion is stale */
    assert_int_equal(jd_sched_complete(s, tok, strdup("\"again\""), strdup("{}")), JD_ESTALE);
    jd_sched_stats(s, &st);
    assert_true(st.stale_dropped >= 2);
    assert_int_equal(st.blocked, 0);
    jd_sched_destroy(s);
}

static void test_duplicate_completion_delivered_once(void **state)
{
    (void)state;
    struct jd_sched *s = make(1, true);
    jd_pid pid = spawn(s, K_IDLE_MSG);
    (void)pid;
    /* K_WAIT_EXT waits for tag 7; complete it twice before it can run:
     * exactly one completion is delivered */
    jd_pid p2 = spawn(s, K_WAIT_EXT);
    assert_true(wait_for(&ntokens, 1));
    struct jd_token tok = tokens[0];
    assert_true(tok.pid == p2);
    assert_int_equal(jd_sched_complete(s, tok, strdup("1"), NULL), 0);
    int rc2 = jd_sched_complete(s, tok, strdup("2"), NULL); /* 0 or JD_ESTALE: raced */
    assert_true(rc2 == 0 || rc2 == JD_ESTALE);
    assert_true(wait_for(&nfinished, 1));
    assert_string_equal(last_result, "c7:1;");
    /* Refused at once, the duplicate is counted at once. Accepted (0), it is
     * counted when dropped: by the process, by its finish, or, if it landed
     * just as the process finished, when the freed slot is reused, which
     * may be after this reads the stats. */
    if (rc2 == JD_ESTALE) {
        struct jd_sched_stats st;
        jd_sched_stats(s, &st);
        assert_true(st.stale_dropped >= 1);
    }
    jd_sched_destroy(s);
}

static void test_completion_while_running_not_lost(void **state)
{
    (void)state;
    struct jd_sched *s = make(2, true);
    sem_t gate, in_step;
    sem_init(&gate, 0, 0);
    sem_init(&in_step, 0, 0);
    struct tp *t = tp_new(K_RUNNING);
    t->gate = &gate;
    t->in_step = &in_step;
    jd_pid pid;
    assert_int_equal(jd_sched_spawn(s, &tp_ops, t, NULL, NULL, NULL, &pid), 0);
    assert_true(wait_for(&ntokens, 1));
    sem_wait(&in_step); /* step 2 is running now */
    struct jd_sched_stats st;
    jd_sched_stats(s, &st);
    assert_int_equal(st.running, 1);
    assert_int_equal(jd_sched_complete(s, tokens[0], strdup("\"late\""), NULL), 0);
    sem_post(&gate); /* step 2 returns WAIT: the completion must wake it */
    assert_true(wait_for(&nfinished, 1));
    assert_string_equal(last_result, "c3:\"late\";");
    sem_destroy(&gate);
    sem_destroy(&in_step);
    jd_sched_destroy(s);
}

static void test_message_while_running_then_idle(void **state)
{
    (void)state;
    struct jd_sched *s = make(2, false);
    sem_t gate, in_step;
    sem_init(&gate, 0, 0);
    sem_init(&in_step, 0, 0);
    struct tp *t = tp_new(K_GATED_IDLE);
    t->gate = &gate;
    t->in_step = &in_step;
    jd_pid pid;
    assert_int_equal(jd_sched_spawn(s, &tp_ops, t, NULL, NULL, NULL, &pid), 0);
    sem_wait(&in_step);
    assert_int_equal(jd_sched_send(s, pid, 5, NULL), 0);
    sem_post(&gate); /* returns IDLE with a message pending: it must run again */
    assert_true(wait_for(&nstepped_idle, 2));
    struct jd_sched_stats st;
    jd_sched_stats(s, &st);
    assert_true(st.steps >= 2);
    assert_int_equal(jd_sched_kill(s, pid, "{\"kind\":\"test\"}"), 0);
    assert_true(wait_for(&nfinished, 1));
    jd_sched_destroy(s);
}

static void test_message_to_blocked(void **state)
{
    (void)state;
    struct jd_sched *s = make(2, true);
    jd_pid pid = spawn(s, K_WAIT_EXT);
    assert_true(wait_for(&ntokens, 1));
    assert_int_equal(jd_sched_send(s, pid, 9, NULL), 0);
    assert_true(wait_for(&nfinished, 1));
    assert_string_equal(last_result, "m9;");
    /* the yield's completion now finds the process gone */
    assert_int_equal(jd_sched_complete(s, tokens[0], NULL, NULL), JD_ESTALE);
    jd_sched_destroy(s);
}

static void test_cancel_event(void **state)
{
    (void)state;
    struct jd_sched *s = make(2, false);
    jd_pid pid = spawn(s, K_CANCEL);
    assert_true(wait_for(&nstepped_idle, 1));
    assert_int_equal(jd_sched_cancel(s, pid), 0);
    assert_true(wait_for(&nfinished, 1));
    assert_int_equal(last_status, JD_STEP_FAIL);
    assert_string_equal(last_error, "{\"kind\":\"cancelled\"}");
    assert_int_equal(jd_sched_cancel(s, pid), JD_ENOENT);
    jd_sched_destroy(s);
}

static void test_kill_idle_and_running(void **state)
{
    (void)state;
    struct jd_sched *s = make(2, false);
    jd_pid pid = spawn(s, K_IDLE_MSG);
    assert_true(wait_for(&nstepped_idle, 1));
    assert_int_equal(jd_sched_kill(s, pid, "{\"kind\":\"killed\",\"why\":\"t\"}"), 0);
    assert_true(wait_for(&nfinished, 1));
    assert_int_equal(last_status, JD_STEP_FAIL);
    assert_string_equal(last_error, "{\"kind\":\"killed\",\"why\":\"t\"}");
    assert_true(wait_for(&nclosed, 1));
    assert_int_equal(jd_sched_kill(s, pid, NULL), JD_ENOENT);

    /* kill while Running: no further step after the current one */
    sem_t gate, in_step;
    sem_init(&gate, 0, 0);
    sem_init(&in_step, 0, 0);
    struct tp *t = tp_new(K_GATED_IDLE);
    t->gate = &gate;
    t->in_step = &in_step;
    assert_int_equal(jd_sched_spawn(s, &tp_ops, t, NULL, NULL, NULL, &pid), 0);
    sem_wait(&in_step);
    assert_int_equal(jd_sched_send(s, pid, 1, NULL), 0);
    assert_int_equal(jd_sched_kill(s, pid, NULL), 0);
    sem_post(&gate);
    assert_true(wait_for(&nfinished, 2));
    assert_int_equal(last_status, JD_STEP_FAIL);
    assert_string_equal(last_error, "{\"kind\":\"killed\"}");
    assert_int_equal(nstepped_idle, 2); /* the step that returned IDLE was the last */
    sem_destroy(&gate);
    sem_destroy(&in_step);
    jd_sched_destroy(s);
}

static void test_kill_ready_process(void **state)
{
    (void)state;
    struct jd_sched *s = make(2, false);
    /* it is Ready (queued) or Running at any moment: kill still ends it */
    jd_pid pid = spawn(s, K_FOREVER);
    assert_int_equal(jd_sched_kill(s, pid, "{\"kind\":\"stop\"}"), 0);
    assert_true(wait_for(&nfinished, 1));
    assert_int_equal(last_status, JD_STEP_FAIL);
    assert_string_equal(last_error, "{\"kind\":\"stop\"}");
    assert_true(wait_for(&nclosed, 1));
    assert_int_equal(jd_sched_kill(s, pid, NULL), JD_ENOENT);
    jd_sched_destroy(s);
}

static jd_pid self_seen;
static int self_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    (void)ev;
    (void)n;
    self_seen = jd_sched_self();
    jd_step_done(out, NULL);
    return 0;
}
static const struct jd_process_ops self_ops = {.step = self_step};

static void test_self_pid(void **state)
{
    (void)state;
    struct jd_sched *s = make(1, false);
    assert_true(jd_sched_self() == 0);
    jd_pid pid;
    assert_int_equal(jd_sched_spawn(s, &self_ops, NULL, NULL, NULL, NULL, &pid), 0);
    assert_true(wait_for(&nfinished, 1));
    assert_true(self_seen == pid);
    jd_sched_destroy(s);
}

static void test_continue_and_worker_index(void **state)
{
    (void)state;
    struct jd_sched *s = make(2, false);
    assert_int_equal(jd_sched_workers(s), 2);
    assert_int_equal(jd_sched_current_worker(), -1);
    spawn(s, K_CONTINUE);
    assert_true(wait_for(&nfinished, 1));
    assert_string_equal(last_result, "\"five\"");
    spawn(s, K_WORKER);
    assert_true(wait_for(&nfinished, 2));
    int wi = atoi(last_result);
    assert_true(wi == 0 || wi == 1);
    struct jd_sched_stats st;
    jd_sched_stats(s, &st);
    assert_int_equal(st.spawns, 2);
    assert_int_equal(st.completions, 2);
    assert_int_equal(st.steps, 7);
    assert_int_equal(st.workers, 2);
    jd_sched_destroy(s);
}

/* ---- timers ---- */
static _Atomic int fired;
static void on_timer(void *arg)
{
    atomic_fetch_add((_Atomic int *)arg, 1);
    pthread_mutex_lock(&mu);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void test_timers_fire_and_cancel(void **state)
{
    (void)state;
    struct jd_sched *s = make(1, false);
    atomic_store(&fired, 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t id1, id2, id3;
    assert_int_equal(jd_sched_timer_after(s, 30000000, on_timer, (void *)&fired, &id1), 0);
    assert_int_equal(jd_sched_timer_after(s, 10000000, on_timer, (void *)&fired, &id2), 0);
    assert_int_equal(jd_sched_timer_after(s, 20000000, on_timer, (void *)&fired, &id3), 0);
    assert_int_equal(jd_sched_timer_cancel(s, id3), 0);
    assert_int_equal(jd_sched_timer_cancel(s, id3), JD_ENOENT);
    struct jd_sched_stats st;
    jd_sched_stats(s, &st);
    assert_int_equal(st.timers_pending, 2);
    for (int i = 0; i < 2500 && atomic_load(&fired) < 2; i++) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(atomic_load(&fired), 2);
    long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    assert_true(ms >= 30);
    assert_int_equal(jd_sched_timer_cancel(s, id1), JD_ENOENT); /* already fired */
    assert_int_equal(jd_sched_timer_cancel(s, 987654), JD_ENOENT);
    /* one pending at shutdown is reported, not fired */
    assert_int_equal(jd_sched_timer_after(s, 10000000000ull, on_timer, (void *)&fired, NULL), 0);
    struct jd_sched_pending pd;
    assert_int_equal(jd_sched_shutdown(s, 0, &pd), 0);
    assert_int_equal(pd.timers, 1);
    assert_int_equal(atomic_load(&fired), 2);
    assert_int_equal(jd_sched_timer_after(s, 1, on_timer, (void *)&fired, NULL), JD_ESHUTDOWN);
    jd_sched_destroy(s);
}

/* ---- blocking pool ---- */
static sem_t bgate;
static _Atomic int bactive, bmax, bdone;
static void blocking_job(void *arg)
{
    (void)arg;
    int a = atomic_fetch_add(&bactive, 1) + 1;
    int m = atomic_load(&bmax);
    while (a > m && !atomic_compare_exchange_weak(&bmax, &m, a))
        ;
    assert_int_not_equal(jd_sched_current_worker(), 0); /* never on a worker */
    sem_wait(&bgate);
    atomic_fetch_sub(&bactive, 1);
    atomic_fetch_add(&bdone, 1);
}

static void test_blocking_pool_bound(void **state)
{
    (void)state;
    struct jd_sched *s = make(1, false); /* 2 threads, queue of 3 */
    sem_init(&bgate, 0, 0);
    atomic_store(&bactive, 0);
    atomic_store(&bmax, 0);
    atomic_store(&bdone, 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(jd_sched_run_blocking(s, blocking_job, NULL), 0);
    /* wait until both run, so the queue is empty */
    for (int i = 0; i < 5000 && atomic_load(&bactive) < 2; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(atomic_load(&bactive), 2);
    for (int i = 0; i < 3; i++)
        assert_int_equal(jd_sched_run_blocking(s, blocking_job, NULL), 0);
    assert_int_equal(jd_sched_run_blocking(s, blocking_job, NULL), JD_EFULL);
    struct jd_sched_stats st;
    jd_sched_stats(s, &st);
    assert_int_equal(st.blocking_active, 2);
    assert_int_equal(st.blocking_queued, 3);
    for (int i = 0; i < 5; i++)
        sem_post(&bgate);
    for (int i = 0; i < 5000 && atomic_load(&bdone) < 5; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(atomic_load(&bdone), 5);
    assert_int_equal(atomic_load(&bmax), 2);
    jd_sched_destroy(s);
    assert_int_equal(jd_sched_run_blocking(NULL, blocking_job, NULL), JD_EINVAL);
    sem_destroy(&bgate);
}

/* ---- shutdown ---- */
static void test_shutdown_with_pending_work(void **state)
{
    (void)state;
    struct jd_sched *s = make(2, true);
    for (int i = 0; i < 3; i++)
        spawn(s, K_IDLE_MSG);
    spawn(s, K_WAIT_EXT);
    assert_true(wait_for(&nstepped_idle, 3));
    assert_true(wait_for(&nstepped_wait, 1));
    struct jd_sched_pending pd;
    assert_int_equal(jd_sched_shutdown(s, 50000000, &pd), 0);
    assert_int_equal(pd.idle, 3);
    assert_int_equal(pd.blocked, 1);
    assert_int_equal(pd.ready, 0);
    /* no admissions after shutdown; the process is closed at once */
    int closed = nclosed;
    struct tp *t = tp_new(K_DONE);
    assert_int_equal(jd_sched_spawn(s, &tp_ops, t, NULL, NULL, NULL, NULL), JD_ESHUTDOWN);
    assert_int_equal(nclosed, closed + 1);
    /* not finished: hooks are not called, close is (at destroy) */
    assert_int_equal(nfinished, 0);
    jd_sched_destroy(s);
    assert_int_equal(nclosed, closed + 5);
    assert_int_equal(nfinished, 0);
}

static void test_shutdown_grace_runs_out(void **state)
{
    (void)state;
    struct jd_sched *s = make(1, false);
    spawn(s, K_FOREVER);
    struct jd_sched_pending pd;
    assert_int_equal(jd_sched_shutdown(s, 20000000, &pd), JD_ETIMEOUT);
    assert_int_equal(pd.ready, 1);
    /* idempotent */
    assert_int_equal(jd_sched_shutdown(s, 0, &pd), JD_ETIMEOUT);
    assert_int_equal(pd.ready, 1);
    jd_sched_destroy(s);
    assert_int_equal(nclosed, 1);
}

static void test_shutdown_drains_ready_work(void **state)
{
    (void)state;
    struct jd_sched *s = make(2, false);
    for (int i = 0; i < 1000; i++)
        spawn(s, K_CONTINUE);
    struct jd_sched_pending pd;
    assert_int_equal(jd_sched_shutdown(s, 5000000000ull, &pd), 0);
    assert_int_equal(pd.ready, 0);
    assert_int_equal(nfinished, 1000);
    jd_sched_destroy(s);
}

/* ---- a stuck step is counted and its queue is taken by others ---- */
static sem_t stuck_gate;
static int stuck_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)ev;
    (void)n;
    struct tp *t = self;
    if (t->kind == 1) {
        /* spawn work into our own queue, then block well past stuck_ns */
        for (int i = 0; i < 4; i++)
            jd_sched_spawn(t->s, &tp_ops, tp_new(K_DONE), NULL, NULL, NULL, NULL);
        sem_wait(&stuck_gate);
    }
    jd_step_done(out, NULL);
    return 0;
}
static const struct jd_process_ops stuck_ops = {.step = stuck_step, .close = tp_close};

static void test_stuck_worker_detected(void **state)
{
    (void)state;
    reset_seen();
    struct jd_sched_config cfg = {.workers = 2, .stuck_ns = 5000000};
    cfg.hooks.finished = on_finished;
    struct jd_sched *s;
    assert_int_equal(jd_sched_create(&cfg, &s), 0);
    sem_init(&stuck_gate, 0, 0);
    struct tp *t = tp_new(1);
    t->s = s;
    assert_int_equal(jd_sched_spawn(s, &stuck_ops, t, NULL, NULL, NULL, NULL), 0);
    /* the 4 spawned processes finish on the other worker while we block */
    assert_true(wait_for(&nfinished, 4));
    struct jd_sched_stats st;
    for (int i = 0; i < 2000; i++) {
        jd_sched_stats(s, &st);
        if (st.stuck_events >= 1)
            break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_true(st.stuck_events >= 1);
    sem_post(&stuck_gate);
    assert_true(wait_for(&nfinished, 5));
    jd_sched_destroy(s);
    sem_destroy(&stuck_gate);
}

/* ---- yielders under a steady flood ---- */
#define FLOOD_YIELDERS 2
#define YIELDER_SPIN_NS 50000u /* a yielder's step */
#define FLOOD_SPIN_NS 1000u    /* a flood process's only step */
#define FLOOD_LOW 40000        /* refill the backlog below this ... */
#define FLOOD_HIGH 80000       /* ... up to this: >= 40 ms of work in reserve */
#define FLOOD_WINDOW_NS 200000000u
static _Atomic uint64_t ysteps[FLOOD_YIELDERS];
static _Atomic int flood_outstanding, yielders_alive;
static _Atomic bool flood_stop;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void spin_ns(uint64_t ns)
{
    uint64_t end = mono_ns() + ns;
    while (mono_ns() < end)
        ;
}

static int yielder_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)ev;
    (void)n;
    if (atomic_load(&flood_stop)) {
        atomic_fetch_sub(&yielders_alive, 1);
        out->status = JD_STEP_DONE;
        return 0;
    }
    spin_ns(YIELDER_SPIN_NS);
    atomic_fetch_add(&ysteps[(intptr_t)self], 1);
    out->status = JD_STEP_CONTINUE;
    return 0;
}
static const struct jd_process_ops yielder_ops = {.type_name = "yielder", .step = yielder_step};

static int flood_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    (void)ev;
    (void)n;
    spin_ns(FLOOD_SPIN_NS);
    atomic_fetch_sub(&flood_outstanding, 1);
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops flood_ops = {.type_name = "flood", .step = flood_step};

static void flood_fill(struct jd_sched *s, int upto)
{
    int have = atomic_load(&flood_outstanding);
    if (have >= upto)
        return;
    atomic_fetch_add(&flood_outstanding, upto - have);
    for (int i = have; i < upto; i++)
        assert_int_equal(jd_sched_spawn(s, &flood_ops, NULL, NULL, NULL, NULL, NULL), 0);
}

/* Processes that CONTINUE must keep running while a steady flood of remote
 * spawns never lets the worker run dry, yet must not take most of the
 * worker: one worker, two yielders of 50 us steps, and a backlog of 1 us
 * processes kept above 40,000 for 200 ms. Each yielder must step at least
 * 3 times in the window (the rule releases them about once per ms), and
 * together they may use at most a quarter of the window (releasing every
 * yielder at every 61st tick gave them over half of it). */
static void test_yielders_under_flood(void **state)
{
    (void)state;
    struct jd_sched_config cfg = {.workers = 1};
    struct jd_sched *s;
    assert_int_equal(jd_sched_create(&cfg, &s), 0);
    atomic_store(&flood_stop, false);
    atomic_store(&flood_outstanding, 0);
    atomic_store(&yielders_alive, FLOOD_YIELDERS);
    for (intptr_t i = 0; i < FLOOD_YIELDERS; i++) {
        atomic_store(&ysteps[i], 0);
        assert_int_equal(jd_sched_spawn(s, &yielder_ops, (void *)i, NULL, NULL, NULL, NULL), 0);
    }
    uint64_t t = mono_ns();
    for (int i = 0; i < FLOOD_YIELDERS; i++)
        while (atomic_load(&ysteps[i]) == 0 && mono_ns() - t < 5000000000u)
            sched_yield();
    flood_fill(s, FLOOD_HIGH);
    uint64_t before[FLOOD_YIELDERS];
    for (int i = 0; i < FLOOD_YIELDERS; i++)
        before[i] = atomic_load(&ysteps[i]);
    uint64_t t0 = mono_ns(), t1;
    int low = FLOOD_HIGH;
    while ((t1 = mono_ns()) - t0 < FLOOD_WINDOW_NS) {
        int have = atomic_load(&flood_outstanding);
        if (have < low)
            low = have;
        if (have < FLOOD_LOW)
            flood_fill(s, FLOOD_HIGH);
        else
            usleep(200);
    }
    uint64_t total = 0;
    for (int i = 0; i < FLOOD_YIELDERS; i++) {
        uint64_t d = atomic_load(&ysteps[i]) - before[i];
        total += d;
        assert_true(d >= 3);
    }
    int left = atomic_load(&flood_outstanding);
    print_message("flood window %.1f ms: yielder steps %llu (%.1f%% of the worker), backlog min %d "
                  "end %d\n",
                  (t1 - t0) / 1e6, (unsigned long long)total,
                  100.0 * (double)(total * YIELDER_SPIN_NS) / (double)(t1 - t0), low, left);
    assert_true(low > 0 && left > 0); /* the flood was steady: the worker never ran dry */
    assert_true(total * YIELDER_SPIN_NS <= (t1 - t0) / 4);
    atomic_store(&flood_stop, true);
    t = mono_ns();
    while ((atomic_load(&flood_outstanding) > 0 || atomic_load(&yielders_alive) > 0) &&
           mono_ns() - t < 10000000000u)
        usleep(1000);
    assert_int_equal(atomic_load(&flood_outstanding), 0);
    assert_int_equal(atomic_load(&yielders_alive), 0);
    jd_sched_destroy(s);
}

/* ---- a self-respawning chain under a flood ---- */
#define CHAIN_FLOOD 600 /* remote spawns: more than two rings' worth */
static _Atomic int chain_links, chain_alive;
static _Atomic bool chain_gate, chain_stop;
static _Atomic int links_at_drain; /* chain_links when the last flood process ran */

static int drain_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    (void)ev;
    (void)n;
    if (atomic_fetch_sub(&flood_outstanding, 1) == 1)
        atomic_store(&links_at_drain, atomic_load(&chain_links));
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops drain_ops = {.type_name = "drain", .step = drain_step};

static const struct jd_process_ops link_ops;
static int link_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)ev;
    (void)n;
    if (self) { /* the first link holds the worker until the flood is queued */
        uint64_t t = mono_ns();
        while (!atomic_load(&chain_gate) && mono_ns() - t < 5000000000u)
            ;
    }
    atomic_fetch_add(&chain_links, 1);
    if (atomic_load(&chain_stop)) {
        atomic_store(&chain_alive, 0);
    } else {
        spin_ns(20000);
        assert_int_equal(jd_sched_spawn(g_sched, &link_ops, NULL, NULL, NULL, NULL, NULL), 0);
    }
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops link_ops = {.type_name = "link", .step = link_step};

/* A chain whose every link spawns the next (20 us each) must not hold back
 * remote spawns by a run of LIFO links per batch: once the LIFO cap has
 * evicted it while other work waits, it gets one link per turn. One
 * worker, 600 queued remote spawns (about 2.4 rings): the chain may run its
 * first link, its LIFO run of 3, one link per fair-share batch and one
 * when the fairness tick picks it as the oldest local work: 7-8 links. A
 * fresh LIFO run per turn took 14. */
static void test_chain_under_flood(void **state)
{
    (void)state;
    struct jd_sched_config cfg = {.workers = 1};
    struct jd_sched *s;
    assert_int_equal(jd_sched_create(&cfg, &s), 0);
    g_sched = s;
    atomic_store(&chain_links, 0);
    atomic_store(&chain_alive, 1);
    atomic_store(&chain_gate, false);
    atomic_store(&chain_stop, false);
    atomic_store(&links_at_drain, -1);
    atomic_store(&flood_outstanding, CHAIN_FLOOD);
    assert_int_equal(jd_sched_spawn(s, &link_ops, (void *)1, NULL, NULL, NULL, NULL), 0);
    for (int i = 0; i < CHAIN_FLOOD; i++)
        assert_int_equal(jd_sched_spawn(s, &drain_ops, NULL, NULL, NULL, NULL, NULL), 0);
    atomic_store(&chain_gate, true);
    uint64_t t = mono_ns();
    while (atomic_load(&links_at_drain) < 0 && mono_ns() - t < 10000000000u)
        usleep(200);
    int links = atomic_load(&links_at_drain);
    print_message("chain links run while %d remote spawns drained: %d\n", CHAIN_FLOOD, links);
    assert_true(links > 0);
    assert_true(links <= 10);
    atomic_store(&chain_stop, true);
    t = mono_ns();
    while (atomic_load(&chain_alive) && mono_ns() - t < 10000000000u)
        usleep(200);
    assert_int_equal(atomic_load(&chain_alive), 0);
    jd_sched_destroy(s);
    g_sched = NULL;
}

/* ---- pinned workers ---- */
static _Atomic int pin_cpu[2], pin_ncpus[2], pin_seen;

static int pin_probe_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    (void)ev;
    (void)n;
    int wi = jd_sched_current_worker();
    cpu_set_t set;
    if (wi >= 0 && wi < 2 && sched_getaffinity(0, sizeof(set), &set) == 0) {
        atomic_store(&pin_ncpus[wi], CPU_COUNT(&set));
        atomic_store(&pin_cpu[wi], sched_getcpu());
        atomic_fetch_or(&pin_seen, 1 << wi);
    }
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops pin_probe_ops = {.type_name = "pin", .step = pin_probe_step};

/* With pin_workers, each worker may run on exactly one CPU, and on a
 * machine with two or more CPUs the two workers run on different ones. */
static void test_pinned_workers(void **state)
{
    (void)state;
    cpu_set_t allowed;
    assert_int_equal(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
    struct jd_sched_config cfg = {.workers = 2, .pin_workers = true};
    struct jd_sched *s;
    assert_int_equal(jd_sched_create(&cfg, &s), 0);
    atomic_store(&pin_seen, 0);
    uint64_t t = mono_ns();
    /* probes until both workers ran one (a parked worker wakes for them) */
    while (atomic_load(&pin_seen) != 3 && mono_ns() - t < 10000000000u) {
        for (int i = 0; i < 64; i++)
            assert_int_equal(jd_sched_spawn(s, &pin_probe_ops, NULL, NULL, NULL, NULL, NULL), 0);
        usleep(1000);
    }
    assert_int_equal(atomic_load(&pin_seen), 3);
    for (int i = 0; i < 2; i++)
        assert_int_equal(atomic_load(&pin_ncpus[i]), 1);
    if (CPU_COUNT(&allowed) >= 2)
        assert_int_not_equal(atomic_load(&pin_cpu[0]), atomic_load(&pin_cpu[1]));
    jd_sched_destroy(s);
    /* unpinned (the default): workers keep the process's whole mask */
    cfg.pin_workers = false;
    assert_int_equal(jd_sched_create(&cfg, &s), 0);
    atomic_store(&pin_seen, 0);
    t = mono_ns();
    while (atomic_load(&pin_seen) == 0 && mono_ns() - t < 10000000000u) {
        assert_int_equal(jd_sched_spawn(s, &pin_probe_ops, NULL, NULL, NULL, NULL, NULL), 0);
        usleep(1000);
    }
    int wi = atomic_load(&pin_seen) & 1 ? 0 : 1;
    assert_int_equal(atomic_load(&pin_ncpus[wi]), CPU_COUNT(&allowed));
    jd_sched_destroy(s);
}

/* ---- stacked workers ---- */
static _Atomic int stack_tid[2], stack_cpu[2], stack_alive;
static _Atomic bool stack_stop;

static const struct jd_process_ops stack_link_ops;
static int stack_link_step(void *self, struct jd_event *ev, size_t n, struct jd_step_out *out)
{
    (void)self;
    (void)ev;
    (void)n;
    int wi = jd_sched_current_worker();
    if (wi >= 0 && wi < 2) {
        atomic_store(&stack_tid[wi], (int)gettid());
        atomic_store(&stack_cpu[wi], sched_getcpu());
    }
    if (atomic_load(&stack_stop)) {
        atomic_fetch_sub(&stack_alive, 1);
    } else {
        spin_ns(2000);
        assert_int_equal(jd_sched_spawn(g_sched, &stack_link_ops, NULL, NULL, NULL, NULL, NULL), 0);
    }
    out->status = JD_STEP_DONE;
    return 0;
}
static const struct jd_process_ops stack_link_ops = {.type_name = "stacklink",
                                                     .step = stack_link_step};

/* Two workers busy with self-respawning chains are forced onto one CPU (as
 * the kernel sometimes leaves them for milliseconds); unpinned, one of them
 * must notice the other stalled on its CPU and step off it: the workers end
 * up on different CPUs and stats count the move. */
static void test_stacked_workers_separate(void **state)
{
    (void)state;
    cpu_set_t allowed;
    assert_int_equal(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
    if (CPU_COUNT(&allowed) < 2) {
        print_message("one CPU: nothing to separate\n");
        return;
    }
    int first = 0;
    while (!CPU_ISSET(first, &allowed))
        first++;
    struct jd_sched_config cfg = {.workers = 2};
    struct jd_sched *s;
    assert_int_equal(jd_sched_create(&cfg, &s), 0);
    g_sched = s;
    atomic_store(&stack_stop, false);
    atomic_store(&stack_alive, 2);
    for (int i = 0; i < 2; i++) {
        atomic_store(&stack_tid[i], 0);
        assert_int_equal(jd_sched_spawn(s, &stack_link_ops, NULL, NULL, NULL, NULL, NULL), 0);
    }
    uint64_t t = mono_ns();
    while ((!atomic_load(&stack_tid[0]) || !atomic_load(&stack_tid[1])) &&
           mono_ns() - t < 5000000000u)
        usleep(1000);
    assert_true(atomic_load(&stack_tid[0]) && atomic_load(&stack_tid[1]));
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    for (int i = 0; i < 2; i++)
        assert_int_equal(sched_setaffinity(atomic_load(&stack_tid[i]), sizeof(one), &one), 0);
    /* stacked: both report that CPU (the scheduler may already be moving
     * one of them off it, so whichever comes first) */
    struct jd_sched_stats st;
    jd_sched_stats(s, &st);
    uint64_t before = st.unstacks;
    t = mono_ns();
    while (atomic_load(&stack_cpu[0]) != atomic_load(&stack_cpu[1]) && st.unstacks == before &&
           mono_ns() - t < 1000000000u) {
        usleep(100);
        jd_sched_stats(s, &st);
    }
    /* only the scheduler can undo this: the kernel may not move them */
    t = mono_ns();
    do {
        usleep(2000);
        jd_sched_stats(s, &st);
    } while ((st.unstacks == before || atomic_load(&stack_cpu[0]) == atomic_load(&stack_cpu[1])) &&
             mono_ns() - t < 5000000000u);
    print_message("separated after %.1f ms, %llu unstacks, CPUs %d and %d\n", (mono_ns() - t) / 1e6,
                  (unsigned long long)st.unstacks, atomic_load(&stack_cpu[0]),
                  atomic_load(&stack_cpu[1]));
    assert_true(st.unstacks > before);
    assert_int_not_equal(atomic_load(&stack_cpu[0]), atomic_load(&stack_cpu[1]));
    atomic_store(&stack_stop, true);
    t = mono_ns();
    while (atomic_load(&stack_alive) > 0 && mono_ns() - t < 5000000000u)
        usleep(1000);
    assert_int_equal(atomic_load(&stack_alive), 0);
    jd_sched_destroy(s);
    g_sched = NULL;
}

static void test_misuse(void **state)
{
    (void)state;
    struct jd_sched *s = make(1, false);
    struct jd_process_ops bad = {0};
    assert_int_equal(jd_sched_spawn(s, &bad, NULL, NULL, NULL, NULL, NULL), JD_EINVAL);
    assert_int_equal(jd_sched_spawn(s, NULL, NULL, NULL, NULL, NULL, NULL), JD_EINVAL);
    struct jd_token tok = {.pid = 0, .tag = 1};
    assert_int_equal(jd_sched_complete(s, tok, strdup("x"), NULL), JD_ESTALE);
    tok.pid = 12345;
    tok.tag = 0;
    assert_int_equal(jd_sched_complete(s, tok, NULL, strdup("x")), JD_ESTALE);
    assert_int_equal(jd_sched_timer_after(s, 1, NULL, NULL, NULL), JD_EINVAL);
    jd_sched_destroy(s);
    jd_sched_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_helpers),
        cmocka_unit_test(test_spawn_done_and_close),
        cmocka_unit_test(test_init_failure),
        cmocka_unit_test(test_message_to_idle),
        cmocka_unit_test(test_message_before_first_step),
        cmocka_unit_test(test_yield_completed_in_dispatch),
        cmocka_unit_test(test_no_dispatcher_fails_yields),
        cmocka_unit_test(test_completion_from_outside_and_duplicate),
        cmocka_unit_test(test_duplicate_completion_delivered_once),
        cmocka_unit_test(test_completion_while_running_not_lost),
        cmocka_unit_test(test_message_while_running_then_idle),
        cmocka_unit_test(test_message_to_blocked),
        cmocka_unit_test(test_cancel_event),
        cmocka_unit_test(test_kill_idle_and_running),
        cmocka_unit_test(test_kill_ready_process),
        cmocka_unit_test(test_self_pid),
        cmocka_unit_test(test_continue_and_worker_index),
        cmocka_unit_test(test_timers_fire_and_cancel),
        cmocka_unit_test(test_blocking_pool_bound),
        cmocka_unit_test(test_shutdown_with_pending_work),
        cmocka_unit_test(test_shutdown_grace_runs_out),
        cmocka_unit_test(test_shutdown_drains_ready_work),
        cmocka_unit_test(test_stuck_worker_detected),
        cmocka_unit_test(test_yielders_under_flood),
        cmocka_unit_test(test_chain_under_flood),
        cmocka_unit_test(test_pinned_workers),
        cmocka_unit_test(test_stacked_workers_separate),
        cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
