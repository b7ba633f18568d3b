/*
 * The job layer (jobs.h): creating it (scheduler, plugin registry, paused
 * queues, replay), draining and destroying it, and the plugin environment.
 * The rest of the layer is split by concern; jobs_impl.h holds the shared
 * structures and says which file holds what.
 *
 * Every non-terminal job has a struct job in a hash table (jobs.mu). A job
 * moves: inserted (in the table, not yet durable) -> queued (insert committed;
 * in its queue's ready list, or waiting for its run_at timer) -> started (a
 * process spawned on the scheduler) -> finished (the process completed; the
 * final state is being committed) -> removed from the table once that commit
 * is durable, which is also when watchers learn about it.
 *
 * Recording: every transition, dispatch, completion, message and cancel is a
 * jd_write on the storage writer. Results reach a process only after their
 * completion record is committed (struct rec's after-commit action), so a
 * completion a process has seen is always in the history, and a replay can
 * deliver it again instead of running the step twice. Events carry "run" (the
 * job's attempt counter) so that replay only considers the current attempt
 * after a manual retry.
 *
 * Replay: jd_jobs_create reads every non-terminal job with its events; the
 * process is rebuilt and, as it yields, a tag whose completion is recorded is
 * completed from the record, one dispatched but not completed is dispatched
 * again (attempt + 1, idempotency key "<job_id>:<tag>") and timers re-arm at
 * their recorded deadlines. Tags come from the definition (jobdef.h), so a
 * differing command for a recorded tag means the definition or process type
 * changed: the job fails with kind "nondeterminism". Recorded completions
 * and messages reach the replayed process in their history order, and live
 * ones only after them (struct dlv): what the process decided from that
 * order before a crash, e.g. a wait step timed out because its timer's
 * completion was recorded before a message, it decides again. A timer's
 * firing is a recorded completion like any other, delivered only once
 * committed; a firing that was not committed is free to lose to a message.
 * (A process that does not yield a recorded tag again leaves the events
 * behind it waiting; cancel and timeout_ms still end it.)
 *
 * Poison jobs: a job whose replay kills the process would kill it on every
 * start. jobs.crashes counts, per job, the deaths in a row of a process that
 * was running it (the store says whether the last process closed the
 * database: jd_store_unclean). At start the count of every started job goes
 * up by one after an unclean end (or back to 0 after a clean one) and is
 * committed before any replay runs; at max_replays the job fails with kind
 * "quarantined" instead. A new completion, going idle, a fresh run or the
 * job's end puts it back to 0 (jobs_crashes_reset).
 *
 * Watches: a watch stays findable from jd_jobs_watch until its fn has
 * returned or it was withdrawn (struct watch), which is what lets unwatch
 * keep its promise in the window between a commit detaching it and its fn.
 *
 * Threading: one mutex (mu) guards the table, queues, watches and every
 * struct job. Registry calls and jd_sched_kill are made without mu (they may
 * call back into this layer on the same thread); the other scheduler and
 * store functions only enqueue and may be called under mu. Hooks run on
 * workers, timer callbacks on the timer thread, commit callbacks on the
 * store's completion thread (jd_store_done_thread, started in
 * jd_jobs_create; the writer itself if that thread could not start), one
 * at a time in commit order.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t env_timer_after(void *ctx, uint64_t delay_ms, void (*fn)(void *arg), void *arg)
{
    struct jd_jobs *j = ctx;
    uint64_t id = 0;
    if (jd_sched_timer_after(j->sched, delay_ms * 1000000u, fn, arg, &id) != 0)
        return 0;
    return id + 1; /* the registry wants ids > 0 */
}

static int env_timer_cancel(void *ctx, uint64_t id)
{
    struct jd_jobs *j = ctx;
    return id && jd_sched_timer_cancel(j->sched, id - 1) == 0 ? 0 : 1;
}

/* A cluster node: a blocking command's handle() starts on the blocking
 * pool, maybe long after its dispatch (queued there, or the node stalled):
 * it starts only while the lease holds (a node that lost it starts over
 * before it would run). */
struct blocking_arg {
    struct jd_jobs *j;
    void (*fn)(void *arg);
    void *arg;
};

static void blocking_run(void *p)
{
    struct blocking_arg a = *(struct blocking_arg *)p;
    free(p);
    jobs_cluster_lease_wait(a.j);
    a.fn(a.arg);
}

