/*
 * RFC 9457 problem details (application/problem+json) and the small text
 * helpers every response shares. Pure functions; safe from any thread.
 */
#ifndef JD_API_PROBLEM_H
#define JD_API_PROBLEM_H

#include <stddef.h>

/* The reason phrase of an HTTP status ("Unprocessable Content"). */
const char *jd_http_reason(int status);

/*
 * Render {"type","title","status","detail","instance","pointer","request_id"}
 * followed by a newline. detail, pointer, instance and request_id are
 * borrowed and may be NULL or "" (then omitted). Caller frees with free().
 */
char *jd_problem_json(int status, const char *detail, const char *pointer, const char *instance,
                      const char *request_id);

/* As jd_problem_json, with a problem type of our own: "type" is
 * "urn:jackdaw:problem:<reason>" and the object also carries "reason":
 * "<reason>" (a short word, e.g. "lease_lost"), for conflicts a client
 * must tell apart. reason NULL: exactly jd_problem_json. */
char *jd_problem_json_reason(int status, const char *reason, const char *detail,
                             const char *pointer, const char *instance, const char *request_id);

/*
 * Constant-time check of an Authorization header value against
 * "Bearer <token>" (scheme case-insensitive). Time depends only on the
 * lengths of the header and the token, never on where they differ.
 * Returns 1 on match, 0 otherwise (also for a NULL header).
 */
int jd_auth_bearer_ok(const char *header, const char *token);

/* Is this Content-Type JSON ("application/json", "application/x+json",
 * with any parameters)? NULL or "" counts as JSON (curl --data-binary @f
 * with no -H); anything else (form, text/plain, ...) does not. */
int jd_content_type_is_json(const char *ct);

/* Is s[0..n) well-formed UTF-8 (no overlong forms, surrogates or code
 * points over U+10FFFF)? JSON text must be (RFC 8259 section 8.1). */
int jd_utf8_valid(const char *s, size_t n);

#endif
