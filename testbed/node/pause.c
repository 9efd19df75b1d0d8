/* The pod sandbox's init (what registry.k8s.io/pause does): sleep until told to stop, reap orphans.
   Built here, static, so the local node needs no registry. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void die(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction a = {0};
  a.sa_handler = die; sigaction(SIGINT, &a, NULL); sigaction(SIGTERM, &a, NULL);
  a.sa_handler = reap; a.sa_flags = SA_NOCLDSTOP; sigaction(SIGCHLD, &a, NULL);
  for (;;) pause();
}
