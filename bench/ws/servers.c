/*
 * shmipc-bench-ws, the servers measured: spawning each target (the TCP floor,
 * examples/c/ws_echo, the npm `ws` echo and its install), stopping it, and its CPU time.
 */
#include "ws_bench.h"

static const char node_script[] =
    "// Written by shmipc-bench-ws: an echo server on the npm `ws` package.\n"
    "const { WebSocketServer } = require('ws');\n"
    "const wss = new WebSocketServer({ host: '127.0.0.1', port: Number(process.argv[2]),\n"
    "  backlog: 4096, perMessageDeflate: false, clientTracking: false,\n"
    "  maxPayload: 64 * 1024 * 1024 });\n"
    "wss.on('connection', (ws) => {\n"
    "  ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));\n"
    "  ws.on('error', () => {});\n"
    "});\n"
    "process.on('SIGTERM', () => process.exit(0));\n";

/* Runs argv pinned to the server CPU with stdout into /dev/null; returns its pid. */
static pid_t spawn(char *const argv[], const char *node_path)
{
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        /* And should the client die anyway, the server goes with it. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        pin(opt.server_cpu);
        if (null >= 0)
            dup2(null, 1);
        if (node_path != NULL)
            setenv("NODE_PATH", node_path, 1);
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    children[nchildren++] = pid;
    return pid;
}

int tcp_connect(int port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sin, sizeof sin) < 0) {
        close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

void start_target(struct target *t)
{
    char port[16], workers[16], script[300], node_path[600];
    t->port = free_port();
    snprintf(port, sizeof port, "%d", t->port);
    snprintf(workers, sizeof workers, "%d", opt.workers);
    if (t->kind == K_TCP) {
        char *argv[] = {self_exe, "tcp-echo", port, NULL};
        t->pid = spawn(argv, NULL);
    } else if (t->kind == K_OURS) {
        char *argv[] = {ws_echo_path, port, "--workers", workers, "--backend", t->backend, NULL};
        if (t->backend[0] == '\0')
            argv[4] = NULL;
        t->pid = spawn(argv, NULL);
    } else {
        char *argv[] = {"node", script, port, NULL};
        snprintf(script, sizeof script, "%s/ws_echo.js", tmpdir);
        snprintf(node_path, sizeof node_path, "%s/node_modules", opt.npm_dir);
        t->pid = spawn(argv, node_path);
    }
    for (int i = 0; i < 500; i++) {
        int fd = tcp_connect(t->port), status;
        if (fd >= 0) {
            close(fd);
            return;
        }
        if (waitpid(t->pid, &status, WNOHANG) == t->pid) {
            for (int k = 0; k < nchildren; k++)
                if (children[k] == t->pid)
                    children[k] = 0;
            die("the %s server exited before it listened on port %d", t->name, t->port);
        }
        sleep_ms(20);
    }
    die("the %s server did not listen on port %d within 10 s", t->name, t->port);
}

void stop_target(struct target *t)
{
    if (t->pid <= 0)
        return;
    kill(t->pid, SIGTERM);
    for (int i = 0; i < 250 && waitpid(t->pid, NULL, WNOHANG) == 0; i++)
        sleep_ms(20);
    if (waitpid(t->pid, NULL, WNOHANG) == 0) {
        fprintf(stderr, "shmipc-bench-ws: %s did not stop within 5 s of SIGTERM; killed\n",
                t->name);
        kill(t->pid, SIGKILL);
        waitpid(t->pid, NULL, 0);
    }
    for (int k = 0; k < nchildren; k++)
        if (children[k] == t->pid)
            children[k] = 0;
    t->pid = 0;
}

/* CPU time (user + system, all threads) of a server process, in ns. */
uint64_t server_cpu_ns(pid_t pid)
{
    clockid_t clk;
    struct timespec ts;
    if (clock_getcpuclockid(pid, &clk) == 0 && clock_gettime(clk, &ts) == 0)
        return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    return 0;
}

/* Installs `ws` into opt.npm_dir (once: a later run reuses it) and writes the echo script;
 * 0, or -1 with a note when Node.js cannot be measured. */
int node_prepare(void)
{
    char path[700], cmd[1600], line[256];
    FILE *f;
    if (!have("node") || !have("npm")) {
        fprintf(stderr, "shmipc-bench-ws: node or npm not found: the Node.js `ws` peer is left "
                        "out (Debian: apt-get install nodejs npm)\n");
        return -1;
    }
    snprintf(path, sizeof path, "%s/node_modules/ws/package.json", opt.npm_dir);
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "shmipc-bench-ws: npm install ws into %s\n", opt.npm_dir);
        snprintf(cmd, sizeof cmd,
                 "mkdir -p '%s' && cd '%s' && npm install --no-audit --no-fund --no-save "
                 "--loglevel=error --cache '%s/npm-cache' ws@8 >&2",
                 opt.npm_dir, opt.npm_dir, opt.npm_dir);
        if (system(cmd) != 0 || access(path, R_OK) != 0) {
            fprintf(stderr, "shmipc-bench-ws: npm install ws failed: the Node.js `ws` peer is "
                            "left out\n");
            return -1;
        }
    }
    f = fopen(path, "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, " \"version\": \"%63[^\"]\"", ws_version) == 1)
            break;
    if (f != NULL)
        fclose(f);
    f = popen("node --version", "r");
    if (f != NULL) {
        if (fgets(node_version, sizeof node_version, f) == NULL)
            node_version[0] = '\0';
        node_version[strcspn(node_version, "\n")] = '\0';
        pclose(f);
    }
    snprintf(path, sizeof path, "%s/ws_echo.js", tmpdir);
    f = fopen(path, "w");
    if (f == NULL || fputs(node_script, f) < 0 || fclose(f) != 0)
        die("%s: %s", path, strerror(errno));
    return 0;
}
