/*
 * jackdawd: the composition root. Parses the configuration, opens storage,
 * starts HTTP (so /livez and /readyz answer while jobs are recovered),
 * creates the job layer (scheduler, plugins, recovery) and loads the
 * schedules (arming their timers; missed fires catch up), becomes ready, and
 * waits for SIGTERM/SIGINT. Then: readiness 503, stop accepting, answer
 * parked waiters, stop the schedules' timers, drain the job layer (running steps finish within
 * --grace, pending commits complete and their requests are answered), stop HTTP, free the job
 * layer, close storage, exit 0. Jobs still running stay non-terminal in the database and resume on
 * the next start.
 *
 * A cluster node (PostgreSQL): after the schedules load, the job layer's
 * cluster thread and the store's cluster threads start (the hooks below
 * forward to the job and schedule layers). A lost lease reaches main() as
 * SIGUSR1 (hook_lease_lost); the node then starts over by re-executing
 * itself (start_over).
 *
 * Threading: main() is the only thread here; signals are blocked in every
 * thread and taken synchronously with sigwait, so no handler runs
 * asynchronously. After the first signal main() unblocks them with their
 * default action, so a second one ends the process at once (jobs still
 * resume on the next start: everything acknowledged is durable).
 */
#include "api/forward.h"
#include "api/http.h"
#include "common/alloc.h"
#include "common/log.h"
#include "server/config.h"
#include "server/jobs.h"
#include "server/schedules.h"
#include "server/tasks.h"
#include "storage/store.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The built-in plugins live in plugins/ next to the binary (build/plugins). */
static char *default_plugin_dir(void)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return jd_xstrdup("plugins");
    exe[n] = '\0';
    return jd_xasprintf("%s/plugins", dirname(exe));
}

/* ---- the cluster (a PostgreSQL store) ---- */

/* The store's cluster threads run until jd_store_close, after the job and
 * schedule layers are gone: the hooks reach them only while `live`
 * (cluster_off clears it, under the write lock, before they are freed). */
struct cluster_ctx {
    pthread_rwlock_t lock;
    bool live;
    struct jd_jobs *jobs;
    struct jd_schedules *schedules;
};

static void hook_changed(void *arg, const struct jd_job_change *c, size_t n)
{
    struct cluster_ctx *x = arg;
    pthread_rwlock_rdlock(&x->lock);
    if (x->live)
        jd_jobs_cluster_changed(x->jobs, c, n);
    pthread_rwlock_unlock(&x->lock);
}

static void hook_schedule_changed(void *arg, const char *id)
{
    struct cluster_ctx *x = arg;
    pthread_rwlock_rdlock(&x->lock);
    if (x->live)
        jd_schedules_cluster_changed(x->schedules, id);
    pthread_rwlock_unlock(&x->lock);
}

static void hook_requests(void *arg)
{
    struct cluster_ctx *x = arg;
    pthread_rwlock_rdlock(&x->lock);
    if (x->live)
        jd_jobs_cluster_requests(x->jobs);
    pthread_rwlock_unlock(&x->lock);
}

static void hook_claimable(void *arg)
{
    struct cluster_ctx *x = arg;
    pthread_rwlock_rdlock(&x->lock);
    if (x->live)
        jd_jobs_cluster_claimable(x->jobs);
    pthread_rwlock_unlock(&x->lock);
}

static void hook_tasks_waiting(void *arg, const char *payload)
{
    struct cluster_ctx *x = arg;
    pthread_rwlock_rdlock(&x->lock);
    if (x->live)
        jd_jobs_tasks_announced(x->jobs, payload);
    pthread_rwlock_unlock(&x->lock);
}

/* The base URL other nodes reach this one at (README "Running a cluster"):
 * --advertise-url, else http://<listen host>:<bound port>, with the host
 * name for a wildcard listen. Caller frees. */
static char *advertise_url(const struct jd_config *cfg, unsigned port)
{
    if (cfg->advertise_url && cfg->advertise_url[0]) {
        char *u = jd_xstrdup(cfg->advertise_url);
        size_t n = strlen(u);
        while (n > 0 && u[n - 1] == '/')
            u[--n] = '\0'; /* paths are appended: "/v1/..." */
        return u;
    }
    const char *h = cfg->host;
    char name[256];
    if (h[0] == '\0' || strcmp(h, "0.0.0.0") == 0 || strcmp(h, "::") == 0) {
        if (gethostname(name, sizeof name - 1) != 0)
            snprintf(name, sizeof name, "localhost");
        name[sizeof name - 1] = '\0';
        h = name;
    }
    if (strchr(h, ':'))
        return jd_xasprintf("http://[%s]:%u", h, port);
    return jd_xasprintf("http://%s:%u", h, port);
}

