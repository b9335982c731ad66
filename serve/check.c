/*
 * shmipc-serve's worker command and --check (options.h, docs/serve.md "Configuration"): the
 * argv template each kind of application runs under the supervisor, and every option checked
 * against the system (the directory, the interpreter, the listen address, the access log, APP
 * imported) without starting anything. The options themselves are parsed in options.c.
 */
#include "options.h"
#include "options_int.h"

#include "shmipc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

void shmipc__serve_argv_free(char **argv)
{
    if (argv == NULL)
        return;
    for (size_t i = 0; argv[i] != NULL; i++)
        free(argv[i]);
    free(argv);
}

/* Lua and C apps run in shmipc-serve-worker (serve/worker.c), installed beside this program. */
static int native_kind(int kind)
{
    return kind == SHMIPC__SERVE_LUA || kind == SHMIPC__SERVE_C;
}

static int worker_program(char *buf, size_t len, char *err, size_t errlen)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        shmipc__serve_set_err(err, errlen, "cannot find this program's directory: %s",
                              strerror(errno));
        return SHMIPC_EINVAL;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL)
        *slash = '\0';
    if ((size_t)snprintf(buf, len, "%s/shmipc-serve-worker", self) >= len) {
        shmipc__serve_set_err(err, errlen, "the directory of this program is too long");
        return SHMIPC_EINVAL;
    }
    return 0;
}

int shmipc__serve_worker_argv(const shmipc__serve_options *o, char ***argvp, char *err,
                              size_t errlen)
{
    if (argvp != NULL)
        *argvp = NULL;
    if (o == NULL || argvp == NULL || o->app == NULL || o->python == NULL) {
        shmipc__serve_set_err(err, errlen, "no options or no application");
        return SHMIPC_EINVAL;
    }
    char maxreq[32], ppid[32], prog[PATH_MAX];
    snprintf(maxreq, sizeof maxreq, "%llu", (unsigned long long)o->max_requests);
    /* The worker ends itself when this process dies, even by SIGKILL (worker.py). */
    snprintf(ppid, sizeof ppid, "%ld", (long)getpid());
    const char *t[16] = {o->python,   "-m",        "shmipc.serve.worker", o->app,
                         "--address", "{address}", "--parent-pid",        ppid};
    size_t n = 8;
    if (native_kind(o->kind)) {
        int rc = worker_program(prog, sizeof prog, err, errlen);
        if (rc < 0)
            return rc;
        const char *nt[] = {prog,        o->kind == SHMIPC__SERVE_C ? "--c" : "--lua",
                            o->app,      "--address",
                            "{address}", "--parent-pid",
                            ppid};
        n = sizeof nt / sizeof nt[0];
        memcpy(t, nt, sizeof nt);
    }
    char conc[16];
    snprintf(conc, sizeof conc, "%u",
             o->concurrency ? o->concurrency : SHMIPC__SERVE_DEFAULT_CONCURRENCY);
    if (o->kind == SHMIPC__SERVE_ASGI) {
        t[n++] = "--asgi";
        t[n++] = "--concurrency";
        t[n++] = conc;
    }
    if (o->max_requests) {
        t[n++] = "--max-requests";
        t[n++] = maxreq;
    }
    char **v = calloc(n + 1, sizeof *v);
    if (v == NULL)
        return SHMIPC_ENOMEM;
    for (size_t i = 0; i < n; i++)
        if ((v[i] = strdup(t[i])) == NULL) {
            shmipc__serve_argv_free(v);
            return SHMIPC_ENOMEM;
        }
    *argvp = v;
    return 0;
}

/* ---- --check ------------------------------------------------------------------------------ */

/*
 * The program as the workers' posix_spawnp finds it: a path with '/', else each PATH entry;
 * a relative one in `dir` (--chdir: the spawn changes directory before it looks), not in this
 * process's directory, so --check refuses no interpreter the workers find and passes none
 * they do not (test_check_imports_the_app).
 */
static int find_in(int dfd, const char *prog, char *const *envp)
{
    if (strchr(prog, '/') != NULL)
        return faccessat(dfd, prog, X_OK, 0);
    const char *path = NULL;
    for (char *const *e = envp; e != NULL && *e != NULL; e++)
        if (strncmp(*e, "PATH=", 5) == 0)
            path = *e + 5;
    if (path == NULL)
        path = "/usr/local/bin:/usr/bin:/bin";
    char buf[PATH_MAX];
    while (*path != '\0') {
        const char *c = strchr(path, ':');
        size_t len = c != NULL ? (size_t)(c - path) : strlen(path);
        if (len > 0 && len + strlen(prog) + 2 < sizeof buf) {
            memcpy(buf, path, len);
            buf[len] = '/';
            strcpy(buf + len + 1, prog);
            if (faccessat(dfd, buf, X_OK, 0) == 0)
                return 0;
        }
        path += len + (c != NULL);
    }
    return -1;
}

