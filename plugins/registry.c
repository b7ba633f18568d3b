/*
 * The plugin registry (registry.h): create and destroy, freeze, lookups of
 * commands and process types, and plugin process types run as scheduler
 * processes. Loading is in loader.c, calls in call.c; the tables they share
 * are in registry_impl.h.
 *
 * Threading: create/freeze/destroy on one thread at start-up and shutdown;
 * after freeze, lookups read immutable sorted arrays without a lock and are
 * safe from any thread. A plugin process's callbacks run on the scheduler
 * worker running it.
 */
#include "plugins/registry_impl.h"

#include "common/alloc.h"
#include "common/error.h"
#include "plugins/jackdaw_json.h"
#include "scheduler/process.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- registry life ---- */

int jd_registry_create(const struct jd_plugin_env *env, struct jd_registry **out)
{
    struct jd_registry *r;
    if (!env || !out)
        return JD_EINVAL;
    r = jd_xcalloc(1, sizeof *r);
    r->env = *env;
    registry_calls_attach(r);
    *out = r;
    return JD_OK;
}

void jd_registry_destroy(struct jd_registry *r)
{
    if (!r)
        return;
    registry_calls_detach(r);
    /* Loaded objects stay mapped: a plugin may own threads (http's event
     * loop, exec's reaper) that live as long as the process, and the ABI
     * has no unload hook. */
    for (size_t i = 0; i < r->nplugins; i++)
        free(r->plugins[i].origin);
    free(r->plugins);
    free(r->cmds);
    free(r->pts);
    free(r->pt_ops);
    free(r);
}

/* ---- lookups ---- */

static int cmp_cmd(const void *a, const void *b)
{
    return strcmp(((const struct named_cmd *)a)->name, ((const struct named_cmd *)b)->name);
}

static int cmp_pt(const void *a, const void *b)
{
    return strcmp(((const struct named_pt *)a)->name, ((const struct named_pt *)b)->name);
}

static void build_pt_ops(struct jd_registry *r);

void jd_registry_freeze(struct jd_registry *r)
{
    if (r->frozen)
        return;
    if (r->ncmds)
        qsort(r->cmds, r->ncmds, sizeof *r->cmds, cmp_cmd);
    if (r->npts)
        qsort(r->pts, r->npts, sizeof *r->pts, cmp_pt);
    build_pt_ops(r);
    r->frozen = true;
}

void jd_registry_set_fallback(struct jd_registry *r,
                              const struct jd_command *(*lookup)(void *ctx, const char *name),
                              void *ctx)
{
    r->fallback = lookup;
    r->fallback_ctx = ctx;
}

/* A command a loaded plugin provides, or NULL. */
static const struct jd_command *plugin_command(const struct jd_registry *r, const char *name)
{
    if (r->frozen) {
        struct named_cmd key = {name, NULL};
        const struct named_cmd *hit =
            r->ncmds ? bsearch(&key, r->cmds, r->ncmds, sizeof *r->cmds, cmp_cmd) : NULL;
        return hit ? hit->cmd : NULL;
    }
    for (size_t i = 0; i < r->ncmds; i++)
        if (strcmp(r->cmds[i].name, name) == 0)
            return r->cmds[i].cmd;
    return NULL;
}

const struct jd_command *jd_registry_command(const struct jd_registry *r, const char *name)
{
    if (!r || !name)
        return NULL;
    const struct jd_command *c = plugin_command(r, name);
    if (!c && r->fallback)
        c = r->fallback(r->fallback_ctx, name);
    return c;
}

static const struct named_pt *find_pt(const struct jd_registry *r, const char *name)
{
    if (!r || !name)
        return NULL;
    if (r->frozen) {
        struct named_pt key = {name, NULL};
        return r->npts ? bsearch(&key, r->pts, r->npts, sizeof *r->pts, cmp_pt) : NULL;
    }
    for (size_t i = 0; i < r->npts; i++)
        if (strcmp(r->pts[i].name, name) == 0)
            return &r->pts[i];
    return NULL;
}

const struct jd_process_type *jd_registry_process_type(const struct jd_registry *r,
                                                       const char *name)
{
    const struct named_pt *hit = find_pt(r, name);
    return hit ? hit->pt : NULL;
}

const struct jd_plugin *jd_registry_plugin(const struct jd_registry *r, size_t index)
{
    return r && index < r->nplugins ? r->plugins[index].desc : NULL;
}

