/* procmem.c: /proc/meminfo and /proc/self/smaps read with stdio (see
 * procmem.h). */
#include "core/procmem.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t cv_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* A mapping's header line of smaps: "START-END PERMS OFFSET DEV INODE [PATH]".
 * Returns its size and sets *counted_whole for a file mapping that is not
 * data_path. */
static uint64_t mapping(const char *line, const char *data_path, bool *counted_whole)
{
    unsigned long long lo, hi, inode;
    int path_at = 0;
    if (sscanf(line, "%llx-%llx %*s %*s %*s %llu %n", &lo, &hi, &inode, &path_at) < 3)
        return 0;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", line + path_at);
    path[strcspn(path, "\n")] = 0;
    *counted_whole = inode != 0 && path[0] == '/' && strcmp(path, data_path) != 0;
    return hi - lo;
}

uint64_t cv_proc_baseline(const char *data_path)
{
    char data_real[PATH_MAX];
    if (!realpath(data_path, data_real))
        snprintf(data_real, sizeof data_real, "%s", data_path);
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return 0;
    char line[PATH_MAX + 128];
    uint64_t total = 0;
    bool whole = false; /* the current mapping counts whole, not by its Rss */
    while (fgets(line, sizeof line, f)) {
        const size_t word = strcspn(line, " \n");
        unsigned long long kb;
        if (word > 0 && line[word - 1] != ':') /* a mapping's header, not one of its "Field:" lines */
            total += mapping(line, data_real, &whole) * whole;
        else if (!whole && sscanf(line, "Rss: %llu kB", &kb) == 1)
            total += (uint64_t)kb * 1024;
    }
    fclose(f);
    return total;
}
