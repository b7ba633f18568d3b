/*
 * Output for people: rows of cells printed tab-separated, each cell but the
 * last padded to its column's width so the columns line up in a terminal and
 * `cut -f` still works. Pure; no I/O besides the FILE given.
 */
#ifndef JD_CLI_TABLE_H
#define JD_CLI_TABLE_H

#include <stdio.h>

#define JD_CLI_TABLE_COLS 8

struct jd_cli_table {
    int ncols, nrows, cap;
    char **cells; /* nrows * ncols, each owned */
};

void jd_cli_table_init(struct jd_cli_table *t, int ncols);
/* Append a row of t->ncols cells (borrowed, copied; NULL prints "-"). */
void jd_cli_table_row(struct jd_cli_table *t, const char *const *cells);
void jd_cli_table_print(const struct jd_cli_table *t, FILE *out);
void jd_cli_table_free(struct jd_cli_table *t);

#endif
