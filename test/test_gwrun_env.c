/*
 * test_gwrun_env.c: the environment gw-run gives its ranks (out of
 * test_gwrun.c, which was past 900 lines): GW_* made and passed through,
 * OMP_NUM_THREADS from the affinity, --master and the multi-node numbering,
 * torchrun's names and option spellings.
 */
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gwrun_helpers.h"

/* ---- 2: environment ---- */

struct env_seen {
    int lines;
    bool rank_seen[8];
    char token[128];
    int omp;
};

static void check_env_line(const char *line, void *arg)
{
    struct env_seen *s = arg;
    int prefix, rank, port, omp, lws, nnodes, node_rank, used = 0;
    char addr[64], token[128];
    int n = sscanf(line, "[%d] %d %63s %d %127s %d %d %d %d%n", &prefix, &rank, addr, &port, token,
                   &omp, &lws, &nnodes, &node_rank, &used);
    ck_assert_msg(n == 9 && line[used] == '\0', "unexpected line '%s'", line);
    ck_assert_int_eq(prefix, rank);
    ck_assert(rank >= 0 && rank < 8);
    s->rank_seen[rank] = true;
    ck_assert_str_eq(addr, "127.0.0.1");
    ck_assert_msg(port >= 1 && port <= 65535, "GW_MASTER_PORT %d", port);
    ck_assert_int_ge(omp, 1);
    ck_assert_int_eq(nnodes, 1);
    ck_assert_int_eq(node_rank, 0);
    if (s->lines == 0) {
        snprintf(s->token, sizeof s->token, "%s", token);
        s->omp = omp;
    } else {
        ck_assert_msg(strcmp(s->token, token) == 0, "ranks see different tokens: %s vs %s",
                      s->token, token);
        ck_assert_int_eq(s->omp, omp);
    }
    (void)lws;
    s->lines++;
}

static const char env_script[] =
    "echo $GW_RANK $GW_MASTER_ADDR $GW_MASTER_PORT $GW_JOB_TOKEN $OMP_NUM_THREADS "
    "$GW_LOCAL_WORLD_SIZE $GW_NNODES $GW_NODE_RANK";

START_TEST(test_env_generated)
{
    struct run r;
    const char *env[] = {"GW_JOB_TOKEN", "OMP_NUM_THREADS", NULL};
    const char *args[] = {"-n", "2", "sh", "-c", env_script, NULL};
    gwrun_run(&r, env, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    struct env_seen s = {0};
    gwrun_for_each_line(r.out, check_env_line, &s);
    ck_assert_int_eq(s.lines, 2);
    ck_assert(s.rank_seen[0] && s.rank_seen[1]);
    ck_assert_uint_eq(strlen(s.token), 32);
    for (int i = 0; i < 32; i++)
        ck_assert_msg(isxdigit((unsigned char)s.token[i]), "token %s is not hex", s.token);
    /* Two runs must not share a token: it is the job's secret. */
    struct run r2;
    gwrun_run(&r2, env, args);
    ck_assert_int_eq(r2.code, 0);
    struct env_seen s2 = {0};
    gwrun_for_each_line(r2.out, check_env_line, &s2);
    ck_assert_str_ne(s.token, s2.token);
    gwrun_free(&r);
    gwrun_free(&r2);
}
END_TEST

START_TEST(test_env_passthrough)
{
    struct run r;
    const char *env[] = {"GW_JOB_TOKEN=my-preset-token", "OMP_NUM_THREADS=5", NULL};
    const char *args[] = {"-n", "3", "sh", "-c", env_script, NULL};
    gwrun_run(&r, env, args);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    struct env_seen s = {0};
    gwrun_for_each_line(r.out, check_env_line, &s);
    ck_assert_int_eq(s.lines, 3);
    ck_assert_str_eq(s.token, "my-preset-token");
    ck_assert_int_eq(s.omp, 5);
    gwrun_free(&r);
}
END_TEST

/* OMP_NUM_THREADS counts the cores gw-run may use (taskset, a cpuset), not
 * the machine's: one core and one rank make 1, not the machine's count. */
START_TEST(test_env_omp_affinity)
{
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
        return; /* nothing to tell apart */
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
    ck_assert_int_eq(sched_setaffinity(0, sizeof one, &one), 0); /* this test's process, and gw-run after it */
    struct run r;
    const char *env[] = {"OMP_NUM_THREADS", NULL};
    const char *args[] = {"-n", "1", "sh", "-c", "echo threads $OMP_NUM_THREADS", NULL};
    gwrun_run(&r, env, args);
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] threads 1"), "exit %d, stdout:\n%s\nstderr:\n%s", r.code,
                  r.out, r.err);
    gwrun_free(&r);
}
END_TEST