static int env_run_blocking(void *ctx, void (*fn)(void *arg), void *arg)
{
    struct jd_jobs *j = ctx;
    if (!j->cl)
        return jd_sched_run_blocking(j->sched, fn, arg);
    struct blocking_arg *a = jd_xmalloc(sizeof *a);
    *a = (struct blocking_arg){j, fn, arg};
    int rc = jd_sched_run_blocking(j->sched, blocking_run, a);
    if (rc)
        free(a);
    return rc;
}

static const char *env_config(void *ctx, const char *key)
{
    struct jd_jobs *j = ctx;
    if (strcmp(key, "exec_allow") == 0)
        return j->exec_allow;
    if (strcmp(key, "http_allow") == 0)
        return j->http_allow;
    if (strcmp(key, "output_cap") == 0)
        return j->output_cap;
    if (strcmp(key, "exec_env_allow") == 0)
        return j->exec_env_allow;
    if (strcmp(key, "exec_timeout_ms") == 0)
        return j->exec_timeout[0] ? j->exec_timeout : NULL;
    if (strcmp(key, "http_timeout_ms") == 0)
        return j->http_timeout[0] ? j->http_timeout : NULL;
    return NULL;
}

/* Parse "name=N,name=N" into a list (*out, may be NULL for a check only). */
static int command_limits_parse(const char *spec, struct cmd_limit **out, struct jd_error *err)
{
    struct cmd_limit *list = NULL;
    int rc = 0;
    const char *p = spec ? spec : "";
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        size_t nlen = eq ? (size_t)(eq - p) : 0;
        char num[16] = "";
        if (eq && len - nlen - 1 < sizeof num)
            memcpy(num, eq + 1, len - nlen - 1);
        char *e = NULL;
        long v = num[0] >= '0' && num[0] <= '9' ? strtol(num, &e, 10) : 0;
        bool name_ok = nlen > 0 && nlen <= 64;
        for (size_t i = 0; name_ok && i < nlen; i++)
            name_ok = p[i] == '_' || p[i] == '-' || p[i] == '.' || (p[i] >= '0' && p[i] <= '9') ||
                      (p[i] >= 'a' && p[i] <= 'z') || (p[i] >= 'A' && p[i] <= 'Z');
        if (!name_ok || !e || *e || v < 1 || v > JD_COMMAND_LIMIT_MAX) {
            rc = jd_error_set(err, JD_EINVAL, NULL,
                              "--command-limit: \"%.*s\" is not COMMAND=N (N from 1 to %d)",
                              (int)(len > 80 ? 80 : len), p, JD_COMMAND_LIMIT_MAX);
            goto out;
        }
        for (struct cmd_limit *c = list; c; c = c->next)
            if (strlen(c->name) == nlen && memcmp(c->name, p, nlen) == 0) {
                rc = jd_error_set(err, JD_EINVAL, NULL, "--command-limit: \"%s\" given twice",
                                  c->name);
                goto out;
            }
        struct cmd_limit *c = jd_xcalloc(1, sizeof *c);
        c->name = jd_xstrndup(p, nlen);
        c->limit = (unsigned)v;
        c->from_flag = true;
        c->next = list;
        list = c;
        p += len;
        if (*p == ',')
            p++;
    }
out:
    if (rc || !out) {
        while (list) {
            struct cmd_limit *c = list;
            list = c->next;
            free(c->name);
            free(c);
        }
    } else {
        *out = list;
    }
    return rc;
}

static void queues_free(struct jd_jobs *j)
{
    while (j->queues) {
        struct queue *q = j->queues;
        j->queues = q->next;
        free(q->name);
        free(q);
    }
}

static void command_limits_free(struct jd_jobs *j)
{
    while (j->cmd_limits) {
        struct cmd_limit *c = j->cmd_limits;
        j->cmd_limits = c->next;
        free(c->name);
        free(c);
    }
}

int jd_jobs_command_limits_check(const char *spec, struct jd_error *err)
{
    return command_limits_parse(spec, NULL, err);
}

