/*
 * Static x86-64 trampoline installed inside the aarch64 sysroot.
 *
 * There is no binfmt_misc on the test machines, so when an emulated aarch64
 * process (PoCL, via the clang driver) calls execve() on an aarch64 program
 * such as the linker, the host kernel refuses it.  This wrapper is a native
 * x86-64 executable placed where the aarch64 program was; it re-executes the
 * real program (moved aside at build time) under qemu-user, inside the same
 * chroot, with the original arguments.
 *
 * Build (done by prepare_aarch64.sh):
 *   gcc -static -O2 -DTARGET_PROGRAM='"/usr/libexec/edgecv-aarch64/ld.bfd"' \
 *       -o wrapper qemu_exec_wrapper.c
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef TARGET_PROGRAM
#error "define TARGET_PROGRAM as the path of the real aarch64 program"
#endif

#ifndef QEMU_PROGRAM
#define QEMU_PROGRAM "/usr/bin/qemu-aarch64-static"
#endif

int main(int argc, char **argv)
{
    /* qemu, "-0", argv0, target, argv[1..argc-1], NULL */
    char **args = calloc((size_t)argc + 4, sizeof *args);
    int n = 0;

    if (args == NULL) {
        perror("qemu-exec-wrapper: calloc");
        return 127;
    }
    args[n++] = QEMU_PROGRAM;
    args[n++] = "-0"; /* keep the caller's argv[0] for the guest program */
    args[n++] = (argc > 0 && argv[0] != NULL) ? argv[0] : TARGET_PROGRAM;
    args[n++] = TARGET_PROGRAM;
    for (int i = 1; i < argc; i++)
        args[n++] = argv[i];
    args[n] = NULL;

    execv(QEMU_PROGRAM, args);
    fprintf(stderr, "qemu-exec-wrapper: cannot run %s for %s: %s\n",
            QEMU_PROGRAM, TARGET_PROGRAM, strerror(errno));
    return 127;
}
