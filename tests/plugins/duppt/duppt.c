/*
 * Test plugin "duppt": registers process type "tproc", which the "good" test
 * plugin already provides; loaded after it, the loader must refuse it.
 */
#include "plugins/jackdaw_plugin.h"

#include <stddef.h>

static void *create(const char *method, const char *input_json, char *err, size_t errlen)
{
    (void)method, (void)input_json, (void)err, (void)errlen;
    return NULL;
}

static int step(void *self, const struct jd_plugin_event *ev, size_t n, void *out)
{
    (void)self, (void)ev, (void)n, (void)out;
    return 1;
}

static const char *const methods[] = {"run", NULL};
static const struct jd_process_type types[] = {
    {.name = "tproc", .methods = methods, .create = create, .step = step}};

static const struct jd_plugin plugin = {
    .abi_version = JD_PLUGIN_ABI_VERSION,
    .name = "duppt",
    .version = "0.1.0",
    .process_types = types,
    .nprocess_types = 1,
};

const struct jd_plugin *jd_plugin_entry(const struct jd_host *h)
{
    (void)h;
    return &plugin;
}
