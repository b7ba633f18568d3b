/*
 * exec: run a program and return its exit status and output.
 *
 *   {"argv": ["/bin/echo", "hi"], "env": {"K": "v"}, "stdin": "text",
 *    "cwd": "/tmp", "timeout_ms": 5000}
 * ->{"exit_code": 0, "signal": null, "stdout": "hi\n", "stderr": "",
 *    "truncated": false, "duration_ms": 3}
 *
 * A non-zero exit (or death by a signal) fails the call with kind
 * "exit_status" (retryable: a job's retry policy decides) and the same object
 * as details. Output beyond config "output_cap" bytes per stream (default
 * 64 KiB) is read and discarded, and "truncated" is true. The child gets only
 * PATH=/usr/local/bin:/usr/bin:/bin plus the "env" given (the server's own
 * environment, which may hold secrets, is not passed on), descriptors 0, 1
 * and 2 and no other, default signal dispositions and an empty signal mask.
 * "env" names that hook the loader or an interpreter are refused (see
 * env_denied), or, with config "exec_env_allow", every name not listed
 * there. Every call has a deadline: "timeout_ms", else config
 * "exec_timeout_ms" (default 10 minutes).
 *
 * Only programs named in config "exec_allow" run (comma-separated absolute
 * paths or bare names looked up in the server's PATH, compared with argv[0]
 * as written; "*" allows any; relative paths with a slash never match, as
 * they would resolve against the job's cwd). Unset or empty:
 * exec refuses everything and says so, at submit time (validate, pointer
 * /argv/0) and again at run time.
 *
 * Process groups: each child is the leader of its own process group, so a
 * timeout (the args' timeout_ms, or the host's deadline through cancel())
 * or a cancel kills the whole group with SIGKILL, grandchildren included.
 * When the leader exits, the rest of its group is killed too (before the
 * leader is reaped): background children do not outlive the call.
 *
 * Reaping (the choice): exec reaps only its own children, by pid, with
 * waitpid(pid, WNOHANG) under the children-table lock, after a pidfd (or a
 * 10 ms poll where pidfd_open is missing) says the child exited. Nothing in
 * Jackdaw calls waitpid(-1), so no one steals those statuses. Orphans are a
 * concern only when we are PID 1 (a container without an init) or a child
 * subreaper: then exec starts one orphan-reaper thread that peeks at zombies
 * with waitid(P_ALL, WNOWAIT) and reaps any pid not in its table of own
 * children, leaving its own for their owners. Spawning and registering a pid
 * happen under the same lock the orphan reaper checks, so it can never reap
 * a child of ours before it is known. The table lock also guarantees a kill
 * never hits a recycled pid: a pid is only killed while still unreaped.
 *
 * Threading: handle() is JD_CMD_BLOCKING and runs on the host's blocking
 * pool (it waits for the child); cancel() runs on any thread and only sends
 * signals. The children table is guarded by one mutex.
 */
#include "plugins/builtin.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define EXEC_DEFAULT_CAP (64 * 1024) /* enough for a status report, small enough to store */
#define EXEC_DEFAULT_TIMEOUT_MS                                                                    \
    (10 * 60 * 1000) /* --exec-timeout's default: long for a build step, bounded for a hang */
#define EXEC_DRAIN_MS                                                                              \
    100 /* after the child exits, how long to collect output its                                   \
           leftover descendants may still be writing */
#define EXEC_BASE_PATH "PATH=/usr/local/bin:/usr/bin:/bin"
#define EXEC_REFUSED 2 /* args_parse: well-formed, but the configuration refuses it */

static const struct jd_host *host;

struct child {
    struct jd_call *call;
    pid_t pid;  /* 0 until spawned */
    int reaped; /* pid no longer ours: never signal it */
    int killed; /* cancel() asked for it */
    struct child *next;
};

static pthread_mutex_t tbl_mu = PTHREAD_MUTEX_INITIALIZER;
static struct child *children;

/* ---- configuration ---- */

