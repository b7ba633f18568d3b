/*
 * Test plugin "badabi": claims an ABI version the host does not speak; the
 * loader must refuse it. No state.
 */
#include "plugins/jackdaw_plugin.h"

static void handle(const struct jd_call_info *info)
{
    (void)info;
}

static const struct jd_command commands[] = {{.name = "tbadabi", .handle = handle}};

static const struct jd_plugin plugin = {
    .abi_version = JD_PLUGIN_ABI_VERSION + 998,
    .name = "badabi",
    .version = "0.1.0",
    .commands = commands,
    .ncommands = 1,
};

const struct jd_plugin *jd_plugin_entry(const struct jd_host *h)
{
    (void)h;
    return &plugin;
}