static void cluster_off(struct cluster_ctx *x)
{
    pthread_rwlock_wrlock(&x->lock);
    x->live = false;
    pthread_rwlock_unlock(&x->lock);
}

/* On the store's heartbeat thread: main() takes it from here (SIGUSR1). */
static void hook_lease_lost(void *arg)
{
    (void)arg;
    kill(getpid(), SIGUSR1);
}

/* End the processes this one started (exec steps, each in its own process
 * group): their jobs are other nodes' now, which run those steps again. */
static void kill_children(void)
{
    DIR *d = opendir("/proc");
    if (!d)
        return;
    pid_t me = getpid();
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char path[300], line[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(line, 1, sizeof line - 1, f);
        fclose(f);
        line[n] = '\0';
        const char *rp = strrchr(line, ')'); /* the name may hold anything */
        char state;
        int ppid;
        if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == me) {
            pid_t pid = (pid_t)atoi(e->d_name);
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
        }
    }
    closedir(d);
    usleep(20000); /* reap the ones already gone */
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
}

/* The lease is lost: every job this incarnation held belongs to other
 * nodes now, and its writes are refused. Start over as a new incarnation
 * (a new node id, no jobs), the simplest state that is surely right: its
 * child processes killed, then the same binary and arguments, every descriptor (the listening
 * socket, the database connections) closed on exec. Returns only if exec failed. */
static void start_over(char **argv)
{
    jd_log(JD_LOG_WARN, "this node lost its lease; starting over as a new incarnation", NULL);
    kill_children();
    close_range(3, ~0u, CLOSE_RANGE_CLOEXEC);
    execv("/proc/self/exe", argv);
    jd_log(JD_LOG_ERROR, "cannot start over", "error", strerror(errno), NULL);
}

/* Create the database's directory when it is missing (one level, as for
 * the default ./data), so a fresh checkout starts without a manual mkdir. */
static void ensure_db_dir(const char *db)
{
    if (strstr(db, "://"))
        return; /* a PostgreSQL URL */
    char *copy = jd_xstrdup(db);
    const char *dir = dirname(copy);
    struct stat st;
    if (stat(dir, &st) != 0 && mkdir(dir, 0750) == 0)
        jd_log(JD_LOG_INFO, "created the database directory", "dir", dir, NULL);
    free(copy);
}

#define DB_RETRY_FIRST_MS 250 /* a database starting beside us is often up within a second */
#define DB_RETRY_MAX_MS 5000  /* the longest pause between two attempts */

/* Open the store; a PostgreSQL database that cannot be reached (JD_EIO:
 * not up yet, or unreachable) is tried again with backoff until wait_ms
 * have passed since the first attempt, each failure logged. A refusal
 * (foreign or newer schema) is not retried. SIGTERM/SIGINT (in sigs,
 * blocked) while waiting ends it with JD_ESHUTDOWN. HTTP is not up yet:
 * the port opens only once the database is reached. */
static int store_open_retrying(const struct jd_store_config *scfg, int64_t wait_ms,
                               const sigset_t *sigs, struct jd_store **store, struct jd_error *err)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int64_t pause = DB_RETRY_FIRST_MS;
    for (unsigned attempt = 1;; attempt++) {
        jd_error_clear(err);
        int rc = jd_store_open(scfg, store, err);
        if (rc != JD_EIO || !strstr(scfg->path, "://"))
            return rc;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t spent = (int64_t)(now.tv_sec - t0.tv_sec) * 1000 +
                        (int64_t)(now.tv_nsec - t0.tv_nsec) / 1000000;
        if (spent + pause > wait_ms)
            return rc; /* the caller logs the last failure */
        char n[16], in[32];
        snprintf(n, sizeof n, "%u", attempt);
        snprintf(in, sizeof in, "%lldms", (long long)pause);
        jd_log(JD_LOG_WARN, "the database cannot be reached yet; retrying", "attempt", n,
               "retry_in", in, "error", err->message[0] ? err->message : jd_strerror(rc), NULL);
        struct timespec ts = {.tv_sec = (time_t)(pause / 1000),
                              .tv_nsec = (long)(pause % 1000) * 1000000L};
        int sig = sigtimedwait(sigs, NULL, &ts);
        if (sig == SIGTERM || sig == SIGINT) {
            jd_log(JD_LOG_INFO, "stopped before the database could be reached", NULL);
            return JD_ESHUTDOWN;
        }
        pause = pause * 2 > DB_RETRY_MAX_MS ? DB_RETRY_MAX_MS : pause * 2;
    }
}

