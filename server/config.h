/*
 * The server's configuration: command-line flags with JACKDAW_* environment
 * equivalents (a flag wins over its variable, the variable over the
 * default). Parsing is pure (no I/O but getenv) so unit tests can drive it.
 * Not thread-safe: parse once in main() before starting threads.
 */
#ifndef JD_SERVER_CONFIG_H
#define JD_SERVER_CONFIG_H

#include "common/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define JD_CONFIG_HOST_MAX 256 /* a DNS name or an address literal */
#define JD_CONFIG_URL_MAX 512  /* --advertise-url: a base URL, no query */

struct jd_config {
    char host[JD_CONFIG_HOST_MAX]; /* --listen host part; default 127.0.0.1 */
    uint16_t port;                 /* --listen port; 0 picks a free port; default 8080 */
    char *db;                      /* --db; default ./data/jackdaw.db */
    unsigned workers;              /* --workers; 0: one per core */
    bool pin_workers;              /* --pin-workers on|off; default off */
    char *plugin_dir;              /* --plugin-dir; default given to jd_config_parse */
    bool sync_full;                /* --sync full|normal; default full */
    char *token;                   /* --token; NULL: /v1 is open */
    char *worker_token;            /* --worker-token; NULL: none */
    char *exec_allow;              /* --exec-allow; NULL: exec refuses every program */
    char *exec_env_allow;          /* --exec-env-allow; NULL: any env name but the deny-list */
    int64_t exec_timeout_ms;       /* --exec-timeout; default deadline of exec, default 10 min */
    char *http_allow;              /* --http-allow; NULL: any host */
    char *webhook_secret;          /* --webhook-secret; NULL: job webhooks are unsigned */
    int64_t http_timeout_ms;       /* --http-timeout; default deadline of http, default 60 s */
    int64_t retention_ms;          /* --retention; 0: keep terminal jobs forever */
    char *command_limits;          /* --command-limit "http=64,exec=8"; NULL: none */
    size_t max_body;               /* --max-body; default 4 MiB */
    int log_level;                 /* --log-level; enum jd_log_level, default info */
    unsigned http_threads;         /* --http-threads; default 2 */
    unsigned max_connections;      /* --max-connections; default 1000 */
    unsigned conn_timeout_s;       /* --conn-timeout; idle connection cut-off, default 30 s */
    unsigned max_parked;           /* --max-parked; long-poll + SSE connections, default 512 */
    int64_t max_wait_ms;           /* --max-wait; cap on ?wait=, default 60 s */
    int64_t heartbeat_ms;          /* --heartbeat; SSE comment interval, default 15 s */
    int64_t grace_ms;              /* --grace; shutdown drain period, default 10 s */
    unsigned max_schedules;        /* --max-schedules; default 10000 */
    size_t max_job_memory;         /* --max-job-memory; definitions in memory, default 256 MiB */
    unsigned max_replays;          /* --max-replays; poison-job quarantine, default 3, 0: off */
    unsigned queue_window;         /* --queue-window; queued jobs in memory per queue, 0: all */
    char *advertise_url;           /* --advertise-url; NULL: derived from --listen */
    int64_t lease_ms;              /* --lease; a cluster node's lease (PostgreSQL), default 10 s */
    unsigned db_readers;           /* --db-readers; PostgreSQL read connections at most, 16 */
    int64_t db_reader_idle_ms;     /* --db-reader-idle; close an idle one after, default 60 s */
    int64_t db_connect_wait_ms;    /* --db-connect-wait; retry an unreachable database, 30 s */
    bool ui;                       /* --ui on|off; serve the dashboard, default on */
    bool help;                     /* --help was given: print usage, exit 0 */
};

/*
 * Fill c from argv and the environment. default_plugin_dir (borrowed, may be
 * NULL) is used when neither --plugin-dir nor JACKDAW_PLUGIN_DIR is given.
 * Returns 0, or JD_EINVAL with err naming the flag and the bad value. Strings
 * in c are malloc'd: caller frees with jd_config_free (also after failure).
 */
int jd_config_parse(struct jd_config *c, int argc, char **argv, const char *default_plugin_dir,
                    struct jd_error *err);
void jd_config_free(struct jd_config *c);

/* Parse "HOST:PORT" or "[v6]:PORT" into host (hostlen bytes) and port. */
int jd_config_parse_listen(const char *s, char *host, size_t hostlen, uint16_t *port);

/* Parse a byte count: digits with an optional k/K, m/M or g/G (binary) suffix. */
int jd_config_parse_bytes(const char *s, size_t *out);

/* --help text. */
void jd_config_usage(FILE *f, const char *argv0);

#endif
