/*
 * Test plugin "nosym": a shared object that exports no jd_plugin_entry (a
 * misspelt entry point); the loader must refuse it. No state.
 */
#include "plugins/jackdaw_plugin.h"

const struct jd_plugin *jd_plugin_entri(const struct jd_host *h);

const struct jd_plugin *jd_plugin_entri(const struct jd_host *h)
{
    (void)h;
    return NULL;
}