int main(int argc, char **argv)
{
    struct jd_config cfg;
    struct jd_error err = {0};
    struct jd_store *store = NULL;
    struct jd_jobs *jobs = NULL;
    struct jd_schedules *schedules = NULL;
    struct jd_http *http = NULL;
    struct jd_forward *fwd = NULL;
    int status = 1;
    char *db_shown = NULL;
    static struct cluster_ctx cctx = {.lock = PTHREAD_RWLOCK_INITIALIZER};

    char *plugdir = default_plugin_dir();
    int rc = jd_config_parse(&cfg, argc, argv, plugdir, &err);
    free(plugdir);
    if (rc != 0) {
        fprintf(stderr, "jackdawd: %s\n", err.message);
        status = 2;
        goto out;
    }
    if (cfg.help) {
        jd_config_usage(stdout, argv[0]);
        status = 0;
        goto out;
    }
    jd_log_set_level((enum jd_log_level)cfg.log_level);

    /* Block the shutdown signals before any thread starts, so every thread
     * inherits the mask and only sigwait below receives them. SIGPIPE is
     * ignored: a client that goes away must not kill the server. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    if (strstr(cfg.db, "://"))     /* PostgreSQL: a cluster node */
        sigaddset(&sigs, SIGUSR1); /* the lease was lost (hook_lease_lost) */
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    ensure_db_dir(cfg.db);
    db_shown = jd_store_display_path(cfg.db); /* no password in the logs */
    struct jd_store_config scfg = {
        .path = cfg.db,
        .sync_full = cfg.sync_full,
        .retention_ms = cfg.retention_ms,
        .lease_ms = cfg.lease_ms,
        .read_max = cfg.db_readers,
        .read_idle_ms = cfg.db_reader_idle_ms,
    };
    if ((rc = store_open_retrying(&scfg, cfg.db_connect_wait_ms, &sigs, &store, &err)) != 0) {
        if (rc == JD_ESHUTDOWN) {
            status = 0; /* stopped on request before the database came up */
            goto out;
        }
        jd_log(JD_LOG_ERROR, "cannot open the database", "db", db_shown, "error",
               err.message[0] ? err.message : jd_strerror(rc), NULL);
        goto out;
    }

    struct jd_http_config hcfg = {
        .host = cfg.host,
        .port = cfg.port,
        .threads = cfg.http_threads,
        .max_connections = cfg.max_connections,
        .conn_timeout_s = cfg.conn_timeout_s,
        .max_parked = cfg.max_parked,
        .max_body = cfg.max_body,
        .token = cfg.token,
        .worker_token = cfg.worker_token,
        .max_wait_ms = cfg.max_wait_ms,
        .heartbeat_ms = cfg.heartbeat_ms,
        .store = store,
        .ui_off = !cfg.ui,
    };
    if ((rc = jd_http_start(&hcfg, &http, &err)) != 0) {
        jd_log(JD_LOG_ERROR, "cannot start HTTP", "error", err.message, NULL);
        goto out;
    }
    char addr[JD_CONFIG_HOST_MAX + 16];
    if (strchr(cfg.host, ':') != NULL)
        snprintf(addr, sizeof addr, "[%s]:%u", cfg.host, jd_http_port(http));
    else
        snprintf(addr, sizeof addr, "%s:%u", cfg.host, jd_http_port(http));
    jd_log(JD_LOG_INFO, "listening", "addr", addr, NULL);

    struct jd_jobs_config jcfg = {
        .store = store,
        .workers = cfg.workers,
        .pin_workers = cfg.pin_workers,
        .plugin_dir = cfg.plugin_dir,
        .exec_allow = cfg.exec_allow,
        .exec_env_allow = cfg.exec_env_allow,
        .exec_timeout_ms = cfg.exec_timeout_ms,
        .http_allow = cfg.http_allow,
        .webhook_secret = cfg.webhook_secret,
        .http_timeout_ms = cfg.http_timeout_ms,
        .max_replays = cfg.max_replays ? (int)cfg.max_replays : -1, /* at most 10^6 */
        .command_limits = cfg.command_limits,
        .max_job_memory = cfg.max_job_memory,
        .queue_window = cfg.queue_window,
    };
    if ((rc = jd_jobs_create(&jcfg, &jobs, &err)) != 0) {
        jd_log(JD_LOG_ERROR, "cannot start the job layer", "error",
               err.message[0] ? err.message : jd_strerror(rc), NULL);
        goto out;
    }
    struct jd_schedules_config schcfg = {
        .store = store, .jobs = jobs, .max_schedules = cfg.max_schedules};
    if ((rc = jd_schedules_create(&schcfg, &schedules, &err)) != 0) {
        jd_log(JD_LOG_ERROR, "cannot load the schedules", "error",
               err.message[0] ? err.message : jd_strerror(rc), NULL);
        goto out;
    }
    jd_http_attach_schedules(http, schedules);
    if (jd_store_clustered(store)) {
        /* Remote tasks from any node (api/forward.h): this node's URL in
         * its node row, then the forwarding threads. */
        char *url = advertise_url(&cfg, jd_http_port(http));
        struct jd_forward_config fcfg = {.store = store, .token = cfg.token};
        if ((rc = jd_store_node_advertise(store, url)) != 0 ||
            (rc = jd_forward_start(&fcfg, &fwd)) != 0) {
            jd_log(JD_LOG_ERROR, "cannot advertise this node for remote tasks", "url", url, "error",
                   jd_strerror(rc), NULL);
            free(url);
            goto out;
        }
        jd_log(JD_LOG_INFO, "advertised for remote tasks", "url", url, NULL);
        free(url);
        jd_http_attach_forward(http, fwd);
        struct jd_task_remote remote;
        jd_forward_task_remote(fwd, &remote);
        jd_jobs_set_task_remote(jobs, &remote);
    }
    jd_http_attach(http, jobs);
    jd_jobs_set_claim_alive(jobs, jd_http_claim_alive);
    if (jd_store_clustered(store)) {
        cctx.jobs = jobs;
        cctx.schedules = schedules;
        cctx.live = true;
        struct jd_store_cluster_hooks hooks = {
            .changed = hook_changed,
            .schedule_changed = hook_schedule_changed,
            .requests = hook_requests,
            .claimable = hook_claimable,
            .lease_lost = hook_lease_lost,
            .tasks_waiting = hook_tasks_waiting,
            .arg = &cctx,
        };
        if ((rc = jd_jobs_cluster_start(jobs)) != 0 ||
            (rc = jd_store_cluster_start(store, &hooks)) != 0) {
            jd_log(JD_LOG_ERROR, "cannot join the cluster", "error", jd_strerror(rc), NULL);
            goto out;
        }
        char node[24];
        snprintf(node, sizeof node, "%lld", (long long)jd_store_node_id(store));
        jd_log(JD_LOG_INFO, "joined the cluster", "node", node, NULL);
    }
    jd_log(JD_LOG_INFO, "ready", "addr", addr, "db", db_shown, "plugin_dir",
           cfg.plugin_dir ? cfg.plugin_dir : "", NULL);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0 || sig == SIGUSR1) {
        if (sig == SIGUSR1) {
            start_over(argv);
            goto out;
        }
    }
    jd_log(JD_LOG_INFO, "shutting down", "signal", sig == SIGINT ? "SIGINT" : "SIGTERM", "hint",
           "a second signal exits at once", NULL);
    /* A second SIGTERM/SIGINT takes the default action (exit at once):
     * only this thread unblocks them, so it is the one they reach. */
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &sigs, NULL);
    status = 0;

out:
    if (http != NULL)
        jd_http_drain(http);
    if (schedules != NULL)
        jd_schedules_stop(schedules); /* no fire starts; those in flight commit */
    if (jobs != NULL) {
        rc = jd_jobs_drain(jobs, cfg.grace_ms);
        if (rc != 0)
            jd_log(JD_LOG_WARN, "grace period over with work left; it resumes on the next start",
                   NULL);
    }
    jd_forward_stop(fwd); /* queued relays answer 503; the job layer's hooks refuse from now */
    if (http != NULL)
        jd_http_stop(http, 2000);
    cluster_off(&cctx); /* no hook reaches the layers freed below */
    if (schedules != NULL)
        jd_schedules_destroy(schedules);
    if (jobs != NULL)
        jd_jobs_destroy(jobs);
    jd_forward_free(fwd); /* after the job layer, which holds its hooks */
    if (store != NULL)
        jd_store_close(store);
    free(db_shown);
    if (status == 0 && !cfg.help)
        jd_log(JD_LOG_INFO, "stopped", NULL);
    jd_config_free(&cfg);
    return status;
}
