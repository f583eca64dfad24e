/* gw-run-setup.c - what gw-run prepares before it spawns a job (out of
 * gw-run.c, which was past 900 lines): the ranks' shared environment in
 * torchrun's names, free ports, the job token and its per-attempt form,
 * -n by kind (gpu, cpu, auto); whether --master names a loopback is
 * comm/netname.c's, shared with the library.  Also the shared memory that
 * ranks which died during their setup left (removed before the next
 * attempt and at the end; out of gw-run-teardown.c, past 900 lines). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <signal.h>
#include <sys/stat.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "decimal.h"
#include "gw-run.h"

/* Binding port 0 lets the kernel pick a free port. It is released again before
 * rank 0 binds it, so another process could take it in between; torchrun
 * accepts the same small race, and a clash shows up as a clear bind error. */
int gw__run_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* What every rank of the job shares, under gradwire's names (GW_*) and
 * torchrun's beside them, from the same values so the two never drift: a
 * program written for torchrun (init_process_group("env://"), LOCAL_RANK for
 * the device, TORCHELASTIC_RESTART_COUNT) runs under gw-run unchanged.
 * torchrun's MASTER_PORT is the port of rank 0's TCPStore, not gradwire's
 * rendezvous (GW_MASTER_PORT), so that a program using both binds two ports:
 * on one node another free port, across nodes the --master port + 2 (+ 3 where
 * the launcher port is + 2), or none past 65535.  Set again at each restart
 * (a fresh token, and on one node fresh ports). */
void gw__run_setenv_long(const char *a, const char *b, const char *c, long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    for (const char *const *name = (const char *const[]){a, b, c, NULL}; *name; name++)
        setenv(*name, buf, 1);
}

void gw__run_job_env(long world, long local_n, long nnodes, long node_rank, const char *host, long port,
                     long lport, bool multi, const char *token)
{
    char buf[32];
    gw__run_setenv_long("GW_WORLD_SIZE", "WORLD_SIZE", "ROLE_WORLD_SIZE", world);
    gw__run_setenv_long("GW_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", NULL, local_n);
    gw__run_setenv_long("GW_NNODES", "GROUP_WORLD_SIZE", NULL, nnodes);
    gw__run_setenv_long("GW_NODE_RANK", "GROUP_RANK", NULL, node_rank);
    gw__run_setenv_long("GW_MASTER_PORT", NULL, NULL, port);
    setenv("GW_MASTER_ADDR", host, 1);
    setenv("MASTER_ADDR", host, 1);
    setenv("GW_JOB_TOKEN", token, 1);
    long store = -1;
    if (!multi) {
        for (int tries = 0; tries < 8 && (store < 0 || store == port); tries++)
            store = gw__run_free_port();
    } else {
        store = port + 2 != lport ? port + 2 : port + 3; /* the same on every node: from flags they share */
        if (store > 65535)
            store = -1;
    }
    if (store > 0 && store != port) {
        snprintf(buf, sizeof buf, "%ld", store);
        setenv("MASTER_PORT", buf, 1);
    } else {
        unsetenv("MASTER_PORT");
        static bool said; /* once, not at each restart */
        if (multi && !said)
            gw__run_say("gw-run: note: no MASTER_PORT for the ranks (torch.distributed's store takes the master port "
                        "+ 2 or 3 across nodes, past 65535 here): give a lower --master-port if they use one\n");
        said = true;
    }
    /* not torchrun's agent store, which would move gradwire's port; nor an
     * outer torchrun's worker's error file (gw-run started inside one), which
     * would make every rank of this job that worker (each rank gets its own
     * in gw-run's folder: gw__run_cause_env).  The run id is this
     * job's (torch.distributed.is_torchelastic_launched() asks for it; the
     * job token stays GW_JOB_TOKEN). */
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    setenv("TORCHELASTIC_RUN_ID", gw__run.run_id && *gw__run.run_id ? gw__run.run_id : "none", 1);
    unsetenv("TORCHELASTIC_ERROR_FILE");
}

/* The GPUs this job may use, as torch.cuda.device_count() counts them
 * (torch.cuda._parse_visible_devices): without CUDA_VISIBLE_DEVICES those
 * the NVIDIA driver lists (no CUDA needed); with it, its entries up to the
 * first that is not an ordinal (an empty one, a word, a negative number:
 * "0,,1" is 1 GPU, "-1" none) or, where the driver lists GPUs, names none of
 * them (an ordinal past its count), and none at all when an entry repeats
 * ("0,0": torch's empty set); GPU-/MIG- UUIDs while they keep that prefix.
 * Counting every comma-separated entry started more ranks than torch saw
 * GPUs. */
static long visible_gpus(void)
{
    long raw = 0;
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    for (struct dirent *e; d && (e = readdir(d));)
        raw += e->d_name[0] != '.';
    if (d)
        closedir(d);
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v)
        return raw;
    const bool uuids = !strncmp(v, "GPU-", 4) || !strncmp(v, "MIG-", 4);
    enum { MAX_SEEN = 1024 };
    static char seen[MAX_SEEN][64]; /* the entries so far, for repeats */
    long n = 0;
    for (const char *p = v; *p && n < MAX_SEEN; p += *p == ',') {
        const size_t len = strcspn(p, ",");
        size_t b = 0, e = len; /* torch strips each entry */
        while (b < e && isspace((unsigned char)p[b]))
            b++;
        while (e > b && isspace((unsigned char)p[e - 1]))
            e--;
        char entry[64];
        snprintf(entry, sizeof entry, "%.*s", (int)(e - b), p + b);
        p += len;
        if (uuids) {
            if (strncmp(entry, v, 4) != 0)
                break;
        } else {
            /* the ordinal the entry starts with (a sign, then digits), as torch's _strtoul */
            const size_t sign = entry[0] == '+' || entry[0] == '-';
            size_t k = sign;
            while (isdigit((unsigned char)entry[k]))
                k++;
            const long ord = k > sign ? strtol(entry, NULL, 10) : -1;
            if (ord < 0 || (raw > 0 && ord >= raw))
                break;
            snprintf(entry, sizeof entry, "%ld", ord);
        }
        for (long i = 0; i < n; i++)
            if (!strcmp(seen[i], entry))
                return 0;
        snprintf(seen[n++], sizeof seen[0], "%s", entry);
    }
    return n;
}

