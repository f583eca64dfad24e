/*
 * gw-run-args.c: gw-run's command line (out of gw-run.c, which was past 900
 * lines): the help text, the usage error, strict numbers and HOST:PORT, and
 * torchrun's rendezvous options as far as gw-run has them (--nnodes N:N,
 * --rdzv-backend c10d|static, --rdzv-conf join_timeout and is_host; the
 * endpoint and the id are gw-run.c's --master and job token).
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h> /* optarg */

#include "decimal.h"
#include "gw-run.h"

const char gw__run_usage_text[] =
    "usage: gw-run -n N [--nnodes M [--node-rank R] --master HOST:PORT] [--] PROGRAM [ARGS...]\n"
    "\n"
    "Starts N ranks of PROGRAM on this machine with the GW_* environment set,\n"
    "prefixes their output lines with [rank], and stops the job when a rank fails.\n"
    "With --nnodes M > 1, run one gw-run per node: node 0's gw-run listens on the\n"
    "launcher port (PORT + 1) of the master HOST, the others connect to it, and a\n"
    "rank failure, a signal or a missing node on any node stops the job everywhere.\n"
    "\n"
    "options:\n"
    "  -n, --nproc-per-node N  ranks to start on this node (1..4096), or as torchrun:\n"
    "                          gpu (one per GPU), cpu (one per core it may use),\n"
    "                          auto (gpu where there are GPUs, else cpu)\n"
    "  --nnodes M              nodes in the job (default 1); run one gw-run per node\n"
    "  --node-rank R           index of this node, 0..M-1; with --nnodes > 1 and no\n"
    "                          --node-rank, node 0 is the gw-run that can listen\n"
    "                          on the launcher port at HOST, and the others are\n"
    "                          numbered 1, 2, ... as they join it (said)\n"
    "  --master HOST:PORT      rendezvous address, [v6addr]:PORT for IPv6; required\n"
    "                          with --nnodes > 1, else 127.0.0.1 and a free port;\n"
    "                          node 0 must run on the machine HOST names\n"
    "  --master-addr A, --master-port P  torchrun's spelling of --master A:P (the\n"
    "                          address alone: port 29500, as torchrun); torch 1.x's\n"
    "                          --nproc_per_node, --node_rank, --master_addr,\n"
    "                          --master_port, --max_restarts are taken too\n"
    "  --rdzv-endpoint HOST[:PORT]  torchrun's: --master HOST:PORT (port 29400 when\n"
    "                          not given, as torchrun's c10d)\n"
    "  --rdzv-id ID            torchrun's job id: the job token when GW_JOB_TOKEN\n"
    "                          is unset (the same on every node)\n"
    "  --rdzv-backend B        c10d or static (gw-run's own rendezvous either way)\n"
    "  --rdzv-conf K=V,...     join_timeout=S (as GW_RUN_JOIN_TIMEOUT), is_host=1|0\n"
    "                          (this gw-run is node 0, or never is); others said\n"
    "                          and ignored; --nnodes N:N is N (no elastic range)\n"
    "                          (torchrun's PET_NPROC_PER_NODE, PET_NNODES, PET_NODE_RANK,\n"
    "                          PET_MASTER_ADDR, PET_MASTER_PORT, PET_RDZV_ENDPOINT, PET_RDZV_ID,\n"
    "                          PET_RDZV_BACKEND, PET_MAX_RESTARTS stand for the flags not given)\n"
    "  --standalone            one node (the default; torchrun's flag)\n"
    "  --launcher-port P       port of the launcher control channel between the\n"
    "                          gw-runs of a multi-node job (default PORT + 1),\n"
    "                          bound by node 0 on the master HOST only\n"
    "  --max-restarts K        start the job again, all N ranks, when it fails\n"
    "                          (a rank exits non-zero or is killed; not after a\n"
    "                          signal to gw-run), up to K times (default 0); the\n"
    "                          ranks see GW_RESTART_COUNT (0 on the first start)\n"
    "                          and GW_MAX_RESTARTS; every node of a multi-node\n"
    "                          job gives the same K, and all restart together\n"
    "  --log-dir DIR           also write each rank's stdout and stderr, as printed\n"
    "                          (no prefix), to DIR/RUN/attempt_K/RANK/stdout.log and\n"
    "                          stderr.log: RUN new at each start (its date, time and\n"
    "                          6 random characters; said), K the restart, RANK the\n"
    "                          global rank\n"
    "  -t, --tee S             as torchrun: the streams written to files and to the\n"
    "                          console: 0 none, 1 stdout, 2 stderr, 3 both, for\n"
    "                          every rank or as LOCAL_RANK:S,... (default 3 with\n"
    "                          --log-dir)\n"
    "  -r, --redirects S       the streams written to files only (same values);\n"
    "                          --tee or --redirects without --log-dir: a new\n"
    "                          directory under $TMPDIR (or /tmp), said at the start\n"
    "  --local-ranks-filter L  torchrun's: only these local ranks' lines reach the\n"
    "                          console (e.g. 0, or 0,3); log files keep every\n"
    "                          rank's, and a hidden rank that fails has the end of\n"
    "                          its stderr said\n"
    "  -m, --module            PROGRAM is a Python module: python3 -u -m PROGRAM\n"
    "  --no-python             run PROGRAM as given, even a .py script (otherwise\n"
    "                          a PROGRAM ending in .py runs as python3 -u PROGRAM,\n"
    "                          as under torchrun; GW_RUN_PYTHON, else torchrun's\n"
    "                          PYTHON_EXEC, names another interpreter)\n"
    "  --role NAME             torchrun's: the ranks' ROLE_NAME (default: default)\n"
    "  --log-line-prefix-template T  torchrun's: each console line's prefix, with\n"
    "                          ${rank}, ${local_rank} and ${role_name} put in\n"
    "                          (default \"[${rank}] \")\n"
    "  --monitor-interval S, --start-method spawn|fork|forkserver  torchrun's,\n"
    "                          checked and otherwise unused: gw-run sees a rank\n"
    "                          exit at once, and every rank is a fresh process\n"
    "  -h, --help              show this help\n"
    "\n"
    "Each rank gets GW_RANK, GW_LOCAL_RANK, GW_WORLD_SIZE, ... and torchrun's RANK,\n"
    "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT\n"
    "(its TCPStore's: not gradwire's port), TORCHELASTIC_RESTART_COUNT, ...\n"
    "and GW_ERROR_FILE, where libgradwire records the rank's first failure (and a\n"
    "program its own: gw_record_failure): a failed job then names the rank the\n"
    "failure began at when that is not the one that failed first.\n"
    "\n"
    "environment:\n"
    "  GW_JOB_TOKEN       shared secret of the job, at most 128 characters; generated\n"
    "                     if unset, but must be set (to the same value on every\n"
    "                     node) with --nnodes > 1 unless --rdzv-id gives one\n"
    "  OMP_NUM_THREADS    passed through if set, else the cores gw-run may run on\n"
    "                     (its CPU affinity) / N (at least 1)\n"
    "  GW_RUN_KILL_GRACE  seconds between SIGTERM and SIGKILL at teardown (default 5)\n"
    "  GW_RUN_JOIN_TIMEOUT seconds for every node's gw-run to join node 0's\n"
    "                     (default 120); a node still missing then fails the job\n"
    "  GW_RUN_HEARTBEAT_TIMEOUT seconds a joined node's gw-run may be silent (stopped,\n"
    "                     hung) before the job fails naming it (default 60; 0: never)\n";