int jd_jobs_create(const struct jd_jobs_config *cfg, struct jd_jobs **out, struct jd_error *err)
{
    jd_error_clear(err);
    *out = NULL;
    struct jd_jobs *j = jd_xcalloc(1, sizeof *j);
    int rc;
    j->store = cfg->store;
    j->limits = jd_jobdef_limits(&cfg->limits);
    j->cancel_grace_ms = cfg->cancel_grace_ms > 0 ? cfg->cancel_grace_ms : 5000;
    j->max_running = cfg->max_running ? cfg->max_running : 10000;
    j->max_replays = cfg->max_replays < 0    ? 0u
                     : cfg->max_replays == 0 ? JD_JOBS_MAX_REPLAYS_DEFAULT
                                             : (unsigned)cfg->max_replays;
    j->exec_allow = jd_xstrdup(cfg->exec_allow);
    j->http_allow = jd_xstrdup(cfg->http_allow);
    j->exec_env_allow = jd_xstrdup(cfg->exec_env_allow);
    j->webhook_secret = jd_xstrdup(cfg->webhook_secret);
    if (cfg->exec_timeout_ms > 0)
        snprintf(j->exec_timeout, sizeof j->exec_timeout, "%" PRId64, cfg->exec_timeout_ms);
    if (cfg->http_timeout_ms > 0)
        snprintf(j->http_timeout, sizeof j->http_timeout, "%" PRId64, cfg->http_timeout_ms);
    snprintf(j->output_cap, sizeof j->output_cap, "%zu",
             cfg->output_cap ? cfg->output_cap : (size_t)64 << 10);
    j->max_job_memory = cfg->max_job_memory ? cfg->max_job_memory : (size_t)256 << 20;
    j->window = cfg->queue_window < (1u << 24) ? cfg->queue_window : 1u << 24; /* 2N fits */
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->series = jd_stats_create();
    if ((rc = command_limits_parse(cfg->command_limits, &j->cmd_limits, err))) {
        jd_stats_destroy(j->series);
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->cv);
        free(j->exec_allow);
        free(j->http_allow);
        free(j->exec_env_allow);
        free(j);
        return rc;
    }
    jobs_bulk_init(j);
    /* Commit callbacks (rendering answers, waking connections, starting and
     * freeing jobs) on the store's completion thread, off the serial writer.
     * On failure they stay on the writer, which is correct, only slower. */
    if (jd_store_done_thread(j->store) != 0)
        jd_log(JD_LOG_WARN, "no completion thread; commit callbacks run on the writer", NULL);

    struct jd_sched_config sc = {
        .workers = cfg->workers,
        .blocking_threads = cfg->blocking_threads,
        .pin_workers = cfg->pin_workers,
        .hooks = {.ctx = j,
                  .dispatch = jobs_hook_dispatch,
                  .stepped = jobs_hook_stepped,
                  .finished = jobs_hook_finished},
    };
    if ((rc = jd_sched_create(&sc, &j->sched))) {
        jd_error_set(err, rc, NULL, "cannot start the scheduler: %s", jd_strerror(rc));
        goto fail;
    }
    struct jd_plugin_env env = {.ctx = j,
                                .timer_after = env_timer_after,
                                .timer_cancel = env_timer_cancel,
                                .run_blocking = env_run_blocking,
                                .config = env_config};
    if ((rc = jd_registry_create(&env, &j->reg))) {
        jd_error_set(err, rc, NULL, "cannot create the plugin registry: %s", jd_strerror(rc));
        goto fail;
    }
    if (cfg->plugin_dir && (rc = jd_registry_load_dir(j->reg, cfg->plugin_dir, NULL, err)))
        goto fail;
    if (cfg->register_plugins && (rc = cfg->register_plugins(cfg->register_arg, j->reg))) {
        if (err && !err->message[0])
            jd_error_set(err, rc, NULL, "registering in-process plugins failed: %s",
                         jd_strerror(rc));
        goto fail;
    }
    jd_registry_freeze(j->reg);

    char **paused = NULL;
    size_t npaused = 0;
    if (jd_store_paused_queues(j->store, &paused, &npaused) == 0) {
        for (size_t i = 0; i < npaused; i++)
            jobs_queue_get(j, paused[i])->paused = true;
        jd_strings_free(paused, npaused);
    }
    jobs_queue_controls_load(j);

    if ((rc = jobs_tasks_create(j, err)))
        goto fail;
    if (jd_store_clustered(j->store)) {
        /* A new incarnation owns no job: they come in by claims, which the
         * node's room bounds (so the queued-job window is not used). */
        jobs_cluster_init(j);
        if (j->window)
            jobs_window_cluster_start(j);
    } else if ((rc = jobs_recover(j, err))) {
        goto fail;
    }
    jobs_unique_recover(j);
    jobs_admit(j);
    *out = j;
    return 0;
fail:
    jobs_cluster_free(j);
    jobs_window_fini(j);
    if (j->reg)
        jd_registry_destroy(j->reg);
    if (j->sched)
        jd_sched_destroy(j->sched);
    command_limits_free(j);
    queues_free(j);
    jobs_tasks_destroy(j);
    jd_stats_destroy(j->series);
    jobs_bulk_fini(j);
    free(j->exec_allow);
    free(j->http_allow);
    free(j->exec_env_allow);
    free(j->webhook_secret);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
    return rc;
}