/* 0 if prog may run; else a reason in err.
 *
 * An entry matches argv[0] only when it is "*", absolute, or a bare name
 * (looked up in the server's PATH, which jobs cannot change). A relative
 * entry with a slash ("./deploy.sh", "bin/tool") never matches: the child
 * resolves it against the job's own "cwd", so allowing it would let any job
 * run whatever file of that name sits in any directory it picks. */
static int allowed(const char *prog, char *err, size_t errlen)
{
    const char *list = host->config("exec_allow");
    size_t plen = strlen(prog), n;
    int any = 0, relative = 0;
    for (const char *cur = list, *p; (p = jd_builtin_list_next(&cur, &n));) {
        if (n) {
            any = 1;
            if (n == 1 && *p == '*')
                return 0;
            if (*p != '/' && memchr(p, '/', n))
                relative = 1; /* never matches; said below when it would have */
            else if (n == plen && memcmp(p, prog, n) == 0)
                return 0;
        }
    }
    if (!any)
        snprintf(err, errlen,
                 "exec is disabled: no program is allowed (start jackdawd with --exec-allow)");
    else if (relative && prog[0] != '/' && strchr(prog, '/'))
        snprintf(err, errlen,
                 "program \"%.200s\" is a relative path, which depends on the job's cwd: "
                 "allow-list entries and argv[0] must be absolute paths (or bare names)",
                 prog);
    else
        snprintf(err, errlen, "program \"%.200s\" is not in the exec allow-list", prog);
    return 1;
}

/* ---- the environment a job may set ---- */

/* Names that make a program run code or load files the job chooses, through
 * the dynamic loader, libc, a shell or an interpreter, although argv[0] is
 * allowed: glibc's list of variables it strips for setuid programs
 * (unsecvars.h), the hooks of sh/bash, Perl, Python, Ruby, Node, the JVM,
 * OpenSSL and git, and pagers/editors that programs run for the user. Without
 * this, allowing one harmless shell script (ldd) and setting
 * BASH_FUNC_printf%% ran any command. Compared exactly (names are
 * case-sensitive, and the loaders only honour these spellings). */
static const char *const env_denied[] = {
    /* glibc (besides LD_* and MALLOC_*, refused as prefixes) */
    "GCONV_PATH",
    "GETCONF_DIR",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TZDIR",
    /* shells */
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS1",
    "PS2",
    "PS3",
    "PS4",
    "PROMPT_COMMAND",
    "IFS",
    "CDPATH",
    "GLOBIGNORE",
    "BASH_XTRACEFD",
    "BASH_LOADABLES_PATH",
    "FPATH",
    "ZDOTDIR",
    "NULLCMD",
    "READNULLCMD",
    "TMPPREFIX",
    "EXECIGNORE",
    /* interpreters and runtimes */
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "PERL5DB",
    "PERLIO_DEBUG",
    "PYTHONSTARTUP",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONINSPECT",
    "PYTHONUSERBASE",
    "PYTHONWARNINGS",
    "PYTHONBREAKPOINT",
    "PYTHONEXECUTABLE",
    "PYTHONPLATLIBDIR",
    "PYTHONPYCACHEPREFIX",
    "NODE_OPTIONS",
    "NODE_PATH",
    "NODE_REPL_EXTERNAL_MODULE",
    "RUBYOPT",
    "RUBYLIB",
    "RUBYSHELL",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
    "OPENSSL_CONF",
    "OPENSSL_ENGINES",
    "OPENSSL_MODULES",
    "KRB5_CONFIG",
    /* git and the programs it and others run on the user's behalf */
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "GIT_EXEC_PATH",
    "GIT_PROXY_COMMAND",
    "GIT_EXTERNAL_DIFF",
    "GIT_PAGER",
    "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR",
    "GIT_TEMPLATE_DIR",
    "PAGER",
    "MANPAGER",
    "EDITOR",
    "VISUAL",
    "LESSOPEN",
    "LESSCLOSE",
    "BROWSER",
};

