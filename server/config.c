/*
 * Flags and JACKDAW_* environment variables -> struct jd_config.
 *
 * Every option is one row of a table (flag, variable, kind, help), so the
 * parser, the environment lookup and --help cannot drift apart. Values are
 * applied in order defaults, environment, flags; both "--flag value" and
 * "--flag=value" are accepted. Single-threaded: called from main() only.
 */
#include "server/config.h"
#include "server/jobs.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

enum opt_kind {
    OPT_LISTEN,
    OPT_STR,
    OPT_UINT,
    OPT_BOOL,
    OPT_SYNC,
    OPT_DURATION,
    OPT_BYTES,
    OPT_LEVEL
};

struct opt {
    const char *flag;
    const char *env;
    enum opt_kind kind;
    size_t off; /* offsetof the field in struct jd_config */
    const char *arg;
    const char *help;
};

#define F(field) offsetof(struct jd_config, field)

static const struct opt opts[] = {
    {"--listen", "JACKDAW_LISTEN", OPT_LISTEN, 0, "HOST:PORT",
     "address to listen on (default 127.0.0.1:8080; port 0 picks a free port)"},
    {"--db", "JACKDAW_DB", OPT_STR, F(db), "FILE|URL",
     "SQLite database file (default ./data/jackdaw.db), or postgres://user@host:port/db"},
    {"--workers", "JACKDAW_WORKERS", OPT_UINT, F(workers), "N",
     "scheduler worker threads (default 0: one per core)"},
    {"--pin-workers", "JACKDAW_PIN_WORKERS", OPT_BOOL, F(pin_workers), "on|off",
     "pin worker i to the i-th allowed CPU (default off)"},
    {"--plugin-dir", "JACKDAW_PLUGIN_DIR", OPT_STR, F(plugin_dir), "DIR",
     "load every plugin .so in DIR (default: plugins/ next to the binary)"},
    {"--sync", "JACKDAW_SYNC", OPT_SYNC, F(sync_full), "full|normal",
     "full: fsync every commit (default); normal: WAL sync at checkpoints"},
    {"--token", "JACKDAW_TOKEN", OPT_STR, F(token), "T",
     "require 'Authorization: Bearer T' on /v1 (default: open)"},
    {"--worker-token", "JACKDAW_WORKER_TOKEN", OPT_STR, F(worker_token), "T",
     "a second token for workers: opens only /v1/tasks/* and PUT /v1/commands/* (needs --token)"},
    {"--exec-allow", "JACKDAW_EXEC_ALLOW", OPT_STR, F(exec_allow), "LIST",
     "programs the exec handler may run: comma-separated absolute paths, or * (default: none)"},
    {"--exec-env-allow", "JACKDAW_EXEC_ENV_ALLOW", OPT_STR, F(exec_env_allow), "LIST",
     "env names exec jobs may set, comma-separated, NAME or PREFIX* (default: any but loader "
     "and interpreter hooks)"},
    {"--exec-timeout", "JACKDAW_EXEC_TIMEOUT", OPT_DURATION, F(exec_timeout_ms), "DURATION",
     "deadline of an exec call whose args give no timeout_ms (default 10m)"},
    {"--http-allow", "JACKDAW_HTTP_ALLOW", OPT_STR, F(http_allow), "LIST",
     "hosts the http handler may call: HOST, HOST:PORT, [V6]:PORT, comma-separated (default: "
     "any but link-local)"},
    {"--webhook-secret", "JACKDAW_WEBHOOK_SECRET", OPT_STR, F(webhook_secret), "SECRET",
     "key of the HMAC-SHA256 signature on job webhooks (\"notify\"), header Jackdaw-Signature "
     "(default: unsigned)"},
    {"--http-timeout", "JACKDAW_HTTP_TIMEOUT", OPT_DURATION, F(http_timeout_ms), "DURATION",
     "deadline of an http call whose args give no timeout_ms (default 60s)"},
    {"--retention", "JACKDAW_RETENTION", OPT_DURATION, F(retention_ms), "DURATION",
     "delete terminal jobs finished longer ago, e.g. 7d (default 0: keep)"},
    {"--command-limit", "JACKDAW_COMMAND_LIMIT", OPT_STR, F(command_limits), "LIST",
     "calls of a command in flight at once, e.g. http=64,exec=8; more wait in order "
     "(default: no limit)"},
    {"--max-body", "JACKDAW_MAX_BODY", OPT_BYTES, F(max_body), "BYTES",
     "largest request body, suffix k/m allowed (default 4m); larger gets 413"},
    {"--log-level", "JACKDAW_LOG_LEVEL", OPT_LEVEL, F(log_level), "LEVEL",
     "debug, info (default), warn, error or off"},
    {"--http-threads", "JACKDAW_HTTP_THREADS", OPT_UINT, F(http_threads), "N",
     "HTTP event-loop threads (default 2)"},
    {"--max-connections", "JACKDAW_MAX_CONNECTIONS", OPT_UINT, F(max_connections), "N",
     "open HTTP connections at most (default 1000)"},
    {"--conn-timeout", "JACKDAW_CONN_TIMEOUT", OPT_DURATION, F(conn_timeout_s), "DURATION",
     "close a connection idle this long, e.g. a slow client (default 30s)"},
    {"--max-parked", "JACKDAW_MAX_PARKED", OPT_UINT, F(max_parked), "N",
     "long-poll and SSE connections parked at once; more get 429 (default 512)"},
    {"--max-wait", "JACKDAW_MAX_WAIT", OPT_DURATION, F(max_wait_ms), "DURATION",
     "cap on GET /v1/jobs/{id}?wait= (default 60s)"},
    {"--heartbeat", "JACKDAW_HEARTBEAT", OPT_DURATION, F(heartbeat_ms), "DURATION",
     "SSE heartbeat comment interval (default 15s)"},
    {"--grace", "JACKDAW_GRACE", OPT_DURATION, F(grace_ms), "DURATION",
     "on SIGTERM/SIGINT, wait this long for running steps (default 10s)"},
    {"--max-schedules", "JACKDAW_MAX_SCHEDULES", OPT_UINT, F(max_schedules), "N",
     "schedules kept at most; creating more gets 429 (default 10000)"},
    {"--max-job-memory", "JACKDAW_MAX_JOB_MEMORY", OPT_BYTES, F(max_job_memory), "BYTES",
     "memory live jobs' definitions and step outputs may hold together, suffix k/m/g "
     "allowed (default 256m); a submit past it gets 503"},
    {"--max-replays", "JACKDAW_MAX_REPLAYS", OPT_UINT, F(max_replays), "N",
     "fail a job as quarantined once the server died N times in a row while running it "
     "(default 3, 0: never)"},
    {"--queue-window", "JACKDAW_QUEUE_WINDOW", OPT_UINT, F(queue_window), "N",
     "queued jobs each queue keeps in memory, the next to run; the rest wait in the store "
     "and are read in as these drain (default 1000, 0: all in memory)"},
    {"--lease", "JACKDAW_LEASE", OPT_DURATION, F(lease_ms), "DURATION",
     "cluster (PostgreSQL): a node that misses its heartbeats this long loses its jobs to the "
     "other nodes (default 10s, at least 1s)"},
    {"--db-readers", "JACKDAW_DB_READERS", OPT_UINT, F(db_readers), "N",
     "PostgreSQL: read connections this node opens at most (default 16, at least 2); a read "
     "that finds them all busy for 5s gets 503"},
    {"--db-reader-idle", "JACKDAW_DB_READER_IDLE", OPT_DURATION, F(db_reader_idle_ms), "DURATION",
     "PostgreSQL: close a read connection idle this long, keeping 2 (default 60s)"},
    {"--db-connect-wait", "JACKDAW_DB_CONNECT_WAIT", OPT_DURATION, F(db_connect_wait_ms),
     "DURATION",
     "PostgreSQL: at start, keep retrying a database that cannot be reached this long, "
     "with backoff, before giving up (default 30s, 0: do not retry)"},
    {"--advertise-url", "JACKDAW_ADVERTISE_URL", OPT_STR, F(advertise_url), "URL",
     "cluster (PostgreSQL): the base URL other nodes reach this one at, for remote tasks "
     "(default http://<--listen>; a 0.0.0.0 or [::] listen uses the host name)"},
    {"--ui", "JACKDAW_UI", OPT_BOOL, F(ui), "on|off",
     "serve the dashboard at /ui/ (default on; off: /ui/ and / answer 404)"},
};

