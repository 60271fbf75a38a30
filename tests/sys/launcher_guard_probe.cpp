// Run by test_launcher_guard as the child of a stand-in for mpirun: `launcher_guard_probe MODE`
// where MODE is
//   abnormal  starts the launcher guard and ends without standing it down, as a rank that
//             mpirun killed or that aborted;
//   finished  starts it, stands it down (as after MPI_Finalize) and exits 0.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "sys/launcher_guard.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "abnormal" && mode != "finished") {
    std::fprintf(stderr, "usage: launcher_guard_probe abnormal|finished\n");
    return 2;
  }
  bottle::start_launcher_guard();
  if (mode == "finished") {
    bottle::stand_down_launcher_guard();
    return 0;
  }
  std::_Exit(1);
}
