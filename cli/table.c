/* See table.h. */
#include "cli/table.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

void jd_cli_table_init(struct jd_cli_table *t, int ncols)
{
    memset(t, 0, sizeof *t);
    t->ncols = ncols;
}

void jd_cli_table_row(struct jd_cli_table *t, const char *const *cells)
{
    if (t->nrows == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 16;
        t->cells = jd_xrealloc(t->cells, (size_t)t->cap * (size_t)t->ncols * sizeof *t->cells);
    }
    for (int c = 0; c < t->ncols; c++) {
        const char *v = cells[c] && *cells[c] ? cells[c] : "-";
        /* A tab or newline in a value would break the columns. */
        char *s = jd_xstrdup(v);
        for (char *p = s; *p; p++)
            if (*p == '\t' || *p == '\n' || *p == '\r')
                *p = ' ';
        t->cells[t->nrows * t->ncols + c] = s;
    }
    t->nrows++;
}

void jd_cli_table_print(const struct jd_cli_table *t, FILE *out)
{
    size_t w[JD_CLI_TABLE_COLS] = {0};
    for (int r = 0; r < t->nrows; r++)
        for (int c = 0; c < t->ncols && c < JD_CLI_TABLE_COLS; c++) {
            size_t n = strlen(t->cells[r * t->ncols + c]);
            if (n > w[c])
                w[c] = n;
        }
    for (int r = 0; r < t->nrows; r++) {
        for (int c = 0; c < t->ncols; c++) {
            const char *v = t->cells[r * t->ncols + c];
            if (c == t->ncols - 1)
                fprintf(out, "%s\n", v);
            else
                fprintf(out, "%-*s\t", (int)w[c < JD_CLI_TABLE_COLS ? c : 0], v);
        }
    }
}

void jd_cli_table_free(struct jd_cli_table *t)
{
    for (int i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    memset(t, 0, sizeof *t);
}