/* The values gw__run_pet_argv made flags of, and their variables: a usage
 * error about one names the variable, not only a flag the user never typed. */
static const char *pet_given_value[16], *pet_given_var[16], *pet_given_flag[16];
static int pet_given;

const char *gw__run_pet_note(const char *flag, char *buf, size_t cap)
{
    buf[0] = '\0';
    for (int i = 0; i < pet_given; i++)
        if (!strcmp(flag, pet_given_flag[i]))
            snprintf(buf, cap, " (%s from %s in the environment, torchrun's variable for it)", flag,
                     pet_given_var[i]);
    return buf;
}

void gw__run_usage_error(const char *fmt, const char *arg)
{
    char msg[2048];
    snprintf(msg, sizeof msg, fmt, arg);
    gw__run_usage_error_for(msg, arg);
}

void gw__run_usage_error_for(const char *msg, const char *arg)
{
    fprintf(stderr, "gw-run: %s", msg);
    /* getopt's optarg is the very string: the value passed (arg), or the
     * option being parsed when the message names its flag (a parser's
     * message passed whole) */
    for (int i = 0; i < pet_given; i++)
        if (arg == pet_given_value[i] || (optarg == pet_given_value[i] && strstr(msg, pet_given_flag[i])))
            fprintf(stderr, " (from %s in the environment, torchrun's variable for it)", pet_given_var[i]);
    fputs("\n\n", stderr);
    fputs(gw__run_usage_text, stderr);
    exit(2);
}