START_TEST(test_env_master_and_multinode)
{
    const char *script = "echo $GW_RANK $GW_WORLD_SIZE $GW_LOCAL_RANK $GW_LOCAL_WORLD_SIZE "
                         "$GW_NODE_RANK $GW_NNODES $GW_MASTER_ADDR $GW_MASTER_PORT";
    struct run r;
    const char *a1[] = {"-n", "1", "--master", "10.1.2.3:29500", "sh", "-c", script, NULL};
    gwrun_run(&r, NULL, a1);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(gwrun_has_line(r.out, "[0] 0 1 0 1 0 1 10.1.2.3 29500"), "stdout:\n%s", r.out);
    gwrun_free(&r);

    const char *a2[] = {"-n", "1", "--master", "[::1]:4000", "--", "sh", "-c", script, NULL};
    gwrun_run(&r, NULL, a2);
    ck_assert_msg(r.code == 0, "exit code %d, stderr:\n%s", r.code, r.err);
    ck_assert_msg(gwrun_has_line(r.out, "[0] 0 1 0 1 0 1 ::1 4000"), "stdout:\n%s", r.out);
    gwrun_free(&r);

    /* Node 1 of 2 with 2 ranks each holds global ranks 2 and 3. Its node 0
     * runs too: without one, node 1 would wait for it to join. */
    const char *env[] = {"GW_JOB_TOKEN=shared", NULL};
    int port = gwrun_free_port_pair();
    char master[64], line[128];
    snprintf(master, sizeof master, "127.0.0.1:%d", port);
    const char *a0[] = {"-n", "2", "--nnodes", "2", "--master", master, "true", NULL};
    const char *a3[] = {"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1",
                        "--master", master, "sh", "-c", script, NULL};
    struct run r0;
    gwrun_start(&r0, env, a0);
    gwrun_start(&r, env, a3);
    gwrun_wait(&r, GWRUN_TIMEOUT_S);
    gwrun_wait(&r0, GWRUN_TIMEOUT_S);
    ck_assert_msg(r.code == 0 && r0.code == 0, "exit codes %d, %d, stderr:\n%s%s", r0.code,
                  r.code, r0.err, r.err);
    ck_assert_int_eq(gwrun_count_lines(r.out), 2);
    snprintf(line, sizeof line, "[2] 2 4 0 2 1 2 127.0.0.1 %d", port);
    ck_assert_msg(gwrun_has_line(r.out, line), "stdout:\n%s", r.out);
    snprintf(line, sizeof line, "[3] 3 4 1 2 1 2 127.0.0.1 %d", port);
    ck_assert_msg(gwrun_has_line(r.out, line), "stdout:\n%s", r.out);
    gwrun_free(&r);
    gwrun_free(&r0);
}
END_TEST

/* torchrun's names beside gradwire's (a program written for torchrun runs
 * unchanged), its MASTER_PORT another port than gradwire's rendezvous; its
 * spellings --master-addr / --master-port / --standalone and -n cpu. */
