/*
 * test_gwrun_cause.c: gw-run names the rank a failure began at when that is
 * not the rank it saw fail first (tools/gw-run-cause.c): each rank's
 * GW_ERROR_FILE, the records libgradwire writes (comm/failrec.c) and the
 * program's own (gw_record_failure), records written by hand (what gw-run
 * takes and what it leaves), and the records' folder removed afterwards;
 * and what else it says of a failure: the ranks that had exited 0 before it,
 * and no rank "still running" that ended while gw-run was stopped.
 */
#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gwrun_helpers.h"

/* A folder for gw-run's TMPDIR (its records' folder goes there). */
static void fresh_tmp(char *dir, size_t len)
{
    snprintf(dir, len, "/tmp/gwrun-cause-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

/* Whether gw-run left nothing in dir (then removes it). */
static bool left_nothing(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    rmdir(dir);
    return n == 0;
}

/* The line of text starting with start ("" when none). */
static const char *line_of(const char *text, const char *start, char *buf, size_t len)
{
    const char *p = strstr(text, start);
    buf[0] = '\0';
    if (p)
        snprintf(buf, len, "%.*s", (int)strcspn(p, "\n"), p);
    return buf;
}

static const char *failing_bin(void)
{
    const char *b = getenv("GW_TEST_FAILING_BIN");
    ck_assert_msg(b && *b, "GW_TEST_FAILING_BIN is not set (point it at the built gwrun_failing)");
    return b;
}

/* gw-run with args under a fresh TMPDIR (made in tmp, 64 bytes) and one
 * more variable (NULL: none). */
static void run_in_tmp(struct run *r, char *tmp, const char *more, const char *const *args)
{
    char env_tmp[100];
    fresh_tmp(tmp, 64);
    snprintf(env_tmp, sizeof env_tmp, "TMPDIR=%s", tmp);
    const char *env[] = {env_tmp, more, NULL};
    gwrun_run(r, env, args);
}

/* A job gw-run saw fail first at rank 0 (exit 1) whose failure began at
 * rank 1, the line ending in ...tail (which must be there): the line. */
static const char *began_at_rank1(const struct run *r, const char *tail, char *line, size_t len)
{
    ck_assert_msg(r->code == 1, "exit code %d; stderr:\n%s", r->code, r->err);
    ck_assert_msg(strstr(r->err, "gw-run: rank 0 (pid"), "stderr:\n%s", r->err);
    line_of(r->err, "gw-run: the failure began at ", line, len);
    ck_assert_msg(strstr(line, "gw-run: the failure began at rank 1 (pid ") && strstr(line, tail), "no '%s'; stderr:\n%s",
                  tail, r->err);
    return line;
}

/* Each of n ranks printed its own var, <tmp>/gw-run-.../rank.<k><suffix>, and
 * none wrote the one gw-run was given (shared). */
static void own_files(const struct run *r, const char *tmp, int n, const char *var, const char *suffix,
                      const char *shared)
{
    for (int k = 0; k < n; k++) {
        char want[160];
        snprintf(want, sizeof want, "[%d] %s/gw-run-", k, tmp);
        ck_assert_msg(strstr(r->out, want), "rank %d's %s is not under %s:\n%s", k, var, tmp, r->out);
        snprintf(want, sizeof want, "/rank.%d%s\n", k, suffix);
        ck_assert_msg(strstr(r->out, want), "rank %d's %s:\n%s", k, var, r->out);
    }
    ck_assert_msg(access(shared, F_OK) != 0, "a rank wrote gw-run's own %s", var);
}

/* Rank 1 gives up on its own and lingers 3 s; ranks 0 and 2 fail of it at
 * once and are the ones gw-run sees fail.  The line names rank 1 and the
 * reason it recorded: the program's own (gw_record_failure), or, without
 * one, the library's record of its abort. */
static void origin_named(bool record, const char *reason)
{
    char tmp[64], env_tmp[100], line[1200];
    fresh_tmp(tmp, sizeof tmp);
    snprintf(env_tmp, sizeof env_tmp, "TMPDIR=%s", tmp);
    const char *env[] = {env_tmp, record ? "GWF_RECORD=1" : "GWF_RECORD=0", "GW_TIMEOUT=30", NULL};
    const char *args[] = {"-n", "3", failing_bin(), NULL};
    struct run r;
    gwrun_run(&r, env, args);
    ck_assert_msg(r.code == 1, "exit code %d; stderr:\n%s", r.code, r.err);
    /* the first failure gw-run saw is rank 0's or rank 2's (rank 1 lingers) */
    ck_assert_msg(strstr(r.err, "gw-run: rank 0 (pid") || strstr(r.err, "gw-run: rank 2 (pid"), "stderr:\n%s", r.err);
    line_of(r.err, "gw-run: the failure began at ", line, sizeof line);
    char want[200];
    snprintf(want, sizeof want, "): %s", reason);
    ck_assert_msg(strstr(line, "gw-run: the failure began at rank 1 (pid ") && strstr(line, " before rank ") &&
                      !strstr(line, " before rank 1's") && strlen(line) > strlen(want) &&
                      !strcmp(line + strlen(line) - strlen(want), want),
                  "no line naming rank 1 with '%s'; stderr:\n%s", reason, r.err);
    ck_assert_msg(left_nothing(tmp), "gw-run left files in its TMPDIR %s", tmp);
    gwrun_free(&r);
}

START_TEST(test_failure_origin_named)
{
    origin_named(true, "rank 1: bad input (gwrun_failing)");
    origin_named(false, "rank 1: aborted by gw_comm_abort");
}
END_TEST

/* Records written by hand: an origin 5 s before the failure gw-run saw (of a
 * rank that recorded nothing) is named with its time, its control characters
 * made '?'; a consequence, a record of a rank that exited 0, a malformed one
 * and one from after the failure are not.  Each rank gets its own
 * GW_ERROR_FILE whatever gw-run was given; what a rank leaves in the folder
 * (a folder of its own) goes with it. */
START_TEST(test_failure_records_read)
{
    char tmp[64], line[1200];
    /* rank 0 fails first; rank 1 recorded an origin 5 s ago and is stopped by
     * the teardown; rank 2 a consequence 9 s ago; rank 3 an origin 8 s ago
     * but exits 0 first; rank 4 a line with no time; rank 5 an origin in the
     * future (after the failure gw-run saw) */
    const char *script =
        "now=$(date +%s); echo \"$GW_ERROR_FILE\"; "
        "case $GW_RANK in "
        "0) sleep 1; exit 1;; "
        "1) printf 'gw-failure 1\\torigin\\t%s.250000\\t%s\\tmy own\\033[31m words\\n' $((now - 5)) $$ "
        "   > \"$GW_ERROR_FILE\"; exec sleep 30;; "
        "2) printf 'gw-failure 1\\tconsequence\\t%s.000000\\t%s\\ttold\\n' $((now - 9)) $$ > \"$GW_ERROR_FILE\"; "
        "   mkdir \"$GW_ERROR_FILE.d\" && touch \"$GW_ERROR_FILE.d/x\"; exec sleep 30;; "
        "3) printf 'gw-failure 1\\torigin\\t%s.000000\\t%s\\tfine after all\\n' $((now - 8)) $$ > \"$GW_ERROR_FILE\"; "
        "   exit 0;; "
        "4) printf 'gw-failure 1\\torigin\\tsoon\\t%s\\tno time\\n' $$ > \"$GW_ERROR_FILE\"; exec sleep 30;; "
        "5) printf 'gw-failure 1\\torigin\\t%s.000000\\t%s\\tlater\\n' $((now + 60)) $$ > \"$GW_ERROR_FILE\"; "
        "   exec sleep 30;; "
        "esac";
    const char *args[] = {"-n", "6", "sh", "-c", script, NULL};
    struct run r;
    run_in_tmp(&r, tmp, "GW_ERROR_FILE=/tmp/gwrun-cause-shared", args);
    began_at_rank1(&r, " s before rank 0's failure above): my own?[31m words", line, sizeof line);
    ck_assert_msg(!strstr(line, "\t"), "stderr:\n%s", r.err);
    double ahead = 0;
    const char *s = strstr(line, "(pid ");
    ck_assert_msg(s && sscanf(s, "(pid %*d, %lf s before", &ahead) == 1 && ahead > 4.5 && ahead < 10, "line: %s", line);
    /* every rank its own file, in gw-run's folder under TMPDIR */
    own_files(&r, tmp, 6, "GW_ERROR_FILE", "", "/tmp/gwrun-cause-shared");
    ck_assert_msg(left_nothing(tmp), "gw-run left files in its TMPDIR %s", tmp);
    gwrun_free(&r);
}
END_TEST

/* Every rank refusing the same input on its own: the rank gw-run names
 * recorded its own failure too, so no other is said to be where it began;
 * an empty message is said as such; an origin recorded after gw-run began
 * stopping the job (a rank that aborts on the teardown's SIGTERM) is the
 * teardown's consequence. */
START_TEST(test_failure_own_everywhere)
{
    char tmp[64], env_tmp[100], line[1200];
    fresh_tmp(tmp, sizeof tmp);
    snprintf(env_tmp, sizeof env_tmp, "TMPDIR=%s", tmp);
    const char *env[] = {env_tmp, NULL};
    const char *same = "now=$(date +%s); printf 'gw-failure 1\\torigin\\t%s.000000\\t%s\\tbad --batch\\n' "
                       "$((now - GW_RANK)) $$ > \"$GW_ERROR_FILE\"; [ $GW_RANK = 0 ] && exit 2; exec sleep 30";
    const char *args[] = {"-n", "3", "sh", "-c", same, NULL};
    struct run r;
    gwrun_run(&r, env, args);
    ck_assert_msg(r.code == 2 && strstr(r.err, "gw-run: rank 0 (pid") && !strstr(r.err, "the failure began"),
                  "exit %d; stderr:\n%s", r.code, r.err);
    gwrun_free(&r);
    /* rank 0 told (a consequence); rank 1's origin has no words */
    const char *empty = "now=$(date +%s); case $GW_RANK in "
                        "0) printf 'gw-failure 1\\tconsequence\\t%s.000000\\t%s\\ttold\\n' $now $$ > \"$GW_ERROR_FILE\"; "
                        "   sleep 0.5; exit 1;; "
                        "1) printf 'gw-failure 1\\torigin\\t%s.000000\\t%s\\t\\n' $((now - 1)) $$ > \"$GW_ERROR_FILE\"; "
                        "   exec sleep 30;; esac";
    const char *args2[] = {"-n", "2", "sh", "-c", empty, NULL};
    gwrun_run(&r, env, args2);
    line_of(r.err, "gw-run: the failure began at ", line, sizeof line);
    ck_assert_msg(strstr(line, "gw-run: the failure began at rank 1 (pid ") &&
                      strstr(line, " before rank 0's failure above): (an empty message)"),
                  "stderr:\n%s", r.err);
    gwrun_free(&r);
    const char *late = "case $GW_RANK in 0) sleep 0.5; exit 1;; "
                       "1) trap 'printf \"gw-failure 1\\torigin\\t%s\\t%s\\taborted on SIGTERM\\n\" $(date +%s.%6N) $$ "
                       "> \"$GW_ERROR_FILE\"; exit 1' TERM; sleep 30 & wait;; esac";
    const char *args3[] = {"-n", "2", "sh", "-c", late, NULL};
    gwrun_run(&r, env, args3);
    ck_assert_msg(r.code == 1 && strstr(r.err, "gw-run: rank 0 (pid") && !strstr(r.err, "the failure began"),
                  "exit %d; stderr:\n%s", r.code, r.err);
    ck_assert_msg(left_nothing(tmp), "gw-run left files in its TMPDIR %s", tmp);
    gwrun_free(&r);
}
END_TEST

/* A PyTorch program's exception under torchelastic's @record: each rank
 * gets TORCHELASTIC_ERROR_FILE in gw-run's folder, and the file torch
 * writes there is read as the rank's record (its JSON escapes undone, control
 * characters made '?', UTF-8 kept): the earliest names where the failure
 * began, also when the rank gw-run named wrote one of its own later (an
 * exception does not say whether it was its own); a file of another form
 * is not taken; the other form torch reads, a character past 16 bits and a
 * message too long to keep.  Rank 1 writes what torch 1.13's ErrorHandler writes and is
 * stopped by the teardown; rank 2 an earlier file that is no such record;
 * rank 0 its own file, then exits 1 first. */
START_TEST(test_failure_torch_error_file)
{
    char tmp[64], line[1200];
    const char *script =
        "echo \"$TORCHELASTIC_ERROR_FILE\"; "
        "case $GW_RANK in "
        "0) sleep 1.5; printf '{\"message\": {\"message\": \"RuntimeError: Connection closed by peer\", "
        "\"extraInfo\": {\"py_callstack\": \"\", \"timestamp\": \"0\"}}}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 1;; "
        "1) sleep 0.5; printf '{\"message\": {\"message\": \"ValueError: bad \\\\\"shard\\\\\" 7\\\\nnext line "
        "caf\\\\u00e9\\\\u0001\", \"extraInfo\": {\"py_callstack\": \"Traceback ...\", \"timestamp\": \"1\"}}}' "
        "> \"$TORCHELASTIC_ERROR_FILE\"; exec sleep 30;; "
        "2) printf '{\"msg\": \"plain\", \"message\": \"second\"}' > \"$TORCHELASTIC_ERROR_FILE\"; exec sleep 30;; "
        "esac";
    const char *args[] = {"-n", "3", "sh", "-c", script, NULL};
    struct run r;
    run_in_tmp(&r, tmp, "TORCHELASTIC_ERROR_FILE=/tmp/gwrun-cause-torch-shared", args);
    began_at_rank1(&r, " before rank 0's failure above): ValueError: bad \"shard\" 7?next line caf\xc3\xa9?", line,
                   sizeof line);
    ck_assert_msg(line[strlen(line) - 1] == '?', "stderr:\n%s", r.err);
    own_files(&r, tmp, 3, "TORCHELASTIC_ERROR_FILE", ".json", "/tmp/gwrun-cause-torch-shared");
    ck_assert_msg(left_nothing(tmp), "gw-run left files in its TMPDIR %s", tmp);
    gwrun_free(&r);
    /* torch's other form ({"message": "..."}), a character past 16 bits as
     * json.dump escapes it (a surrogate pair), and a message longer than
     * what is read of the file: cut with "..." */
    const char *script2 = "case $GW_RANK in 0) sleep 1; exit 1;; esac; "
                          "{ printf '{\"message\": \"KeyError: \\\\ud83d\\\\ude00 '; head -c 20000 /dev/zero | tr '\\0' x; "
                          "printf '\", \"timestamp\": 1}'; } > \"$TORCHELASTIC_ERROR_FILE\"; exec sleep 30";
    const char *args2[] = {"-n", "2", "sh", "-c", script2, NULL};
    run_in_tmp(&r, tmp, NULL, args2);
    began_at_rank1(&r, " before rank 0's failure above): KeyError: \xf0\x9f\x98\x80 xxxx", line, sizeof line);
    ck_assert_msg(strlen(line) > 900 && strlen(line) < 1200 && !strcmp(line + strlen(line) - 4, "x..."),
                  "a %zu-byte line: %s", strlen(line), line);
    ck_assert_msg(left_nothing(tmp), "gw-run left files in its TMPDIR %s", tmp);
    gwrun_free(&r);
}
END_TEST

/* The same file as torch itself writes it (its ErrorHandler, which @record
 * calls), where this machine's python3 has torch: rank 1 records a
 * ValueError and lingers; rank 0 exits 1 once the file is there. */
START_TEST(test_failure_torch_record_real)
{
    /* the first python3 on PATH, else Debian's (a pyenv's may lack torch) */
    const char *py = NULL;
    static const char *const pys[] = {"python3", "/usr/bin/python3"};
    for (int i = 0; i < 2 && !py; i++) {
        char cmd[200];
        snprintf(cmd, sizeof cmd, "%s -c 'import torch.distributed.elastic.multiprocessing.errors' >/dev/null 2>&1",
                 pys[i]);
        if (system(cmd) == 0)
            py = pys[i];
    }
    if (!py) {
        fprintf(stderr, "test_failure_torch_record_real: no python3 with torch here; the test above has its format\n");
        return;
    }
    char tmp[64], env_py[64], line[1200];
    snprintf(env_py, sizeof env_py, "PY=%s", py);
    const char *script =
        "case $GW_RANK in "
        "0) i=0; while [ $i -lt 300 ] && [ ! -s \"${TORCHELASTIC_ERROR_FILE%/*}/rank.1.json\" ]; do "
        "   sleep 0.05; i=$((i + 1)); done; sleep 0.2; exit 1;; "
        "1) exec \"$PY\" -c 'import time\n"
        "from torch.distributed.elastic.multiprocessing.errors import ErrorHandler\n"
        "try:\n    raise ValueError(\"shard 7 is corrupt\")\n"
        "except ValueError as e:\n    ErrorHandler().record_exception(e)\n"
        "time.sleep(30)';; "
        "esac";
    const char *args[] = {"-n", "2", "sh", "-c", script, NULL};
    struct run r;
    run_in_tmp(&r, tmp, env_py, args);
    began_at_rank1(&r, " before rank 0's failure above): ValueError: shard 7 is corrupt", line, sizeof line);
    ck_assert_msg(left_nothing(tmp), "gw-run left files in its TMPDIR %s", tmp);
    gwrun_free(&r);
}
END_TEST

/* A SIGTERM to gw-run while it stops the ranks after a failure (to hurry a
 * rank that ignores the teardown's) leaves the failure's exit code, and the
 * line naming where it began (it was left out after any signal). */
START_TEST(test_failure_origin_named_after_signal)
{
    char tmp[64], env_tmp[100], line[1200];
    fresh_tmp(tmp, sizeof tmp);
    snprintf(env_tmp, sizeof env_tmp, "TMPDIR=%s", tmp);
    const char *env[] = {env_tmp, "GW_RUN_KILL_GRACE=4", NULL};
    const char *script = "now=$(date +%s); case $GW_RANK in 0) sleep 0.5; exit 1;; "
                         "1) printf 'gw-failure 1\torigin\t%s.000000\t%s\tdisk full\n' $((now - 1)) $$ "
                         "> \"$GW_ERROR_FILE\"; trap '' TERM; exec sleep 30;; esac";
    const char *args[] = {"-n", "2", "sh", "-c", script, NULL};
    struct run r;
    gwrun_start(&r, env, args);
    const bool stopping = gwrun_stderr_has(&r, "gw-run: stopping the 1 other running rank", 20);
    if (stopping)
        kill(r.pid, SIGTERM);
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    ck_assert_msg(stopping && !r.timed_out && r.code == 1, "exit %d; stderr:\n%s", r.code, r.err);
    ck_assert_msg(strstr(r.err, "gw-run: received SIGTERM"), "stderr:\n%s", r.err);
    line_of(r.err, "gw-run: the failure began at ", line, sizeof line);
    ck_assert_msg(strstr(line, "gw-run: the failure began at rank 1 (pid ") &&
                      strstr(line, " before rank 0's failure above): disk full"),
                  "stderr:\n%s", r.err);
    ck_assert_msg(left_nothing(tmp), "gw-run left files in its TMPDIR %s", tmp);
    gwrun_free(&r);
}
END_TEST

/* A rank killed by a signal closes its files (its peers see it gone and may
 * exit 1 at once) before gw-run can collect it: such a peer's exit 1 came
 * first about 8 runs in 100 and was the job's failure, the crash reported
 * after it.  gw-run now waits (at most 0.5 s) for a rank the kernel counts as
 * dying before it judges an exit with a code.  Here rank 1 is long dying
 * (its main thread gone), rank 0 exits 1 once it is, and rank 1 kills
 * itself once gw-run collected rank 0 (a handshake, no sleep: without the
 * wait gw-run has judged by then): the job's code is SIGKILL's, and both are
 * reported. */
START_TEST(test_dying_rank_over_exit)
{
    char mark[] = "/tmp/gwrun-dying-XXXXXX", script[1024];
    ck_assert_ptr_nonnull(mkdtemp(mark));
    snprintf(script, sizeof script,
             "if [ \"$GW_RANK\" = 1 ]; then GWF_DIE_WHEN_GONE=%s/pid0 GWF_DIE_MARK=%s/dying exec %s; fi; i=0; "
             "while [ ! -e %s/dying ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; echo $$ > %s/pid0.new; "
             "mv %s/pid0.new %s/pid0; exit 1",
             mark, mark, failing_bin(), mark, mark, mark, mark);
    const char *env[] = {"GW_RUN_KILL_GRACE=30", NULL};
    const char *args[] = {"-n", "2", "sh", "-c", script, NULL};
    struct run r;
    gwrun_run(&r, env, args);
    char path[96];
    snprintf(path, sizeof path, "%s/dying", mark);
    const bool marked = access(path, F_OK) == 0;
    unlink(path);
    snprintf(path, sizeof path, "%s/pid0", mark);
    unlink(path), rmdir(mark);
    ck_assert_msg(marked, "rank 1 did not get to dying; stderr:\n%s", r.err);
    ck_assert_msg(r.code == 128 + SIGKILL, "exit code %d, not SIGKILL's; stderr:\n%s", r.code, r.err);
    ck_assert_msg(strstr(r.err, "gw-run: rank 1 (pid") && strstr(r.err, "killed by signal 9") &&
                      strstr(r.err, "gw-run: rank 0 (pid") && strstr(r.err, "exited with code 1"),
                  "stderr does not report both:\n%s", r.err);
    gwrun_free(&r);
}
END_TEST

/* Ranks that exited with code 0 before another failed are named with the
 * failure (their peers, waiting for them, fail by a timeout that could only
 * say they were missing); ranks still running, and the failed one, are not.
 * Rank 0 fails 1.5 s after ranks 1 and 2 ended of themselves. */
START_TEST(test_early_exits_named_with_failure)
{
    struct run r;
    const char *args[] = {"-n", "4", "sh", "-c",
                          "case $GW_RANK in 1|2) exit 0;; 0) sleep 1.5; exit 3;; esac; sleep 30", NULL};
    gwrun_run(&r, NULL, args);
    ck_assert_msg(r.code == 3, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(strstr(r.err, "rank 1 had exited with code 0, ") && strstr(r.err, "rank 2 had exited with code 0, "),
                  "the early exits are not named:\n%s", r.err);
    ck_assert_msg(!strstr(r.err, "rank 0 had exited") && !strstr(r.err, "rank 3 had exited"), "stderr:\n%s", r.err);
    const char *s1 = strstr(r.err, "rank 1 had exited with code 0, ");
    double ago = -1;
    ck_assert_msg(s1 && sscanf(s1, "rank 1 had exited with code 0, %lf s before", &ago) == 1 && ago >= 1.0 && ago < 20,
                  "how long before is not said: %.1f\n%s", ago, r.err);
    gwrun_free(&r);
    /* a job that fails with no rank ended before: no such line */
    const char *none[] = {"-n", "2", "sh", "-c", "[ $GW_RANK = 1 ] && exit 5; sleep 30", NULL};
    gwrun_run(&r, NULL, none);
    ck_assert_msg(r.code == 5 && !strstr(r.err, "had exited with code 0"), "exit %d\n%s", r.code, r.err);
    gwrun_free(&r);
}
END_TEST

/* gw-run stopped (SIGSTOP) in its teardown past the kill deadline, while
 * the rank it waits for ends of the SIGTERM: once it goes on, that rank is
 * collected, not said to be "still running" and sent SIGKILL (a helper's
 * probe). */
START_TEST(test_stopped_past_kill_deadline)
{
    struct run r;
    const char *env[] = {"GW_RUN_KILL_GRACE=1", NULL};
    const char *args[] = {"-n", "2", "sh", "-c",
                          "[ $GW_RANK = 1 ] && { sleep 0.3; exit 3; }; trap 'sleep 0.3; exit 0' TERM; "
                          "sleep 30 & wait", NULL};
    gwrun_start(&r, env, args);
    const bool tearing = gwrun_stderr_has(&r, "stopping the 1 other running rank", 20);
    if (tearing) {
        kill(r.pid, SIGSTOP);
        gwrun_sleep(2.5);
        kill(r.pid, SIGCONT);
    }
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    ck_assert_msg(tearing, "no teardown; stderr:\n%s", r.err);
    ck_assert_msg(r.code == 3 && !strstr(r.err, "still running after"), "exit %d, stderr:\n%s", r.code, r.err);
    gwrun_free(&r);
}
END_TEST

void gwrun_add_cause_tests(TCase *tc)
{
    tcase_add_test(tc, test_early_exits_named_with_failure);
    tcase_add_test(tc, test_stopped_past_kill_deadline);
    tcase_add_test(tc, test_dying_rank_over_exit);
    tcase_add_test(tc, test_failure_origin_named_after_signal);
    tcase_add_test(tc, test_failure_origin_named);
    tcase_add_test(tc, test_failure_records_read);
    tcase_add_test(tc, test_failure_own_everywhere);
    tcase_add_test(tc, test_failure_torch_error_file);
    tcase_add_test(tc, test_failure_torch_record_real);
}
