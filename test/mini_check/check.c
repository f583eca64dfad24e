/* check.c - see check.h. */
#include "check.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_TESTS 64
struct TCase {
  const char *name;
  const TTest *tests[MAX_TESTS];
  int ntests;
  double timeout;
};
struct Suite {
  const char *name;
  TCase *cases[MAX_TESTS];
  int ncases;
};
struct SRunner {
  Suite *suite;
  int run, failed;
};

Suite *suite_create(const char *name) {
  Suite *s = calloc(1, sizeof *s);
  if (s) s->name = name;
  return s;
}

TCase *tcase_create(const char *name) {
  TCase *tc = calloc(1, sizeof *tc);
  if (tc) tc->name = name, tc->timeout = 4;
  return tc;
}

/* More than MAX_TESTS would be left out unseen: a build-time mistake, said. */
static void too_many(const char *what, const char *name) {
  fprintf(stderr, "mini_check: more than %d %s in %s (raise MAX_TESTS in test/mini_check/check.c)\n", MAX_TESTS,
          what, name);
  exit(1);
}

void tcase_add_test(TCase *tc, const TTest *t) {
  if (tc->ntests == MAX_TESTS) too_many("tests", tc->name);
  tc->tests[tc->ntests++] = t;
}

void tcase_set_timeout(TCase *tc, double seconds) { tc->timeout = seconds; }

void suite_add_tcase(Suite *s, TCase *tc) {
  if (s->ncases == MAX_TESTS) too_many("cases", s->name);
  s->cases[s->ncases++] = tc;
}

SRunner *srunner_create(Suite *s) {
  SRunner *sr = calloc(1, sizeof *sr);
  if (sr) sr->suite = s;
  return sr;
}

void srunner_run_all(SRunner *sr, enum print_output mode) {
  const char *only = getenv("CK_RUN_CASE"), *fork_env = getenv("CK_FORK");
  const int no_fork = fork_env && !strcmp(fork_env, "no");
  printf("Running suite(s): %s\n", sr->suite->name);
  fflush(stdout);
  int matched = 0;
  for (int c = 0; c < sr->suite->ncases; c++) {
    TCase *tc = sr->suite->cases[c];
    if (only && strcmp(only, tc->name) != 0) continue;
    matched = 1;
    for (int t = 0; t < tc->ntests; t++) {
      fflush(stdout), fflush(stderr); /* or the child's exit writes the parent's buffered lines again */
      /* CK_FORK=no (as Check's): in this process, for a debugger or a tool
       * that follows one process; a failing test then ends the run. */
      pid_t pid = no_fork ? 0 : fork();
      if (pid == 0 && no_fork) {
        tc->tests[t]->fn(0);
        sr->run++;
        if (mode == CK_VERBOSE) printf("%s:%s: Passed\n", tc->name, tc->tests[t]->name);
        continue;
      }
      if (pid == 0) {
        alarm((unsigned)(tc->timeout + 0.999));
        tc->tests[t]->fn(0);
        exit(0);
      }
      int status = 0;
      sr->run++;
      if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        sr->failed++;
        fprintf(stderr, "%s:%s: failed (%s %d)\n", tc->name, tc->tests[t]->name,
                pid > 0 && WIFSIGNALED(status) ? "signal" : "exit",
                pid > 0 && WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      } else if (mode == CK_VERBOSE) {
        printf("%s:%s: Passed\n", tc->name, tc->tests[t]->name);
      }
    }
  }
  if (only && !matched) { /* a mistyped CK_RUN_CASE ran nothing: not a pass */
    fprintf(stderr, "mini_check: no case named '%s' in suite %s\n", only, sr->suite->name);
    sr->run++, sr->failed++;
  }
  printf("%d%%: Checks: %d, Failures: %d, Errors: 0\n", sr->run ? 100 * (sr->run - sr->failed) / sr->run : 100,
         sr->run, sr->failed);
}

int srunner_ntests_failed(SRunner *sr) { return sr->failed; }
int srunner_ntests_run(SRunner *sr) { return sr->run; }

void srunner_free(SRunner *sr) {
  if (!sr) return;
  for (int c = 0; c < sr->suite->ncases; c++) free(sr->suite->cases[c]);
  free(sr->suite);
  free(sr);
}