int jd_jobs_drain(struct jd_jobs *j, int64_t grace_ms)
{
    pthread_mutex_lock(&j->mu);
    if (j->drained) {
        pthread_mutex_unlock(&j->mu);
        return 0;
    }
    j->draining = true;
    pthread_mutex_unlock(&j->mu);
    jobs_cluster_fini(j); /* no more claims or inbox requests */
    jobs_tasks_drain(j);  /* parked claims answer (empty) now */
    pthread_mutex_lock(&j->mu);
    /* Let calls in flight finish (and be recorded) within the grace period.
     * Remote tasks do not hold the drain: they do not run here, and their
     * workers' answers are refused while draining (503); after the restart
     * waiting ones wait again and claimed ones are offered again. */
    uint64_t deadline = jd_now_ns() + (uint64_t)(grace_ms > 0 ? grace_ms : 0) * 1000000u;
    while (j->inflight_calls > jobs_tasks_count(j) && jd_now_ns() < deadline) {
        pthread_mutex_unlock(&j->mu);
        usleep(2000);
        pthread_mutex_lock(&j->mu);
    }
    j->stopping = true;
    size_t n = 0, cap = 0;
    struct job **v = NULL;
    for (unsigned b = 0; b < NBUCKETS; b++)
        for (struct job *jb = j->table[b]; jb; jb = jb->hnext) {
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                v = jd_xrealloc(v, cap * sizeof *v);
            }
            jb->refs++;
            v[n++] = jb;
        }
    pthread_mutex_unlock(&j->mu);
    for (size_t i = 0; i < n; i++)
        jobs_cancel_inflight(j, v[i]);
    int rc = jd_sched_shutdown(j->sched, 0, NULL);
    jd_store_sync(j->store);
    pthread_mutex_lock(&j->mu);
    for (size_t i = 0; i < n; i++)
        jobs_job_unref(v[i]);
    free(v);
    struct fire *fires = NULL;
    for (unsigned b = 0; b < NBUCKETS; b++) {
        for (struct watch *w = j->watches[b]; w; w = w->next) {
            if (w->fired)
                continue; /* another thread fires it */
            w->fired = true;
            struct fire *f = jd_xcalloc(1, sizeof *f);
            f->w = w;
            f->rc = JD_ESHUTDOWN;
            f->next = fires;
            fires = f;
        }
    }
    j->drained = true;
    pthread_mutex_unlock(&j->mu);
    jobs_watches_fire(j, fires, JD_ESHUTDOWN);
    return rc == JD_ETIMEOUT ? 0 : rc;
}

/* At destroy: a job with its timers and calls, whatever its refs. */
static void job_free_all(struct job *jb)
{
    for (struct jtimer *t = jb->timers, *tn; t; t = tn) {
        tn = t->next;
        jobs_jtimer_free(t);
    }
    for (struct call *c = jb->calls, *cn; c; c = cn) {
        cn = c->next;
        free(c->command);
        free(c->args);
        free(c);
    }
    jobs_job_free(jb);
}

void jd_jobs_destroy(struct jd_jobs *j)
{
    if (!j)
        return;
    atomic_store(&j->release_wait, false); /* the jobs freed below release nothing */
    jd_jobs_drain(j, 0);
    jobs_window_fini(j);
    jobs_bulk_fini(j);
    jd_registry_destroy(j->reg);
    jd_sched_destroy(j->sched);
    jobs_tasks_destroy(j);
    jd_store_sync(j->store);
    /* No thread calls in any more: free what is left, whatever its refs. */
    for (unsigned b = 0; b < NBUCKETS; b++) {
        struct job *jb = j->table[b];
        while (jb) {
            struct job *n = jb->hnext;
            job_free_all(jb);
            jb = n;
        }
    }
    /* Ended (folded) jobs whose process never finished: out of the table. */
    for (struct job *jb = j->ending, *n; jb; jb = n) {
        n = jb->enext;
        job_free_all(jb);
    }
    for (unsigned b = 0; b < NBUCKETS; b++) /* drain fired them all; none left running */
        while (j->watches[b]) {
            struct watch *w = j->watches[b];
            j->watches[b] = w->next;
            free(w);
        }
    queues_free(j);
    command_limits_free(j);
    while (j->idems) {
        struct idem *i = j->idems;
        j->idems = i->next;
        free(i->key);
        free(i);
    }
    jd_stats_destroy(j->series);
    jobs_cluster_free(j);
    free(j->exec_allow);
    free(j->http_allow);
    free(j->exec_env_allow);
    free(j->webhook_secret);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}
