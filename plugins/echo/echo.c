/*
 * echo: a command that returns its args as its result. The smallest useful
 * handler, and the one tests and workflows use to move data around.
 *
 * Threading: handle() completes on the calling thread before returning; no
 * state.
 */
#include "plugins/builtin.h"

static const struct jd_host *host;

static void echo_handle(const struct jd_call_info *info)
{
    host->complete(info->call, info->args_json);
}

static const struct jd_command commands[] = {
    {.name = "echo", .flags = 0, .default_timeout_ms = 0, .handle = echo_handle},
};

JD_BUILTIN_PLUGIN("echo", commands, 1, NULL, 0)