#define NOPTS (sizeof opts / sizeof opts[0])

int jd_config_parse_listen(const char *s, char *host, size_t hostlen, uint16_t *port)
{
    const char *colon;
    const char *h = s;
    size_t hl;
    if (s == NULL || *s == '\0')
        return JD_EINVAL;
    if (*s == '[') {
        const char *close = strchr(s, ']');
        if (close == NULL || close[1] != ':')
            return JD_EINVAL;
        h = s + 1;
        hl = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (colon == NULL)
            return JD_EINVAL;
        hl = (size_t)(colon - s);
        if (memchr(s, ':', hl) != NULL) /* bare IPv6 needs brackets */
            return JD_EINVAL;
    }
    if (hl == 0 || hl >= hostlen)
        return JD_EINVAL;
    const char *p = colon + 1;
    if (*p == '\0' || strlen(p) > 5)
        return JD_EINVAL;
    unsigned long v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9')
            return JD_EINVAL;
        v = v * 10 + (unsigned long)(*p - '0');
    }
    if (v > 65535)
        return JD_EINVAL;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (uint16_t)v;
    return 0;
}

int jd_config_parse_bytes(const char *s, size_t *out)
{
    if (s == NULL || *s < '0' || *s > '9')
        return JD_EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0)
        return JD_EINVAL;
    unsigned shift = 0;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    default:
        return JD_EINVAL;
    }
    if (*end == 'b' || *end == 'B') /* "4mb", "4MB" */
        end++;
    if (*end != '\0' || v > (SIZE_MAX >> shift) || v == 0)
        return JD_EINVAL;
    *out = (size_t)(v << shift);
    return 0;
}

