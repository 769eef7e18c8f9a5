/* sysprobe NAME...: make each named syscall and print "NAME ok" or "NAME errno=N".
 * Built static into test images to claim what the sandbox's seccomp filter lets through. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef AF_ALG
#define AF_ALG 38
#endif
#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#define KEYCTL_GET_KEYRING_ID 0
#define KEY_SPEC_SESSION_KEYRING -3

static long probe(const char *name) {
    if (!strcmp(name, "personality-query")) return syscall(SYS_personality, 0xffffffffUL);
    if (!strcmp(name, "personality-no-aslr")) return syscall(SYS_personality, ADDR_NO_RANDOMIZE);
    if (!strcmp(name, "unshare-user")) return syscall(SYS_unshare, CLONE_NEWUSER);
    if (!strcmp(name, "keyctl"))
        return syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0);
    if (!strcmp(name, "socket-inet")) return syscall(SYS_socket, AF_INET, SOCK_STREAM, 0);
    if (!strcmp(name, "socket-alg")) return syscall(SYS_socket, AF_ALG, SOCK_SEQPACKET, 0);
    if (!strcmp(name, "socket-vsock")) return syscall(SYS_socket, AF_VSOCK, SOCK_STREAM, 0);
    if (!strcmp(name, "getpid")) return syscall(SYS_getpid);
    errno = EINVAL;
    return -2;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        errno = 0;
        long rc = probe(argv[i]);
        if (rc == -2 && errno == EINVAL) printf("%s unknown\n", argv[i]);
        else if (rc < 0) printf("%s errno=%d\n", argv[i], errno);
        else printf("%s ok\n", argv[i]);
    }
    return 0;
}
