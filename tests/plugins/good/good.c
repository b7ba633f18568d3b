/*
 * Test plugin "good": a well-formed plugin for the loader tests. Command
 * "tgood" completes with {"good":true}; process type "tproc" (method "run")
 * finishes at once with {"ran":true}. No state; any thread.
 */
#include "plugins/jackdaw_plugin.h"

#include <stddef.h>

static const struct jd_host *host;

static void tgood_handle(const struct jd_call_info *info)
{
    host->complete(info->call, "{\"good\":true}");
}

static void *tproc_create(const char *method, const char *input_json, char *err, size_t errlen)
{
    static int instance;
    (void)method, (void)input_json, (void)err, (void)errlen;
    return &instance;
}

static int tproc_step(void *self, const struct jd_plugin_event *ev, size_t n, void *out)
{
    (void)self, (void)ev, (void)n;
    host->step_done(out, "{\"ran\":true}");
    return 0;
}

static const char *const methods[] = {"run", NULL};

static const struct jd_command commands[] = {{.name = "tgood", .handle = tgood_handle}};
static const struct jd_process_type types[] = {
    {.name = "tproc", .methods = methods, .create = tproc_create, .step = tproc_step}};

static const struct jd_plugin plugin = {
    .abi_version = JD_PLUGIN_ABI_VERSION,
    .name = "good",
    .version = "0.1.0",
    .commands = commands,
    .ncommands = 1,
    .process_types = types,
    .nprocess_types = 1,
};

const struct jd_plugin *jd_plugin_entry(const struct jd_host *h)
{
    host = h;
    return &plugin;
}
