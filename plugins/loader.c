/*
 * Loading plugins: dlopen of a .so or a directory of them, built-in plugins
 * by entry function, and the check of each descriptor against the ABI and
 * the names already loaded, which fills the registry's plugin, command and
 * process type tables (sorted later by jd_registry_freeze).
 *
 * Threading: one thread at start-up, before jd_registry_freeze; a frozen
 * registry refuses every load.
 */
#include "plugins/registry_impl.h"

#include "common/alloc.h"
#include "common/error.h"
#include "common/log.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool valid_name(const char *s)
{
    if (!s || !(*s >= 'a' && *s <= 'z'))
        return false;
    for (s++; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '.' ||
              *s == '-'))
            return false;
    return true;
}

static const struct jd_plugin *cmd_owner(const struct jd_registry *r, const char *name)
{
    for (size_t i = 0; i < r->nplugins; i++) {
        const struct jd_plugin *p = r->plugins[i].desc;
        for (size_t j = 0; j < p->ncommands; j++)
            if (strcmp(p->commands[j].name, name) == 0)
                return p;
    }
    return NULL;
}

static const struct jd_plugin *pt_owner(const struct jd_registry *r, const char *name)
{
    for (size_t i = 0; i < r->nplugins; i++) {
        const struct jd_plugin *p = r->plugins[i].desc;
        for (size_t j = 0; j < p->nprocess_types; j++)
            if (strcmp(p->process_types[j].name, name) == 0)
                return p;
    }
    return NULL;
}

/* Check a descriptor against the ABI and the names already loaded. 0, or
 * JD_EINVAL with why in msg. */
static int check_desc(const struct jd_registry *r, const struct jd_plugin *p, char *msg, size_t len)
{
    const struct jd_plugin *other;
    if (!p) {
        snprintf(msg, len, "%s returned NULL (the plugin refused to load)", JD_PLUGIN_ENTRY);
        return JD_EINVAL;
    }
    if (p->abi_version != JD_PLUGIN_ABI_VERSION) {
        snprintf(msg, len, "ABI version %u, but this Jackdaw speaks version %d", p->abi_version,
                 JD_PLUGIN_ABI_VERSION);
        return JD_EINVAL;
    }
    if (!p->name || !*p->name) {
        snprintf(msg, len, "the descriptor has no name");
        return JD_EINVAL;
    }
    for (size_t i = 0; i < r->nplugins; i++) {
        if (strcmp(r->plugins[i].desc->name, p->name) == 0) {
            snprintf(msg, len, "duplicate plugin name \"%s\" (already loaded from %s)", p->name,
                     r->plugins[i].origin);
            return JD_EINVAL;
        }
    }
    if ((p->ncommands && !p->commands) || (p->nprocess_types && !p->process_types)) {
        snprintf(msg, len, "a count is set but its array is NULL");
        return JD_EINVAL;
    }
    for (size_t i = 0; i < p->ncommands; i++) {
        const struct jd_command *c = &p->commands[i];
        if (!valid_name(c->name)) {
            snprintf(msg, len, "command %zu has an invalid name (want [a-z][a-z0-9_.-]*)", i);
            return JD_EINVAL;
        }
        if (!c->handle) {
            snprintf(msg, len, "command \"%s\" has no handle function", c->name);
            return JD_EINVAL;
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(p->commands[j].name, c->name) == 0) {
                snprintf(msg, len, "duplicate command name \"%s\" within the plugin", c->name);
                return JD_EINVAL;
            }
        }
        if ((other = cmd_owner(r, c->name)) != NULL) {
            snprintf(msg, len, "duplicate command name \"%s\" (already provided by plugin \"%s\")",
                     c->name, other->name);
            return JD_EINVAL;
        }
    }
    for (size_t i = 0; i < p->nprocess_types; i++) {
        const struct jd_process_type *t = &p->process_types[i];
        if (!valid_name(t->name)) {
            snprintf(msg, len, "process type %zu has an invalid name (want [a-z][a-z0-9_.-]*)", i);
            return JD_EINVAL;
        }
        if (!t->methods || !t->create || !t->step) {
            snprintf(msg, len, "process type \"%s\" lacks methods, create or step", t->name);
            return JD_EINVAL;
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(p->process_types[j].name, t->name) == 0) {
                snprintf(msg, len, "duplicate process type \"%s\" within the plugin", t->name);
                return JD_EINVAL;
            }
        }
        if ((other = pt_owner(r, t->name)) != NULL) {
            snprintf(msg, len, "duplicate process type \"%s\" (already provided by plugin \"%s\")",
                     t->name, other->name);
            return JD_EINVAL;
        }
    }
    return JD_OK;
}

