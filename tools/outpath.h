/* outpath.h - before any work, so a bad output path fails at once instead of
 * after the measurement or the training: path names a file that is not a
 * directory, in an existing directory this process can write into (where
 * the file is new, tried by making one there and removing it: root passes
 * access() on /proc).  A symbolic link to nothing is checked where the file
 * it names will be made (the end of its chain of links).  0, or -1 with err
 * naming flag and path (gw-train, gw-perf). */
#ifndef GW_OUTPATH_H
#define GW_OUTPATH_H

#include <stdbool.h>
#include <stddef.h>

int output_path_ok(const char *flag, const char *path, char *err, size_t errlen);

/* The same for a file replaced by renaming a temporary file over it (the
 * safetensors writer): a symbolic link is followed to the file it names (a
 * link to nothing is refused), which must be a regular file where it exists,
 * and the checks above apply to that file and its directory, where the
 * temporary file goes (tried whether or not the file exists). */
int replaced_path_ok(const char *flag, const char *path, int temp_suffix, char *err, size_t errlen);
/* temp_suffix: the most its writer's temporary files add to the name, for
 * which the name must leave room: the safetensors writer's ".tmp." 8 hex "."
 * pid (7 digits at Linux's largest pid_max) "." a 32-bit counter; the tuning
 * file's ".tmp." pid; the plot's data file's ".dat.tmp". */
enum { OUTPATH_TEMP_WEIGHTS = 32, OUTPATH_TEMP_TUNE = 12, OUTPATH_TEMP_PLOT = 8 };

/* Whether two output paths name one file: the same file where both exist
 * (links and "./" spellings included), else the same name in the same
 * directory (a link to nothing counting as the file it will make). */
int same_output_file(const char *a, const char *b);

/* Whether path is an existing regular file, not empty, under this one name:
 * what writing over it would lose, whose content the caller must check
 * (gw-train's --save-weights and --plot).  A file with other hard links stays
 * under them when a new one is renamed over this name. */
bool replaced_content_at_stake(const char *path);

#endif