/* Strict decimal parse: the whole string must be a number within [lo, hi]. */
bool gw__run_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || !gw_decimal_text(s) || errno != 0 || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* HOST:PORT or [v6addr]:PORT. A bare IPv6 address is refused because its
 * last colon cannot be told apart from the port separator. */
bool gw__run_parse_master(const char *s, char *host, size_t hostsz, long *port)
{
    const char *h, *colon;
    size_t hl;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return false;
        h = s + 1;
        hl = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || memchr(s, ':', (size_t)(colon - s)))
            return false;
        h = s;
        hl = (size_t)(colon - s);
    }
    if (hl == 0 || hl >= hostsz || memchr(h, '[', hl) || memchr(h, ']', hl) ||
        !gw__run_parse_long(colon + 1, 1, 65535, port))
        return false;
    memcpy(host, h, hl);
    host[hl] = '\0';
    return true;
}

/* ---- torchrun's rendezvous options, as far as gw-run has them ---- */

bool gw__run_parse_nnodes(const char *v, long *out, char *err, size_t errsz)
{
    char *end;
    errno = 0;
    const long lo = strtol(v, &end, 10);
    long hi = lo;
    if (*end == ':' && end > v) {
        const char *h = end + 1;
        hi = strtol(h, &end, 10);
        if (end == h)
            hi = -1;
    }
    if (errno || *end || end == v || lo < 1 || lo > 65536 || hi < 1 || hi > 65536) {
        snprintf(err, errsz, "--nnodes must be a number from 1 to 65536 (or N:N), not '%s'", v);
        return false;
    }
    if (hi != lo) {
        snprintf(err, errsz, "--nnodes %s: gw-run has no elastic membership (torchrun's MIN:MAX); every node "
                 "of the job must come: give one number, or MIN:MAX with MIN = MAX", v);
        return false;
    }
    *out = lo;
    return true;
}

bool gw__run_check_rdzv_backend(const char *v, char *err, size_t errsz)
{
    if (strcmp(v, "c10d") == 0 || strcmp(v, "static") == 0)
        return true;
    snprintf(err, errsz, "--rdzv-backend %s: gw-run has its own rendezvous, as torchrun's c10d or static (both "
             "taken): node 0's gw-run at --rdzv-endpoint HOST:PORT%s", v,
             strncmp(v, "etcd", 4) == 0 ? "; there is no etcd backend" : "");
    return false;
}

/* "yes"-like 1, "no"-like 0, else -1 (torchrun's is_host spellings). */
static int conf_bool(const char *v)
{
    static const char *const yes[] = {"1", "true", "t", "yes", "y"}, *const no[] = {"0", "false", "f", "no", "n"};
    for (int i = 0; i < 5; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return 1;
        if (strcasecmp(v, no[i]) == 0)
            return 0;
    }
    return -1;
}