/* torchrun's -n gpu | cpu | auto: the GPUs this job may use, the cores this
 * process may use, or GPUs where there are some.  1 with *n, 0 when kind is
 * none of these, -1 for gpu without one. */
int gw__run_ranks_by_kind(const char *kind, long *n)
{
    const long gpus = visible_gpus();
    cpu_set_t aff;
    const long cores = sched_getaffinity(0, sizeof aff, &aff) == 0 ? CPU_COUNT(&aff) : sysconf(_SC_NPROCESSORS_ONLN);
    if (!strcmp(kind, "gpu") && gpus > 0)
        *n = gpus;
    else if (!strcmp(kind, "cpu") || (!strcmp(kind, "auto") && gpus == 0))
        *n = cores;
    else if (!strcmp(kind, "auto"))
        *n = gpus;
    else if (!strcmp(kind, "gpu"))
        return -1;
    else
        return 0;
    *n = *n < 1 ? 1 : *n > GW_RUN_MAX_LOCAL_RANKS ? GW_RUN_MAX_LOCAL_RANKS : *n;
    return 1;
}

bool gw__run_make_token(char out[33])
{
    unsigned char raw[16];
    if (!gw__run_random(raw, sizeof raw))
        return false;
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return true;
}

/* The job token of attempt k: TOKEN.restartK, within the library's 128
 * characters (a token that fit at the first start must not make every
 * restart fail at init): a longer one keeps its start and a hash of the
 * whole instead, the same on every node. */
void gw__run_attempt_token(const char *token, long k, char *out, size_t cap)
{
    if (snprintf(out, cap, "%s.restart%ld", token, k) <= GW_RUN_TOKEN_MAX)
        return;
    char tail[64];
    int t = snprintf(tail, sizeof tail, ".%016llx.restart%ld", (unsigned long long)gw__run_fnv1a(token), k);
    snprintf(out, cap, "%.*s%s", GW_RUN_TOKEN_MAX - t, token, tail);
}

/* Seconds from the environment variable name (at most 86400, 0 allowed where
 * zero_ok), else dflt; a bad value is said and ignored. */
double gw__run_env_seconds(const char *name, double dflt, bool zero_ok)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    const double x = strtod(v, &end);
    if (*end != '\0' || !gw_decimal_text(v) || !isfinite(x) || x < 0 || (x == 0 && !zero_ok) || x > 86400) {
        gw__run_say("gw-run: ignoring %s='%s' (want seconds, %s86400)\n", name, v,
                    zero_ok ? "0.." : "above 0, at most ");
        return dflt;
    }
    return x;
}

/* FNV-1a 64 of a string: the library's job hash (comm/core.h's gw__fnv, which
 * gw-run, linking nothing of the library, does not include). */
uint64_t gw__run_fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

/* Removes the shared-memory segments (/dev/shm/gw-HASH-PEER-SELF-PID-...) that
 * ranks of this job left behind: the library unlinks each one once both of its
 * ends have opened it (and its liveness files, gw-HASH-RANK-RANK-PID-live-...,
 * at the end of the rendezvous), so only a rank that died during its setup leaves one,
 * and nothing else ever would remove it (it holds memory until reboot).  Only
 * names of this job's token (HASH: the low 32 bits of its FNV-1a 64, as the
 * library makes them) created by one of the ranks gw-run started (PID). */
void gw__run_remove_leftover_shm(const char *token)
{
    const uint64_t h = gw__run_fnv1a(token);
    char prefix[16];
    snprintf(prefix, sizeof prefix, "gw-%08llx-", (unsigned long long)(h & 0xffffffffu));
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct stat nsst;
    const uint64_t own_pidns = stat("/proc/self/ns/pid", &nsst) == 0 ? (uint64_t)nsst.st_ino : 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int peer, self, pid;
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 ||
            sscanf(e->d_name + strlen(prefix), "%d-%d-%d-", &peer, &self, &pid) != 3)
            continue;
        /* A rank's own, or one whose creator is gone: a rank started through a
         * wrapper (a script that runs python without exec) creates them in a
         * process that is not gw-run's child.  The name ends with the
         * creator's pid namespace: a pid from another one (a container
         * sharing /dev/shm) says nothing here, not even one gw-run started
         * (another job of the same token there had its live segment taken). */
        const char *dash = strrchr(e->d_name, '-');
        char *end = NULL;
        const unsigned long long ns = dash ? strtoull(dash + 1, &end, 10) : 0;
        const bool named = ns && end && !*end, here = named && ns == (unsigned long long)own_pidns;
        const bool ours = gw__run_started_pid((pid_t)pid) && (here || !named || !own_pidns);
        if (!ours && (!here || pid <= 0 || kill((pid_t)pid, 0) == 0 || errno != ESRCH))
            continue;
        char path[300];
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        removed += unlink(path) == 0;
    }
    closedir(d);
    if (removed)
        gw__run_say("gw-run: removed %d shared-memory segment%s that ranks which died during setup left in "
                    "/dev/shm\n", removed, removed == 1 ? "" : "s");
}
