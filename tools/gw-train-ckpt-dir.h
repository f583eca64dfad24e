/* gw-train-ckpt-dir.h - the checkpoint directory (gw-train-ckpt-dir.c):
 * its files' names, listing, pruning, the directory's lock, temporary files
 * a dead save left, refused files moved aside.  What the files hold, and
 * which one a resume takes: gw-train-ckpt.c. */
#ifndef GW_TRAIN_CKPT_DIR_H
#define GW_TRAIN_CKPT_DIR_H

#include <stddef.h>
#include <stdint.h>

#define MAX_CKPT 4096
/* Copies of refused files kept for one step: .refused, .refused.1 to .refused.<MAX_REFUSED - 1>. */
#define MAX_REFUSED 100

/* Steps of the newest `max` checkpoint files in dir, newest first; -1 (errno
 * set) when the directory cannot be read to its end. */
int ckpt_list_steps(const char *dir, int64_t *steps, int max);
/* Removes all but the newest `keep` checkpoints. */
void ckpt_prune(const char *dir, int keep);
/* mkdir -p; 0 or -1 with errno. */
int ckpt_make_dir(const char *dir);
/* Moves a refused checkpoint to <from>.refused (.refused.1, ...: never
 * replacing one); the name it took into to.  0, or -1 with errno. */
int ckpt_move_aside(const char *from, char *to, size_t tolen);

#endif
