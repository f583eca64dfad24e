/* outpath.h - before any work, so a bad output path fails at once instead of
 * after the measurement or the training: path names a file that is not a
 * directory, in an existing directory this process can write into.  0, or -1
 * with err naming flag and path (gw-train, gw-perf). */
#ifndef GW_OUTPATH_H
#define GW_OUTPATH_H

#include <stddef.h>

int output_path_ok(const char *flag, const char *path, char *err, size_t errlen);

#endif
