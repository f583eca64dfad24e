/* check.h - a stand-in for the small part of Check (libcheck) that the device
 * suite uses, for machines without Check: scripts/gpu-check.sh builds with it
 * on a GPU machine where nothing can be installed (-Druntime_only=true and no
 * Check found).  Each test runs in a forked child under its case's timeout;
 * CK_RUN_CASE picks one case, CK_FORK=no runs them in this process, as in
 * Check.  Not a general replacement. */
#ifndef GW_MINI_CHECK_H
#define GW_MINI_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct TTest {
  const char *name;
  void (*fn)(int);
} TTest;
typedef struct TCase TCase;
typedef struct Suite Suite;
typedef struct SRunner SRunner;
enum print_output { CK_SILENT, CK_MINIMAL, CK_NORMAL, CK_VERBOSE };

#define START_TEST(name)                                   \
  static void name##_fn(int _i);                           \
  static const TTest name##_ttest = {#name, name##_fn};    \
  static const TTest *name = &name##_ttest;                \
  static void name##_fn(int _i __attribute__((unused)))
#define END_TEST

#define ck_assert_msg(cond, ...)                                                       \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "%s:%d: Assertion '%s' failed: ", __FILE__, __LINE__, #cond);    \
      fprintf(stderr, __VA_ARGS__);                                                    \
      fputc('\n', stderr);                                                             \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)
#define ck_assert(cond) ck_assert_msg(cond, "%s", "")
#define ck_assert_int_eq(a, b)                                                          \
  do {                                                                                  \
    intmax_t ck_a_ = (intmax_t)(a), ck_b_ = (intmax_t)(b);                              \
    ck_assert_msg(ck_a_ == ck_b_, "%s == %jd, %s == %jd", #a, ck_a_, #b, ck_b_);         \
  } while (0)

#define ck_assert_int_op_(a, op, b)                                                     \
  do {                                                                                  \
    intmax_t ck_a_ = (intmax_t)(a), ck_b_ = (intmax_t)(b);                              \
    ck_assert_msg(ck_a_ op ck_b_, "%s == %jd, %s == %jd", #a, ck_a_, #b, ck_b_);         \
  } while (0)
#define ck_assert_int_ne(a, b) ck_assert_int_op_(a, !=, b)
#define ck_assert_int_lt(a, b) ck_assert_int_op_(a, <, b)
#define ck_assert_int_le(a, b) ck_assert_int_op_(a, <=, b)
#define ck_assert_int_gt(a, b) ck_assert_int_op_(a, >, b)
#define ck_assert_int_ge(a, b) ck_assert_int_op_(a, >=, b)
#define ck_assert_uint_op_(a, op, b)                                                    \
  do {                                                                                  \
    uintmax_t ck_a_ = (uintmax_t)(a), ck_b_ = (uintmax_t)(b);                           \
    ck_assert_msg(ck_a_ op ck_b_, "%s == %ju, %s == %ju", #a, ck_a_, #b, ck_b_);         \
  } while (0)
#define ck_assert_uint_eq(a, b) ck_assert_uint_op_(a, ==, b)
#define ck_assert_uint_ne(a, b) ck_assert_uint_op_(a, !=, b)
#define ck_assert_uint_le(a, b) ck_assert_uint_op_(a, <=, b)
#define ck_assert_uint_ge(a, b) ck_assert_uint_op_(a, >=, b)
#define ck_abort_msg(...) ck_assert_msg(0, __VA_ARGS__)
#define ck_abort() ck_abort_msg("%s", "")

#define ck_assert_ptr_op_(a, op, b)                                                     \
  do {                                                                                  \
    const void *ck_p_ = (const void *)(a), *ck_q_ = (const void *)(b);                  \
    ck_assert_msg(ck_p_ op ck_q_, "%s == %p, %s == %p", #a, ck_p_, #b, ck_q_);           \
  } while (0)
#define ck_assert_ptr_eq(a, b) ck_assert_ptr_op_(a, ==, b)
#define ck_assert_ptr_ne(a, b) ck_assert_ptr_op_(a, !=, b)
#define ck_assert_ptr_null(p) ck_assert_msg((p) == NULL, "%s is not NULL", #p)
#define ck_assert_ptr_nonnull(p) ck_assert_msg((p) != NULL, "%s is NULL", #p)
#define ck_assert_str_eq(a, b)                                                          \
  do {                                                                                  \
    const char *ck_s_ = (a), *ck_t_ = (b);                                              \
    ck_assert_msg(!strcmp(ck_s_, ck_t_), "%s == \"%s\", %s == \"%s\"", #a, ck_s_, #b, ck_t_); \
  } while (0)
#define ck_assert_str_ne(a, b)                                                          \
  do {                                                                                  \
    const char *ck_s_ = (a), *ck_t_ = (b);                                              \
    ck_assert_msg(strcmp(ck_s_, ck_t_), "%s == %s == \"%s\"", #a, #b, ck_s_);           \
  } while (0)

Suite *suite_create(const char *name);
TCase *tcase_create(const char *name);
void tcase_add_test(TCase *tc, const TTest *t);
void tcase_set_timeout(TCase *tc, double seconds);
void suite_add_tcase(Suite *s, TCase *tc);
SRunner *srunner_create(Suite *s);
void srunner_run_all(SRunner *sr, enum print_output mode);
int srunner_ntests_failed(SRunner *sr);
int srunner_ntests_run(SRunner *sr);
void srunner_free(SRunner *sr);

#endif