static int add_desc(struct jd_registry *r, const struct jd_plugin *p, void *dl, const char *origin,
                    struct jd_error *err)
{
    char msg[JD_ERROR_MSG_MAX - 64];
    if (r->frozen) {
        snprintf(msg, sizeof msg, "the registry is frozen (plugins load at start-up only)");
        goto refuse;
    }
    if (check_desc(r, p, msg, sizeof msg) != JD_OK)
        goto refuse;
    if (r->nplugins == r->cap_plugins) {
        r->cap_plugins = r->cap_plugins ? r->cap_plugins * 2 : 8;
        r->plugins = jd_xrealloc(r->plugins, r->cap_plugins * sizeof *r->plugins);
    }
    r->plugins[r->nplugins++] = (struct plugin_entry){dl, p, jd_xstrdup(origin)};
    for (size_t i = 0; i < p->ncommands; i++) {
        if (r->ncmds == r->cap_cmds) {
            r->cap_cmds = r->cap_cmds ? r->cap_cmds * 2 : 16;
            r->cmds = jd_xrealloc(r->cmds, r->cap_cmds * sizeof *r->cmds);
        }
        r->cmds[r->ncmds++] = (struct named_cmd){p->commands[i].name, &p->commands[i]};
    }
    for (size_t i = 0; i < p->nprocess_types; i++) {
        if (r->npts == r->cap_pts) {
            r->cap_pts = r->cap_pts ? r->cap_pts * 2 : 8;
            r->pts = jd_xrealloc(r->pts, r->cap_pts * sizeof *r->pts);
        }
        r->pts[r->npts++] = (struct named_pt){p->process_types[i].name, &p->process_types[i]};
    }
    jd_log(JD_LOG_INFO, "plugin loaded", "file", origin, "plugin", p->name, "version",
           p->version ? p->version : "", NULL);
    return JD_OK;
refuse:
    jd_log(JD_LOG_ERROR, "plugin refused", "file", origin, "reason", msg, NULL);
    return jd_error_set(err, JD_EINVAL, NULL, "plugin %s refused: %s", origin, msg);
}

int jd_registry_load_file(struct jd_registry *r, const char *path, struct jd_error *err)
{
    void *dl;
    void *sym;
    jd_plugin_entry_fn entry;
    int rc;
    if (r->frozen)
        return add_desc(r, NULL, NULL, path, err);
    dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        jd_log(JD_LOG_ERROR, "plugin refused", "file", path, "reason", why ? why : "dlopen failed",
               NULL);
        return jd_error_set(err, JD_EINVAL, NULL, "plugin %s refused: %s", path,
                            why ? why : "dlopen failed");
    }
    sym = dlsym(dl, JD_PLUGIN_ENTRY);
    if (!sym) {
        jd_log(JD_LOG_ERROR, "plugin refused", "file", path, "reason",
               "no " JD_PLUGIN_ENTRY " symbol", NULL);
        dlclose(dl);
        return jd_error_set(err, JD_EINVAL, NULL, "plugin %s refused: it exports no %s function",
                            path, JD_PLUGIN_ENTRY);
    }
    /* dlsym returns an object pointer; POSIX guarantees it converts. */
    memcpy(&entry, &sym, sizeof entry);
    rc = add_desc(r, entry(jd_registry_host(r)), dl, path, err);
    if (rc != JD_OK)
        dlclose(dl);
    return rc;
}

int jd_registry_add(struct jd_registry *r, jd_plugin_entry_fn entry, const char *origin,
                    struct jd_error *err)
{
    if (!entry)
        return jd_error_set(err, JD_EINVAL, NULL, "plugin %s: no entry function",
                            origin ? origin : "?");
    return add_desc(r, r->frozen ? NULL : entry(jd_registry_host(r)), NULL,
                    origin ? origin : "(built in)", err);
}

static int so_filter(const struct dirent *d)
{
    size_t n = strlen(d->d_name);
    return n > 3 && d->d_name[0] != '.' && strcmp(d->d_name + n - 3, ".so") == 0;
}

int jd_registry_load_dir(struct jd_registry *r, const char *dir, unsigned *loaded,
                         struct jd_error *err)
{
    struct dirent **names = NULL;
    int n, first = JD_OK;
    unsigned ok = 0;
    struct jd_error tmp;
    if (loaded)
        *loaded = 0;
    n = scandir(dir, &names, so_filter, alphasort);
    if (n < 0) {
        /* Say why and what to do: the usual cause is a build directory that
         * was moved or never built. */
        const char *why = strerror(errno);
        jd_log(JD_LOG_ERROR, "plugin directory unreadable", "dir", dir, "error", why, NULL);
        return jd_error_set(err, JD_EIO, NULL,
                            "cannot read plugin directory %s: %s (point --plugin-dir at the "
                            "directory holding the plugin .so files)",
                            dir, why);
    }
    for (int i = 0; i < n; i++) {
        char *path = jd_xasprintf("%s/%s", dir, names[i]->d_name);
        int rc = jd_registry_load_file(r, path, first == JD_OK ? err : &tmp);
        if (rc == JD_OK)
            ok++;
        else if (first == JD_OK)
            first = rc;
        free(path);
        free(names[i]);
    }
    free(names);
    if (loaded)
        *loaded = ok;
    return first;
}
