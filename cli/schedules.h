/*
 * jackdaw schedules (see schedules.c). Called from main's thread after
 * curl_global_init, with jd_cli set.
 */
#ifndef JD_CLI_SCHEDULES_H
#define JD_CLI_SCHEDULES_H

#define jd_schedules_usage                                                                         \
    "usage: jackdaw schedules ls [--limit N] [--cursor C]\n"                                       \
    "       jackdaw schedules get|pause|resume|trigger|rm|events ID\n"                             \
    "       jackdaw schedules put [ID] FILE|-\n"                                                   \
    "ls: ID STATE TIMETABLE TIMEZONE NEXT FIRES (more pages: --cursor on stderr).\n"               \
    "get: the schedule, its next fire times, last fire and counts.\n"                              \
    "put: create or replace the schedule in FILE ({\"cron\" or \"every\", \"job\", ...});\n"       \
    "  the id is ID, or the file's \"id\" member. Prints the schedule.\n"                          \
    "pause / resume: stop and restart its fires. trigger: run its job once now and\n"              \
    "  print the job's id. rm: delete it (its jobs stay). events: its history.\n"

/* argv[0] is "schedules"; returns the exit code. */
int jd_schedules_main(int argc, char **argv);

#endif
