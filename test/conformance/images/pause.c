// pause: the process that holds a pod's namespaces in the suite's
// registry.k8s.io/pause image. It sleeps until SIGINT or SIGTERM and reaps
// any child re-parented to it (it may be a pod's PID 1). Built static with
// the system C compiler by images.sh.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(int argc, char **argv) {
	(void)argv;
	if (argc > 1) {
		return 0; /* "-v" and friends: nothing to print, like upstream's build without a version */
	}
	struct sigaction sa = {0};
	sa.sa_handler = stop;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sa.sa_handler = reap;
	sa.sa_flags = SA_NOCLDSTOP;
	sigaction(SIGCHLD, &sa, NULL);
	for (;;) {
		pause();
	}
}