static int parse_uint(const char *s, unsigned *out)
{
    if (s == NULL || *s < '0' || *s > '9')
        return JD_EINVAL;
    errno = 0;
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > 1000000)
        return JD_EINVAL;
    *out = (unsigned)v;
    return 0;
}

static int apply(struct jd_config *c, const struct opt *o, const char *val, const char *from,
                 struct jd_error *err)
{
    char *base = (char *)c;
    int64_t ms;
    unsigned u;
    size_t bytes;
    int lvl;
    switch (o->kind) {
    case OPT_LISTEN:
        if (jd_config_parse_listen(val, c->host, sizeof c->host, &c->port) != 0)
            goto bad;
        return 0;
    case OPT_STR: {
        char **field = (char **)(base + o->off);
        free(*field);
        *field = jd_xstrdup(val);
        return 0;
    }
    case OPT_UINT:
        if (parse_uint(val, &u) != 0)
            goto bad;
        *(unsigned *)(base + o->off) = u;
        return 0;
    case OPT_BOOL:
        if (strcmp(val, "on") == 0 || strcmp(val, "true") == 0 || strcmp(val, "yes") == 0 ||
            strcmp(val, "1") == 0)
            *(bool *)(base + o->off) = true;
        else if (strcmp(val, "off") == 0 || strcmp(val, "false") == 0 || strcmp(val, "no") == 0 ||
                 strcmp(val, "0") == 0)
            *(bool *)(base + o->off) = false;
        else
            goto bad;
        return 0;
    case OPT_SYNC:
        if (strcmp(val, "full") == 0)
            c->sync_full = true;
        else if (strcmp(val, "normal") == 0)
            c->sync_full = false;
        else
            goto bad;
        return 0;
    case OPT_DURATION:
        if (jd_duration_parse(val, &ms) != 0 || ms < 0)
            goto bad;
        if (o->off == F(conn_timeout_s)) {
            int64_t s = (ms + 999) / 1000;
            if (s > 86400)
                goto bad;
            c->conn_timeout_s = (unsigned)s;
        } else {
            *(int64_t *)(base + o->off) = ms;
        }
        return 0;
    case OPT_BYTES:
        if (jd_config_parse_bytes(val, &bytes) != 0)
            goto bad;
        *(size_t *)(base + o->off) = bytes;
        return 0;
    case OPT_LEVEL:
        lvl = jd_log_level_parse(val);
        if (lvl < 0)
            goto bad;
        c->log_level = lvl;
        return 0;
    }
bad:
    return jd_error_set(err, JD_EINVAL, NULL, "invalid value \"%s\" for %s (%s %s)", val, from,
                        o->flag, o->arg);
}