START_TEST(test_env_torchrun_names)
{
    const char *script = "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $GROUP_WORLD_SIZE "
                         "$ROLE_RANK $MASTER_ADDR $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS "
                         "$(test \"$MASTER_PORT\" -gt 0 && test \"$MASTER_PORT\" != \"$GW_MASTER_PORT\" && echo apart)";
    struct run r;
    const char *a1[] = {"-n", "2", "--standalone", "sh", "-c", script, NULL};
    gwrun_run(&r, NULL, a1);
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] 0 0 2 2 0 1 0 127.0.0.1 0 0 apart") &&
                      gwrun_has_line(r.out, "[1] 1 1 2 2 0 1 1 127.0.0.1 0 0 apart"),
                  "exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    gwrun_free(&r);
    const char *a2[] = {"-n", "1", "--master-addr", "10.1.2.3", "--master-port", "4000", "sh", "-c",
                        "echo $GW_MASTER_ADDR $GW_MASTER_PORT", NULL};
    gwrun_run(&r, NULL, a2);
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] 10.1.2.3 4000"), "exit %d, stdout:\n%s\nstderr:\n%s",
                  r.code, r.out, r.err);
    gwrun_free(&r);
    /* TORCHELASTIC_RUN_ID, torchrun's (torch.distributed.is_torchelastic_launched()
     * asks for it): --rdzv-id, else "none", an outer one's replaced;
     * --standalone drops an endpoint given beside it, saying so (one
     * unreachable held the job until the bootstrap deadline) */
    /* torchrun's PET_* variables (Kubeflow's PyTorchJob) for flags not given:
     * -n from PET_NPROC_PER_NODE, the command line's over it, the master's
     * only when the command line names none */
    const char *pet[] = {"PET_NPROC_PER_NODE=2", "PET_MASTER_ADDR=10.7.7.7", "PET_RDZV_ID=petjob", NULL};
    gwrun_run(&r, pet, (const char *[]){"sh", "-c", "echo $RANK/$WORLD_SIZE $TORCHELASTIC_RUN_ID", NULL});
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] 0/2 petjob") && gwrun_has_line(r.out, "[1] 1/2 petjob"),
                  "PET_NPROC_PER_NODE: exit %d\n%s\n%s", r.code, r.out, r.err);
    gwrun_free(&r);
    gwrun_run(&r, pet, (const char *[]){"-n", "1", "--standalone", "sh", "-c", "echo $WORLD_SIZE $MASTER_ADDR", NULL});
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] 1 127.0.0.1") && !strstr(r.err, "10.7.7.7"),
                  "the command line over PET_*: exit %d\n%s\n%s", r.code, r.out, r.err);
    gwrun_free(&r);
    /* a bad value from PET_* is named by its variable, not only by a flag
     * nobody typed */
    const char *bad_pet[] = {"PET_MAX_RESTARTS=abc", NULL};
    gwrun_run(&r, bad_pet, (const char *[]){"-n", "1", "true", NULL});
    ck_assert_msg(r.code == 2 && strstr(r.err, "not 'abc' (from PET_MAX_RESTARTS in the environment"),
                  "PET_MAX_RESTARTS=abc: exit %d\n%s", r.code, r.err);
    gwrun_free(&r);
    const char *bad_end[] = {"PET_RDZV_ENDPOINT=host:x", NULL};
    gwrun_run(&r, bad_end, (const char *[]){"-n", "1", "true", NULL});
    ck_assert_msg(r.code == 2 && strstr(r.err, "--rdzv-endpoint must give HOST:PORT") &&
                      strstr(r.err, "(from PET_RDZV_ENDPOINT in the environment"),
                  "PET_RDZV_ENDPOINT=host:x: exit %d\n%s", r.code, r.err);
    gwrun_free(&r);
    /* a node rank out of range from the environment: the variables named (only a flag never typed was) */
    const char *bad_rank[] = {"PET_NNODES=2", "PET_NODE_RANK=3", "GW_JOB_TOKEN=pet-rank", NULL};
    gwrun_run(&r, bad_rank, (const char *[]){"-n", "1", "--master", "127.0.0.1:29999", "true", NULL});
    ck_assert_msg(r.code == 2 && strstr(r.err, "--node-rank 3 is out of range for --nnodes 2 (0..1) (--node-rank from "
                                               "PET_NODE_RANK in the environment"),
                  "PET_NODE_RANK=3: exit %d\n%s", r.code, r.err);
    gwrun_free(&r);
    const char *outer[] = {"TORCHELASTIC_RUN_ID=outer", NULL};
    gwrun_run(&r, outer, (const char *[]){"-n", "1", "sh", "-c", "echo id=$TORCHELASTIC_RUN_ID", NULL});
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] id=none"), "no --rdzv-id: exit %d\n%s", r.code, r.out);
    gwrun_free(&r);
    gwrun_run(&r, NULL, (const char *[]){"-n", "1", "--rdzv-id", "job7", "--standalone", "--rdzv-endpoint",
                                         "10.9.9.9:29400", "sh", "-c", "echo id=$TORCHELASTIC_RUN_ID $MASTER_ADDR",
                                         NULL});
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] id=job7 127.0.0.1") &&
                      strstr(r.err, "--standalone runs on this machine alone: 10.9.9.9:29400 is not used"),
                  "--rdzv-id with --standalone: exit %d\n%s\n%s", r.code, r.out, r.err);
    gwrun_free(&r);
    /* --role names ROLE_NAME ("default" without); --monitor-interval and
     * --start-method are taken, checked */
    const char *no_role[] = {"ROLE_NAME=outer", NULL};
    gwrun_run(&r, no_role, (const char *[]){"-n", "1", "sh", "-c", "echo $ROLE_NAME", NULL});
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] default"), "no --role: exit %d\n%s", r.code, r.out);
    gwrun_free(&r);
    gwrun_run(&r, NULL, (const char *[]){"-n", "1", "--role", "trainer", "--monitor-interval", "0.1",
                                         "--start-method", "spawn", "sh", "-c", "echo $ROLE_NAME", NULL});
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] trainer"), "--role: exit %d\n%s\n%.800s", r.code, r.out,
                  r.err);
    gwrun_free(&r);
    /* torchrun's --log-line-prefix-template (Template.safe_substitute: ${x} or
     * $x, $$, unknown names and a lone $ as written), cut at 127 bytes */
    gwrun_run(&r, NULL, (const char *[]){"-n", "2", "--role", "trn", "--log-line-prefix-template",
                                         "${role_name}/$rank:${local_rank}|$$ ${nope} $", "sh", "-c", "echo hi", NULL});
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "trn/1:1|$ ${nope} $hi"), "template: exit %d\n%s", r.code,
                  r.out);
    gwrun_free(&r);
    char longer[300];
    memset(longer, 'x', 299), longer[299] = '\0';
    gwrun_run(&r, NULL, (const char *[]){"-n", "1", "--log-line-prefix-template", longer, "sh", "-c", "echo hi", NULL});
    ck_assert_msg(r.code == 0 && gwrun_count_lines(r.out) == 1 && strlen(r.out) == 127 + 3 &&
                      !strncmp(r.out + 127, "hi\n", 3) &&
                      strstr(r.err, "--log-line-prefix-template makes prefixes longer than 127 bytes; they are cut"),
                  "a long template (cut, and said so): exit %d\n%.400s\n%s", r.code, r.out, r.err);
    gwrun_free(&r);
    /* one that fits rank 0's prefix but not rank 10's: said too */
    char fits0[200];
    memset(fits0, 'x', 126), strcpy(fits0 + 126, "${rank}"); /* 127 bytes for ranks 0-9 */
    gwrun_run(&r, NULL, (const char *[]){"-n", "11", "--log-line-prefix-template", fits0, "sh", "-c", "true", NULL});
    ck_assert_msg(r.code == 0 && strstr(r.err, "--log-line-prefix-template makes prefixes longer than 127 bytes"),
                  "cut for rank 10 only: exit %d\n%s", r.code, r.err);
    gwrun_free(&r);
    const char *a3[] = {"-n", "1", "--master-addr", "10.1.2.3", "sh", "-c", "echo $GW_MASTER_PORT", NULL};
    gwrun_run(&r, NULL, a3);
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] 29500"), "torchrun's default port: exit %d\n%s",
                  r.code, r.out);
    gwrun_free(&r);
    cpu_set_t aff;
    ck_assert_int_eq(sched_getaffinity(0, sizeof aff, &aff), 0);
    const char *a4[] = {"-n", "cpu", "sh", "-c", "echo $WORLD_SIZE", NULL};
    gwrun_run(&r, NULL, a4);
    char want[32];
    snprintf(want, sizeof want, "[0] %d", CPU_COUNT(&aff));
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, want), "-n cpu: exit %d, stdout:\n%s", r.code, r.out);
    gwrun_free(&r);
    /* the GPUs CUDA_VISIBLE_DEVICES leaves, as torch.cuda.device_count():
     * its entries up to the first that is not an ordinal, or past the
     * driver's GPUs where it lists some; none refused */
    int raw = 0; /* the GPUs the driver lists (0: no driver, nothing to cut by) */
    DIR *gd = opendir("/proc/driver/nvidia/gpus");
    for (struct dirent *e; gd && (e = readdir(gd));)
        raw += e->d_name[0] != '.';
    if (gd)
        closedir(gd);
    const int of025 = raw == 0 || raw > 5 ? 3 : raw > 2 ? 2 : 1;
    char want3[32];
    snprintf(want3, sizeof want3, "[%d] %d", of025 - 1, of025);
    const char *three[] = {"CUDA_VISIBLE_DEVICES=0,2,5", NULL}, *none[] = {"CUDA_VISIBLE_DEVICES=-1", NULL};
    const char *a5[] = {"--nproc_per_node", "gpu", "sh", "-c", "echo $WORLD_SIZE", NULL};
    gwrun_run(&r, three, a5);
    ck_assert_msg(r.code == 0 && gwrun_count_lines(r.out) == of025 && gwrun_has_line(r.out, want3),
                  "-n gpu of 0,2,5 visible (the driver lists %d): exit %d, stdout:\n%s\nstderr:\n%s", raw, r.code,
                  r.out, r.err);
    gwrun_free(&r);
    gwrun_run(&r, none, a5);
    ck_assert_msg(r.code == 2 && strstr(r.err, "-n gpu: no GPU to use"), "-n gpu of none: exit %d\n%s", r.code,
                  r.err);
    gwrun_free(&r);
    /* an empty entry ends the list (one GPU, where three ranks started); a
     * repeated one leaves none (torch's empty set), said */
    const char *gap[] = {"CUDA_VISIBLE_DEVICES=0,,1", NULL}, *twice[] = {"CUDA_VISIBLE_DEVICES=0,0", NULL};
    gwrun_run(&r, gap, a5);
    ck_assert_msg(r.code == 0 && gwrun_count_lines(r.out) == 1 && gwrun_has_line(r.out, "[0] 1"),
                  "-n gpu of '0,,1': exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    gwrun_free(&r);
    gwrun_run(&r, twice, a5);
    ck_assert_msg(r.code == 2 && strstr(r.err, "-n gpu: no GPU to use: CUDA_VISIBLE_DEVICES='0,0' leaves none, as "
                                                "torch reads it"),
                  "-n gpu of '0,0': exit %d\n%.600s", r.code, r.err);
    gwrun_free(&r);
    static const char *const refused[][8] = {
        {"-n", "1", "--master", "h:1", "--master-port", "2", "true", NULL},
        {"-n", "1", "--standalone", "--nnodes", "2", "--master", "h:1", NULL},
        {"-n", "some", "true", NULL},
        {"-n", "1", "--start-method", "thread", "true", NULL},
        {"-n", "1", "--monitor-interval", "0", "true", NULL},
        {"-n", "1", "--role", "", "true", NULL},
    };
    static const char *const why[] = {"give one of --master", "--standalone is a job of one node",
                                      "or gpu, cpu or auto, not 'some'", "spawn, fork or forkserver",
                                      "--monitor-interval must be seconds above 0", "--role must name the role"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        gwrun_run(&r, NULL, refused[i]);
        ck_assert_msg(r.code == 2 && strstr(r.err, why[i]), "case %zu: exit %d, stderr:\n%s", i, r.code, r.err);
        gwrun_free(&r);
    }
}
END_TEST