/* Refused as prefixes: every loader variable (LD_PRELOAD, LD_AUDIT,
 * LD_LIBRARY_PATH, ...), glibc's malloc hooks, bash's exported functions,
 * git's config injection (GIT_CONFIG, GIT_CONFIG_PARAMETERS,
 * GIT_CONFIG_KEY_0, ...). */
static const char *const env_denied_prefix[] = {"LD_", "MALLOC_", "BASH_FUNC_", "GIT_CONFIG"};

/* 1 if name matches one entry of a comma-separated list: an exact name, or a
 * prefix ending in '*' ("APP_*"). */
static int env_listed(const char *list, const char *name)
{
    size_t n, len = strlen(name);
    for (const char *cur = list, *p; (p = jd_builtin_list_next(&cur, &n));) {
        if (n && p[n - 1] == '*' && len >= n - 1 && memcmp(p, name, n - 1) == 0)
            return 1;
        if (n && n == len && memcmp(p, name, n) == 0)
            return 1;
    }
    return 0;
}

/* 0 if a job may set the variable `name`; else a reason in err. With config
 * "exec_env_allow" (--exec-env-allow) only the names listed there; without
 * it, any name but the hooks above. A name holding "%%" is bash's exported
 * function syntax whatever its prefix, so it is refused in both modes. */
static int env_name_allowed(const char *name, char *err, size_t errlen)
{
    const char *list = host->config("exec_env_allow");
    if (strstr(name, "%%"))
        goto denied;
    if (list && *list) {
        if (env_listed(list, name))
            return 0;
        snprintf(err, errlen, "env \"%.100s\" is not in the exec env allow-list (--exec-env-allow)",
                 name);
        return 1;
    }
    for (size_t i = 0; i < sizeof env_denied_prefix / sizeof *env_denied_prefix; i++)
        if (strncmp(name, env_denied_prefix[i], strlen(env_denied_prefix[i])) == 0)
            goto denied;
    for (size_t i = 0; i < sizeof env_denied / sizeof *env_denied; i++)
        if (strcmp(name, env_denied[i]) == 0)
            goto denied;
    return 0;
denied:
    snprintf(err, errlen,
             "env \"%.100s\" is refused: it makes programs load or run code the job chooses", name);
    return 1;
}

/* ---- arguments ---- */

struct exec_args {
    struct jd_pjson *root;
    char **argv; /* borrowed strings from root, NULL-terminated */
    char **envp; /* malloc'd "K=V" strings, NULL-terminated */
    const char *stdin_text;
    size_t stdin_len;
    const char *cwd;
    int64_t timeout_ms; /* 0: none */
};

static void args_free(struct exec_args *a)
{
    if (a->envp)
        for (char **e = a->envp; *e; e++)
            free(*e);
    free(a->envp);
    free(a->argv);
    jd_pjson_free(a->root);
    memset(a, 0, sizeof *a);
}

/* Turn a number or boolean argv item into a string node in place. */
static void argv_item_to_text(struct jd_pjson *v)
{
    char buf[64];
    if (jd_pjson_is(v, JD_PJSON_NUMBER)) {
        if (v->number == (double)(long long)v->number && v->number > -9e15 && v->number < 9e15)
            snprintf(buf, sizeof buf, "%lld", (long long)v->number);
        else
            snprintf(buf, sizeof buf, "%.17g", v->number);
    } else if (jd_pjson_is(v, JD_PJSON_TRUE)) {
        snprintf(buf, sizeof buf, "true");
    } else if (jd_pjson_is(v, JD_PJSON_FALSE)) {
        snprintf(buf, sizeof buf, "false");
    } else {
        return;
    }
    free(v->string);
    v->string = strdup(buf);
    if (!v->string)
        abort();
    v->len = strlen(buf);
    v->type = JD_PJSON_STRING;
}

/* Parse and check args: 0; 1 (malformed) or EXEC_REFUSED (a program or an
 * env name the configuration refuses), with a message and a JSON pointer. */
