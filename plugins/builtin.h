/*
 * builtin.h — helpers shared by the built-in plugins (plugins/<name>/),
 * which would otherwise each carry their own copy. Not part of the plugin
 * ABI: a third-party plugin needs only jackdaw_plugin.h (and, optionally,
 * jackdaw_json.h), and nothing here changes what crosses the ABI.
 *
 * Each built-in plugin keeps `static const struct jd_host *host;` at file
 * scope and ends with JD_BUILTIN_PLUGIN(...), which defines its descriptor
 * and its entry point (the entry point stores the host table in `host`).
 *
 * Threading: no state of its own; the functions are safe from any thread
 * (host->config is).
 */
#ifndef JD_PLUGINS_BUILTIN_H
#define JD_PLUGINS_BUILTIN_H

#include "plugins/jackdaw_json.h"
#include "plugins/jackdaw_plugin.h"

/* The descriptor and jd_plugin_entry of a built-in plugin named NAME with
 * an array of commands and an array of process types (either may be NULL
 * with a count of 0). Every built-in is version 1.0.0. */
#define JD_BUILTIN_PLUGIN(NAME, CMDS, NCMDS, TYPES, NTYPES)                                        \
    static const struct jd_plugin builtin_plugin = {                                               \
        .abi_version = JD_PLUGIN_ABI_VERSION,                                                      \
        .name = (NAME),                                                                            \
        .version = "1.0.0",                                                                        \
        .commands = (CMDS),                                                                        \
        .ncommands = (NCMDS),                                                                      \
        .process_types = (TYPES),                                                                  \
        .nprocess_types = (NTYPES),                                                                \
    };                                                                                             \
    const struct jd_plugin *jd_plugin_entry(const struct jd_host *h)                               \
    {                                                                                              \
        host = h;                                                                                  \
        return &builtin_plugin;                                                                    \
    }

/* Parse a command's args, which must be a JSON object. Returns the tree
 * (caller frees with jd_pjson_free), or NULL with a message in err. */
static inline struct jd_pjson *jd_builtin_parse_args(const char *args_json, char *err,
                                                     size_t errlen)
{
    struct jd_pjson *a = jd_pjson_parse(args_json, err, errlen);
    if (a && !jd_pjson_is(a, JD_PJSON_OBJECT)) {
        if (err)
            snprintf(err, errlen, "args must be an object");
        jd_pjson_free(a);
        return NULL;
    }
    return a;
}

/* Config "output_cap" (a positive decimal byte count), or dflt when it is
 * unset or not one. */
static inline size_t jd_builtin_output_cap(const struct jd_host *h, size_t dflt)
{
    const char *s = h->config("output_cap");
    char *end;
    unsigned long long v;
    if (!s || *s < '0' || *s > '9')
        return dflt;
    v = strtoull(s, &end, 10);
    return *end || v == 0 ? dflt : (size_t)v;
}

/* Config key as a count of milliseconds (a positive decimal), or dflt when
 * it is unset or not one. */
static inline int64_t jd_builtin_config_ms(const struct jd_host *h, const char *key, int64_t dflt)
{
    const char *s = h->config(key);
    char *end;
    long long v;
    if (!s || *s < '0' || *s > '9')
        return dflt;
    v = strtoll(s, &end, 10);
    return *end || v <= 0 ? dflt : (int64_t)v;
}

/* Write prefix + "/" + tok into ptr (ptrlen bytes) as a JSON pointer: tok
 * escaped as RFC 6901 says ("~" as "~0", "/" as "~1"), cut to fit. For
 * validate's ptr when the member is named by the job (an env or header name). */
static inline void jd_builtin_ptr_token(char *ptr, size_t ptrlen, const char *prefix,
                                        const char *tok)
{
    size_t o = (size_t)snprintf(ptr, ptrlen, "%s/", prefix);
    for (; *tok && o + 3 < ptrlen; tok++) {
        if (*tok == '~' || *tok == '/') {
            ptr[o++] = '~';
            ptr[o++] = *tok == '~' ? '0' : '1';
        } else {
            ptr[o++] = *tok;
        }
    }
    if (o < ptrlen)
        ptr[o] = '\0';
}

/* Walk a comma-separated config list: returns the next entry with blanks
 * (spaces, tabs) trimmed and its length in *n, or NULL at the end. Empty
 * entries come back with *n == 0. *cursor starts at the list (may be NULL). */
static inline const char *jd_builtin_list_next(const char **cursor, size_t *n)
{
    const char *p = *cursor, *e;
    size_t len;
    if (!p || !*p)
        return NULL;
    e = strchr(p, ',');
    len = e ? (size_t)(e - p) : strlen(p);
    *cursor = e ? e + 1 : NULL;
    while (len && (*p == ' ' || *p == '\t'))
        p++, len--;
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
        len--;
    *n = len;
    return p;
}

#endif
