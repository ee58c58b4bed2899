// A fatal signal's native frames on stderr, for the GPU check's test runs (LD_PRELOAD): a
// segmentation fault in C++ under pytest otherwise shows only Python's frames (faulthandler),
// and a GPU machine is lent for minutes, so the first crash must name where it happened.
// Each frame is printed as glibc's backtrace_symbols_fd does ("module(+offset) [address]");
// gpu_check.sh turns the offsets into function and line with addr2line. Python's faulthandler,
// installed after this, chains to this handler; the signal is then re-raised with its default
// action, so the process still dies of it (exit status and core as without this library).
#define _GNU_SOURCE
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

// stderr as it was at load: pytest later points fd 2 at its capture file, which a crashing
// process never prints (Python's faulthandler keeps its own copy of stderr for the same reason).
static int trace_fd = 2;

static void on_fatal(int sig) {
  static const char head[] = "\n=== segv_trace: fatal signal, native frames:\n";
  void* frames[128];
  const int n = backtrace(frames, 128);
  (void)!write(trace_fd, head, sizeof head - 1);
  backtrace_symbols_fd(frames, n, trace_fd);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  const int fd = fcntl(2, F_DUPFD_CLOEXEC, 100);
  if (fd >= 0) trace_fd = fd;
  struct sigaction a;
  memset(&a, 0, sizeof a);
  a.sa_handler = on_fatal;
  a.sa_flags = SA_RESETHAND | SA_NODEFER;
  const int signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (unsigned k = 0; k < sizeof signals / sizeof signals[0]; ++k) sigaction(signals[k], &a, 0);
}