static const struct opt *find_flag(const char *arg, size_t len)
{
    for (size_t i = 0; i < NOPTS; i++)
        if (strlen(opts[i].flag) == len && strncmp(opts[i].flag, arg, len) == 0)
            return &opts[i];
    return NULL;
}

int jd_config_parse(struct jd_config *c, int argc, char **argv, const char *default_plugin_dir,
                    struct jd_error *err)
{
    int rc;
    memset(c, 0, sizeof *c);
    strcpy(c->host, "127.0.0.1");
    c->port = 8080;
    c->db = jd_xstrdup("./data/jackdaw.db");
    c->plugin_dir = jd_xstrdup(default_plugin_dir);
    c->sync_full = true;
    c->ui = true;
    c->max_body = (size_t)4 << 20; /* a 1000-job batch of small definitions fits */
    c->log_level = JD_LOG_INFO;
    c->http_threads = 2;       /* the target machines have 2 cores */
    c->max_connections = 1000; /* below the usual 1024 open-file limit */
    c->conn_timeout_s = 30;
    c->max_parked = 512; /* half the connections: waiters cannot starve submitters */
    c->max_wait_ms = 60000;
    c->heartbeat_ms = 15000; /* below common proxy idle timeouts (30-60 s) */
    c->grace_ms = 10000;
    c->max_job_memory = (size_t)256 << 20; /* ~128 jobs of the largest size (1 MiB) at once */
    c->max_schedules = 10000;              /* each holds a timer and its definition in memory */
    c->max_replays = JD_JOBS_MAX_REPLAYS_DEFAULT;
    c->queue_window = 1000; /* ~3 MB of queued jobs per queue; a backlog waits in the store */
    c->exec_timeout_ms = 10 * 60 * 1000; /* a hung child cannot hold a blocking thread forever */
    c->http_timeout_ms = 60 * 1000;      /* as common HTTP clients' total timeouts */
    c->lease_ms = 10000;                 /* a dead node's jobs move within ~1.5 leases */
    c->db_readers = 16;            /* x nodes: within PostgreSQL's default max_connections (100) */
    c->db_reader_idle_ms = 60000;  /* a burst's connections go within a minute */
    c->db_connect_wait_ms = 30000; /* PostgreSQL starting beside the node (compose) is up by then */