static int find_program(const char *prog, const char *dir, char *const *envp)
{
    if (dir == NULL)
        return find_in(AT_FDCWD, prog, envp);
    int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -1;
    int rc = find_in(dfd, prog, envp);
    close(dfd);
    return rc;
}

/* Imports APP with the interpreter, as the worker's load_app would. */
static const char import_check[] = "import sys\n"
                                   "try:\n"
                                   "    from shmipc.serve.worker import load_app\n"
                                   "    load_app(sys.argv[1])\n"
                                   "except BaseException as e:\n"
                                   "    print(f'{type(e).__name__}: {e}', file=sys.stderr)\n"
                                   "    sys.exit(2)\n";

static int check_import(const shmipc__serve_options *o, char *const *envp, uint32_t timeout_ms,
                        char *err, size_t errlen)
{
    char sb[80];
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        shmipc__serve_set_err(err, errlen, "cannot check APP: %s", strerror(errno));
        return SHMIPC_EINVAL;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 2);
    if (o->chdir_to != NULL)
        posix_spawn_file_actions_addchdir_np(&fa, o->chdir_to);
    const char *argv[] = {o->python, "-c", import_check, o->app, NULL};
    char prog[PATH_MAX];
    if (native_kind(o->kind)) {
        /* The worker loads the .so or the Lua module as it would to serve, and says why not. */
        if (worker_program(prog, sizeof prog, err, errlen) < 0) {
            posix_spawn_file_actions_destroy(&fa);
            close(pfd[0]);
            close(pfd[1]);
            return SHMIPC_EINVAL;
        }
        argv[0] = prog;
        argv[1] = o->kind == SHMIPC__SERVE_C ? "--c" : "--lua";
        argv[2] = o->app;
        argv[3] = "--check";
    }
    /* The interpreter gets SIGPIPE's default: shmipc-serve ignores it from its first line. */
    posix_spawnattr_t at;
    sigset_t def;
    posix_spawnattr_init(&at);
    sigemptyset(&def);
    sigaddset(&def, SIGPIPE);
    posix_spawnattr_setsigdefault(&at, &def);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF);
    pid_t pid;
    int e = posix_spawnp(&pid, argv[0], &fa, &at, (char *const *)argv, envp);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    close(pfd[1]);
    if (e != 0) {
        close(pfd[0]);
        shmipc__serve_set_err(err, errlen, "%s%s: cannot run: %s",
                              native_kind(o->kind) ? "" : "--python ",
                              shmipc__serve_shown(argv[0], sb, sizeof sb), strerror(e));
        return SHMIPC_EINVAL;
    }
    char out[400];
    size_t got = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int timed_out = 0;
    for (;;) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        int64_t left = (int64_t)timeout_ms -
                       ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            timed_out = r == 0;
            break;
        }
        char tmp[512];
        ssize_t k = read(pfd[0], tmp, sizeof tmp);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        /* Keep the last bytes: the exception line is printed last. */
        size_t kk = (size_t)k, room = sizeof out - 1;
        if (kk >= room) {
            memcpy(out, tmp + kk - room, room);
            got = room;
        } else {
            if (got + kk > room) {
                size_t drop = got + kk - room;
                memmove(out, out + drop, got - drop);
                got -= drop;
            }
            memcpy(out + got, tmp, kk);
            got += kk;
        }
    }
    close(pfd[0]);
    if (timed_out)
        kill(pid, SIGKILL);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    out[got] = '\0';
    while (got > 0 && (out[got - 1] == '\n' || out[got - 1] == '\r'))
        out[--got] = '\0';
    const char *last = strrchr(out, '\n');
    last = last != NULL ? last + 1 : out;
    if (timed_out) {
        shmipc__serve_set_err(err, errlen, "APP %s: importing it took longer than %.1f s",
                              shmipc__serve_shown(o->app, sb, sizeof sb), timeout_ms / 1000.0);
        return SHMIPC_EINVAL;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char lb[200];
        size_t n = 0;
        for (const char *p = last; *p != '\0' && n + 1 < sizeof lb; p++)
            lb[n++] = (unsigned char)*p >= 0x20 ? *p : '?';
        lb[n] = '\0';
        shmipc__serve_set_err(err, errlen, "APP %s cannot be loaded by %s: %s",
                              shmipc__serve_shown(o->app, sb, sizeof sb),
                              native_kind(o->kind) ? "shmipc-serve-worker" : o->python,
                              n ? lb : "the interpreter failed");
        return SHMIPC_EINVAL;
    }
    return 0;
}

