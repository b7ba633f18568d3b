/*
 * Internals of the plugin registry shared by its files. Not a public
 * contract (that is registry.h): only plugins/registry.c, loader.c and
 * call.c include it.
 *
 *   registry.c   create, destroy, freeze; lookups of commands and process
 *                types; plugin process types as scheduler processes
 *   loader.c     loading plugins (dlopen, built-ins), checking descriptors
 *                against the ABI, the plugin / command / process type tables
 *   call.c       the call lifecycle: the process-wide attempt table, logical
 *                calls and their attempts, deadlines, cancel, retries with
 *                backoff, completion, statistics; the host function table
 *
 * Threading: the tables below are written by create/load/add/freeze/destroy
 * on one thread at start-up and shutdown; after freeze they are immutable
 * and read without a lock. The counters are relaxed atomics (statistics
 * only), bumped by call.c from any thread.
 */
#ifndef JD_PLUGINS_REGISTRY_IMPL_H
#define JD_PLUGINS_REGISTRY_IMPL_H

#include "plugins/registry.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct plugin_entry {
    void *dl; /* dlopen handle, or NULL for jd_registry_add */
    const struct jd_plugin *desc;
    char *origin;
};

struct named_cmd {
    const char *name;
    const struct jd_command *cmd;
};

struct named_pt {
    const char *name;
    const struct jd_process_type *pt;
};

struct jd_registry {
    struct jd_plugin_env env;
    struct plugin_entry *plugins;
    size_t nplugins, cap_plugins;
    struct named_cmd *cmds; /* sorted by name after freeze */
    size_t ncmds, cap_cmds;
    struct named_pt *pts; /* sorted by name after freeze */
    size_t npts, cap_pts;
    struct jd_process_ops *pt_ops; /* pt_ops[i] wraps pts[i]; built at freeze */
    bool frozen;
    const struct jd_command *(*fallback)(void *ctx, const char *name); /* or NULL */
    void *fallback_ctx;
    /* Counters: relaxed, they are statistics only. */
    _Atomic uint64_t calls, ok, failed, timeouts, cancelled, retries, late_dropped, unknown;
};

/* call.c: r joins the process-wide attempt table (initialised once) and
 * becomes the registry context-free host functions use (g_current). Called
 * by jd_registry_create. */
void registry_calls_attach(struct jd_registry *r);
/* call.c: r stops being g_current and the attempts a plugin never released
 * for r are freed. Called by jd_registry_destroy, after every call ended. */
void registry_calls_detach(struct jd_registry *r);

#endif
