/*
 * Error codes and the error detail every layer shares.
 *
 * Functions that can fail return 0 or a negative JD_E* code; human detail
 * (a message and, for invalid input, a JSON pointer to the bad spot) goes into
 * a caller-provided struct jd_error, which the HTTP layer turns into the
 * problem+json "detail" and "pointer". One table maps each code to its text
 * and HTTP status. Thread-safe: no shared state.
 */
#ifndef JD_COMMON_ERROR_H
#define JD_COMMON_ERROR_H

#include <stddef.h>

enum {
    JD_OK = 0,
    JD_EINVAL = -1,      /* invalid input (422) */
    JD_ENOMEM = -2,      /* out of memory or over a size limit the client controls (413) */
    JD_ENOENT = -3,      /* no such thing (404) */
    JD_EEXIST = -4,      /* already exists / duplicate (409) */
    JD_ECONFLICT = -5,   /* state does not allow it (409) */
    JD_EFULL = -6,       /* queue or pool full, try later (429) */
    JD_ESHUTDOWN = -7,   /* draining or stopped (503) */
    JD_EIO = -8,         /* storage or OS failure (500) */
    JD_ESTALE = -9,      /* stale token, late or duplicate completion: dropped */
    JD_ETIMEOUT = -10,   /* deadline passed (504 where it reaches HTTP) */
    JD_ECANCELLED = -11, /* cancelled */
    JD_EPARSE = -12,     /* malformed input (400) */
    JD_EBUSY = -13,      /* resource held by someone else (e.g. database locked) */
    JD_ECORRUPT = -14,   /* corrupt or foreign file */
    JD_EPERM = -15,      /* not allowed (403) */
    JD_ETOOBIG = -16,    /* body or field over a limit (413) */
    JD_EINTERNAL = -17,  /* a bug: should not happen (500) */
};

#define JD_ERROR_MSG_MAX 512 /* a detail line, not a document */
#define JD_ERROR_PTR_MAX 256 /* JSON pointers into job definitions are short */

struct jd_error {
    int code;                       /* the JD_E* code, or 0 */
    char message[JD_ERROR_MSG_MAX]; /* "unknown handler \"htp\"" */
    char pointer[JD_ERROR_PTR_MAX]; /* "/steps/2/call", or "" */
};

/* Short fixed text for a code ("invalid input"); never NULL. */
const char *jd_strerror(int code);

/* The HTTP status a code maps to (500 for unknown codes). */
int jd_error_http_status(int code);

/*
 * Fill err (which may be NULL) with code, pointer (may be NULL) and a
 * printf-style message. Returns code, so callers can `return jd_error_set(...)`.
 */
int jd_error_set(struct jd_error *err, int code, const char *pointer, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Clear err (code 0, empty strings). err may be NULL. */
void jd_error_clear(struct jd_error *err);

#endif