/* torchrun's PROGRAM: a .py script runs as python3 -u SCRIPT (torchrun runs
 * every script so; gw-run exec'd it: not executable, not on PATH, it
 * failed), -m a module, --no-python the file as given, GW_RUN_PYTHON another
 * interpreter; --no-python with -m, and --run-path, refused. */
START_TEST(test_env_python_program)
{
    if (system("command -v python3 >/dev/null") != 0) {
        printf("test_env_python_program: no python3 here: not run\n");
        return;
    }
    char dir[] = "/tmp/gwrun-py-XXXXXX", path[96], pypath[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/pkg", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    static const struct { const char *name, *text; mode_t mode; } files[] = {
        {"s.py", "import os, sys\nprint('py', os.environ['RANK'], sys.argv[1:], sys.stdout.write_through)\n", 0644},
        {"pkg/__init__.py", "", 0644},
        {"pkg/__main__.py", "import os\nprint('module', os.environ['LOCAL_RANK'])\n", 0644},
        {"direct.py", "#!/bin/sh\necho direct $RANK\n", 0755},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
        FILE *f = fopen(path, "w");
        ck_assert_msg(f && fputs(files[i].text, f) >= 0 && fclose(f) == 0 && chmod(path, files[i].mode) == 0,
                      "cannot write %s", path);
    }
    struct run r;
    snprintf(path, sizeof path, "%s/s.py", dir);
    const char *buffered[] = {"PYTHONUNBUFFERED", NULL}; /* so write_through is -u's */
    gwrun_run(&r, buffered, (const char *[]){"-n", "2", path, "--lr", "0.1", NULL});
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[1] py 1 ['--lr', '0.1'] True"),
                  "a .py script: exit %d, stdout:\n%s\nstderr:\n%.800s", r.code, r.out, r.err);
    gwrun_free(&r);
    const char *env_py[] = {"GW_RUN_PYTHON=/bin/echo", NULL};
    gwrun_run(&r, env_py, (const char *[]){"-n", "1", path, NULL});
    char want[160];
    snprintf(want, sizeof want, "[0] -u %s", path);
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, want), "GW_RUN_PYTHON: exit %d, stdout:\n%s", r.code, r.out);
    gwrun_free(&r);
    snprintf(pypath, sizeof pypath, "PYTHONPATH=%s", dir);
    const char *env_mod[] = {pypath, NULL};
    gwrun_run(&r, env_mod, (const char *[]){"-n", "2", "-m", "pkg", NULL});
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[1] module 1"), "-m: exit %d, stdout:\n%s\nstderr:\n%.800s",
                  r.code, r.out, r.err);
    gwrun_free(&r);
    snprintf(path, sizeof path, "%s/direct.py", dir);
    gwrun_run(&r, NULL, (const char *[]){"-n", "1", "--no-python", path, NULL});
    ck_assert_msg(r.code == 0 && gwrun_has_line(r.out, "[0] direct 0"), "--no-python: exit %d, stdout:\n%s\n%.800s",
                  r.code, r.out, r.err);
    gwrun_free(&r);
    gwrun_run(&r, NULL, (const char *[]){"-n", "1", "--no-python", "-m", "pkg", NULL});
    ck_assert_msg(r.code == 2 && strstr(r.err, "exclude each other"), "exit %d:\n%.800s", r.code, r.err);
    gwrun_free(&r);
    gwrun_run(&r, NULL, (const char *[]){"-n", "1", "--run-path", path, NULL});
    ck_assert_msg(r.code == 2 && strstr(r.err, "--run-path runs the script inside"), "exit %d:\n%.800s", r.code, r.err);
    gwrun_free(&r);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

void gwrun_add_env_tests(TCase *tc)
{
    tcase_add_test(tc, test_env_python_program);
    tcase_add_test(tc, test_env_generated);
    tcase_add_test(tc, test_env_passthrough);
    tcase_add_test(tc, test_env_omp_affinity);
    tcase_add_test(tc, test_env_master_and_multinode);
    tcase_add_test(tc, test_env_torchrun_names);
}