int jd_registry_validate(const struct jd_registry *r, const char *command, const char *args_json,
                         const char *ptr_prefix, struct jd_error *err)
{
    const struct jd_command *cmd = jd_registry_command(r, command);
    char msg[JD_ERROR_MSG_MAX] = "";
    char ptr[JD_ERROR_PTR_MAX] = "";
    char full[JD_ERROR_PTR_MAX];
    if (!cmd)
        return jd_error_set(err, JD_EINVAL, NULL, "unknown handler \"%s\"", command ? command : "");
    if (!cmd->validate ||
        cmd->validate(args_json ? args_json : "{}", msg, sizeof msg, ptr, sizeof ptr) == 0)
        return JD_OK;
    msg[sizeof msg - 1] = '\0';
    ptr[sizeof ptr - 1] = '\0';
    snprintf(full, sizeof full, "%s%s", ptr_prefix ? ptr_prefix : "", ptr);
    return jd_error_set(err, JD_EINVAL, full, "%s", msg[0] ? msg : "invalid args");
}

/* ---- plugin process types as scheduler processes ---- */

/* No status set yet: a value outside enum jd_step_status. */
#define STEP_UNSET ((enum jd_step_status)0x7f)
#define STEP_EVENTS_ON_STACK 16

struct pt_proc {
    const struct jd_process_type *pt;
    void *inst; /* the plugin's instance, NULL before init */
    char *error;
};

static int pt_init(void *self, const char *method, const char *input, struct jd_error *err)
{
    struct pt_proc *p = self;
    char msg[JD_ERROR_MSG_MAX] = "";
    bool known = false;
    for (const char *const *m = p->pt->methods; *m; m++)
        if (method && strcmp(*m, method) == 0)
            known = true;
    if (!known)
        return jd_error_set(err, JD_EINVAL, "/method", "process type \"%s\" has no method \"%s\"",
                            p->pt->name, method ? method : "");
    p->inst = p->pt->create(method, input, msg, sizeof msg);
    if (!p->inst) {
        msg[sizeof msg - 1] = '\0';
        return jd_error_set(err, JD_EINVAL, "/input", "%s",
                            msg[0] ? msg : "the process type refused the input");
    }
    return JD_OK;
}

static void pt_fail(struct jd_step_out *out, const char *kind, const char *message)
{
    struct jd_pjson_buf b = {0};
    jd_pjson_buf_cat(&b, "{\"kind\":");
    jd_pjson_buf_str(&b, kind);
    jd_pjson_buf_cat(&b, ",\"message\":");
    jd_pjson_buf_str(&b, message);
    jd_pjson_buf_cat(&b, "}");
    jd_step_fail_take(out, b.p);
}

static int pt_step(void *self, struct jd_event *events, size_t n, struct jd_step_out *out)
{
    struct pt_proc *p = self;
    struct jd_plugin_event stack[STEP_EVENTS_ON_STACK];
    struct jd_plugin_event *pev = n > STEP_EVENTS_ON_STACK ? jd_xcalloc(n, sizeof *pev) : stack;
    int rc;
    if (!p->inst) {
        pt_fail(out, "process_error", "step before a successful init");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        pev[i].type = events[i].type == JD_EVENT_YIELD_COMPLETE ? JD_PEVENT_COMPLETE
                      : events[i].type == JD_EVENT_MESSAGE      ? JD_PEVENT_MESSAGE
                                                                : JD_PEVENT_CANCEL;
        pev[i].tag = events[i].tag;
        pev[i].data_json = events[i].data;
        pev[i].error_json = events[i].error;
    }
    out->status = STEP_UNSET;
    rc = p->pt->step(p->inst, pev, n, out);
    if (rc != 0 && out->status != JD_STEP_FAIL) {
        pt_fail(out, "process_error", "the process type's step returned an error");
    } else if (out->status == STEP_UNSET) {
        if (out->nyields > 0)
            out->status = JD_STEP_WAIT;
        else
            pt_fail(out, "process_error", "step set no status and yielded nothing");
    }
out:
    if (pev != stack)
        free(pev);
    return JD_OK;
}

static void pt_close(void *self)
{
    struct pt_proc *p = self;
    if (p->inst && p->pt->destroy)
        p->pt->destroy(p->inst);
    free(p);
}

static void build_pt_ops(struct jd_registry *r)
{
    r->pt_ops = r->npts ? jd_xcalloc(r->npts, sizeof *r->pt_ops) : NULL;
    for (size_t i = 0; i < r->npts; i++)
        r->pt_ops[i] = (struct jd_process_ops){
            .type_name = r->pts[i].name, .init = pt_init, .step = pt_step, .close = pt_close};
}

int jd_registry_process_new(const struct jd_registry *r, const char *type,
                            const struct jd_process_ops **ops, void **self)
{
    const struct named_pt *hit = r && r->frozen ? find_pt(r, type) : NULL;
    struct pt_proc *p;
    if (!hit)
        return JD_ENOENT;
    p = jd_xcalloc(1, sizeof *p);
    p->pt = hit->pt;
    *ops = &r->pt_ops[hit - r->pts];
    *self = p;
    return JD_OK;
}
