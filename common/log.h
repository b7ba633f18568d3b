/*
 * Logging: one JSON object per line on stderr, e.g.
 *   {"time":"...","level":"info","msg":"listening","addr":"127.0.0.1:8080"}
 * Extra fields are passed as key/value string pairs terminated by NULL.
 * Thread-safe (each line is written with one write(2)).
 */
#ifndef JD_COMMON_LOG_H
#define JD_COMMON_LOG_H

enum jd_log_level { JD_LOG_DEBUG, JD_LOG_INFO, JD_LOG_WARN, JD_LOG_ERROR, JD_LOG_OFF };

/* Lines below this level are dropped. Default JD_LOG_INFO. */
void jd_log_set_level(enum jd_log_level level);
enum jd_log_level jd_log_get_level(void);
/* "debug", "info", "warn", "error", "off" -> level; -1 if unknown. */
int jd_log_level_parse(const char *s);

/* jd_log(JD_LOG_INFO, "job finished", "job_id", "42", "state", "succeeded", NULL) */
void jd_log(enum jd_log_level level, const char *msg, ...) __attribute__((sentinel));

/* printf-style message with no extra fields. */
void jd_logf(enum jd_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