    for (size_t i = 0; i < NOPTS; i++) {
        const char *v = getenv(opts[i].env);
        if (v != NULL && (rc = apply(c, &opts[i], v, opts[i].env, err)) != 0)
            return rc;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            c->help = true;
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const struct opt *o = find_flag(a, len);
        if (o == NULL)
            return jd_error_set(err, JD_EINVAL, NULL, "unknown option \"%s\" (see --help)", a);
        const char *val;
        if (eq != NULL) {
            val = eq + 1;
        } else {
            if (i + 1 >= argc)
                return jd_error_set(err, JD_EINVAL, NULL, "%s needs a value (%s)", o->flag, o->arg);
            val = argv[++i];
        }
        if ((rc = apply(c, o, val, o->flag, err)) != 0)
            return rc;
    }
    if (c->http_threads == 0 || c->max_connections == 0 || c->max_body == 0)
        return jd_error_set(err, JD_EINVAL, NULL,
                            "--http-threads, --max-connections and --max-body must be > 0");
    if (c->exec_timeout_ms <= 0 || c->http_timeout_ms <= 0)
        return jd_error_set(err, JD_EINVAL, NULL,
                            "--exec-timeout and --http-timeout must be > 0 (a job may ask for "
                            "longer with its own timeout_ms)");
    if (c->lease_ms < 1000 || c->lease_ms > 3600000)
        return jd_error_set(err, JD_EINVAL, NULL,
                            "--lease must be from 1s to 1h (heartbeats go every lease/5)");
    if (c->db_readers < 2 || c->db_readers > 1000 || c->db_reader_idle_ms < 1000)
        return jd_error_set(err, JD_EINVAL, NULL,
                            "--db-readers must be from 2 to 1000 and --db-reader-idle at least 1s");
    if (c->db_connect_wait_ms < 0 || c->db_connect_wait_ms > 3600000)
        return jd_error_set(err, JD_EINVAL, NULL, "--db-connect-wait must be from 0 to 1h");
    if (c->token != NULL && c->token[0] == '\0') {
        free(c->token); /* an empty token means "no auth", as an unset variable */
        c->token = NULL;
    }
    if (c->worker_token != NULL && c->worker_token[0] == '\0') {
        free(c->worker_token);
        c->worker_token = NULL;
    }
    if (c->advertise_url != NULL && c->advertise_url[0] != '\0' &&
        ((strncmp(c->advertise_url, "http://", 7) != 0 &&
          strncmp(c->advertise_url, "https://", 8) != 0) ||
         strlen(c->advertise_url) > JD_CONFIG_URL_MAX))
        return jd_error_set(err, JD_EINVAL, NULL,
                            "--advertise-url must be an http:// or https:// URL of at most %d "
                            "bytes",
                            JD_CONFIG_URL_MAX);
    if (c->worker_token != NULL && c->token == NULL)
        return jd_error_set(err, JD_EINVAL, NULL,
                            "--worker-token needs --token (without it /v1 is open to anyone)");
    if (c->worker_token != NULL && strcmp(c->worker_token, c->token) == 0)
        return jd_error_set(err, JD_EINVAL, NULL, "--worker-token must differ from --token");
    return 0;
}

void jd_config_free(struct jd_config *c)
{
    free(c->db);
    free(c->plugin_dir);
    free(c->token);
    free(c->worker_token);
    c->worker_token = NULL;
    free(c->exec_allow);
    free(c->exec_env_allow);
    free(c->http_allow);
    free(c->command_limits);
    c->command_limits = NULL;
    free(c->webhook_secret);
    free(c->advertise_url);
    c->advertise_url = NULL;
    c->db = c->plugin_dir = c->token = c->exec_allow = c->exec_env_allow = c->http_allow = NULL;
    c->webhook_secret = NULL;
}

void jd_config_usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "Usage: %s [options]\n\n"
            "Jackdaw: an HTTP job-queue service. Every option can also be set by the\n"
            "environment variable shown; a flag wins over its variable.\n\n",
            argv0);
    for (size_t i = 0; i < NOPTS; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s %s", opts[i].flag, opts[i].arg);
        fprintf(f, "  %-28s %s\n  %-28s [%s]\n", left, opts[i].help, "", opts[i].env);
    }
    fprintf(f, "  %-28s %s\n\n", "--help", "show this text");
    fprintf(f, "DURATION: 500ms, 30s, 2m, 1h, 7d or a bare number of seconds.\n"
               "Signals: SIGTERM or SIGINT drain and exit 0; running jobs resume on the next "
               "start.\n");
}