static int args_parse(const char *json, struct exec_args *a, char *err, size_t errlen, char *ptr,
                      size_t ptrlen)
{
    struct jd_pjson *v, *argv, *env;
    memset(a, 0, sizeof *a);
    a->root = jd_builtin_parse_args(json, err, errlen);
    if (!a->root)
        return 1;
    argv = jd_pjson_get(a->root, "argv");
    if (!jd_pjson_is(argv, JD_PJSON_ARRAY) || argv->len == 0) {
        snprintf(err, errlen, "argv must be a non-empty array of strings");
        snprintf(ptr, ptrlen, "/argv");
        return 1;
    }
    a->argv = calloc(argv->len + 1, sizeof *a->argv);
    if (!a->argv) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    for (size_t i = 0; i < argv->len; i++) {
        /* Numbers and booleans become their text, so that a substituted
         * value such as "${steps.a.output.count}" (which keeps its JSON type)
         * can be an argument. The node owns the new string. */
        argv_item_to_text(argv->items[i]);
        if (!jd_pjson_is(argv->items[i], JD_PJSON_STRING) ||
            strlen(argv->items[i]->string) != argv->items[i]->len) {
            snprintf(err, errlen, "argv items must be strings without NUL bytes");
            snprintf(ptr, ptrlen, "/argv/%zu", i);
            return 1;
        }
        a->argv[i] = argv->items[i]->string;
    }
    if (!a->argv[0][0]) {
        snprintf(err, errlen, "argv[0] must name a program");
        snprintf(ptr, ptrlen, "/argv/0");
        return 1;
    }
    env = jd_pjson_get(a->root, "env");
    if (env && !jd_pjson_is(env, JD_PJSON_OBJECT)) {
        snprintf(err, errlen, "env must be an object of strings");
        snprintf(ptr, ptrlen, "/env");
        return 1;
    }
    a->envp = calloc((env ? env->len : 0) + 2, sizeof *a->envp);
    if (!a->envp) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    size_t ne = 0;
    int path_given = 0;
    for (size_t i = 0; env && i < env->len; i++) {
        const char *k = env->keys[i];
        struct jd_pjson *val = env->items[i];
        if (!*k || strchr(k, '=') || !jd_pjson_is(val, JD_PJSON_STRING) ||
            strlen(val->string) != val->len) {
            snprintf(err, errlen, "env names must be non-empty without '=', values strings");
            jd_builtin_ptr_token(ptr, ptrlen, "/env", k);
            return 1;
        }
        if (env_name_allowed(k, err, errlen) != 0) {
            jd_builtin_ptr_token(ptr, ptrlen, "/env", k);
            return EXEC_REFUSED;
        }
        if (strcmp(k, "PATH") == 0)
            path_given = 1;
        size_t n = strlen(k) + strlen(val->string) + 2;
        a->envp[ne] = malloc(n);
        if (!a->envp[ne]) {
            snprintf(err, errlen, "out of memory");
            return 1;
        }
        snprintf(a->envp[ne++], n, "%s=%s", k, val->string);
    }
    if (!path_given)
        a->envp[ne++] = strdup(EXEC_BASE_PATH);
    if ((v = jd_pjson_get(a->root, "stdin")) && !jd_pjson_is(v, JD_PJSON_NULL)) {
        if (!jd_pjson_is(v, JD_PJSON_STRING)) {
            snprintf(err, errlen, "stdin must be a string");
            snprintf(ptr, ptrlen, "/stdin");
            return 1;
        }
        a->stdin_text = v->string;
        a->stdin_len = v->len;
    }
    if ((v = jd_pjson_get(a->root, "cwd")) && !jd_pjson_is(v, JD_PJSON_NULL)) {
        if (!jd_pjson_is(v, JD_PJSON_STRING) || !v->len) {
            snprintf(err, errlen, "cwd must be a directory path");
            snprintf(ptr, ptrlen, "/cwd");
            return 1;
        }
        a->cwd = v->string;
    }
    if ((v = jd_pjson_get(a->root, "timeout_ms")) &&
        (!jd_pjson_int(v, &a->timeout_ms) || a->timeout_ms < 0)) {
        snprintf(err, errlen, "timeout_ms must be a non-negative integer");
        snprintf(ptr, ptrlen, "/timeout_ms");
        return 1;
    }
    if (allowed(a->argv[0], err, errlen) != 0) {
        snprintf(ptr, ptrlen, "/argv/0");
        return EXEC_REFUSED;
    }
    return 0;
}