char **gw__run_pet_argv(const char given[128], int *argc, char **argv)
{
    static const struct { const char *var, *flag; char code; bool master; } pet[] = {
        {"PET_NPROC_PER_NODE", "--nproc-per-node", 'n', false}, {"PET_NNODES", "--nnodes", 'N', false},
        {"PET_NODE_RANK", "--node-rank", 'K', false},          {"PET_MAX_RESTARTS", "--max-restarts", 'R', false},
        {"PET_RDZV_ID", "--rdzv-id", 'I', false},              {"PET_RDZV_BACKEND", "--rdzv-backend", 'B', false},
        {"PET_MASTER_ADDR", "--master-addr", 'A', true},       {"PET_MASTER_PORT", "--master-port", 'P', true},
        {"PET_RDZV_ENDPOINT", "--rdzv-endpoint", 'E', true},
    };
    const size_t np = sizeof pet / sizeof pet[0];
    const bool master_given = given['A'] || given['P'] || given['E'] || given['O'] || given['S'];
    static char **out; /* kept to the end (LeakSanitizer sees it held) */
    out = calloc((size_t)*argc + 2 * np + 1, sizeof *out);
    if (!out)
        return argv;
    int k = 0;
    out[k++] = argv[0];
    for (size_t i = 0; i < np; i++) {
        const char *v = getenv(pet[i].var);
        if (!v || !*v || given[(unsigned char)pet[i].code] || (pet[i].master && master_given))
            continue;
        /* an endpoint beside an address from the same environment: the endpoint, as torchrun's c10d */
        if (pet[i].master && pet[i].code != 'E' && getenv("PET_RDZV_ENDPOINT") && *getenv("PET_RDZV_ENDPOINT"))
            continue;
        out[k++] = (char *)pet[i].flag;
        out[k++] = (char *)v;
        if (pet_given < (int)(sizeof pet_given_var / sizeof pet_given_var[0]))
            pet_given_value[pet_given] = v, pet_given_flag[pet_given] = pet[i].flag,
            pet_given_var[pet_given++] = pet[i].var;
    }
    if (k == 1)
        return argv;
    for (int i = 1; i <= *argc; i++) /* argv[argc] is NULL */
        out[k + i - 1] = argv[i];
    *argc += k - 1;
    return out;
}

const char *gw__run_standalone(bool standalone, long nnodes, const char *master)
{
    if (!standalone)
        return master;
    if (nnodes > 1)
        gw__run_usage_error("%s--standalone is a job of one node; --nnodes is more", "");
    if (master)
        gw__run_say("gw-run: note: --standalone runs on this machine alone: %s is not used (as torchrun)\n", master);
    return NULL;
}

bool gw__run_parse_rdzv_conf(const char *v, double *join_timeout_s, int *is_host, char *err, size_t errsz)
{
    char buf[1024];
    if (strlen(v) >= sizeof buf) {
        snprintf(err, errsz, "--rdzv-conf is longer than %zu characters", sizeof buf - 1);
        return false;
    }
    snprintf(buf, sizeof buf, "%s", v);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq || eq == kv) {
            snprintf(err, errsz, "--rdzv-conf wants KEY=VALUE,... (torchrun's), not '%s'", kv);
            return false;
        }
        *eq = '\0';
        const char *val = eq + 1;
        if (strcmp(kv, "join_timeout") == 0) {
            char *end;
            const double x = strtod(val, &end);
            if (*end || end == val || !gw_decimal_text(val) || !isfinite(x) || x <= 0 || x > 86400) {
                snprintf(err, errsz, "--rdzv-conf join_timeout must be seconds above 0, at most 86400, not '%s'",
                         val);
                return false;
            }
            *join_timeout_s = x;
        } else if (strcmp(kv, "is_host") == 0) {
            if ((*is_host = conf_bool(val)) < 0) {
                snprintf(err, errsz, "--rdzv-conf is_host must be true or false (1 or 0), not '%s'", val);
                return false;
            }
        } else {
            gw__run_say("gw-run: ignoring --rdzv-conf %s=%s (gw-run takes join_timeout and is_host)\n", kv, val);
        }
    }
    return true;
}

