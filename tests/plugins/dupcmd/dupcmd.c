/*
 * Test plugin "dupcmd": offers command "tgood", which the "good" test plugin
 * already provides; loaded after it, the loader must refuse it. No state.
 */
#include "plugins/jackdaw_plugin.h"

static void handle(const struct jd_call_info *info)
{
    (void)info;
}

static const struct jd_command commands[] = {{.name = "tother", .handle = handle},
                                             {.name = "tgood", .handle = handle}};

static const struct jd_plugin plugin = {
    .abi_version = JD_PLUGIN_ABI_VERSION,
    .name = "dupcmd",
    .version = "0.1.0",
    .commands = commands,
    .ncommands = 2,
};

const struct jd_plugin *jd_plugin_entry(const struct jd_host *h)
{
    (void)h;
    return &plugin;
}