static int exec_validate(const char *args_json, char *err, size_t errlen, char *ptr, size_t ptrlen)
{
    struct exec_args a;
    int rc = args_parse(args_json, &a, err, errlen, ptr, ptrlen);
    args_free(&a);
    return rc != 0;
}

/* ---- the children table and the orphan reaper ---- */

/* Caller holds tbl_mu. */
static int known_pid(pid_t pid)
{
    for (struct child *c = children; c; c = c->next)
        if (c->pid == pid && !c->reaped)
            return 1;
    return 0;
}

static void *orphan_reaper(void *arg)
{
    (void)arg;
    for (;;) {
        siginfo_t si;
        int known;
        memset(&si, 0, sizeof si);
        if (waitid(P_ALL, 0, &si, WEXITED | WNOWAIT) != 0 || si.si_pid == 0) {
            usleep(50 * 1000); /* no children right now */
            continue;
        }
        pthread_mutex_lock(&tbl_mu);
        known = known_pid(si.si_pid);
        if (!known)
            waitpid(si.si_pid, NULL, WNOHANG); /* an orphan: reap and forget it */
        pthread_mutex_unlock(&tbl_mu);
        if (known)
            usleep(2 * 1000); /* ours: its owner reaps it in a moment */
    }
    return NULL;
}

static pthread_once_t reaper_once = PTHREAD_ONCE_INIT;

static void reaper_start(void)
{
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, orphan_reaper, NULL) != 0)
        host->log(JD_PLOG_ERROR, "exec", "cannot start the orphan reaper thread");
    pthread_attr_destroy(&at);
}

static void maybe_start_reaper(void)
{
    int sub = 0;
    if (getpid() == 1 || (prctl(PR_GET_CHILD_SUBREAPER, &sub, 0, 0, 0) == 0 && sub))
        pthread_once(&reaper_once, reaper_start);
}

/* Reap c if it exited: 1 and *status if so. Under tbl_mu, so a cancel()
 * never signals a reaped (maybe recycled) pid.
 *
 * Before reaping, the rest of the leader's process group is killed: a job's
 * background children ("sleep 1000 &") must not outlive the job. It is done
 * while the leader is still a zombie, because the zombie keeps its pid (the
 * group's id) from being reused, so the signal cannot reach a new group. */
