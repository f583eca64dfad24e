/* gw-perf-json.c - gw-perf's --json file (gw-perf-run.h).
 *
 * It stays a whole document as rows come (a run stopped midway, by a time
 * limit or a rank's failure, left it empty or cut): each row goes in place
 * of the last closing tail, and a new tail follows it, "complete": false
 * until the end's true.  Where the file cannot seek (a FIFO), rows stream
 * and only the end's tail is written. */
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

#include "gw-perf-run.h"

static long tail_at = -1; /* where the closing tail begins; -1: the file streams */
static const char interim[] = "\n  ],\n  \"complete\": false\n}\n";

/* The tail at tail_at, the file cut after it. */
static void put_tail(FILE *json, const char *tail, bool final) {
  if (tail_at >= 0 && fseek(json, tail_at, SEEK_SET) != 0) tail_at = -1;
  if (tail_at < 0 && !final) return; /* (streaming: only the end's) */
  fputs(tail, json);
  fflush(json);
  if (tail_at >= 0 && ftruncate(fileno(json), ftell(json)) != 0) tail_at = -1;
}

void gwp_json_begin(FILE *json, const char *coll, int nranks) {
  fprintf(json, "{\n  \"collective\": \"%s\",\n  \"nranks\": %d,\n  \"results\": [", coll, nranks);
  tail_at = ftell(json); /* -1 where it cannot seek */
  put_tail(json, interim, false);
}

void gwp_json_row(FILE *json, const char *row) {
  if (tail_at >= 0 && fseek(json, tail_at, SEEK_SET) != 0) tail_at = -1;
  fputs(row, json);
  if (tail_at >= 0) tail_at = ftell(json);
  put_tail(json, interim, false);
}

void gwp_json_end(FILE *json, double avg_busbw, int check, const char *wrong) {
  char tail[200];
  snprintf(tail, sizeof tail, "\n  ],\n  \"avg_busbw\": %.4f,\n  \"check\": %d,\n  \"wrong\": %s,\n  \"complete\": true\n}\n",
           avg_busbw, check, wrong);
  put_tail(json, tail, true);
}