int shmipc__serve_check(const shmipc__serve_options *o, char *const *envp, uint32_t timeout_ms,
                        char *err, size_t errlen)
{
    char sb[80];
    shmipc__serve_set_err(err, errlen, "%s", "");
    if (o == NULL) {
        shmipc__serve_set_err(err, errlen, "no options");
        return SHMIPC_EINVAL;
    }
    if (envp == NULL)
        envp = environ;
    if (timeout_ms == 0)
        timeout_ms = 30000;
    if (shmipc__serve_validate((shmipc__serve_options *)o, err, errlen) != 0)
        return SHMIPC_EINVAL;
    if (o->app == NULL) {
        shmipc__serve_set_err(err, errlen, "no application");
        return SHMIPC_EINVAL;
    }
    struct stat st;
    if (o->chdir_to != NULL && (stat(o->chdir_to, &st) != 0 || !S_ISDIR(st.st_mode))) {
        shmipc__serve_set_err(err, errlen, "--chdir %s: not a directory",
                              shmipc__serve_shown(o->chdir_to, sb, sizeof sb));
        return SHMIPC_EINVAL;
    }
    if (!native_kind(o->kind) && find_program(o->python, o->chdir_to, envp) != 0) {
        shmipc__serve_set_err(err, errlen, "--python %s: not found or not executable",
                              shmipc__serve_shown(o->python, sb, sizeof sb));
        return SHMIPC_EINVAL;
    }
    if (strncmp(o->listen, "unix:", 5) == 0) {
        /* The socket's directory must exist (the file is created at start). */
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", o->listen + 5);
        char *slash = strrchr(dir, '/');
        if (slash != NULL) {
            *slash = '\0';
            if (dir[0] != '\0' && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
                shmipc__serve_set_err(err, errlen, "--listen %s: the directory does not exist",
                                      shmipc__serve_shown(o->listen, sb, sizeof sb));
                return SHMIPC_EINVAL;
            }
        }
    } else {
        char host[300];
        const char *colon = strrchr(o->listen, ':');
        size_t hl = (size_t)(colon - o->listen);
        const char *h = o->listen;
        if (h[0] == '[') {
            h++;
            hl -= 2;
        }
        if (hl >= sizeof host) {
            shmipc__serve_set_err(err, errlen, "--listen: the host is too long");
            return SHMIPC_EINVAL;
        }
        memcpy(host, h, hl);
        host[hl] = '\0';
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_PASSIVE;
        int g = getaddrinfo(host, colon + 1, &hints, &res);
        if (g != 0) {
            shmipc__serve_set_err(err, errlen, "--listen %s: %s",
                                  shmipc__serve_shown(o->listen, sb, sizeof sb), gai_strerror(g));
            return SHMIPC_EINVAL;
        }
        freeaddrinfo(res);
    }
    if (o->access_log != NULL && strcmp(o->access_log, "-") != 0) {
        /* Writable where it is, or creatable in its directory; nothing is created here. */
        if (access(o->access_log, F_OK) == 0) {
            if (stat(o->access_log, &st) != 0 || S_ISDIR(st.st_mode) ||
                access(o->access_log, W_OK) != 0) {
                shmipc__serve_set_err(err, errlen, "--access-log %s: cannot be written",
                                      shmipc__serve_shown(o->access_log, sb, sizeof sb));
                return SHMIPC_EINVAL;
            }
        } else {
            char dir[PATH_MAX];
            snprintf(dir, sizeof dir, "%s", o->access_log);
            char *slash = strrchr(dir, '/');
            const char *d = ".";
            if (slash != NULL) {
                *slash = '\0';
                d = dir[0] != '\0' ? dir : "/";
            }
            if (access(d, W_OK) != 0) {
                shmipc__serve_set_err(err, errlen,
                                      "--access-log %s: its directory cannot be written",
                                      shmipc__serve_shown(o->access_log, sb, sizeof sb));
                return SHMIPC_EINVAL;
            }
        }
    }
    return check_import(o, envp, timeout_ms, err, errlen);
}