static int try_reap(struct child *c, int *status)
{
    siginfo_t si;
    int got = 0;
    pthread_mutex_lock(&tbl_mu);
    memset(&si, 0, sizeof si);
    if (!c->reaped && waitid(P_PID, (id_t)c->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        si.si_pid == c->pid) {
        kill(-c->pid, SIGKILL);
        if (waitpid(c->pid, status, WNOHANG) == c->pid) {
            c->reaped = 1;
            got = 1;
        }
    }
    pthread_mutex_unlock(&tbl_mu);
    return got;
}

static void kill_group(struct child *c)
{
    pthread_mutex_lock(&tbl_mu);
    if (c->pid > 0 && !c->reaped)
        kill(-c->pid, SIGKILL);
    pthread_mutex_unlock(&tbl_mu);
}

static void unregister(struct child *c)
{
    pthread_mutex_lock(&tbl_mu);
    for (struct child **pp = &children; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    pthread_mutex_unlock(&tbl_mu);
}

static void exec_cancel(struct jd_call *call)
{
    pthread_mutex_lock(&tbl_mu);
    for (struct child *c = children; c; c = c->next) {
        if (c->call == call) {
            c->killed = 1;
            if (c->pid > 0 && !c->reaped)
                kill(-c->pid, SIGKILL);
        }
    }
    pthread_mutex_unlock(&tbl_mu);
}

/* ---- running ---- */

struct stream {
    int fd;
    char *buf;
    size_t len;
    int truncated;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* now + ms without overflow: a job may ask for any timeout_ms up to 2^63. */
static int64_t deadline_after(int64_t now, int64_t ms)
{
    return ms > INT64_MAX - now ? INT64_MAX : now + ms;
}

/* Milliseconds from now until t, as poll() takes them (0..INT_MAX). */
static int poll_ms_until(int64_t t, int64_t now)
{
    if (t <= now)
        return 0;
    return t - now > INT_MAX ? INT_MAX : (int)(t - now);
}

/* Read what is available; returns 0 at EOF or error (fd closed), 1 otherwise. */
static int stream_read(struct stream *s, size_t cap)
{
    char tmp[16384];
    for (;;) {
        ssize_t n = read(s->fd, tmp, sizeof tmp);
        if (n > 0) {
            size_t keep = s->len < cap ? cap - s->len : 0;
            if ((size_t)n > keep)
                s->truncated = 1;
            else
                keep = (size_t)n;
            if (keep) {
                memcpy(s->buf + s->len, tmp, keep);
                s->len += keep;
            }
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 1;
        if (n < 0 && errno == EINTR)
            continue;
        close(s->fd);
        s->fd = -1;
        return 0;
    }
}

static int pidfd_of(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    return -1;
#endif
}

static void result_json(struct jd_pjson_buf *b, int status, const struct stream *out,
                        const struct stream *err, int64_t duration)
{
    jd_pjson_buf_cat(b, "{\"exit_code\":");
    if (WIFEXITED(status))
        jd_pjson_buf_printf(b, "%d", WEXITSTATUS(status));
    else
        jd_pjson_buf_cat(b, "null");
    jd_pjson_buf_cat(b, ",\"signal\":");
    if (WIFSIGNALED(status))
        jd_pjson_buf_printf(b, "%d", WTERMSIG(status));
    else
        jd_pjson_buf_cat(b, "null");
    jd_pjson_buf_cat(b, ",\"stdout\":");
    jd_pjson_buf_strn(b, out->buf ? out->buf : "", out->len);
    jd_pjson_buf_cat(b, ",\"stderr\":");
    jd_pjson_buf_strn(b, err->buf ? err->buf : "", err->len);
    jd_pjson_buf_printf(b, ",\"truncated\":%s,\"duration_ms\":%lld}",
                        out->truncated || err->truncated ? "true" : "false", (long long)duration);
}

static void set_nonblock(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static void exec_handle(const struct jd_call_info *info)
{
    struct exec_args a;
    char err[300] = "", ptr[128] = "";
    int in_p[2] = {-1, -1}, out_p[2] = {-1, -1}, err_p[2] = {-1, -1};
    struct stream so = {-1, NULL, 0, 0}, se = {-1, NULL, 0, 0};
    struct child c = {0};
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t sigs;
    int fa_ok = 0, at_ok = 0, pidfd = -1, status = 0, exited = 0, timed_out = 0, rc;
    size_t cap = jd_builtin_output_cap(host, EXEC_DEFAULT_CAP), in_off = 0;
    int64_t start = now_ms(), deadline, drain_until = 0, timeout_ms;
    struct jd_pjson_buf res = {0};
    pid_t pid;

    /* Checked again here, not only at submit: args may come from a
     * substitution (${...}) that validate never saw. */
    if ((rc = args_parse(info->args_json, &a, err, sizeof err, ptr, sizeof ptr)) != 0) {
        host->fail(info->call, rc == EXEC_REFUSED ? "not_allowed" : "invalid_args", err, 0, NULL);
        args_free(&a);
        return;
    }
    maybe_start_reaper();
    so.buf = malloc(cap ? cap : 1);
    se.buf = malloc(cap ? cap : 1);
    if (!so.buf || !se.buf || pipe2(out_p, O_CLOEXEC) || pipe2(err_p, O_CLOEXEC) ||
        (a.stdin_text && pipe2(in_p, O_CLOEXEC))) {
        host->fail(info->call, "spawn_failed", "cannot allocate buffers or pipes", 1, NULL);
        goto out;
    }
    posix_spawn_file_actions_init(&fa);
    fa_ok = 1;
    posix_spawnattr_init(&at);
    at_ok = 1;
    if (a.stdin_text)
        posix_spawn_file_actions_adddup2(&fa, in_p[0], 0);
    else
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out_p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err_p[1], 2);
    /* The child gets 0, 1 and 2 only: no descriptor of the server (other
     * jobs' pipes and sockets, whatever jackdawd inherited) whether or not it
     * is close-on-exec. glibc does this in the child with close_range(3, ~0U),
     * falling back to closing each entry of /proc/self/fd. */
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    if (a.cwd)
        posix_spawn_file_actions_addchdir_np(&fa, a.cwd);
    sigemptyset(&sigs);
    posix_spawnattr_setsigmask(&at, &sigs);
    sigfillset(&sigs);
    sigdelset(&sigs, SIGKILL);
    sigdelset(&sigs, SIGSTOP);
    posix_spawnattr_setsigdefault(&at, &sigs);
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);

    c.call = info->call;
    pthread_mutex_lock(&tbl_mu);
    c.next = children;
    children = &c;
    /* Spawn under the table lock: the orphan reaper must know the pid
     * before it can see it exit. */
    if (strchr(a.argv[0], '/'))
        rc = posix_spawn(&pid, a.argv[0], &fa, &at, a.argv, a.envp);
    else
        rc = posix_spawnp(&pid, a.argv[0], &fa, &at, a.argv, a.envp);
    if (rc == 0)
        c.pid = pid;
    if (rc == 0 && c.killed)
        kill(-pid, SIGKILL); /* cancel() came before the pid existed */
    pthread_mutex_unlock(&tbl_mu);
    if (rc != 0) {
        if (a.cwd)
            snprintf(err, sizeof err, "cannot run %.120s in %.120s: %s", a.argv[0], a.cwd,
                     strerror(rc));
        else
            snprintf(err, sizeof err, "cannot run %.200s: %s", a.argv[0], strerror(rc));
        unregister(&c);
        host->fail(info->call, "spawn_failed", err, 0, NULL);
        goto out;
    }
    if (host->is_cancelled(info->call))
        kill_group(&c);

    close(out_p[1]);
    out_p[1] = -1;
    close(err_p[1]);
    err_p[1] = -1;
    if (in_p[0] >= 0) {
        close(in_p[0]);
        in_p[0] = -1;
        set_nonblock(in_p[1]);
    }
    so.fd = out_p[0];
    se.fd = err_p[0];
    out_p[0] = err_p[0] = -1;
    set_nonblock(so.fd);
    set_nonblock(se.fd);
    pidfd = pidfd_of(pid);
    /* The args' timeout_ms, else the configured default (--exec-timeout):
     * a child that hangs must not hold a blocking-pool thread forever. */
    timeout_ms = a.timeout_ms > 0
                     ? a.timeout_ms
                     : jd_builtin_config_ms(host, "exec_timeout_ms", EXEC_DEFAULT_TIMEOUT_MS);
    deadline = timeout_ms > 0 ? deadline_after(start, timeout_ms) : 0;

    for (;;) {
        struct pollfd pfd[4];
        int n = 0, wait_ms = -1, ipid = -1, iin = -1, iout = -1, ierr = -1;
        int64_t now = now_ms();
        if (!exited && try_reap(&c, &status)) {
            exited = 1;
            drain_until = now + EXEC_DRAIN_MS;
        }
        if (exited && ((so.fd < 0 && se.fd < 0) || now >= drain_until))
            break;
        if (!exited && deadline && now >= deadline && !timed_out) {
            timed_out = 1;
            kill_group(&c);
        }
        if (so.fd >= 0)
            pfd[iout = n++] = (struct pollfd){.fd = so.fd, .events = POLLIN};
        if (se.fd >= 0)
            pfd[ierr = n++] = (struct pollfd){.fd = se.fd, .events = POLLIN};
        if (in_p[1] >= 0 && !exited)
            pfd[iin = n++] = (struct pollfd){.fd = in_p[1], .events = POLLOUT};
        if (pidfd >= 0 && !exited)
            pfd[ipid = n++] = (struct pollfd){.fd = pidfd, .events = POLLIN};
        if (pidfd < 0 && !exited)
            wait_ms = 10; /* no pidfd: look for the exit every 10 ms */
        if (deadline && !timed_out && !exited) {
            int until = poll_ms_until(deadline, now);
            wait_ms = wait_ms < 0 || until < wait_ms ? until : wait_ms;
        }
        if (exited)
            wait_ms = poll_ms_until(drain_until, now);
        if (!n && pidfd >= 0 && !exited)
            wait_ms = wait_ms < 0 ? 1000 : wait_ms;
        if (poll(pfd, (nfds_t)n, wait_ms) < 0 && errno != EINTR)
            break;
        if (iout >= 0 && pfd[iout].revents)
            stream_read(&so, cap);
        if (ierr >= 0 && pfd[ierr].revents)
            stream_read(&se, cap);
        if (iin >= 0 && pfd[iin].revents) {
            ssize_t w = pfd[iin].revents & POLLOUT
                            ? write(in_p[1], a.stdin_text + in_off, a.stdin_len - in_off)
                            : -1;
            if (w > 0)
                in_off += (size_t)w;
            if ((w < 0 && errno != EAGAIN && errno != EINTR) || in_off >= a.stdin_len) {
                close(in_p[1]); /* all written, or the child stopped reading */
                in_p[1] = -1;
            }
        }
    }
    if (!exited) { /* poll failed: make sure the child is gone and reaped */
        kill_group(&c);
        while (!try_reap(&c, &status))
            usleep(1000);
    }
    unregister(&c);

    result_json(&res, status, &so, &se, now_ms() - start);
    if (c.killed) {
        host->complete(info->call, NULL); /* cancelled: the host already finished it */
    } else if (timed_out) {
        snprintf(err, sizeof err, "killed after %lld ms (%s)", (long long)timeout_ms,
                 a.timeout_ms > 0 ? "timeout_ms" : "the default deadline, --exec-timeout");
        host->fail(info->call, "timeout", err, 1, res.p);
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        host->complete(info->call, res.p);
    } else {
        if (WIFEXITED(status))
            snprintf(err, sizeof err, "%.200s exited with status %d", a.argv[0],
                     WEXITSTATUS(status));
        else
            snprintf(err, sizeof err, "%.200s was killed by signal %d", a.argv[0],
                     WTERMSIG(status));
        host->fail(info->call, "exit_status", err, 1, res.p);
    }
out:
    for (int i = 0; i < 2; i++) {
        if (in_p[i] >= 0)
            close(in_p[i]);
        if (out_p[i] >= 0)
            close(out_p[i]);
        if (err_p[i] >= 0)
            close(err_p[i]);
    }
    if (so.fd >= 0)
        close(so.fd);
    if (se.fd >= 0)
        close(se.fd);
    if (pidfd >= 0)
        close(pidfd);
    if (fa_ok)
        posix_spawn_file_actions_destroy(&fa);
    if (at_ok)
        posix_spawnattr_destroy(&at);
    free(so.buf);
    free(se.buf);
    jd_pjson_buf_free(&res);
    args_free(&a);
}

static const struct jd_command commands[] = {
    {
        .name = "exec",
        .flags = JD_CMD_BLOCKING,
        .validate = exec_validate,
        .handle = exec_handle,
        .cancel = exec_cancel,
    },
};

JD_BUILTIN_PLUGIN("exec", commands, 1, NULL, 0)
