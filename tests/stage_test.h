/* stage_test.h: `convoy stage` processes for tests that need a pipeline
 * (include after test.h). test_free_port is a loopback port nothing
 * listens on (for a moment); test_start_stage starts a stage on one,
 * serving `model`, and returns its pid once it listens; test_stop_stage
 * kills it (SIGKILL) and reaps it. */
#ifndef CONVOY_TESTS_STAGE_TEST_H
#define CONVOY_TESTS_STAGE_TEST_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

static inline int test_free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    bind(s, (struct sockaddr *)&a, sizeof a);
    getsockname(s, (struct sockaddr *)&a, &len);
    close(s);
    return ntohs(a.sin_port);
}

static inline pid_t test_start_stage(const char *model, int *port)
{
    *port = test_free_port();
    const struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)*port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", *port);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr))
            _exit(127);
        execl(CONVOY_BINARY_DIR "/convoy", "convoy", "stage", "--listen", listen, "-m", model, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100; i++) { /* wait until it listens */
        int c = socket(AF_INET, SOCK_STREAM, 0);
        int ok = connect(c, (struct sockaddr *)&a, sizeof a) == 0;
        close(c);
        if (ok)
            break;
        usleep(50000);
    }
    return pid;
}

static inline void test_stop_stage(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

#endif
