/* procmem.h: this machine's and this process's memory as Linux reports it
 * (/proc), for a node's budget.
 *
 * Contract: cv_mem_available is MemAvailable of /proc/meminfo in bytes (what
 * the machine can give without swapping), 0 when it cannot be read.
 * cv_proc_baseline is the most this process can hold resident before it
 * does any work: every resident page now (anonymous memory, heap, stacks,
 * touched file pages), plus every page of its file mappings that is not
 * resident yet (the binary and its libraries: running code touches them),
 * except the mapping of `data_path` (a model mapped whole, of which only
 * the touched pages count: they are resident now or counted by whoever
 * touches them later); 0 when /proc/self/smaps cannot be read. */
#ifndef CONVOY_CORE_PROCMEM_H
#define CONVOY_CORE_PROCMEM_H

#include <stdint.h>

uint64_t cv_mem_available(void);
uint64_t cv_proc_baseline(const char *data_path);

#endif
