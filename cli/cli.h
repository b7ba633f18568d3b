/*
 * What every jackdaw subcommand shares: the connection and --json flag set
 * by main, the exit codes, one request with its refusal reported on stderr,
 * and small printing and argument helpers. Single threaded (main's thread;
 * `jackdaw work` has its own threads and does not use these).
 */
#ifndef JD_CLI_CLI_H
#define JD_CLI_CLI_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli/client.h"
#include "cli/table.h"

/* Exit codes (also in --help and README.md). */
enum {
    JD_EX_OK = 0,         /* done */
    JD_EX_REFUSED = 1,    /* the server said no (4xx); its problem detail is on stderr */
    JD_EX_USAGE = 2,      /* bad command line */
    JD_EX_SERVER = 3,     /* cannot connect, 5xx or an unreadable answer */
    JD_EX_JOB_FAILED = 4, /* (--wait) the job ended failed or cancelled */
    JD_EX_WAIT_ENDED = 5, /* (--wait) the wait ended before the job did */
};

extern struct jd_cli_conn jd_cli; /* URL and token, set by main before any command */
extern int jd_cli_json;           /* --json: print the server's JSON unchanged */

/* Print a usage text: to stdout for --help (returns 0), else to stderr (2). */
int jd_cli_usage(const char *text, int to_stdout);
int jd_cli_is_help(const char *a);

/* Report a failed or refused answer on stderr; returns its exit code. */
int jd_cli_report(const struct jd_cli_resp *r, int rc);

/* One request; returns an exit code. On success *out (if out) is the parsed
 * JSON (cJSON_Delete) and *raw (if raw) the body (free). */
int jd_cli_call(const char *method, const char *path, const char *body, long timeout_s, cJSON **out,
                char **raw);

/* o[k] as a string (NULL if absent or not a string). */
const char *jd_cli_str(const cJSON *o, const char *k);
/* o[k], a number or a string, as text into buf ("" if absent). */
void jd_cli_num_or_str(const cJSON *o, const char *k, char *buf, size_t n);
/* A "key<TAB>JSON" row in t for each of o's members keys[0..n) present
 * and not null. */
void jd_cli_table_json_rows(struct jd_cli_table *t, const cJSON *o, const char *const *keys,
                            size_t n);
/* j on one line, unformatted. */
void jd_cli_print_json(const cJSON *j);

/* A list answer as a table: GET path and print the array at member as
 * ncols columns under header, one row per element made by row (which may
 * format into buf[col], JD_CLI_CELL bytes each); --json prints the answer
 * unchanged. When there is a next page, its --cursor goes to stderr.
 * Returns the exit code. */
#define JD_CLI_CELL 512
typedef void jd_cli_row_fn(const cJSON *e, char (*buf)[JD_CLI_CELL], const char **cells);
int jd_cli_list(const char *path, const char *member, int ncols, const char *const *header,
                jd_cli_row_fn *row);

/* A duration ("30s", "2m"); prints the complaint and returns -1 if bad. */
int jd_cli_parse_dur(const char *s, int64_t *ms);
/* All of file ("-": stdin), at most JD_CLI_BODY_MAX bytes, NUL-terminated;
 * NULL (the reason printed on stderr) if larger or unreadable. Caller frees. */
char *jd_cli_read_file(const char *file);

#endif
