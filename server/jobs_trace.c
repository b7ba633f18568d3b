/*
 * W3C trace context on the calls a job makes: a job with a "traceparent"
 * (its own member, or the submit request's header) passes it to http calls
 * as the traceparent header and to exec calls as the TRACEPARENT variable,
 * unless the call's args already set one; a remote command's task shows it
 * as its "traceparent" member (jobs_tasks.c's remote_handle copies it
 * from the job, under mu, when the task is made). The same value is passed on
 * (no new span id: Jackdaw does not record spans), so the receiver's spans
 * are children of the submitter's.
 *
 * Threading: any thread; jobs_trace_args is pure.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Whether an --exec-env-allow list (NAME or PREFIX*, comma-separated) lets
 * a job set `name`; an unset list allows it (TRACEPARENT is no loader hook). */
static bool env_allowed(const char *list, const char *name)
{
    if (!list || !*list)
        return true;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n > 0 && p[n - 1] == '*' ? strncmp(name, p, n - 1) == 0
                                     : strlen(name) == n && strncmp(name, p, n) == 0)
            return true;
        p += n;
        if (*p == ',')
            p++;
    }
    return false;
}

char *jobs_trace_args(const char *command, const char *args, const char *traceparent,
                      const char *exec_env_allow)
{
    bool http = strcmp(command, "http") == 0, exec = strcmp(command, "exec") == 0;
    if (!traceparent || (!http && !exec) || (exec && !env_allowed(exec_env_allow, "TRACEPARENT")))
        return jd_xstrdup(args);
    cJSON *a = cJSON_Parse(args);
    if (!cJSON_IsObject(a)) {
        cJSON_Delete(a);
        return jd_xstrdup(args);
    }
    const char *member = http ? "headers" : "env";
    cJSON *o = cJSON_GetObjectItemCaseSensitive(a, member);
    if (!o)
        o = cJSON_AddObjectToObject(a, member);
    bool has = false;
    for (const cJSON *c = cJSON_IsObject(o) ? o->child : NULL; c; c = c->next)
        has = has || strcasecmp(c->string, http ? "traceparent" : "TRACEPARENT") == 0;
    if (cJSON_IsObject(o) && !has)
        cJSON_AddStringToObject(o, http ? "traceparent" : "TRACEPARENT", traceparent);
    char *out = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    return out;
}
