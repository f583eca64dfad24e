/* check_quiet.h - included before every test file built with Check (-include,
 * test/meson.build): a passing ck_assert* marks nothing.  Check's own macro
 * records each passing assertion's place for a crash report ("after this
 * point"), by a write(2) to its message file: the suites' assertions inside
 * loops made 13 million writes a run here (test_reduce 4.9 million, most of
 * its time; the trees' shapes 2.4 million, the CPU backend's layers 1.7
 * million).  A failing assertion is reported as before, with its place and
 * message; a test that crashes is named with the signal (under ASan with the
 * stack), only without the last assertion passed before it. */
#ifndef GW_CHECK_QUIET_H
#define GW_CHECK_QUIET_H

#include <check.h>

#undef ck_assert_msg
#define ck_assert_msg(expr, ...) \
  ((expr) ? (void)0 : _ck_assert_failed(__FILE__, __LINE__, "Assertion '" #expr "' failed", ##__VA_ARGS__))

#endif