char **gw__run_program_argv(char **argv, int mode)
{
    size_t n = 0;
    while (argv[n])
        n++;
    const size_t len = strlen(argv[0]);
    if (mode == GW_RUN_PROG_DIRECT || (mode == GW_RUN_PROG_AUTO && (len < 3 || strcmp(argv[0] + len - 3, ".py") != 0)))
        return argv;
    /* torchrun's: the interpreter, unbuffered (each line reaches gw-run as it
     * is printed), then the script or -m and the module */
    char **out = calloc(n + 4, sizeof *out);
    if (!out)
        return NULL;
    const char *py = getenv("GW_RUN_PYTHON"), *torchrun_py = getenv("PYTHON_EXEC");
    size_t k = 0;
    out[k++] = (char *)(py && *py ? py : torchrun_py && *torchrun_py ? torchrun_py : "python3");
    out[k++] = "-u";
    if (mode == GW_RUN_PROG_MODULE)
        out[k++] = "-m";
    for (size_t i = 0; i <= n; i++)
        out[k++] = argv[i];
    return out;
}

bool gw__run_parse_ranks_filter(const char *v, int local_n, bool *shown, char *err, size_t errsz)
{
    memset(shown, !*v, (size_t)local_n * sizeof *shown); /* '': torchrun's default, every rank */
    if (!*v)
        return true;
    const char *p = v;
    int named = 0;
    for (;;) {
        char *end;
        errno = 0;
        const long r = strtol(p, &end, 10);
        if (end == p || errno || r < 0 || (*end && *end != ',')) {
            snprintf(err, errsz, "--local-ranks-filter must be local ranks separated by commas (torchrun's, "
                     "e.g. 0 or 0,3), not '%s'", v);
            return false;
        }
        if (r < local_n) /* ranks past -n show nothing, as torchrun's */
            shown[r] = true;
        named++;
        if (!*end)
            break;
        p = end + 1;
    }
    return named > 0;
}

bool gw__run_check_ignored(const char *flag, const char *v, char *err, size_t errsz)
{
    if (strcmp(flag, "--start-method") == 0) {
        if (strcmp(v, "spawn") == 0 || strcmp(v, "fork") == 0 || strcmp(v, "forkserver") == 0)
            return true;
        snprintf(err, errsz, "--start-method must be spawn, fork or forkserver (torchrun's), not '%s'", v);
        return false;
    }
    char *end;
    const double s = strtod(v, &end);
    if (end != v && !*end && gw_decimal_text(v) && isfinite(s) && s > 0)
        return true;
    snprintf(err, errsz, "%s must be seconds above 0, not '%s'", flag, v);
    return false;
}

bool gw__run_format_prefix(const char *tmpl, const char *role, int rank, int local, char *out, size_t cap)
{
    if (!tmpl) {
        snprintf(out, cap, "[%d] ", rank);
        return false;
    }
    /* Python's Template.safe_substitute: ${name} or $name, $$ for $, the
     * rest (an unknown name, a lone $) as written */
    size_t o = 0;
    const char *p = tmpl;
    for (; *p && o + 1 < cap;) {
        char val[32] = "";
        const char *v = NULL;
        size_t skip = 0;
        if (p[0] == '$' && p[1] == '$') {
            v = "$", skip = 2;
        } else if (p[0] == '$') {
            static const char *const names[] = {"role_name", "rank", "local_rank"};
            for (int i = 0; i < 3 && !v; i++) {
                const size_t nl = strlen(names[i]);
                const bool braced = p[1] == '{' && strncmp(p + 2, names[i], nl) == 0 && p[2 + nl] == '}';
                const bool bare = strncmp(p + 1, names[i], nl) == 0 &&
                                  !(p[1 + nl] == '_' || (p[1 + nl] >= 'a' && p[1 + nl] <= 'z') ||
                                    (p[1 + nl] >= 'A' && p[1 + nl] <= 'Z') || (p[1 + nl] >= '0' && p[1 + nl] <= '9'));
                if (braced || bare) {
                    if (i == 0)
                        v = role;
                    else
                        snprintf(val, sizeof val, "%d", i == 1 ? rank : local), v = val;
                    skip = braced ? nl + 3 : nl + 1;
                }
            }
        }
        if (!v) {
            out[o++] = *p++;
            continue;
        }
        const size_t n = (size_t)snprintf(out + o, cap - o, "%s", v);
        if (o + n >= cap) {
            out[cap - 1] = '\0';
            return true;
        }
        o += n;
        p += skip;
    }
    out[o] = '\0';
    return *p != '\0'; /* the template not all used: cut */
}
